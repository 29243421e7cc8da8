"""Dump, as canonical JSON, every compile-time choice the kernels make on every preset conv layer.

    python3 scripts/kernel_constants_dump.py > /tmp/before.json   # on one tree
    python3 scripts/kernel_constants_dump.py | diff /tmp/before.json -   # on another: empty = identical

No GPU needed: the CUDA modules' ``kernel_specs`` (the NVRTC source, its SHA-256 with headers pasted in,
and the -D options prepare() would compile) and cuda-auto's table are host-side; the Triton modules'
``choose_config`` and ``kernel_constants`` are too (baked weights are dumped as a hash). The proof behind a
refactoring that must leave kernel behaviour unchanged: run it before and after, the outputs must match.
The layer walk here is written out on purpose (models only), so that it does not move with the code it checks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

# The tree this script sits in, not whichever convforge is installed (python puts scripts/ first on the path).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def preset_layers():
    """{(M, C, H, W, K): (activation, pool) or None} for every distinct preset conv layer."""
    from convforge.harness.verify import model_layers
    from convforge.models import PRESETS
    seen = {}
    for preset in PRESETS.values():
        for spec in model_layers(preset.architecture):
            s = spec.shape
            seen.setdefault((s.M, s.C, s.H, s.W, s.K), spec.fusion)
    return seen


def _spec(spec) -> dict:
    from convforge.conv import cuda_common as cc
    return {"source": spec.source, "sha256": hashlib.sha256(cc.load_source(spec.source).encode()).hexdigest(),
            "options": list(spec.options())}


def _plain(value):
    """JSON-able form of configs, tuples of baked weights, dataclasses."""
    if dataclasses.is_dataclass(value):
        return {"type": type(value).__name__, **{k: _plain(v) for k, v in dataclasses.asdict(value).items()}}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        if len(value) > 16 and all(isinstance(v, (int, float)) for v in value):
            return {"values": len(value), "sha256": hashlib.sha256(repr(tuple(value)).encode()).hexdigest()}
        return [_plain(v) for v in value]
    return value


def _guard(fn):
    try:
        return fn()
    except Exception as exc:  # an impossible layer/config is part of the record, not a crash
        return {"error": f"{type(exc).__name__}: {exc}"}


def cuda_record(shape, fusion) -> dict:
    from convforge.conv import (cuda_auto, cuda_constmem, cuda_direct, cuda_fused_gemm, cuda_fused_layer,
                                cuda_naive, cuda_tc, cuda_tiled, cuda_unroll_gemm)
    from convforge.conv import cuda_common as cc
    rec = {}
    for module in (cuda_naive, cuda_tiled, cuda_constmem, cuda_unroll_gemm, cuda_fused_gemm, cuda_direct):
        name = module.__name__.rsplit(".", 1)[1]
        rec[name] = _guard(lambda: [_spec(s) for s in module.kernel_specs(*shape)])
    for precision in cuda_tc.PRECISIONS:
        rec[f"cuda_tc {precision}"] = _guard(lambda: [_spec(s) for s in cuda_tc.kernel_specs(*shape,
                                                                                            precision=precision)])
    rec["cuda_auto"] = {"plain": list(cuda_auto.choose(*shape, 1))}
    if fusion is not None:
        activation, pool = fusion
        act = cc.activation_code(activation)
        rec["cuda_fused_gemm fused"] = _guard(lambda: [_spec(s) for s in cuda_fused_gemm.kernel_specs(
            *shape, pool=pool, activation=act)])
        rec["cuda_direct fused"] = _guard(lambda: [_spec(s) for s in cuda_direct.kernel_specs(
            *shape, pool=pool, activation=act)])
        rec["cuda_fused_layer"] = _guard(lambda: [_spec(s) for s in cuda_fused_layer.kernel_specs(
            *shape, pool=pool, activation=activation)])
        rec["cuda_auto"]["fused"] = list(cuda_auto.choose(*shape, pool))
    for kind, pool in (("plain", 1), ("fused", fusion[1] if fusion else None)):
        if pool is None:
            continue
        impl, config = cuda_auto.choose(*shape, pool)
        from convforge import conv
        module = conv.get(impl)._module()
        act = cc.activation_code(fusion[0]) if pool > 1 else 0
        extra = {"activation": fusion[0] if impl == "cuda-fused-layer" else act} if pool > 1 else {}
        rec[f"cuda_auto {kind} specs"] = _guard(lambda: [_spec(s) for s in module.kernel_specs(
            *shape, pool=pool, config=config, **extra)] if pool > 1 else
            [_spec(s) for s in module.kernel_specs(*shape, config=config)])
    return rec


def triton_record(shape, fusion) -> dict:
    import torch
    from convforge.conv import triton_common as common
    from convforge.conv import triton_direct, triton_fused_layer, triton_gemm
    M, C, H, W, K = shape

    def weights_for(cfg):
        if not common.bakes(cfg, C, K):
            return ()
        plan = common.plan_maps(M, cfg.positions_per_thread, cfg.max_per_pass)
        g = torch.Generator().manual_seed(0)
        return common.bake_weights(common.pack_weights(torch.randn(M, C, K, K, generator=g), plan.width))

    rec = {}
    cfg = triton_direct.choose_config(M, C, K)
    rec["triton_direct"] = {"config": _plain(cfg), "constants": {
        str(b): _plain(triton_direct.kernel_constants(M, C, K, H, W, b, cfg, weights_for(cfg))) for b in (False, True)}}
    rec["triton_direct sweep"] = [_guard(lambda: _plain(triton_direct.kernel_constants(M, C, K, H, W, False, c,
                                                                                        weights_for(c))))
                                  for c in triton_direct.SWEEP]
    if fusion is not None:
        activation, pool = fusion
        cfg = triton_fused_layer.choose_config(M, C, K, pool)
        rec["triton_fused_layer"] = {"config": _plain(cfg), "constants": {
            str(b): _plain(triton_fused_layer.kernel_constants(M, C, K, H, W, b, activation, pool, cfg,
                                                               weights_for(cfg))) for b in (False, True)}}
        rec["triton_fused_layer sweep"] = [_guard(lambda: _plain(triton_fused_layer.kernel_constants(
            M, C, K, H, W, False, activation, pool, c, weights_for(c)))) for c in triton_fused_layer.SWEEP]
    for precision in ("ieee", "tf32", "tf32x3"):
        rec[f"triton_gemm {precision}"] = _guard(lambda: {
            "constants": _plain(triton_gemm.kernel_constants(M, C, K, H, W, False, precision)),
            "configs": [{**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}
                        for c in triton_gemm._configs(precision)]})
    return rec


def main() -> int:
    import convforge
    print(f"kernel constants of {Path(convforge.__file__).parent}", file=sys.stderr)
    out = {}
    for shape, fusion in sorted(preset_layers().items()):
        label = "M=%d C=%d H=%d W=%d K=%d" % shape + (f" {fusion[0]}+pool{fusion[1]}" if fusion else "")
        out[label] = {"cuda": cuda_record(shape, fusion), "triton": triton_record(shape, fusion)}
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
