"""cuda-fused-layer: convolution + bias + activation + max pool in one kernel, writing only the pooled map.

Technique: one of two fused kernels, chosen by the layer's channel count (``design``), each of which keeps
the conv output on chip and stores only the activated window maxima (tanh, relu and sigmoid are monotone,
so act(max) == max(act) exactly; conv rows and columns that fill no window, floor semantics as
F.max_pool2d, are never computed):
- ``regtile`` (several input channels): ``cuda/regtile.cu``, the cuda-fused-gemm implicit GEMM, compiled
  with CF_POOL and CF_ACT; each thread's register tile covers whole pool x pool windows (HT, WT multiples
  of the pool), the accumulators start at the bias and the epilogue takes the window maximum.
- ``direct`` (one input channel): ``cuda/direct.cu``, cuda-direct's pooled kernel: weights as constant-bank
  FFMA operands, a thread's tile of pool rows x columns x maps in registers, only the pooled values stored.
  On one channel the implicit GEMM's reduction is only K*K long, so its shared-memory staging and address
  arithmetic cost more than the FFMAs: in the B = 10000 bench on an H200 (RESULTS.md, run 10 in the seventh
  GPU section) the direct kernel took 0.66-0.79x the regtile kernel's time on all six one-channel pooled
  layers (fa17 0.361 against 0.456 ms), and the regtile kernel won the four-channel fa20 L2 (1.338 against
  1.585 ms).
``config`` picks a design and its launch shape: {"kernel": "direct", "mg": ..} or a regtile config
({"kernel": "regtile", "tm": ..}, "kernel" optional; cuda-auto's table names it). ``prepare`` (no fusion) is
cuda-fused-gemm.
Course step: the course's layer fusion (conv + activation + pooling kept on chip), past its milestones.
Bottleneck: FP32 FFMA issue (and on the one-channel layers the constant-bank weight reads beside it); the
pooled output is pool^2 times smaller than the conv output, so the first layers are no longer bound by
their stores (fused floor = pooled-output bytes or FLOPs / the measured matmul rate).
"""

from __future__ import annotations

from typing import Optional

import torch

from convforge.conv import cuda_common as cc
from convforge.conv import cuda_direct as direct
from convforge.conv import cuda_fused_gemm as gemm

DESIGNS = ("regtile", "direct")
LAUNCH_CONFIGS = gemm.LAUNCH_CONFIGS
unavailable_reason = cc.unavailable_reason
prepare = gemm.prepare


def design(C: int, config=None) -> tuple[str, Optional[object]]:
    """(kernel design, its launch config or None for that design's tuned/modelled default) for a layer of C
    input channels: ``direct`` for one channel, ``regtile`` otherwise, unless ``config`` names one."""
    if config is None or (isinstance(config, dict) and not config):
        return ("direct" if C == 1 else "regtile"), None
    if isinstance(config, direct.DirectConfig):
        return "direct", config
    if not isinstance(config, dict):
        return "regtile", config          # a RegTileConfig, as the sweeps pass it
    cfg = dict(config)
    kind = cfg.pop("kernel", "regtile")   # sweep --write-auto names the design; a bare dict is a regtile config
    if kind not in DESIGNS:
        raise ValueError(f"kernel must be one of {DESIGNS}, got {kind!r}")
    return kind, cfg or None


def kernel_specs(M: int, C: int, H: int, W: int, K: int, pool: int = 2, activation: Optional[str] = "tanh",
                 config=None, **_) -> list[cc.KernelSpec]:
    kind, cfg = design(C, config)
    act = cc.activation_code(activation)
    if kind == "direct":
        return direct.kernel_specs(M, C, H, W, K, pool, act, cfg)
    return gemm.kernel_specs(M, C, H, W, K, pool, act, cfg)


def candidate_configs(M: int, C: int, H: int, W: int, K: int, pool: int = 2, **kw):
    """The regtile design's launch shapes (the direct design's are cuda-direct's, swept under that name)."""
    return gemm.candidate_configs(M, C, H, W, K, pool, **kw)


def prepare_fused(weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str], pool: int,
                  config=None, input_hw=None, out_dtype: torch.dtype = torch.float32):
    """``out_dtype=torch.float16``: the direct design writes FP16 (cuda-direct's); the regtile design writes
    float32 whatever is asked (the returned tensor's dtype says which)."""
    weight, bias = cc.check_weight(weight, bias)
    act, pool = cc.fusion_codes(activation, pool)
    kind, cfg = design(weight.shape[1], config)
    half = cc.is_half("out_dtype", out_dtype)

    def make(h: int, w: int):
        if kind == "direct":
            return direct.DirectLayer(weight, bias, h, w, pool, act, cfg, half)
        return gemm.RegTileLayer(weight, bias, h, w, pool, act, cfg)

    return cc.per_input_size(weight, make, input_hw)
