"""Where the whole forward's time goes at 10 and 100 images: per preset, path (exact, fast) and batch, the
CUDA-graph forward timed as bench --whole times it (host launch included), its GPU time alone (a spin kernel
queued ahead), and the kernels of one replay under torch.profiler (name, GPU microseconds).

    python3 probe.py OUT.json [PRESET ...]
"""
import json
import sys

import numpy as np
import torch

from convforge.engine import Engine
from convforge.harness.timing import rotated_inputs, time_calls
from convforge.harness.whole import launch_copy_call
from convforge.models import load_preset

PRESETS = sys.argv[2:] or ["fa17-high", "sp18", "sp19", "fa18", "fa19", "fa20"]
rows = []


def kernels_of(forward, x, replays=10):
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(replays):
            forward(x)
        torch.cuda.synchronize()
    per = {}
    spans = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.is_user_annotation:
            per.setdefault(e.name, []).append(e.time_range.end - e.time_range.start)
            spans.append((e.time_range.start, e.time_range.end))
    kernels = sorted(((n, float(np.median(d)), len(d) / replays) for n, d in per.items()), key=lambda r: -r[1])
    return [dict(name=n[:120], us=us, per_call=c) for n, us, c in kernels]


for name in PRESETS:
    network = load_preset(name)
    arch = network.architecture
    for batch in (10, 100):
        x = torch.randint(0, 256, (batch, arch.in_channels, arch.input_size, arch.input_size),
                          device="cuda").to(torch.float32)
        inputs = rotated_inputs(x)
        yard = launch_copy_call(x)
        with torch.inference_mode():
            yard_ms = float(np.median(time_calls(yard, inputs, "cuda", repeat=500, timing="call"))) * 1e3
        for precision in ("exact", "fast"):
            engine = Engine(network, impl="auto", device="cuda", precision=precision)
            graphed = engine.graphed(batch)
            with torch.inference_mode():
                call_ms = float(np.median(time_calls(graphed, inputs, "cuda", repeat=200, timing="call"))) * 1e3
                gpu_ms = float(np.median(time_calls(graphed, inputs, "cuda", repeat=200, timing="gpu"))) * 1e3
                kernels = kernels_of(graphed, x)
            layers = [(s.result.impl if s.result else type(s.layer).__name__) for s in engine.steps]
            row = dict(model=name, batch=batch, precision=precision, call_ms=call_ms, gpu_ms=gpu_ms,
                       yardstick_ms=yard_ms, x_yardstick=call_ms / yard_ms, layers=layers,
                       kernel_sum_us=sum(k["us"] * k["per_call"] for k in kernels), kernels=kernels)
            rows.append(row)
            print(f"{name:9s} {batch:4d} {precision:5s} call {call_ms*1e3:6.1f} us gpu {gpu_ms*1e3:6.1f} us "
                  f"yard {yard_ms*1e3:5.1f} us ({call_ms/yard_ms:4.2f}x) kernels {row['kernel_sum_us']:6.1f} us "
                  f"{layers}", flush=True)
            for k in kernels:
                print(f"      {k['us']:7.2f} us x{k['per_call']:.0f}  {k['name'][:100]}", flush=True)
            del graphed, engine
json.dump(rows, open(sys.argv[1], "w"), indent=1)
