"""Tables of README.md from call2-final-bench: `python3 tables.py > tables.md` (from this folder).

x conv: torch-bf16's time / triton-igemm-bf16's, both from `convforge bench` (bench.json, one process).
x pure, x NHWC: cuDNN on bf16 tensors (NCHW, and channels-last) / triton-igemm-bf16, both from probe.py final
(final.json, one process). GFLOP/s of triton-igemm-bf16 from bench.json.
"""
import json, statistics
from collections import defaultdict
from pathlib import Path

here = Path(__file__).resolve().parent / "call2-final-bench"
final = defaultdict(dict)
for r in json.load(open(here / "final.json")):
    final[(r["set"], tuple(r["shape"]))][r["entry"]] = r
bench = defaultdict(dict)
for r in json.load(open(here / "bench.json")):
    bench[(r["B"], r["M"], r["C"], r["H"], r["W"], r["K"])][r["impl"]] = r

for name in ("gpumode", "wide"):
    print(f"#### {name} (H100; ms, and x = the yardstick's time / triton-igemm-bf16's)\n")
    print("| B | M | C | H | W | K | cuDNN fp32 | torch-bf16 | triton-igemm-bf16 | GFLOP/s | x conv | cuDNN bf16 pure "
          "| x pure | cuDNN bf16 NHWC | x NHWC | tile (R, TW, BM, BK, warps, stages) |")
    print("|" + "---|" * 16)
    xc, xp, xn, xf = [], [], [], []
    for (s_name, s), d in final.items():
        if s_name != name:
            continue
        b = bench[s]
        tri, conv = b["triton-igemm-bf16"]["median_ms"], b["torch-bf16"]["median_ms"]
        ftri, pure, nhwc = d["triton-igemm-bf16"]["ms"], d["cudnn-bf16-pure"]["ms"], d["cudnn-bf16-nhwc"]["ms"]
        xc.append(conv / tri), xp.append(pure / ftri), xn.append(nhwc / ftri)
        xf.append(d["torch-bf16"]["ms"] / ftri)
        print("| " + " | ".join(map(str, s)) + f" | {b['torch']['median_ms']:.4g} | {conv:.4g} | {tri:.4g} | "
              f"{b['triton-igemm-bf16']['gflops']:.0f} | **{conv / tri:.2f}** | {pure:.4g} | **{pure / ftri:.2f}** | "
              f"{nhwc:.4g} | {nhwc / ftri:.2f} | {tuple(d['triton-igemm-bf16']['tile'])} |")
    n = len(xc)
    print(f"\nMedians over {n} shapes: x conv {statistics.median(xc):.2f} ({sum(v >= 1.1 for v in xc)} of {n} >= 1.1x); "
          f"x pure {statistics.median(xp):.2f} ({sum(v >= 1.1 for v in xp)} of {n} >= 1.1x); x NHWC "
          f"{statistics.median(xn):.2f} ({sum(v >= 1.1 for v in xn)} of {n} >= 1.1x). probe.py's own torch-bf16 "
          f"in the final process: x conv median {statistics.median(xf):.2f} ({sum(v >= 1.1 for v in xf)} of {n}).\n")
