"""Tables of a whole_small.py run (whole.json): per preset and batch, the graphed forward of each path in us and as
a multiple of the launch + input copy yardstick measured beside it, eager torch's graph, and eager torch (cuDNN)
over each of ours. Usage:
python3 tables.py CALL_DIR/whole.json"""
import json
import sys
from collections import defaultdict

rows = json.load(open(sys.argv[1]))
by = defaultdict(dict)
for r in rows:
    if "batch" in r and r.get("ms") is not None:
        by[(r["model"], r["batch"])][r["candidate"]] = r
print("| preset | images | launch + copy us | exact graph us (x) | fast graph us (x) | torch graph us (x) "
      "| eager torch us | eager / exact, fast |")
print("|---|---|---|---|---|---|---|---|")
for (model, batch), c in by.items():
    y = c["one empty kernel + input copy"]["ms"]
    cell = lambda k: f"{c[k]['ms'] * 1e3:.1f} ({c[k]['ms'] / y:.1f}x)" if k in c else "-"   # noqa: E731
    print(f"| {model} | {batch} | {y * 1e3:.1f} | {cell('convforge, CUDA graph')} | "
          f"{cell('convforge fast, CUDA graph')} | {cell('torch eager, CUDA graph')} | "
          + (f"{c['torch eager']['ms'] * 1e3:.1f} | {c['torch eager']['ms'] / c['convforge, CUDA graph']['ms']:.1f}x, "
             f"{c['torch eager']['ms'] / c['convforge fast, CUDA graph']['ms']:.1f}x |" if 'torch eager' in c else "- | - |"))
