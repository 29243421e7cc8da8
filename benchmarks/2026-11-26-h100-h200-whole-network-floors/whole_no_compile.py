"""`convforge bench --whole` on the GPU without the torch.compile row (minutes of max-autotune per preset): the
exact and fast paths' % of the network floor, eager torch and CUDA graphs beside them, accuracy on the 10000 test
images. Usage: python3 whole_no_compile.py OUT.json [preset ...]
"""
import json
import sys
from pathlib import Path

from convforge.conv.torch_conv import exact_fp32
from convforge.harness import whole
from convforge.harness.probes import measure_ceilings
from convforge.models import PRESETS

out = Path(sys.argv[1])
models = sys.argv[2:] or [p for p in PRESETS if p != "fa17-low"]
exact_fp32()
ceilings = measure_ceilings("cuda")
print(f"ceilings: {ceilings.describe()}", flush=True)
rows = []
for name in models:
    rows += whole.accuracy_rows(name, 10000)
    rows += whole.bench_network(name, whole.BATCHES, ceilings, (), 20)
    out.write_text(json.dumps(rows, indent=1))
