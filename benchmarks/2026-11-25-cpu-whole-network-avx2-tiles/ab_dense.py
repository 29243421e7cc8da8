"""A/B of convforge.cpu_dense's register tile (MR images x PR panels of 16 outputs) on the presets' first
dense layers (B images: the CPU engine's chunk), 2 threads, the tiles interleaved round by round; median and
min of the rounds and the float64 check; loadavg with every layer.

    PYTHONPATH=. python3 benchmarks/2026-11-25-cpu-whole-network-avx2-tiles/ab_dense.py [--tiles 6,1 12,2 ...]
"""
import argparse
import statistics
import time

import numpy as np
import torch

from convforge import cpu_dense
from convforge.harness.check import relative_error

LAYERS = {  # name: (K inputs, N outputs, activation)
    "fa17-fc1": (50 * 12 * 12, 500, "tanh"),
    "sp18-fc1": (16 * 26 * 26, 140, "tanh"),
    "sp19-fc1": (16 * 18 * 18, 140, "tanh"),
    "fa18-fc1": (24 * 27 * 27, 160, "tanh"),
    "fa19-fc1": (24 * 29 * 29, 160, "tanh"),
    "fa20-fc1": (16 * 8 * 8, 32, "relu"),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", nargs="*", default=list(LAYERS))
    ap.add_argument("--tiles", nargs="*", default=["6,1", "12,2"])
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(2)
    for name in args.layers:
        k, n, act = LAYERS[name]
        g = torch.Generator().manual_seed(k)
        x = torch.randn(args.batch, k, generator=g)
        w, b = torch.randn(n, k, generator=g) / k ** 0.5, torch.randn(n, generator=g)
        ref = torch.tanh(torch.nn.functional.linear(x[:100].double(), w.double(), b.double())).numpy() \
            if act == "tanh" else torch.relu(torch.nn.functional.linear(x[:100].double(), w.double(), b.double())).numpy()
        layers = {t: cpu_dense.DenseLayer(w, b, act, tile=tuple(int(v) for v in t.split(","))) for t in args.tiles}
        out = np.empty((args.batch, cpu_dense.padded(n)), np.float32)
        xn = x.numpy()
        errs = {}
        for t, layer in layers.items():
            layer(xn, k, out)
            errs[t] = relative_error(out[:100, :n], ref)
        times = {t: [] for t in layers}
        for _ in range(args.rounds):
            for t, layer in layers.items():
                t0 = time.perf_counter()
                layer(xn, k, out)
                times[t].append(time.perf_counter() - t0)
        flops = 2 * args.batch * k * n
        load = open("/proc/loadavg").read().split()[0]
        for t in layers:
            med, best = statistics.median(times[t]) * 1e3, min(times[t]) * 1e3
            print(f"{name:9s} B={args.batch} tile {t:>5s}: median {med:8.2f} ms  min {best:8.2f} ms  "
                  f"{flops / best / 1e6:6.1f} GFLOP/s (min)  err {errs[t]:.1e}  loadavg {load}", flush=True)


if __name__ == "__main__":
    main()
