"""Time the tensor-core kernels' launch shapes (gather, rows and pairs) on every preset layer, B = 10000.

    python3 scripts/tc_sweep.py [--layers "fa20 L1,fa17 L1"] [--batch 10000] [--json out.json] [--epi] [--configs JSON | --variants K=V,...;...]

Development tool behind cuda_tc.TUNED: prints, per layer and precision, each configuration's relative
error (vs float64 on 2 images) and median ms (CUDA events, 10 runs after warm-up), then the winner, next to
cuda-fused-gemm and cuda-direct (the exact kernels) in the same process. --epi: each rows configuration
also with the staged epilogue (epi=1). --configs '[{...}, ...]': time exactly these configurations instead; --variants "cs=1;rm=4,nt=256": each
layer's tuned configuration (cuda_tc.TUNED, else the default kernel) and it with those fields changed.
"""
import argparse
import json
import multiprocessing

import torch

from convforge.conv import cuda_direct, cuda_fused_gemm, cuda_tc
from convforge.conv.cuda_smoke import compile_spec, parse_variants, preset_layers, reference, rel_error, time_ms


def layer_configs(M, C, H, W, K, epi=False, only=None, variants=None, precision=None):
    if only is not None:   # --configs: exactly these
        return [dict(c) for c in only]
    if variants is not None:   # --variants: the tuned (or default) configuration, then with each variant's fields
        base = dict(cuda_tc.TUNED.get((M, C, H, W, K, precision)) or {"kernel": cuda_tc.default_kernel(C, K, M)})
        return [base] + [dict(base, **v) for v in variants]
    configs = [{"kernel": "gather"}]
    if K <= 9:
        configs += [{"kernel": "rows", "nc": nc, "nt": nt} for nc in (1, 2, 4) for nt in (64, 128, 256)]
        configs += [{"kernel": "rows", "nc": nc, "nt": 128, "pipe": 2} for nc in (1, 2, 4)]
        configs += [{"kernel": "rows", "nc": nc, "nt": 128, "ib": 1} for nc in (2, 4)]
        default_mt = cuda_tc._rows_maps_per_tile(M, 2)
        configs += [{"kernel": "rows", "nc": 2, "mt": mt}
                    for mt in sorted({cuda_tc._rows_maps_per_tile(M, 4), cuda_tc._rows_maps_per_tile(M, 1)})
                    if mt != default_mt and mt * 8 <= cuda_tc.ROWS_MAX_ACC]
        if epi:
            configs += [dict(c, epi=1) for c in configs if c["kernel"] == "rows"]
    for pairs in ({}, {"rt": 1}, {"rt": 4}, {"ib": 2}, {"nt": 64}, {"nt": 256}):
        try:   # K <= 7 and the register estimate
            cuda_tc.plan_pairs(M, C, H, W, K, precision or "tf32", pairs)
        except ValueError:
            continue
        configs.append(dict(pairs, kernel="pairs"))
    return configs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", default="")
    p.add_argument("--batch", type=int, default=10000)
    p.add_argument("--json", default="")
    p.add_argument("--jobs", type=int, default=16)
    p.add_argument("--epi", action="store_true", help="also every rows configuration with epi=1")
    p.add_argument("--configs", default="", help="a JSON list of configurations to time instead of the default list")
    p.add_argument("--variants", default=None, metavar="K=V[,K=V];...",
                   help="instead: each layer's tuned configuration, and it with these fields changed")
    a = p.parse_args()
    only = json.loads(a.configs) if a.configs else None
    variants = parse_variants(a.variants) if a.variants is not None else None
    wanted = {s.strip() for s in a.layers.split(",") if s.strip()}
    layers = [l for l in preset_layers() if not wanted or l[0] in wanted]
    if a.jobs > 1:  # fill the kernel disk cache in parallel first
        specs = set()
        for label, shape, _ in layers:
            for precision in cuda_tc.PRECISIONS:
                for cfg in layer_configs(*shape, epi=a.epi, only=only, variants=variants, precision=precision):
                    try:
                        specs.add(cuda_tc.plan_any(*shape, precision, cfg).spec())
                    except ValueError:
                        pass
        with multiprocessing.get_context("spawn").Pool(a.jobs) as pool:
            errs = [e for e in pool.map(compile_spec, sorted(specs, key=str)) if e]
        print(f"precompiled {len(specs)} kernels, {len(errs)} failed", errs[:2], flush=True)
    g = torch.Generator().manual_seed(0)
    results = []
    for label, (M, C, H, W, K), _ in layers:
        w = (torch.randn(M, C, K, K, generator=g) * 0.05).cuda()
        b = torch.randn(M, generator=g).cuda()
        x2 = (torch.rand(2, C, H, W, generator=g) * 255).cuda()
        xb = (torch.rand(a.batch, C, H, W, generator=g) * 255).cuda()
        ref = reference(x2, w, b)
        exact_ms = time_ms(cuda_fused_gemm.prepare(w, b), xb)
        direct_ms = time_ms(cuda_direct.prepare(w, b), xb)
        print(f"{label}: cuda-fused-gemm {exact_ms:.3f} ms, cuda-direct {direct_ms:.3f} ms", flush=True)
        for precision in cuda_tc.PRECISIONS:
            best = None
            for cfg in layer_configs(M, C, H, W, K, epi=a.epi, only=only, variants=variants, precision=precision):
                try:
                    fn = cuda_tc.prepare(w, b, precision=precision, config=cfg)
                    err = rel_error(fn(x2), ref)
                    ms = time_ms(fn, xb) if err <= 1e-2 else float("nan")
                except Exception as exc:  # a shape that does not fit: report, go on
                    print(f"  {precision} {cfg}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                    continue
                print(f"  {precision} {cfg}: err {err:.1e} {ms:.3f} ms", flush=True)
                results.append({"layer": label, "precision": precision, "config": cfg, "err": err, "ms": ms,
                                "exact_ms": exact_ms, "direct_ms": direct_ms})
                if ms == ms and (best is None or ms < best[1]):
                    best = (cfg, ms)
            if best:
                print(f"BEST {label} {precision}: {best[0]} {best[1]:.3f} ms = "
                      f"{exact_ms / best[1]:.2f}x cuda-fused-gemm, {direct_ms / best[1]:.2f}x cuda-direct", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "batch": a.batch, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
