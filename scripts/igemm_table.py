"""Markdown tables of a cuda-igemm device run (issue #24): bench rows (gpumode.json, wide.json) against cuDNN fp32,
with cuDNN TF32 (cudnn_tf32.json) and the 3xTF32 ceiling (cuBLAS TF32 matmul rate / 3) beside them.

    python3 scripts/igemm_table.py RUN_DIR     # prints the tables and the goal checks
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def main(run: Path) -> None:
    extra = json.loads((run / "cudnn_tf32.json").read_text()) if (run / "cudnn_tf32.json").exists() else None
    tf32_rate = extra["matmul_tf32"]["tflops"] if extra else None
    cudnn_tf32 = {(r["B"], r["M"], r["C"], r["H"], r["W"], r["K"]): r["cudnn_tf32_ms"] for r in (extra or {}).get("rows", [])}
    if extra:
        print(f"cuBLAS 8192^3: fp32 {extra['matmul_fp32']['tflops']:.1f} TFLOP/s, TF32 {tf32_rate:.1f} TFLOP/s "
              f"-> 3xTF32 ceiling {tf32_rate / 3:.1f} TFLOP/s\n")
    for name in ("gpumode", "wide"):
        path = run / f"{name}.json"
        if not path.exists():
            continue
        rows = json.loads(path.read_text())
        by_case: dict = {}
        for r in rows:
            by_case.setdefault((r["B"], r["M"], r["C"], r["H"], r["W"], r["K"]), {})[r["impl"]] = r
        print(f"### {name} ({rows[0]['gpu']}, torch {rows[0]['torch']}, cuDNN {rows[0]['cudnn']}, {rows[0]['date']})\n")
        print("| B | M | C | H=W | K | GFLOP | cuDNN fp32 ms | 3xTF32 ms | x cuDNN | TFLOP/s | % 3xTF32 ceiling "
              "| cuDNN TF32 ms | TF32 ms | TF32 x cuDNN TF32 |")
        print("|" + "---|" * 14)
        ratios, ratios_tf32 = [], []
        for key, impls in by_case.items():
            torch_ms = impls.get("torch", {}).get("median_ms")
            x3 = impls.get("cuda-igemm-3xtf32")
            t1 = impls.get("cuda-igemm-tf32")
            ct = cudnn_tf32.get(key)
            gflop = (x3 or t1 or impls["torch"])["flops"] / 1e9
            r3 = torch_ms / x3["median_ms"] if x3 and torch_ms else None
            rt = ct / t1["median_ms"] if t1 and ct else None
            if r3:
                ratios.append(r3)
            if rt:
                ratios_tf32.append(rt)
            tfl = gflop / x3["median_ms"] if x3 else None
            pct = 100 * tfl / (tf32_rate / 3) if tfl and tf32_rate else None
            f = lambda v, d=3: "—" if v is None else f"{v:.{d}f}"
            B, M, C, H, W, K = key
            print(f"| {B} | {M} | {C} | {H} | {K} | {gflop:.1f} | {f(torch_ms)} | {f(x3 and x3['median_ms'])} | "
                  f"{f(r3, 2)} | {f(tfl, 1)} | {f(pct, 0)} | {f(ct)} | {f(t1 and t1['median_ms'])} | {f(rt, 2)} |")
        if ratios:
            print(f"\n{name}: 3xTF32 / cuDNN fp32: min {min(ratios):.2f}x, median {statistics.median(ratios):.2f}x, "
                  f"max {max(ratios):.2f}x over {len(ratios)} shapes; >= 1.3x on {sum(r >= 1.3 for r in ratios)}")
        if ratios_tf32:
            print(f"{name}: TF32 / cuDNN TF32: min {min(ratios_tf32):.2f}x, median {statistics.median(ratios_tf32):.2f}x, "
                  f"max {max(ratios_tf32):.2f}x; >= 1.1x on {sum(r >= 1.1 for r in ratios_tf32)} of {len(ratios_tf32)}")
        print()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
