"""The README's table from probe_tf32.json: per shape cuDNN TF32 (NCHW and NHWC), the chosen tile, the best form."""
import json
import statistics
import sys

rows = json.load(open(sys.argv[1]))
shapes = []
for r in rows:
    if (r["set"], r["shape"]) not in shapes:
        shapes.append((r["set"], r["shape"]))
print("| set | B M C H W K | cuDNN TF32 ms | NHWC ms | chosen ms | x chosen | best form | best ms | x best | x best vs NHWC |")
print("|---|---|---|---|---|---|---|---|---|---|")
ratios = {"gpumode": ([], [], []), "wide": ([], [], [])}
for s, shape in shapes:
    mine = [r for r in rows if (r["set"], r["shape"]) == (s, shape)]
    ref = next(r["ms"] for r in mine if r["entry"] == "torch-tf32")
    nhwc = next(r["ms"] for r in mine if r["entry"] == "cudnn-tf32-nhwc")
    chosen = next(r for r in mine if r.get("chosen"))
    ours = [r for r in mine if r["entry"] == "triton-igemm-tf32" and "ms" in r]
    best = min(ours, key=lambda r: r["ms"])
    ratios[s][0].append(ref / chosen["ms"])
    ratios[s][1].append(ref / best["ms"])
    ratios[s][2].append(nhwc / best["ms"])
    form = "chosen" if best.get("chosen") else str(tuple(best["form"]))
    print(f"| {s} | {' '.join(map(str, shape))} | {ref:.4g} | {nhwc:.4g} | {chosen['ms']:.4g} | {ref / chosen['ms']:.2f} | "
          f"{form} {tuple(best['tile'])} | {best['ms']:.4g} | {ref / best['ms']:.2f} | {nhwc / best['ms']:.2f} |")
for s, (c, b, n) in ratios.items():
    print(f"\n{s}: x chosen median {statistics.median(c):.2f} ({sum(v >= 1.1 for v in c)} of {len(c)} >= 1.1x); "
          f"x best form median {statistics.median(b):.2f} ({sum(v >= 1.1 for v in b)} of {len(b)} >= 1.1x); "
          f"best vs NHWC median {statistics.median(n):.2f} ({sum(v >= 1.1 for v in n)} of {len(n)})")
