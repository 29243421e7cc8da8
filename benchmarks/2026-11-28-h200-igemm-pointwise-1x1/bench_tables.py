"""call3-bench/{gpumode,wide}.json -> per layer: cuDNN fp32 / TF32 / torch-bf16 and triton-igemm TF32 / BF16 times
with the ratios #24 asks for (TF32 against cuDNN TF32, BF16 against torch-bf16), and each set's medians.
usage: bench_tables.py FOLDER"""
import json
import statistics
import sys

folder = sys.argv[1]
for name in ("gpumode", "wide"):
    rows = json.load(open(f"{folder}/{name}.json"))
    rows = rows["rows"] if isinstance(rows, dict) else rows
    by = {}
    for r in rows:
        by.setdefault(r["layer"], {})[r["impl"]] = r["median_ms"]
    print(f"\n#### {name}\n")
    print("| layer | cuDNN fp32 ms | cuDNN TF32 ms | triton-igemm-tf32 ms | x cuDNN TF32 | torch-bf16 ms "
          "| triton-igemm-bf16 ms | x torch-bf16 |")
    print("|---|---|---|---|---|---|---|---|")
    tf, bf = [], []
    for layer, t in by.items():
        a, b = t["torch-tf32"] / t["triton-igemm-tf32"], t["torch-bf16"] / t["triton-igemm-bf16"]
        tf.append(a)
        bf.append(b)
        print(f"| {layer} | {t['torch']:.4g} | {t['torch-tf32']:.4g} | {t['triton-igemm-tf32']:.4g} | **{a:.2f}** | "
              f"{t['torch-bf16']:.4g} | {t['triton-igemm-bf16']:.4g} | **{b:.2f}** |")
    print(f"\n{name}: TF32 x cuDNN TF32 median {statistics.median(tf):.2f} ({sum(v >= 1.1 for v in tf)} of {len(tf)} "
          f">= 1.1x); BF16 x torch-bf16 median {statistics.median(bf):.2f} ({sum(v >= 1.1 for v in bf)} of {len(bf)})")
