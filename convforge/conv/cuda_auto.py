"""cuda-auto: per layer shape, the fastest exact CUDA kernel according to bench results kept in the repo.

Technique: no kernel of its own. ``convforge/tuning/cuda-auto.json`` (the tuning store's schema, see
``convforge.tuning``) lists measured winners, one entry per (shape, pool, batch); cuda-auto looks the layer up
when it first sees an input shape (images, height, width), taking the entry whose recorded ``batch`` is nearest
to the call's images in log scale (``tuning.nearest_batch``; an entry without one counts as 10000), and
delegates to that implementation with the recorded launch shape. One delegate is prepared per (height, width,
implementation, config), on the first call that needs it; a call made while a CUDA graph is being captured does
not prepare one (that compiles and allocates) but reuses one prepared for its size, so warm up at the batch you
capture (``engine.GraphedForward`` runs two uncaptured passes first). With no entry
it runs cuda-fused-gemm (plain calls) or cuda-fused-layer (fused calls) with their modelled default launch
shapes. Only kernels held to the exact tolerance are eligible: fp32 arithmetic, and cuda-tc-3xtf32's split TF32
(three tensor-core products a multiply, fp32-accurate), which serves plain (unfused) layers. An entry's ``shape``
is M, C, H, W, K and ``pool`` (1 for a plain conv), its ``config`` the delegate and the delegate's launch config
(null: the delegate's own choice)::

    {"shape": {"M": 24, "C": 12, "H": 33, "W": 33, "K": 7, "pool": 1},
     "config": {"impl": "cuda-fused-gemm", "config": {"tm": 6, "ht": 1, "wt": 4, "nt": 384}},
     "median_ms": 4.5694, "gpu": "NVIDIA H200", "versions": {}, "date": "2026-11-21", "source": "...", ...}

``convforge sweep --variants --batch B --write-auto convforge/tuning/cuda-auto.json`` merges a sweep's winners
into it as entries for batch B (entries of other batches and shapes stay).

Course step: the course's "choose the kernel per layer" optimisation (different kernels for the two layers).
Bottleneck: whichever kernel it picks.
"""

from __future__ import annotations

import json
from typing import Optional

import torch

from convforge import tuning
from convforge.conv import cuda_common as cc

TUNING = "cuda-auto"     # convforge/tuning/cuda-auto.json
ELIGIBLE = frozenset({  # the CUDA implementations held to the exact tolerance
    "cuda-naive", "cuda-tiled", "cuda-constmem", "cuda-unroll-gemm", "cuda-fused-gemm", "cuda-fused-layer",
    "cuda-direct", "cuda-tc-3xtf32"})
FUSING = {"cuda-fused-layer", "cuda-direct"}
DEFAULT_PLAIN, DEFAULT_FUSED = "cuda-fused-gemm", "cuda-fused-layer"
unavailable_reason = cc.unavailable_reason


def choose(M: int, C: int, H: int, W: int, K: int, pool: int = 1, batch: Optional[int] = None
           ) -> tuple[str, Optional[dict]]:
    """(implementation, launch config or None) for one layer shape; pool 1 for a plain convolution; ``batch``:
    the call's images (the entry measured at the nearest batch; None: the B = 10000 entries)."""
    entry = tuning.lookup(TUNING, batch=batch, M=M, C=C, H=H, W=W, K=K, pool=pool)
    impl = (entry or {}).get("impl")
    if impl not in ELIGIBLE or (pool > 1 and impl not in FUSING):
        # no entry, or a reduced-precision or non-fusing winner, which cannot serve this call
        return (DEFAULT_FUSED if pool > 1 else DEFAULT_PLAIN), None
    return impl, entry.get("config")


def _delegate(impl: str, config, weight, bias, hw, activation=None, pool: int = 1, out_dtype=None):
    """The chosen implementation prepared through the registry (which passes ``config`` and ``input_hw``, and
    ``out_dtype`` to a fused delegate that declares it: cuda-direct's and cuda-fused-layer's direct kernel)."""
    from convforge import conv
    entry = conv.get(impl)
    if pool > 1 or activation is not None:
        return entry.prepare_fused(weight, bias, activation, pool, input_hw=hw, config=config, out_dtype=out_dtype)
    return entry.prepare(weight, bias, input_hw=hw, config=config)


def _capturing(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def _lazy(weight, bias, input_hw, activation=None, pool: int = 1, out_dtype=None):
    weight, bias = cc.check_weight(weight, bias)
    M, C, K, _ = weight.shape
    delegates: dict = {}   # (h, w, impl, config as JSON) -> the prepared delegate
    by_shape: dict = {}    # the input's shape (images, channels, h, w) -> its delegate

    def pick(batch: Optional[int], h: int, w: int) -> tuple[str, Optional[dict]]:
        impl, config = choose(M, C, h, w, K, pool, batch)
        if pool == 1 and activation is not None:
            impl = DEFAULT_FUSED if impl not in FUSING else impl
        return impl, config

    def fn_for(batch: Optional[int], h: int, w: int, capturing: bool = False):
        """(delegate, whether it is this batch's choice)."""
        impl, config = pick(batch, h, w)
        key = (h, w, impl, json.dumps(config, sort_keys=True))
        if key not in delegates:
            same_size = [fn for (dh, dw, _, _), fn in delegates.items() if (dh, dw) == (h, w)]
            if capturing and same_size:
                return same_size[0], False   # no compiling inside a capture: this size's first delegate serves
            delegates[key] = _delegate(impl, config, weight, bias, (h, w), activation, pool, out_dtype)
        return delegates[key], True

    if input_hw is not None:
        fn_for(None, *input_hw)   # the B = 10000 choice, prepared ahead as before

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        # The delegate checks every call; here only a shape not seen yet is checked before choosing.
        fn = by_shape.get(x.shape)
        if fn is None:
            x = cc.check_input(x, weight)
            capturing = _capturing(x)
            fn, chosen = fn_for(max(1, x.shape[0]), x.shape[2], x.shape[3], capturing)
            if chosen:
                by_shape[x.shape] = fn
        return fn(x, out)

    run.choice = lambda h, w, batch=None: pick(batch, h, w)
    return run


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, input_hw=None):
    return _lazy(weight, bias, input_hw)


def prepare_fused(weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str], pool: int,
                  input_hw=None, out_dtype: Optional[torch.dtype] = None):
    """``out_dtype=torch.float16``: FP16 output where the delegate can write it (cuda-direct's kernel, also as
    cuda-fused-layer's direct design), else float32; the returned tensor's dtype says which."""
    return _lazy(weight, bias, input_hw, activation, int(pool), out_dtype)
