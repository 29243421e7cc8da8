"""Where the CPU engine's time goes now, per preset: one warm-up pass, then 3 timed passes of 10000 random images
(2 threads); per pass the total, each conv layer's Op Time (the engine's own timing) and each dense layer's
time (DenseLayer.__call__ wrapped with a perf_counter); the last pass is printed.

    PYTHONPATH=. python3 benchmarks/2026-11-25-cpu-fa17-dense-panel/split.py fa17-high [sp18 ...]
"""
import sys
import time

import numpy as np
import torch

import convforge.cpu_dense as cd
from convforge.engine import Engine
from convforge.models import load_preset

torch.set_num_threads(2)
spent = {}
_call = cd.DenseLayer.__call__


def timed_call(self, *args):
    t0 = time.perf_counter()
    result = _call(self, *args)
    spent[id(self)] = spent.get(id(self), 0.0) + time.perf_counter() - t0
    return result


cd.DenseLayer.__call__ = timed_call
for name in sys.argv[1:]:
    net = load_preset(name)
    engine = Engine(net, impl="cpu-parallel", device="cpu")
    size = net.architecture.input_size
    x = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (10000, size, size), dtype=np.uint8)).float().unsqueeze(1)
    with torch.inference_mode():
        engine.forward(x)
        for _ in range(3):
            for step in engine.steps:
                if step.result:
                    step.result.op_time_s = 0.0
            spent.clear()
            t0 = time.perf_counter()
            engine.forward(x)
            total = time.perf_counter() - t0
    convs = " + ".join(f"{s.result.op_time_s * 1e3:.1f}" for s in engine.steps if s.result)
    dense = " + ".join(f"{v * 1e3:.1f}" for v in spent.values())
    print(f"{name:9s} total {total * 1e3:7.1f} ms  convs {convs} ms  dense {dense} ms  "
          f"loadavg {open('/proc/loadavg').read().split()[0]}", flush=True)
