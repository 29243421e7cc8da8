"""bench --whole's rows (no torch.compile, no accuracy pass) at the batches named, for every preset but fa17-low.
Usage: python3 whole_at.py OUT.json BATCH...   (whole_no_compile.py of the floors folder runs all four and accuracy)
"""
import json
import sys
from pathlib import Path

from convforge.conv.torch_conv import exact_fp32
from convforge.harness import whole
from convforge.harness.probes import measure_ceilings
from convforge.models import PRESETS

out = Path(sys.argv[1])
batches = [int(b) for b in sys.argv[2:]]
exact_fp32()
ceilings = measure_ceilings("cuda")
rows = []
for name in [p for p in PRESETS if p != "fa17-low"]:
    rows += whole.bench_network(name, batches, ceilings, (), 20)
    out.write_text(json.dumps(rows, indent=1))
