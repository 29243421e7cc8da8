"""Time the tensor-core kernels' launch shapes (gather and rows) on every preset layer, B = 10000.

    python3 scripts/tc_sweep.py [--layers "fa20 L1,fa17 L1"] [--batch 10000] [--json out.json] [--epi]

Development tool behind cuda_tc.TUNED: prints, per layer and precision, each configuration's relative
error (vs float64 on 2 images) and median ms (CUDA events, 10 runs after warm-up), then the winner, next to
cuda-fused-gemm and cuda-direct (the exact kernels) in the same process. --epi: each rows configuration
also with the staged epilogue (epi=1).
"""
import argparse
import json
import multiprocessing

import torch

from convforge.conv import cuda_direct, cuda_fused_gemm, cuda_tc
from convforge.conv.cuda_smoke import compile_spec, preset_layers, reference, rel_error, time_ms


def layer_configs(M, C, H, W, K, epi=False):
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
    return configs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", default="")
    p.add_argument("--batch", type=int, default=10000)
    p.add_argument("--json", default="")
    p.add_argument("--jobs", type=int, default=16)
    p.add_argument("--epi", action="store_true", help="also every rows configuration with epi=1")
    a = p.parse_args()
    wanted = {s.strip() for s in a.layers.split(",") if s.strip()}
    layers = [l for l in preset_layers() if not wanted or l[0] in wanted]
    if a.jobs > 1:  # fill the kernel disk cache in parallel first
        specs = set()
        for label, shape, _ in layers:
            for cfg in layer_configs(*shape, epi=a.epi):
                for precision in cuda_tc.PRECISIONS:
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
            for cfg in layer_configs(M, C, H, W, K, epi=a.epi):
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
