"""Sweep cuda-direct's launch shapes on every preset layer (plain and fused) on a GPU, against cuda-auto.

    python scripts/direct_sweep.py --jobs 16 --out sweep.json [--layers "fa17 L1,sp19 L1"] [--write-auto]
                                   [--variants "minb=2;rows=2" [--cross]] [--strips 3,6]

For each layer and pool it checks each candidate (map group, strip width, threads) against the float64
reference at B = 2, times it at --batch (median of --repeat calls after warm-up, CUDA events), and times
cuda-auto's current choice in the same process. It prints the per-layer winners as a ``TUNED`` literal for
cuda_direct.py; ``--write-auto`` also records cuda-direct in convforge/tuning/cuda_auto.json wherever it beat
cuda-auto's choice in this run (the old entry stays otherwise).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

import torch

from convforge.conv import cuda_auto, cuda_common as cc, cuda_direct
from convforge.conv.cuda_smoke import (compile_spec, floor_ms, parse_variants, preset_layers, reference, rel_error,
                                       time_ms)


def cases(layers, small_c_only: bool):
    for label, shape, fusion in layers:
        M, C, H, W, K = shape
        if small_c_only and C > 1:
            continue
        for fz in [None] + ([fusion] if fusion else []):
            yield label, shape, fz


def candidates(shape, pool, limit_multichannel: bool, variants=None, cross: bool = False, strips=None):
    if variants is not None and not cross:   # the tuned (or modelled) shape, then with each variant's fields changed
        base = cuda_direct.plan(*shape, pool=pool)
        found = [base] + [replace(base, **v) for v in variants]
    else:
        found = cuda_direct.candidate_configs(*shape, pool=pool)
        if shape[1] > 1 and limit_multichannel:   # multi-channel layers: fewer shapes (long compiles, rarely wins)
            found = [c for c in found if c.nt == 256 and cc.cdiv(shape[0], c.mg) <= 4]
    if strips:   # only these stored-column strip widths
        found = [c for c in found if c.r // pool in strips]
    if cross:   # every candidate, then every candidate with each variant's fields changed
        found = list(dict.fromkeys(found + [replace(c, **v) for v in variants or [] for c in found]))
        M, C, H, W, K = shape   # a forced unroll past twice the code-size limit only makes long compiles
        found = [c for c in found if c.uc != 1 or C * K * K * pool * c.rows * c.r * min(c.mg, M)
                 <= 2 * cuda_direct.UNROLLED_FFMA_LIMIT]
    return [c for c in found if _valid(shape, pool, c)]


def _valid(shape, pool, cfg) -> bool:
    """A variant may not fit a layer (rows that do not divide its height, too many accumulators)."""
    try:
        cuda_direct.plan(*shape, pool=pool, config=cfg)   # caps mg to the largest piece, then checks
        return True
    except ValueError:
        return False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", default="")
    p.add_argument("--batch", type=int, default=10000)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--jobs", type=int, default=0)
    p.add_argument("--c1-only", action="store_true", help="only the one-channel layers")
    p.add_argument("--variants", default=None, metavar="K=V[,K=V];...",
                   help="instead of the candidate list: the tuned shape and the tuned shape with these fields changed")
    p.add_argument("--cross", action="store_true",
                   help="with --variants: every candidate shape, plain and with each variant (not only the tuned one)")
    p.add_argument("--strips", default="", metavar="N[,N]", help="only candidates of these stored-column strip widths")
    p.add_argument("--out", default="")
    p.add_argument("--write-auto", action="store_true")
    p.add_argument("--copy-gbps", type=float, default=4180.0)
    p.add_argument("--matmul-gflops", type=float, default=50900.0)
    args = p.parse_args(argv)
    torch.backends.cudnn.allow_tf32 = False
    wanted = {s.strip() for s in args.layers.split(",") if s.strip()}
    layers = [l for l in preset_layers() if not wanted or l[0] in wanted]
    todo = list(cases(layers, args.c1_only))
    variants = parse_variants(args.variants) if args.variants is not None else None
    strips = {int(n) for n in args.strips.split(",") if n.strip()}

    if args.jobs > 1:   # fill CuPy's disk cache in parallel: every candidate's kernel as instance 0
        import multiprocessing
        specs = set()
        for label, shape, fz in todo:
            pool = fz[1] if fz else 1
            act = cc.activation_code(fz[0]) if fz else 0
            M, C, H, W, K = shape
            for cfg in candidates(shape, pool, True, variants, args.cross, strips):
                specs.update(cuda_direct.kernel_specs(M, C, H, W, K, pool, act, cfg))
        with multiprocessing.get_context("spawn").Pool(args.jobs) as workers:
            errors = [e for e in workers.map(compile_spec, sorted(specs, key=str)) if e]
        print(f"precompiled {len(specs)} kernels, {len(errors)} failed", flush=True)
        for e in errors[:5]:
            print("  ", e[:400], flush=True)

    g = torch.Generator().manual_seed(0)
    rows, best = [], {}
    for label, shape, fz in todo:
        M, C, H, W, K = shape
        pool = fz[1] if fz else 1
        w = (torch.randn(M, C, K, K, generator=g) * (2.0 / (100.0 * (C * K * K) ** 0.5))).cuda()
        b = torch.randn(M, generator=g).cuda() * 0.1
        x2 = (torch.rand(2, C, H, W, generator=g) * 255 - 64).cuda()
        xb = (torch.rand(args.batch, C, H, W, generator=g) * 255 - 64).cuda()
        ref = reference(x2, w, b, *(fz or (None, None)))
        fl = floor_ms(shape, args.batch, pool if fz else None, args.copy_gbps, args.matmul_gflops)
        auto = cuda_auto.prepare_fused(w, b, *fz) if fz else cuda_auto.prepare(w, b)
        auto_choice = auto.choice(H, W)
        auto_ms = time_ms(auto, xb, repeat=args.repeat)
        print(f"{label} pool {pool}: cuda-auto ({auto_choice[0]}) {auto_ms:.3f} ms  {100 * fl / auto_ms:.1f} %", flush=True)
        del auto
        for cfg in candidates(shape, pool, True, variants, args.cross, strips):
            try:
                fn = (cuda_direct.prepare_fused(w, b, fz[0], pool, config=cfg) if fz
                      else cuda_direct.prepare(w, b, config=cfg))
                err = rel_error(fn(x2), ref)
                ms = time_ms(fn, xb, repeat=args.repeat) if err <= 1e-5 else float("nan")
            except Exception as exc:
                print(f"FAIL {label} pool {pool} {cfg}: {type(exc).__name__}: {exc}", flush=True)
                continue
            finally:
                fn = None
                gc.collect()          # release the module instance, so the next candidate reuses id 0
            rows.append({"layer": label, "shape": shape, "pool": pool, "config": asdict(cfg), "err": err,
                         "ms": ms, "floor_ms": fl, "auto_impl": auto_choice[0], "auto_ms": auto_ms})
            print(f"  {cfg}  err {err:.1e}  {ms:8.3f} ms  {100 * fl / ms:5.1f} % of floor", flush=True)
            key = (shape, pool)
            if ms == ms and (key not in best or ms < best[key]["ms"]):
                best[key] = rows[-1]

    print("\nTUNED = {")
    for (shape, pool), row in sorted(best.items()):
        print(f"    {(*shape, pool)}: {row['config']},  # {row['layer']}: {row['ms']:.3f} ms, "
              f"{100 * row['floor_ms'] / row['ms']:.0f} % of floor; cuda-auto ({row['auto_impl']}) {row['auto_ms']:.3f}")
    print("}")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "batch": args.batch,
                                              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                              "rows": rows}, indent=1) + "\n")
    if args.write_auto:
        path = cuda_auto.TUNING_FILE
        doc = json.loads(path.read_text(encoding="utf-8"))
        entries = {(e["M"], e["C"], e["H"], e["W"], e["K"], e.get("pool", 1)): e for e in doc["entries"]}
        for (shape, pool), row in best.items():
            if row["ms"] < row["auto_ms"]:
                entries[(*shape, pool)] = {"M": shape[0], "C": shape[1], "H": shape[2], "W": shape[3], "K": shape[4],
                                           "pool": pool, "impl": "cuda-direct", "config": row["config"],
                                           "median_ms": round(row["ms"], 4), "batch": args.batch,
                                           "device": torch.cuda.get_device_name(),
                                           "beat": f"{row['auto_impl']} {row['auto_ms']:.4f} ms in the same run"}
        doc["entries"] = [entries[k] for k in sorted(entries)]
        doc["source"] += f"; cuda-direct entries: scripts/direct_sweep.py on {torch.cuda.get_device_name()} " \
                         f"({datetime.now(timezone.utc):%Y-%m-%d})"
        path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        print(f"updated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
