"""Whole-network A/B in one process: the CPU engine (cpu-parallel, the arena) with the first layers' 2 x 2 pool
fused main's way (cpu_parallel.POOLED_TILES off: band of conv rows, then pool_kernel; the kernels of main) and
this branch's (pooled register tiles + PREFETCHW of the output rows), the two engines called in turn round after
round on the same images (random 0..255 pixels), so that load from other work hits both alike. Median and min
of the rounds, the per-round ratio, the 1-minute loadavg, and both engines' logits against the float64
reference on the first 64 images, and their predictions against each other on all images.

    PYTHONPATH=. python3 benchmarks/2026-11-25-cpu-first-conv-one-channel/ab_whole.py [--presets sp18 sp19 fa19]
        [--images 10000] [--rounds 7]
"""
import argparse
import statistics
import time

import numpy as np
import torch

from convforge.conv import cpu_parallel
from convforge.engine import Engine
from convforge.harness.check import relative_error
from convforge.models import forward_with, load_preset


def engine(network, pooled):
    saved = cpu_parallel.POOLED_TILES
    cpu_parallel.POOLED_TILES = pooled
    try:
        return Engine(network, impl="cpu-parallel", device="cpu")
    finally:
        cpu_parallel.POOLED_TILES = saved


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", nargs="*", default=["fa17-high", "sp18", "sp19", "fa18", "fa19", "fa20"])
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"whole-network A/B, {args.images} images, threads={args.threads}, rounds={args.rounds}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, loadavg {open('/proc/loadavg').read().strip()}")
    for name in args.presets:
        network = load_preset(name)
        engines = {"main": engine(network, False), "new": engine(network, True)}
        size = network.architecture.input_size
        images = np.random.default_rng(len(name)).integers(0, 256, (args.images, size, size), dtype=np.uint8)
        x = torch.from_numpy(images).float().unsqueeze(1)
        with torch.inference_mode():
            ref = forward_with(network.architecture, {k: v.double() for k, v in network.params.items()},
                               x[:64].double()).numpy()
            logits = {v: e.forward(x).numpy().copy() for v, e in engines.items()}   # also the warm-up
        errs = {v: relative_error(logits[v][:64], ref) for v in engines}
        times = {v: [] for v in engines}
        loads = []
        with torch.inference_mode():
            for _ in range(args.rounds):
                loads.append(float(open("/proc/loadavg").read().split()[0]))
                for v, e in engines.items():
                    t0 = time.perf_counter()
                    e.forward(x, timed=False)
                    times[v].append(time.perf_counter() - t0)
        same = np.array_equal(logits["main"].argmax(1), logits["new"].argmax(1))
        for v in engines:
            print(f"{name:9s} {v}: median {statistics.median(times[v]) * 1e3:8.1f} ms  min {min(times[v]) * 1e3:8.1f} ms"
                  f"  err {errs[v]:.1e}  loadavg {min(loads):.2f}-{max(loads):.2f}", flush=True)
        ratio = [b / a for a, b in zip(times["main"], times["new"])]
        print(f"{name:9s} new/main per round: median {statistics.median(ratio):.3f} (min {min(ratio):.3f}, "
              f"max {max(ratio):.3f}); same predictions: {same}", flush=True)


if __name__ == "__main__":
    main()
