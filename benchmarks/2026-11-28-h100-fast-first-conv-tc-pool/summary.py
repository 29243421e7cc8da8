"""Per first conv: cuda-auto's exact fused kernel, the pool kernel's default launch and its best, from the sweep
JSONs of one call. Usage: python3 summary.py DIR"""
import json
import sys
from pathlib import Path

d = Path(sys.argv[1])
rows = []
for name in ("sweep_auto.json", "sweep_pool.json"):
    if (d / name).exists():
        rows += json.loads((d / name).read_text())
print(f"{'layer':8s} {'auto ms':>8s} {'pool default':>12s} {'pool best':>9s} {'x auto':>7s}  best config")
for layer in dict.fromkeys(r["layer"] for r in rows):
    auto = [r["median_ms"] for r in rows if r["layer"] == layer and r["impl"] == "cuda-auto" and r["ok"]]
    pool = [r for r in rows if r["layer"] == layer and r["impl"] == "cuda-tc-fp16" and r["ok"]]
    if not auto or not pool:
        continue
    default = next((r["median_ms"] for r in pool if r["config"] is None), float("nan"))
    best = min(pool, key=lambda r: r["median_ms"])
    print(f"{layer:8s} {auto[0]:8.3f} {default:12.3f} {best['median_ms']:9.3f} {auto[0] / best['median_ms']:6.2f}x  "
          f"{json.dumps(best['config'], sort_keys=True)}")
