"""Where a graphed forward's time goes at 10 and 100 images: each kernel node's GPU time (torch.profiler over
REPLAYS replays of the engine's CUDA graph), their sum, and the replay's time with the host's launch work included
(CUDA events around input copy + replay, as bench --whole times it). Usage: python3 profile_small.py [preset ...]
"""
import sys
from collections import defaultdict

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from convforge.conv.torch_conv import exact_fp32
from convforge.engine import Engine
from convforge.models import PRESETS, load_preset

REPLAYS = 40


def replay_ms(forward, x, calls=200):
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        forward(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


exact_fp32()
for name in sys.argv[1:] or [p for p in PRESETS if p != "fa17-low"]:
    network = load_preset(name)
    arch = network.architecture
    for precision in ("exact", "fast"):
        engine = Engine(network, impl="auto", device="cuda", precision=precision)
        for batch in (10, 100):
            x = torch.rand((batch, arch.in_channels, arch.input_size, arch.input_size), device="cuda") * 255
            graphed = engine.graphed(batch)
            for _ in range(20):
                graphed(x)
            ms = replay_ms(graphed, x)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(REPLAYS):
                    graphed(x)
                torch.cuda.synchronize()
            per = defaultdict(lambda: [0, 0.0])
            for ev in prof.events():
                if ev.device_type == torch.autograd.DeviceType.CUDA:
                    per[ev.name][0] += 1
                    per[ev.name][1] += ev.device_time
            total = sum(us for _, us in per.values()) / REPLAYS
            nodes = sum(n for n, _ in per.values()) / REPLAYS
            print(f"{name:9s} {precision:5s} {batch:4d}  replay {ms * 1e3:7.1f} us  kernels {nodes:4.1f}  "
                  f"GPU sum {total:7.1f} us", flush=True)
            for kname, (n, us) in sorted(per.items(), key=lambda kv: -kv[1][1]):
                print(f"    {us / REPLAYS:7.1f} us  x{n / REPLAYS:3.1f}  {kname[:110]}")
            del graphed
