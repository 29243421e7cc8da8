"""cuda-unroll-gemm: an unroll (im2col) kernel and a shared-memory tiled matrix multiply, batch chunked.

Technique: ``cuda/unroll_gemm.cu``. ``conv_unroll`` expands a chunk of images into X_unroll (C*K*K rows x
Ho*Wo columns per image) in a scratch buffer; ``gemm_tiled`` multiplies the (M x C*K*K) weight matrix by
each image's X_unroll with 16 x 16 shared-memory tiles (grid.z = image), adding the bias and writing NCHW
output directly. The scratch holds at most ``SCRATCH_BYTES`` (and 65535 images, grid.z's limit), so memory
stays bounded for any batch.
Course step: milestone 4's "unroll + shared-memory matrix multiply" (the im2col formulation).
Bottleneck: device-memory traffic of the K*K-times larger unrolled matrix (written then read back), and a
one-output-per-thread matmul that issues two shared loads per FMA.
"""

from __future__ import annotations

from typing import Optional

import torch

from convforge.conv import cuda_common as cc

TILE = 16
SPEC = cc.KernelSpec.of("unroll_gemm.cu", CF_TILE=TILE)
SCRATCH_BYTES = 256 << 20
UNROLL_BLOCK = 256
MAX_GRID_Z = 65535
unavailable_reason = cc.unavailable_reason


def kernel_specs(M: int, C: int, H: int, W: int, K: int, **_) -> list[cc.KernelSpec]:
    return [SPEC]


def chunk_images(B: int, C: int, H: int, W: int, K: int, scratch_bytes: int = SCRATCH_BYTES) -> int:
    per_image = 4 * C * K * K * (H - K + 1) * (W - K + 1)
    return max(1, min(B, scratch_bytes // per_image, MAX_GRID_Z))


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, input_hw=None,
            scratch_bytes: int = SCRATCH_BYTES):
    weight, bias = cc.check_weight(weight, bias)
    device = weight.device
    unroll = cc.kernel(SPEC, "conv_unroll", device)
    gemm = cc.kernel(SPEC, "gemm_tiled", device)
    M, C, K, _ = weight.shape
    kr = C * K * K
    sms = cc.device_info(device).sm_count

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = cc.check_input(x, weight)
        y, result = cc.output(out, cc.conv_out_shape(x, weight), x)
        B, _, H, W = x.shape
        P = (H - K + 1) * (W - K + 1)
        if y.numel():
            nb = chunk_images(B, C, H, W, K, scratch_bytes)
            scratch = torch.empty(nb * kr * P, dtype=torch.float32, device=device)
            for b0 in range(0, B, nb):
                n = min(nb, B - b0)
                total = n * kr * P
                unroll((min(cc.cdiv(total, UNROLL_BLOCK), sms * 32),), (UNROLL_BLOCK,),
                       (cc.ptr(scratch), cc.ptr(x), cc.i32(n), cc.i32(b0), cc.i32(C), cc.i32(H), cc.i32(W),
                        cc.i32(K)))
                gemm((cc.cdiv(P, TILE), cc.cdiv(M, TILE), n), (TILE, TILE),
                     (cc.ptr(y), cc.ptr(weight), cc.ptr(scratch), cc.ptr(bias), cc.i32(M), cc.i32(kr), cc.i32(P),
                      cc.i32(b0)))
        return cc.finish(y, result)

    return run
