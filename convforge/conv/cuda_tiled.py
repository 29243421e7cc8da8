"""cuda-tiled: the input tile plus its halo in shared memory (``cuda/tiled.cu``).

Technique: a block of TILE x TILE threads computes one TILE x TILE tile of one output map of one image;
per input channel it stages the (TILE+K-1)^2 input patch in shared memory (zero-filled past the edge),
synchronises, and each thread sums its K x K window from shared memory; weights come through the
read-only cache.
Course step: milestone 4's shared-memory tiled convolution (input tile + halo).
Bottleneck: shared-memory loads (one per FMA, plus the weight load) and two barriers per channel; the
patch is reloaded for every map, so the input is read M times from L2.
"""

from __future__ import annotations

from typing import Optional

import torch

from convforge.conv import cuda_common as cc

TILE = 16
SPEC = cc.KernelSpec.of("tiled.cu", CF_TILE=TILE)
unavailable_reason = cc.unavailable_reason


def kernel_specs(M: int, C: int, H: int, W: int, K: int, **_) -> list[cc.KernelSpec]:
    return [SPEC]


def launch_tiles(kernel, args_before, args_after, B: int, M: int, H: int, W: int, K: int, m_count=None):
    """Launch a tiled kernel over B images in chunks that keep grid.x within CUDA's limit."""
    ho, wo = H - K + 1, W - K + 1
    tiles_w, tiles_h = cc.cdiv(wo, TILE), cc.cdiv(ho, TILE)
    tiles = tiles_w * tiles_h
    per_launch = max(1, cc.INT32_MAX // tiles)
    smem = 4 * (TILE + K - 1) ** 2
    maps = M if m_count is None else m_count
    if maps > 65535:
        raise ValueError(f"{maps} maps exceed grid.y's limit of 65535")
    for b0 in range(0, B, per_launch):
        nb = min(per_launch, B - b0)
        kernel((nb * tiles, maps), (TILE, TILE),
               (*args_before, cc.i32(tiles_w), cc.i32(tiles_h), cc.i32(b0), *args_after), shared_mem=smem)


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, input_hw=None):
    weight, bias = cc.check_weight(weight, bias)
    kernel = cc.kernel(SPEC, "conv_tiled", weight.device)
    M, C, K, _ = weight.shape

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = cc.check_input(x, weight)
        y, result = cc.output(out, cc.conv_out_shape(x, weight), x)
        B, _, H, W = x.shape
        if y.numel():
            launch_tiles(kernel, (cc.ptr(y), cc.ptr(x), cc.ptr(weight), cc.ptr(bias), cc.i32(B), cc.i32(M),
                                  cc.i32(C), cc.i32(H), cc.i32(W), cc.i32(K)), (), B, M, H, W, K)
        return cc.finish(y, result)

    return run
