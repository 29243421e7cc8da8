"""The unpooled second convs of fa18, fa19, sp18 and sp19 in the CPU engine's lane layout: cpu-parallel's direct
kernel against cpu-winograd (default tile and the variants given as arguments, (m, MB, TW)), interleaved round by
round, 2 threads, B = 2048 (the engine's chunk), median of 7; the error of the first 64 images against float64.

    PYTHONPATH=. python3 benchmarks/2026-11-27-cpu-winograd-second-convs/ab_layers.py fa18,fa19,sp18,sp19 "(2,6,4)"
"""
import sys
import time

import numpy as np
import torch

from convforge.conv import cpu_parallel as cp
from convforge.conv import cpu_winograd as cw

torch.set_num_threads(2)
B, ROUNDS = 2048, 7
LAYERS = {"fa18": (24, 12, 33, 7), "fa19": (24, 12, 33, 5), "sp18": (16, 6, 30, 5), "sp19": (16, 6, 22, 5)}
configs = [None] + [eval(a) for a in sys.argv[2:]]
for name in sys.argv[1].split(","):
    M, C, H, K = LAYERS[name]
    g = torch.Generator().manual_seed(0)
    x = torch.rand(B, C, H, H, generator=g) * 2 - 1
    w = torch.randn(M, C, K, K, generator=g) / (C * K * K) ** 0.5
    b = torch.randn(M, generator=g)
    xl = cp.to_lanes(x)
    out = torch.empty(cp.lane_shape(B, (M, H - K + 1, H - K + 1)))
    ref = torch.nn.functional.conv2d(x[:64].double(), w.double(), b.double())
    fns = {"cpu-parallel": cp.prepare_lanes(w, b, True, True)}
    for c in configs:
        fns[f"cpu-winograd {c or 'default'}"] = cw.prepare_lanes(w, b, config=c)
    times = {k: [] for k in fns}
    errors = {}
    for rep in range(ROUNDS):
        for k, f in (fns.items() if rep % 2 == 0 else reversed(fns.items())):
            t = time.perf_counter()
            f(xl, out, B)
            times[k].append(time.perf_counter() - t)
            if rep == 0:
                got = cp.from_lanes(out, B)[:64].double()
                errors[k] = ((got - ref).norm() / ref.norm()).item()
    flops = 2 * B * M * C * K * K * (H - K + 1) ** 2
    base = float(np.median(times["cpu-parallel"]))
    for k, v in times.items():
        med = float(np.median(v))
        print(f"{name} {k}: {med * 1e3:.1f} ms, {flops / med / 1e9:.0f} direct-GFLOP/s, x{base / med:.2f} "
              f"cpu-parallel, error {errors[k]:.2e}", flush=True)
