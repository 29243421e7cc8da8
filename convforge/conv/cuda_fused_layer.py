"""cuda-fused-layer: convolution + bias + activation + max pool in one kernel, writing only the pooled map.

Technique: ``cuda/regtile.cu`` (the cuda-fused-gemm kernel) compiled with CF_POOL and CF_ACT: each thread's
register tile covers whole pool x pool windows (HT, WT multiples of the pool), so the epilogue takes the
window maximum of the accumulators (which start at the bias), applies the activation once per pooled
value (tanh, relu and sigmoid are monotone, so act(max) == max(act) exactly) and stores only the pooled
map; conv rows and columns that fill no window (floor semantics, as F.max_pool2d) are never computed.
The activation is a compile-time constant, so it costs no branch. ``prepare`` (no fusion) is cuda-fused-gemm.
Course step: the course's layer fusion (conv + activation + pooling kept on chip), past its milestones.
Bottleneck: FP32 FFMA issue; the pooled output is pool^2 times smaller than the conv output, so the first
layers are no longer bound by their stores (fused floor = pooled-output bytes or FLOPs / 51 TFLOP/s).
"""

from __future__ import annotations

from typing import Optional

import torch

from convforge.conv import cuda_common as cc
from convforge.conv import cuda_fused_gemm as gemm

LAUNCH_CONFIGS = gemm.LAUNCH_CONFIGS
unavailable_reason = cc.unavailable_reason
prepare = gemm.prepare


def kernel_specs(M: int, C: int, H: int, W: int, K: int, pool: int = 2, activation: Optional[str] = "tanh",
                 config=None, **_) -> list[cc.KernelSpec]:
    return gemm.kernel_specs(M, C, H, W, K, pool, cc.activation_code(activation), config)


def candidate_configs(M: int, C: int, H: int, W: int, K: int, pool: int = 2, **kw):
    return gemm.candidate_configs(M, C, H, W, K, pool, **kw)


def prepare_fused(weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str], pool: int,
                  config=None, input_hw=None):
    weight, bias = cc.check_weight(weight, bias)
    act, pool = cc.fusion_codes(activation, pool)
    return cc.per_input_size(weight, lambda h, w: gemm.RegTileLayer(weight, bias, h, w, pool, act, config), input_hw)
