"""Dense-layer A/B in one process, as the CPU engine now calls them (inputs in the lane layout, read in place; 2048
images, 2 threads): cpu_dense's loop orders and slices (variant "tiles:KC": each tile over every group of W, the
default; "panels:KC": each group of W's panels over every tile of the block, panels_outer), called in turn round
after round, per-round ratio to the first variant (median, quartiles), GFLOP/s at the min, error vs float64 (first
64 images), loadavg.

    git apply benchmarks/2026-11-26-cpu-lane-layout/panels_outer.patch   # the tried loop order (not on the branch)
    PYTHONPATH=. python3 benchmarks/2026-11-26-cpu-lane-layout/ab_dense.py [--variants tiles:256 panels:128 ...]
"""
import argparse
import statistics
import time

import numpy as np
import torch

from convforge import cpu_dense
from convforge.harness.check import relative_error

LAYERS = {"fa17-fc1": (7200, 500), "sp18-fc1": (10816, 140), "sp19-fc1": (5184, 140), "fa18-fc1": (17496, 160),
          "fa19-fc1": (20184, 160)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", nargs="*", default=list(LAYERS))
    ap.add_argument("--variants", nargs="*", default=["tiles:256", "panels:256", "panels:128"])
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"dense A/B, B={args.batch}, threads={args.threads}, rounds={args.rounds}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, loadavg {open('/proc/loadavg').read().strip()}")
    for name in args.layers:
        k, n = LAYERS[name]
        g = torch.Generator().manual_seed(k)
        x, w, b = torch.randn(args.batch, k, generator=g), torch.randn(n, k, generator=g) * 0.01, torch.randn(n, generator=g)
        lanes = x.reshape(args.batch // 16, 16, k).permute(0, 2, 1).contiguous().numpy()
        ref = torch.tanh(torch.nn.functional.linear(x[:64].double(), w.double(), b.double())).numpy()
        layers, outs, errs = {}, {}, {}
        for v in args.variants:
            order, kc = v.split(":")
            layers[v] = cpu_dense.DenseLayer(w, b, "tanh", blocking=(int(kc), cpu_dense.NC), lanes=True,
                                             panels_outer=order == "panels")
            outs[v] = np.full((args.batch, cpu_dense.padded(n)), np.nan, np.float32)
            layers[v](lanes, k, outs[v])
            errs[v] = relative_error(outs[v][:64, :n], ref)
        times = {v: [] for v in args.variants}
        loads = []
        for r in range(args.rounds):
            loads.append(float(open("/proc/loadavg").read().split()[0]))
            for v in (args.variants if r % 2 == 0 else args.variants[::-1]):
                t0 = time.perf_counter()
                layers[v](lanes, k, outs[v])
                times[v].append(time.perf_counter() - t0)
        flops = 2.0 * args.batch * k * n
        base = args.variants[0]
        line = [f"{name:9s}"]
        for v in args.variants:
            ratio = sorted(t / u for t, u in zip(times[v], times[base]))
            q = statistics.quantiles(ratio, n=4)
            line.append(f"{v} {statistics.median(times[v]) * 1e3:6.2f} ms ({flops / min(times[v]) / 1e9:5.1f} GF/s at min, "
                        f"x{statistics.median(ratio):.3f} [{q[0]:.3f}-{q[2]:.3f}], err {errs[v]:.1e})")
        print("  ".join(line) + f"  loadavg {min(loads):.2f}-{max(loads):.2f}", flush=True)


if __name__ == "__main__":
    main()
