"""Markdown tables for a run folder's README/NOTES under benchmarks/ from a `convforge bench --out FILE.json` file.

    python3 scripts/results_tables.py benchmarks/2026-11-21-h200-all-impls-course-path/bench_b10000.json [more.json ...]
    python3 scripts/results_tables.py --impls cuda-direct,cuda-auto FILE.json [more.json ...]

Prints (1) each layer's best exact kernel, best Triton kernel and best reduced-precision kernel against
cuDNN and the roofline floor, and (2) the course's optimisation path, kernel by kernel, on every layer.
With --impls: one row per layer (conv and fused), each named implementation's ms (% of floor, x cuDNN);
--clocks adds the median SM clock sampled during that row (and NVML's clock-event reasons when any).
Several files are read as one run's rows (each row keeps the ceilings and cuDNN time of its own run);
``FILE:impl,impl`` takes only those implementations' rows from a file (e.g. the tensor-core rows of another run).
"""

import argparse
import json
from pathlib import Path
from collections import defaultdict

PATH = ("cuda-naive", "cuda-tiled", "cuda-constmem", "cuda-unroll-gemm", "cuda-fused-gemm", "cuda-fused-layer",
        "cuda-tc-tf32", "cuda-tc-fp16", "triton-direct", "triton-gemm", "triton-gemm-tf32", "triton-fused-layer")


def clock_note(row) -> str:
    """", 1980 MHz" (or ", 1755 MHz sw_power_cap") from a row's sampled clock; "" for rows without one."""
    if row.get("sm_clock_mhz_median") is None:
        return ""
    reasons = row.get("clock_event_reasons") or ""
    return f", {row['sm_clock_mhz_median']:.0f} MHz" + (f" {reasons}" if reasons else "")


def per_impl_table(by_case, impls, clocks=False) -> None:
    print("| layer | floor ms | cuDNN / PyTorch ms (% floor) | " + " | ".join(impls) + " |")
    print("|---|---|---|" + "---|" * len(impls))
    for (kind, layer), case in by_case.items():
        base = next(r for r in case if r["impl"] == "torch")
        cells = []
        for impl in impls:
            match = [r for r in case if r["impl"] == impl]
            cells.append(f"{match[0]['median_ms']:.3f} ({match[0]['roofline_pct']:.0f} %, {match[0]['speedup']:.2f}x"
                         f"{clock_note(match[0]) if clocks else ''})" if match else "—")
        label = layer + (" fused conv+act+pool" if kind == "fused" else "")
        print(f"| {label} | {base['floor_ms']:.3f} | {base['median_ms']:.3f} ({base['roofline_pct']:.0f} %"
              f"{clock_note(base) if clocks else ''}) | "
              + " | ".join(cells) + " |")


def main(paths, impls=None, clocks=False) -> None:
    rows = []
    for spec in paths:   # FILE, or FILE:impl,impl to take only those implementations' rows from it
        path, keep = spec, None
        if not Path(spec).exists() and ":" in spec:
            path, _, only = spec.rpartition(":")
            keep = set(only.split(","))
        rows += [row for row in json.load(open(path)) if keep is None or row["impl"] in keep]
    by_case = defaultdict(list)
    for row in rows:
        by_case[(row["kind"], row["layer"])].append(row)
    if impls:
        per_impl_table(by_case, impls, clocks)
        return
    first = rows[0]
    print(f"Machine: {first['gpu']}, torch {first['torch']}, CUDA {first['cuda']}, cuDNN {first['cudnn']}, "
          f"triton {first['triton']}, cupy {first['cupy']}; {first['date']}. Ceilings measured in the same run: "
          f"copy {first['copy_gbps'] / 1e3:.2f} TB/s, fp32 matmul (TF32 off) {first['matmul_gflops'] / 1e3:.1f} TFLOP/s.\n")
    print("| layer | B M C H W K | floor ms | cuDNN ms (% floor) | best exact (ms, % floor, x cuDNN) "
          "| best Triton exact | best reduced precision |")
    print("|---|---|---|---|---|---|---|")
    for (kind, layer), case in by_case.items():
        base = next(r for r in case if r["impl"] == "torch")
        exact = [r for r in case if r["precision"] == "fp32" and r["impl"] != "torch"]
        triton = [r for r in exact if r["impl"].startswith("triton")]
        reduced = [r for r in case if r["precision"] in ("tf32", "fp16", "bf16")]
        cell = lambda r: (f"{r['impl']} {r['median_ms']:.3f} ({r['roofline_pct']:.0f} %, "
                          f"{r['speedup']:.2f}x)") if r else "—"
        best = lambda rs: min(rs, key=lambda r: r["median_ms"]) if rs else None
        label = layer + (" fused conv+act+pool" if kind == "fused" else "")
        shape = f"{base['B']} {base['M']} {base['C']} {base['H']} {base['W']} {base['K']}"
        print(f"| {label} | {shape} | {base['floor_ms']:.3f} | {base['median_ms']:.3f} ({base['roofline_pct']:.0f} %) "
              f"| {cell(best(exact))} | {cell(best(triton))} | {cell(best(reduced))} |")
    layers = [key for key in by_case if key[0] == "conv"]
    print("\nOp time in ms at B = 10000, each conv layer alone (no fusion), in the order of the course's path.\n")
    print("| implementation | " + " | ".join(layer for _, layer in layers) + " |")
    print("|---|" + "---|" * len(layers))
    for impl in ("torch",) + PATH:
        cells = []
        for key in layers:
            match = [r for r in by_case[key] if r["impl"] == impl]
            cells.append(f"{match[0]['median_ms']:.3f}" if match else "—")
        print(f"| {impl if impl != 'torch' else 'torch (cuDNN)'} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--impls", default="", help="comma-separated implementations for a per-implementation table")
    parser.add_argument("--clocks", action="store_true", help="with --impls: the median SM clock of each row")
    args = parser.parse_args()
    main(args.files, [i for i in args.impls.split(",") if i], args.clocks)
