"""`convforge bench --whole`'s GPU rows at the given batches, without torch.compile: every preset's forward beside
eager torch and the launch + input copy yardstick; with ACCURACY=1, each path's accuracy on the 10000 test images
first. Usage: python3 whole_small.py OUT.json BATCH...
"""
import os
import json
import sys
from pathlib import Path

from convforge.conv.torch_conv import exact_fp32
from convforge.harness import whole
from convforge.harness.probes import measure_ceilings
from convforge.models import PRESETS

out = Path(sys.argv[1])
batches = [int(b) for b in sys.argv[2:]] or [10, 100]
exact_fp32()
ceilings = measure_ceilings("cuda")
print(f"ceilings: {ceilings.describe()}", flush=True)
rows = []
for name in [p for p in PRESETS if p != "fa17-low"]:
    if os.environ.get("ACCURACY") == "1":
        rows += whole.accuracy_rows(name, 10000)
    rows += whole.bench_network(name, batches, ceilings, (), 50)
    out.write_text(json.dumps(rows, indent=1))
