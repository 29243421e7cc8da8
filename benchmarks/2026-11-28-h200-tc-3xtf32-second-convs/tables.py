"""The README's tables from call1 (the exact whole forward before/after the entries) and call2 (the sweeps).
Usage: python3 tables.py  (from the repository root or this folder)"""
import json
from pathlib import Path

from convforge.harness.whole import network_cost
from convforge.models import load_preset

HERE = Path(__file__).resolve().parent
TF32_X3 = 444331.8 / 3    # GFLOP/s: call1's "after" ceilings (TF32 444331.8), the 3xTF32 rate
FP32 = 66106.7            # its FMA peak
BANDWIDTH = 4666.8        # its best bandwidth (write), GB/s

print("| layer | images | cuda-auto ms (its choice) | best cuda-tc-3xtf32 ms (launch shape) | auto / 3xTF32 |")
print("|---|---|---|---|---|")
for batch in (10, 100, 1000, 10000):
    rows = json.loads((HERE / f"call2/sweep_b{batch}.json").read_text())
    for layer in ("fa18 L2", "fa19 L2", "sp18 L2", "sp19 L2"):
        auto = next(r for r in rows if r["layer"] == layer and r["impl"] == "cuda-auto")
        best = min((r for r in rows if r["layer"] == layer and r["impl"] == "cuda-tc-3xtf32" and r["ok"]),
                   key=lambda r: r["median_ms"])
        shape = best["config"] and {k: v for k, v in best["config"].items() if k != "kernel"} or "default"
        print(f"| {layer} | {batch} | {auto['median_ms']:.4f} | {best['median_ms']:.4f} ({shape}) | "
              f"{auto['median_ms'] / best['median_ms']:.2f} |")

before = json.loads((HERE / "call1/ab_before.json").read_text())
after = {(r["model"], r["batch"]): r for r in json.loads((HERE / "call1/ab_after.json").read_text())}
print()
print("| preset | images | before ms (x yardstick) | after ms (x yardstick) | before / after | L2 after | "
      "% of floor, convs at fp32 / all at 3xTF32 (after) |")
print("|---|---|---|---|---|---|---|")
for b in before:
    a = after[(b["model"], b["batch"])]
    cost = network_cost(load_preset(b["model"]), b["batch"])
    old = max(cost.bytes_moved / (BANDWIDTH * 1e9), (cost.flops - cost.dense_flops) / (FP32 * 1e9)
              + cost.dense_flops / (TF32_X3 * 1e9)) * 1e3
    new = max(cost.bytes_moved / (BANDWIDTH * 1e9), cost.flops / (TF32_X3 * 1e9)) * 1e3
    print(f"| {b['model']} | {b['batch']} | {b['ms']:.4f} ({b['x_launch_copy']:.2f}x) | {a['ms']:.4f} "
          f"({a['x_launch_copy']:.2f}x) | {b['ms'] / a['ms']:.2f} | {a['choices'][-1][1]} | "
          f"{100 * old / a['ms']:.1f} / {100 * new / a['ms']:.1f} |")
