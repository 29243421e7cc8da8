"""One-call GPU check of the CUDA C implementations: correctness, then timing against the roofline floor.

    python -m convforge.conv.cuda_smoke                       # check every CUDA impl on every preset layer
    python -m convforge.conv.cuda_smoke --time --batch 10000  # + median ms and % of the floor per layer
    python -m convforge.conv.cuda_smoke --sweep 16 --write-auto convforge/tuning/cuda_auto.json

Not an implementation. ``--sweep N`` times the N best-modelled launch shapes of cuda-fused-gemm (plain) and
cuda-fused-layer (fused) per layer; ``--write-auto`` records each layer's fastest exact kernel and launch
shape for cuda-auto. The floor uses the anchors' H200 ceilings (4.22 TB/s, 51.2 TFLOP/s) unless
``--copy-gbps`` / ``--matmul-gflops`` give this machine's. The last lines printed are a short table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime, timezone
from typing import Optional

import torch
import torch.nn.functional as F

CUDA_IMPLS = ("cuda-naive", "cuda-tiled", "cuda-constmem", "cuda-unroll-gemm", "cuda-fused-gemm", "cuda-tc-tf32",
              "cuda-tc-fp16", "cuda-fused-layer", "cuda-direct", "cuda-auto")
ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu, "sigmoid": torch.sigmoid, None: lambda v: v}


def preset_layers():
    from convforge.models import PRESETS, fusion_after
    layers, seen = [], set()
    for preset in PRESETS.values():
        arch = preset.architecture
        if arch.name in seen:
            continue
        seen.add(arch.name)
        walk = list(arch.walk())
        n = 0
        for i, (layer, _, shape_in, _) in enumerate(walk):
            if type(layer).__name__ == "Conv":
                n += 1
                fusion = fusion_after(walk, i)
                layers.append((f"{arch.name} L{n}", (layer.out_channels, *shape_in, layer.kernel),
                               fusion[:2] if fusion else None))
    return layers


def reference(x, w, b, activation=None, pool=None):
    y = F.conv2d(x.double(), w.double(), None if b is None else b.double())
    y = ACTIVATIONS[activation](y)
    return F.max_pool2d(y, pool) if pool else y


def rel_error(got, ref) -> float:
    if not torch.isfinite(got).all():
        return float("inf")
    return float(((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item())


def time_ms(fn, x, warmup: int = 2, repeat: int = 10, timing: str = "gpu") -> float:
    """Median ms of ``repeat`` calls after ``warmup``, timed as ``convforge bench --timing`` (default ``gpu``:
    a spin kernel ahead of each start event, so the host's launch work is not counted; sweeps recorded
    before session 7 of 2026-11-21 were ``call``-timed, 15-50 us more per call)."""
    from convforge.harness.bench import time_calls
    return 1e3 * statistics.median(time_calls(fn, [x], "cuda", warmup=warmup, repeat=repeat, timing=timing).tolist())


def floor_ms(shape, batch, pool, copy_gbps, matmul_gflops) -> float:
    from convforge.models import ConvShape
    M, C, H, W, K = shape
    s = ConvShape(batch, M, C, H, W, K)
    ho, wo = s.out_hw
    out = batch * M * (ho // pool) * (wo // pool) if pool else None
    return 1e3 * max(s.bytes_moved(out) / (copy_gbps * 1e9), s.flops / (matmul_gflops * 1e9))


def parse_variants(text: str) -> list[dict]:
    """'pipe=0;minb=2,pu=1' -> [{'pipe': 0}, {'minb': 2, 'pu': 1}]"""
    out = []
    for part in text.split(";"):
        if part.strip():
            out.append({k.strip(): int(v) for k, v in (kv.split("=") for kv in part.split(","))})
    return out


def sweep_geoms(shape, pool, n, variants):
    """The n best-modelled launch shapes of one layer, then the default with each variant's fields changed."""
    from dataclasses import replace
    from convforge.conv import cuda_fused_gemm
    geoms = cuda_fused_gemm.candidate_configs(*shape, pool=pool)[:n]
    if geoms and variants:
        base = cuda_fused_gemm.plan(*shape, pool=pool).cfg
        for v in variants:
            try:
                geoms.append(cuda_fused_gemm.plan(*shape, pool=pool, config=replace(base, **v)))
            except ValueError as exc:
                print(f"skip variant {v} for {shape} pool {pool}: {exc}", flush=True)
    seen, out = set(), []
    for g in geoms:
        key = (g.cfg, g.xsmem, g.wsmem)
        if key not in seen:
            seen.add(key)
            out.append(g)
    return out


def compile_spec(spec) -> str:
    """Compile one kernel spec into CuPy's disk cache (for process pools); '' or the error."""
    from convforge.conv import cuda_common as cc
    from convforge.conv.cuda_emulate import kernel_names
    try:
        module = cc.module(spec)
        for name in kernel_names(cc.load_source(spec.source)):
            module.get_function(name)                  # NVRTC, then CuPy's disk cache
        return ""
    except Exception as exc:  # reported again (with its layer) when the sweep reaches it
        return f"{spec.options()}: {exc}"


def precompile(layers, n, variants, jobs) -> None:
    """Fill CuPy's kernel disk cache for every kernel the sweep will run, in parallel processes."""
    import multiprocessing
    import time
    from convforge.conv import cuda_common as cc
    specs = set()
    for label, shape, fusion in layers:
        for fz in [None] + ([fusion] if fusion else []):
            pool = fz[1] if fz else 1
            act = cc.activation_code(fz[0]) if fz else 0
            for geom in sweep_geoms(shape, pool, n, variants):
                specs.add(geom.spec(act))
    t0 = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(jobs) as workers:
        errors = [e for e in workers.map(compile_spec, sorted(specs, key=str)) if e]
    print(f"precompiled {len(specs)} kernels in {time.perf_counter() - t0:.1f} s, {len(errors)} failed", flush=True)
    for e in errors[:5]:
        print("  ", e[:400], flush=True)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impls", default=",".join(CUDA_IMPLS))
    p.add_argument("--layers", default="", help="comma-separated labels such as 'fa18 L2' (default: all)")
    p.add_argument("--time", action="store_true")
    p.add_argument("--batch", type=int, default=10000)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--sweep", type=int, default=0, metavar="N")
    p.add_argument("--variants", default="", metavar="K=V[,K=V];...",
                   help="with --sweep: also time the default launch shape with these fields changed")
    p.add_argument("--jobs", type=int, default=0, help="with --sweep: compile every kernel first in N processes")
    p.add_argument("--write-auto", default="")
    p.add_argument("--copy-gbps", type=float, default=4220.0)
    p.add_argument("--matmul-gflops", type=float, default=51200.0)
    args = p.parse_args(argv)

    from convforge import conv
    from convforge.conv import cuda_fused_gemm, cuda_fused_layer
    torch.backends.cudnn.allow_tf32 = False
    impls = [conv.get(n) for n in args.impls.split(",") if n]
    wanted = {s.strip() for s in args.layers.split(",") if s.strip()}
    layers = [l for l in preset_layers() if not wanted or l[0] in wanted]
    variants = parse_variants(args.variants)
    if args.sweep and args.jobs > 1:
        precompile(layers, args.sweep, variants, args.jobs)
    rows, failures, best = [], 0, {}
    g = torch.Generator().manual_seed(0)
    for label, shape, fusion in layers:
        M, C, H, W, K = shape
        w = (torch.randn(M, C, K, K, generator=g) * (2.0 / (100.0 * (C * K * K) ** 0.5))).cuda()
        b = None
        x2 = (torch.rand(2, C, H, W, generator=g) * 255 - 64).cuda()
        xb = (torch.rand(args.batch, C, H, W, generator=g) * 255 - 64).cuda() if (args.time or args.sweep) else None
        calls = [(impl, None) for impl in impls] + [(impl, fusion) for impl in impls if impl.fuses and fusion]
        for impl, fz in calls:
            what = f"{label:8s} {impl.name}{' fused ' + str(fz) if fz else ''}"
            try:
                fn = impl.prepare_fused(w, b, *fz) if fz else impl.prepare(w, b)
                ref = reference(x2, w, b, *(fz or (None, None)))
                out = torch.full(tuple(ref.shape), float("nan"), device="cuda")
                err = rel_error(fn(x2, out=out), ref)
            except Exception as exc:  # report and go on: one broken kernel must not hide the others
                print(f"FAIL {what}: {type(exc).__name__}: {exc}", flush=True)
                failures += 1
                continue
            ok = err <= impl.tolerance
            failures += not ok
            ms = time_ms(fn, xb, repeat=args.repeat) if args.time and ok else float("nan")
            fl = floor_ms(shape, args.batch, fz[1] if fz else None, args.copy_gbps, args.matmul_gflops)
            rows.append((label, impl.name + ("+fused" if fz else ""), err, ok, ms, fl))
            print(f"{'ok  ' if ok else 'BAD '} {what}: err {err:.2e}" +
                  (f"  {ms:8.3f} ms  floor {fl:.3f} ms  {100 * fl / ms:5.1f} %" if ms == ms else ""), flush=True)
            if ok and ms == ms and impl.exact and impl.name != "cuda-auto":
                key = (shape, fz[1] if fz else 1)
                if key not in best or ms < best[key][1]:
                    best[key] = (impl.name, ms, None)
        if args.sweep:
            for fz in [None] + ([fusion] if fusion else []):
                pool = fz[1] if fz else 1
                for geom in sweep_geoms(shape, pool, args.sweep, variants):
                    try:
                        fn = (cuda_fused_layer.prepare_fused(w, b, fz[0], pool, config=geom.cfg) if fz
                              else cuda_fused_gemm.prepare(w, b, config=geom.cfg))
                        err = rel_error(fn(x2), reference(x2, w, b, *(fz or (None, None))))
                        ms = time_ms(fn, xb, repeat=args.repeat) if err <= 1e-5 else float("nan")
                    except Exception as exc:
                        print(f"FAIL sweep {label} {geom.cfg}: {exc}", flush=True)
                        failures += 1
                        continue
                    fl = floor_ms(shape, args.batch, fz[1] if fz else None, args.copy_gbps, args.matmul_gflops)
                    print(f"sweep {label:8s} pool {pool} {cuda_fused_gemm.describe(geom)}  err {err:.1e}  "
                          f"{ms:8.3f} ms  {100 * fl / ms:5.1f} % of floor", flush=True)
                    key = (shape, pool)
                    if ms == ms and (key not in best or ms < best[key][1]):
                        name = "cuda-fused-layer" if fz else "cuda-fused-gemm"
                        cfg = {k: v for k, v in cuda_fused_gemm.describe(geom).items()
                               if k in ("tm", "ht", "wt", "nt", "bh", "minb", "pu", "pipe")}
                        best[key] = (name, ms, cfg)
    if args.write_auto and best:
        entries = [{"M": s[0], "C": s[1], "H": s[2], "W": s[3], "K": s[4], "pool": pool, "impl": name,
                    "config": cfg, "median_ms": round(ms, 4), "batch": args.batch}
                   for (s, pool), (name, ms, cfg) in sorted(best.items())]
        doc = {"source": f"convforge.conv.cuda_smoke --time --sweep {args.sweep} --batch {args.batch} on "
                         f"{torch.cuda.get_device_name()} ({datetime.now(timezone.utc):%Y-%m-%d})",
               "device": torch.cuda.get_device_name(), "entries": entries}
        with open(args.write_auto, "w", encoding="utf-8") as handle:
            json.dump(doc, handle, indent=1)
            handle.write("\n")
        print(f"wrote {len(entries)} entries to {args.write_auto}")
    print("\nlayer     implementation          rel err   ok   median ms   % floor")
    for label, name, err, ok, ms, fl in rows:
        pct = 100 * fl / ms if ms == ms else float("nan")
        print(f"{label:9s} {name:22s} {err:8.1e}  {'yes' if ok else 'NO '}  {ms:9.3f}  {pct:7.1f}")
    print(f"{len(rows) - sum(not r[3] for r in rows)} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
