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
        paths = [run / f"{name}.json"] if (run / f"{name}.json").exists() else sorted(run.glob(f"{name}_*.json"))
        if not paths:
            continue
        rows = [r for path in paths for r in json.loads(path.read_text())]
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


def sweep_table(run: Path) -> None:
    """Before/after per sweep shape (sweep.json): main's kernel (cfg -2: k = (c, p, q), one split), the
    channel-innermost k order alone (-3), split-K alone (-6), the new default (*), the fastest config."""
    path = run / "sweep.json"
    if not path.exists():
        return
    rows = [r for r in json.loads(path.read_text())["rows"] if "ms" in r]
    by: dict = {}
    for r in rows:
        by.setdefault((tuple(r["shape"]), r["precision"]), []).append(r)
    print("### sweep: main's kernel against the changes (ms; error vs float64 on image 0's first 8 output rows)\n")
    print("| B M C H=W K | precision | main (cfg -2) | korder only (-3) | split-K only (-6) | new default | splits | "
          "x main | default error | fastest config (ms) |")
    print("|" + "---|" * 10)
    for (shape, precision), rs in by.items():
        cfg = {r["config"]: r for r in rs}
        default = next((r for r in rs if r["default"]), None)
        # main's kernel: cfg -2, or the default itself where -2 was deduplicated as identical to it
        refused = {r["config"] for r in json.loads(path.read_text())["rows"]
                   if "error" in r and tuple(r["shape"]) == shape and r["precision"] == precision}
        main_ms = cfg[-2]["ms"] if -2 in cfg else (None if -2 in refused else (default or {}).get("ms"))
        # "=": timed once as the identical default; "not run": the config was refused
        f = lambda c: "not run" if c in refused else ("=" if c not in cfg else f"{cfg[c]['ms']:.3f}")
        # the fastest exact config: flush 0 (-1) is wrong on long reductions, never a candidate
        best = min((r for r in rs if r["config"] != -1), key=lambda r: r["ms"] if r.get("ok", True) else float("inf"))
        fails = [r["config"] for r in rs if not r.get("ok", True)]
        print(f"| {' '.join(map(str, shape))} | {precision} | {'not run' if main_ms is None else f'{main_ms:.3f}'} | "
              f"{f(-3)} | {f(-6)} | "
              f"{'—' if default is None else format(default['ms'], '.3f')} | {default and default['splits'][0]} | "
              f"{(main_ms / default['ms']) if default and main_ms else float('nan'):.2f} | "
              f"{default and default.get('rel_err', float('nan')):.1e} | cfg {best['config']} ({best['ms']:.3f})"
              f"{' FAIL ' + str(fails) if fails else ''} |")
    print()


def check_table(run: Path) -> None:
    path = run / "check.json"
    if not path.exists():
        return
    rows = json.loads(path.read_text())
    print("### error vs float64 (check.json: batch 1, image 0's first 8 output rows, full reduction)\n")
    print("| set | B M C H=W K | C*K*K | 3xTF32 | TF32 |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['set']} | {' '.join(map(str, r['shape']))} | {r['kr']} | {r['tf32x3']:.2e}"
              f"{'' if r['tf32x3'] <= 1e-5 else ' FAIL'} | {r['tf32']:.2e}{'' if r['tf32'] <= 1e-2 else ' FAIL'} |")
    worst = max(rows, key=lambda r: r["tf32x3"])
    print(f"\n3xTF32 worst {worst['tf32x3']:.2e} ({worst['shape']}); within 1e-5 on "
          f"{sum(r['tf32x3'] <= 1e-5 for r in rows)} of {len(rows)}\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    sweep_table(Path(sys.argv[1]))
    check_table(Path(sys.argv[1]))
