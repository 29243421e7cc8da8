"""The exact path's whole forward (CUDA graph, host launch included, as `bench --whole` times it) on the presets
whose second conv is a plain layer, at 10 / 100 / 1000 / 10000 images, with each conv layer's cuda-auto choice.
Run once on main's cuda-auto table and once after choose_entries.py: the difference is the 3xTF32 entries.
Usage: python3 ab_exact.py OUT.json LABEL [preset ...]"""
import json
import sys
from pathlib import Path

import numpy as np
import torch

from convforge.conv.torch_conv import exact_fp32
from convforge.engine import Engine
from convforge.harness import whole
from convforge.harness.check import relative_error
from convforge.harness.probes import measure_ceilings
from convforge.harness.timing import rotated_inputs, time_calls
from convforge.models import forward_with, load_preset

out, label = Path(sys.argv[1]), sys.argv[2]
presets = sys.argv[3:] or ["fa18", "fa19", "sp18", "sp19"]
exact_fp32()
ceilings = measure_ceilings("cuda")
print(f"{label}: ceilings {ceilings.describe()}", flush=True)
rows = []
for name in presets:
    network = load_preset(name)
    arch = network.architecture
    params64 = {k: v.to("cuda", torch.float64) for k, v in network.params.items()}
    engine = Engine(network, impl="auto", device="cuda")
    for batch in (10, 100, 1000, 10000):
        g = torch.Generator(device="cuda").manual_seed(batch)
        x = torch.randint(0, 256, (batch, arch.in_channels, arch.input_size, arch.input_size), generator=g,
                          device="cuda").to(torch.float32)
        with torch.inference_mode():
            reference = forward_with(arch, params64, x.double())
            forward = engine.graphed(batch)
            error = relative_error(forward(x).clone(), reference.cpu().numpy())
            inputs = rotated_inputs(x)
            repeat = 200 if batch <= 1000 else 20
            ms = float(np.median(time_calls(lambda xi: forward(xi), inputs, "cuda", repeat=repeat, timing="call"))) * 1e3
            yard = float(np.median(time_calls(whole.launch_copy_call(x), inputs, "cuda", repeat=500, timing="call"))) * 1e3
        cost = whole.network_cost(network, batch)
        floor_fp32 = whole.exact_floor_s(ceilings, cost) * 1e3
        choices = []
        for step in engine.steps:
            fn = step.conv_fn
            if fn is not None and hasattr(fn, "choice"):
                shape = step.result.shape
                choices.append([step.result.index, *fn.choice(shape.H, shape.W, batch)])
        row = dict(label=label, model=name, batch=batch, ms=ms, launch_copy_ms=yard, x_launch_copy=ms / yard,
                   error=error, floor_ms_convs_fp32=floor_fp32, choices=choices)
        rows.append(row)
        print(f"{label} {name:5s} {batch:6d} {ms:9.4f} ms  yardstick {yard:7.4f} ({ms / yard:5.2f}x)  "
              f"err {error:.1e}  {choices}", flush=True)
        out.write_text(json.dumps(rows, indent=1))
