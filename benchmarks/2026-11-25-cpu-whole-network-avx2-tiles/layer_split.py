"""Where a preset's CPU whole-network pass spends its time: the engine (cpu-parallel, fused, the arena) on
N random images, 2 threads, per conv layer (the engine's own Stopwatch) and the rest (dense layers,
copies) as total minus convs; median of R passes after a warm-up, loadavg printed.

    PYTHONPATH=. python3 benchmarks/2026-11-25-cpu-whole-network-avx2-tiles/layer_split.py [presets...]
"""
import statistics
import sys
import time

import numpy as np
import torch

from convforge.engine import Engine
from convforge.models import load_preset

torch.set_num_threads(2)
N, R = 10000, 3
for name in sys.argv[1:] or ["fa17-high", "sp18", "sp19", "fa18", "fa19", "fa20"]:
    net = load_preset(name)
    engine = Engine(net, impl="cpu-parallel", device="cpu")
    size = net.architecture.input_size
    x = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (N, 1, size, size)).astype(np.float32))
    with torch.inference_mode():
        engine.forward(x)
        totals, convs = [], []
        for _ in range(R):
            steps = [s for s in engine.steps if s.result is not None]
            for s in steps:
                s.result.op_time_s = 0.0
            t0 = time.perf_counter()
            engine.forward(x)
            totals.append(time.perf_counter() - t0)
            convs.append([s.result.op_time_s for s in steps])
    best = int(np.argmin(totals))
    parts = "  ".join(f"L{i + 1} {1e3 * c:7.1f}" for i, c in enumerate(convs[best]))
    print(f"{name:9s} N={N} total median {1e3 * statistics.median(totals):7.1f} min {1e3 * totals[best]:7.1f} ms  "
          f"[min pass: {parts}  rest {1e3 * (totals[best] - sum(convs[best])):7.1f}]  chunk {engine.chunk}  "
          f"loadavg {open('/proc/loadavg').read().split()[0]}", flush=True)
