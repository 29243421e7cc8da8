"""reference: the course's convolution in float64, vectorised with NumPy.

Technique: the pseudo-code's sum over (c, p, q) for every (b, m, h, w), computed as an im2col view of
the input (no copy until BLAS packs it) times the flattened weights, in float64.
Course step: the semantics every milestone had to reproduce; here it is the verification reference.
Bottleneck: float64 BLAS on the CPU; not meant to be fast.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from convforge.conv import check_input, finish_output, output_buffer


def conv2d_float64(x: np.ndarray, weight: np.ndarray, bias: Optional[np.ndarray] = None,
                   block_bytes: int = 64 << 20) -> np.ndarray:
    """y[b,m,h,w] = sum_{c,p,q} x[b,c,h+p,w+q] * weight[m,c,p,q] (+ bias[m]), computed in float64."""
    x = np.asarray(x, dtype=np.float64)
    weight = np.asarray(weight, dtype=np.float64)
    maps, channels, kernel, _ = weight.shape
    batch, _, height, width = x.shape
    ho, wo = height - kernel + 1, width - kernel + 1
    y = np.empty((batch, maps, ho, wo), dtype=np.float64)
    # BLAS packs the im2col matrix (C*K*K values per output position): bound it by images per block.
    per_image = 8 * ho * wo * channels * kernel * kernel
    step = max(1, block_bytes // max(per_image, 1))
    for start in range(0, batch, step):
        # (b, C, Ho, Wo, K, K) view: window [.., h, w, p, q] = x[.., h + p, w + q]
        windows = np.lib.stride_tricks.sliding_window_view(x[start:start + step], (kernel, kernel), axis=(2, 3))
        block = np.tensordot(windows, weight, axes=([1, 4, 5], [1, 2, 3]))  # (b, Ho, Wo, M)
        y[start:start + step] = block.transpose(0, 3, 1, 2)
    if bias is not None:
        y += np.asarray(bias, dtype=np.float64).reshape(1, -1, 1, 1)
    return y


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
    weight64 = weight.detach().cpu().double().numpy()
    bias64 = None if bias is None else bias.detach().cpu().double().numpy()

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        shape = check_input(x, weight)
        y = torch.from_numpy(conv2d_float64(x.numpy(), weight64, bias64))
        if out is None:
            return y.float()
        buffer, result = output_buffer(out, shape, x)
        buffer.copy_(y)
        return finish_output(buffer, result)

    return run
