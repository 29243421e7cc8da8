"""cpu-gemm: unroll the input (im2col) and multiply by the weight matrix with BLAS, a chunk of images at a time.

Technique: for a chunk of images the input is unrolled into cols[b, (c, p, q), (h, w)] = x[b, c, h+p, w+q]
(one strided copy of the sliding-window view, no Python loop over taps), then the (M, C*K*K) weight
matrix multiplies it, batched over the chunk, straight into y[b0:b1] viewed as (n, M, Ho*Wo): the
product's layout is y's, so nothing is transposed afterwards. The bias is added to the chunk while it is
still in cache. The chunk is sized so its unrolled matrix takes about CHUNK_BYTES (a few MiB, to stay in
the caches between the copy that writes it and the product that reads it); memory stays bounded at any B.
The product is torch.matmul on CPU tensors rather than NumPy's: it runs on the thread pool that
torch.set_num_threads (the harness's --threads) controls, with no second BLAS pool spinning against it,
and writes into the output through ``out=``. fp32 throughout (exact BLAS sgemm, no TF32 on a CPU).
Course step: the "unroll + matrix multiply" milestone (the unroll kernel feeding a tiled matmul), the
step that turns convolution into the operation libraries are best at.
Bottleneck: memory: the unrolled matrix is K*K times the input (25x / 49x) and is written and read
again; and the products are skinny (M = 4..50 rows), so BLAS stays well below its large-matrix rate.
"""

from __future__ import annotations

from typing import Optional

import torch

from convforge.conv import finish_output, output_buffer
from convforge.conv.cpu_loops import check_input

CHUNK_BYTES = 4 << 20  # unrolled matrix per chunk


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
    maps, channels, kernel, kernel_w = weight.shape
    if kernel != kernel_w:
        raise ValueError(f"square kernels only, got {kernel}x{kernel_w}")
    wmat = weight.detach().to(torch.float32).reshape(maps, channels * kernel * kernel).contiguous()
    b = None if bias is None else bias.detach().to(torch.float32).reshape(1, maps, 1).contiguous()

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        _, shape = check_input(x, weight.shape)
        x = x.detach().contiguous()
        target, result = output_buffer(out, shape, x)
        batch, _, out_h, out_w = shape
        if batch == 0:
            return finish_output(target, result)
        y = target.view(batch, maps, out_h * out_w)
        per_image = channels * kernel * kernel * out_h * out_w * 4
        chunk = max(1, min(batch, CHUNK_BYTES // per_image))
        cols = torch.empty(chunk, channels, kernel, kernel, out_h, out_w)
        for b0 in range(0, batch, chunk):
            n = min(chunk, batch - b0)
            # windows[b, c, h, w, p, q] = x[b, c, h + p, w + q]  ->  cols[b, c, p, q, h, w]
            windows = x[b0:b0 + n].unfold(2, kernel, 1).unfold(3, kernel, 1)
            cols[:n].copy_(windows.permute(0, 1, 4, 5, 2, 3))
            part = y[b0:b0 + n]
            torch.matmul(wmat, cols[:n].view(n, channels * kernel * kernel, out_h * out_w), out=part)
            if b is not None:
                part += b
        return finish_output(target, result)

    return run
