"""cuda-auto: per layer shape, the fastest exact CUDA kernel according to bench results kept in the repo.

Technique: no kernel of its own. ``convforge/tuning/cuda-auto.json`` (the tuning store's schema, see
``convforge.tuning``) lists measured winners, one entry per (shape, pool); cuda-auto looks the layer up when it
first sees the input size and delegates to that implementation with the recorded launch shape. With no entry
it runs cuda-fused-gemm (plain calls) or cuda-fused-layer (fused calls) with their modelled default launch
shapes. Only exact (fp32) kernels are eligible. An entry's ``shape`` is M, C, H, W, K and ``pool`` (1 for a
plain conv), its ``config`` the delegate and the delegate's launch config (null: the delegate's own choice)::

    {"shape": {"M": 24, "C": 12, "H": 33, "W": 33, "K": 7, "pool": 1},
     "config": {"impl": "cuda-fused-gemm", "config": {"tm": 6, "ht": 1, "wt": 4, "nt": 384}},
     "median_ms": 4.5694, "gpu": "NVIDIA H200", "versions": {}, "date": "2026-11-21", "source": "...", ...}

``convforge sweep --variants --write-auto convforge/tuning/cuda-auto.json`` writes it from a sweep's winners.

Course step: the course's "choose the kernel per layer" optimisation (different kernels for the two layers).
Bottleneck: whichever kernel it picks.
"""

from __future__ import annotations

from typing import Optional

import torch

from convforge import tuning
from convforge.conv import cuda_common as cc

TUNING = "cuda-auto"     # convforge/tuning/cuda-auto.json
ELIGIBLE = frozenset({  # the exact CUDA implementations
    "cuda-naive", "cuda-tiled", "cuda-constmem", "cuda-unroll-gemm", "cuda-fused-gemm", "cuda-fused-layer",
    "cuda-direct"})
FUSING = {"cuda-fused-layer", "cuda-direct"}
DEFAULT_PLAIN, DEFAULT_FUSED = "cuda-fused-gemm", "cuda-fused-layer"
unavailable_reason = cc.unavailable_reason


def choose(M: int, C: int, H: int, W: int, K: int, pool: int = 1) -> tuple[str, Optional[dict]]:
    """(implementation, launch config or None) for one layer shape; pool 1 for a plain convolution."""
    entry = tuning.lookup(TUNING, M=M, C=C, H=H, W=W, K=K, pool=pool)
    impl = (entry or {}).get("impl")
    if impl not in ELIGIBLE or (pool > 1 and impl not in FUSING):
        # no entry, or a reduced-precision or non-fusing winner, which cannot serve this call
        return (DEFAULT_FUSED if pool > 1 else DEFAULT_PLAIN), None
    return impl, entry.get("config")


def _delegate(impl: str, config, weight, bias, hw, activation=None, pool: int = 1):
    """The chosen implementation prepared through the registry (which passes ``config`` and ``input_hw``)."""
    from convforge import conv
    entry = conv.get(impl)
    if pool > 1 or activation is not None:
        return entry.prepare_fused(weight, bias, activation, pool, input_hw=hw, config=config)
    return entry.prepare(weight, bias, input_hw=hw, config=config)


def _lazy(weight, bias, input_hw, activation=None, pool: int = 1):
    weight, bias = cc.check_weight(weight, bias)
    M, C, K, _ = weight.shape
    chosen: dict = {}

    def fn_for(h: int, w: int):
        if (h, w) not in chosen:
            impl, config = choose(M, C, h, w, K, pool)
            if pool == 1 and activation is not None:
                impl = DEFAULT_FUSED if impl not in FUSING else impl
            chosen[(h, w)] = _delegate(impl, config, weight, bias, (h, w), activation, pool)
        return chosen[(h, w)]

    if input_hw is not None:
        fn_for(*input_hw)

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        # The delegate checks every call; here only a size not seen yet is checked before choosing.
        fn = chosen.get(tuple(x.shape[2:])) if x.dim() == 4 else None
        if fn is None:
            x = cc.check_input(x, weight)
            fn = fn_for(x.shape[2], x.shape[3])
        return fn(x, out)

    run.choice = lambda h, w: choose(M, C, h, w, K, pool)
    return run


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, input_hw=None):
    return _lazy(weight, bias, input_hw)


def prepare_fused(weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str], pool: int,
                  input_hw=None):
    return _lazy(weight, bias, input_hw, activation, int(pool))
