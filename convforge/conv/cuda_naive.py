"""cuda-naive: one thread per output element, global memory only (``cuda/naive.cu``).

Technique: a grid-stride loop over the flattened output; each thread sums its C*K*K products reading the
input and the weights from global memory on every use (no shared memory, no read-only path, run-time
shapes), then adds the bias.
Course step: milestone 3, the first GPU kernel (the course's ``conv_forward_kernel`` with its x4d/k4d macros).
Bottleneck: load instructions: 2 global loads per FMA, served by L1/L2 (each input value is re-read up to
M*K*K times); far from both the bandwidth and the FP32 roof.
"""

from __future__ import annotations

from typing import Optional

import torch

from convforge.conv import cuda_common as cc

SPEC = cc.KernelSpec.of("naive.cu")
BLOCK = 256
unavailable_reason = cc.unavailable_reason


def kernel_specs(M: int, C: int, H: int, W: int, K: int, **_) -> list[cc.KernelSpec]:
    return [SPEC]


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, input_hw=None):
    weight, bias = cc.check_weight(weight, bias)
    kernel = cc.kernel(SPEC, "conv_naive", weight.device)
    M, C, K, _ = weight.shape

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = cc.check_input(x, weight)
        shape = cc.conv_out_shape(x, weight)
        y, result = cc.output(out, shape, x)
        B, _, H, W = x.shape
        total = y.numel()
        if total:
            grid = min(cc.cdiv(total, BLOCK), cc.INT32_MAX)
            kernel((grid,), (BLOCK,), (cc.ptr(y), cc.ptr(x), cc.ptr(weight), cc.ptr(bias), cc.i32(B), cc.i32(M),
                                       cc.i32(C), cc.i32(H), cc.i32(W), cc.i32(K)))
        return cc.finish(y, result)

    return run
