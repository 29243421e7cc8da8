"""Tables of this folder's bench runs: triton-igemm-tf32 against cuDNN TF32 (torch-tf32) per shape, and
triton-igemm-3xtf32 against cuDNN fp32 with its % of the 3xTF32 ceiling (gpumode.json), and the probe's tiles.

usage: python3 tables.py FOLDER > tables.md
"""
import json
import pathlib
import statistics
import sys

folder = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
for name in ("gpumode", "wide"):
    rows = json.loads((folder / f"{name}.json").read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    by: dict = {}
    for r in rows:
        by.setdefault(r["layer"], {})[r["impl"]] = r
    print(f"\n#### {name}\n")
    print("| layer | cuDNN fp32 ms | cuDNN TF32 ms | triton-igemm-tf32 ms | x cuDNN TF32 | triton-igemm-3xtf32 ms | "
          "x cuDNN fp32 | % of 3xTF32 ceiling |")
    print("|---|---|---|---|---|---|---|---|")
    xs = []
    for layer, v in by.items():
        x = v["torch-tf32"]["median_ms"] / v["triton-igemm-tf32"]["median_ms"]
        xs.append(x)
        three = v.get("triton-igemm-3xtf32")
        print(f"| {layer} | {v['torch']['median_ms']:.4g} | {v['torch-tf32']['median_ms']:.4g} | "
              f"{v['triton-igemm-tf32']['median_ms']:.4g} | **{x:.2f}** | "
              + (f"{three['median_ms']:.4g} | {v['torch']['median_ms'] / three['median_ms']:.2f} | "
                 f"{three['roofline_pct']:.0f} % |" if three else "- | - | - |"))
    print(f"\n{name}: triton-igemm-tf32 x cuDNN TF32 median {statistics.median(xs):.2f}, "
          f"{sum(x >= 1.1 for x in xs)} of {len(xs)} >= 1.1x")
probe = json.loads((folder / "probe_3xtf32.json").read_text())
print(f"\n#### probe_3xtf32 (TF32 matmul {probe['tf32_matmul_tflops']:.1f} TFLOP/s, 3xTF32 ceiling a third)\n")
print("| layer (B, M, C, H, W, K) | tile (R, TW, BM, BK, warps, stages) | chosen | ms | % of 3xTF32 ceiling | "
      "error vs float64 |")
print("|---|---|---|---|---|---|")
for r in probe["rows"]:
    if "error" in r:
        print(f"| {tuple(r['shape'])} | {tuple(r['tile'])} | | {r['error'][:60]} | | |")
    else:
        print(f"| {tuple(r['shape'])} | {tuple(r['tile'])} | {'yes' if r['chosen'] else ''} | {r['ms']:.3f} | "
              f"{r['pct_of_3xtf32_ceiling']:.1f} % | {r['rel_err']:.1e} |")
