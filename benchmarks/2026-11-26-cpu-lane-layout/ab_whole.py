"""Whole-network A/B in one process: the CPU engine (cpu-parallel, the arena) with the layers handing each other
(B, C, H, W) tensors, overlapping last tiles and 16-accumulator tiles (main's way: engine.lanes_next patched to
False, cpu_parallel.REMAINDER_TILES off and TILE_ACCUMULATORS 16 while it is built) and with this branch's lane layout between them and remainder
tiles (ab_whole_1.txt: the lane layout alone, before the remainder tiles existed), the two engines called in turn round after round on the same images (random 0..255
pixels), so that load from other work hits both alike. Median and min of the rounds, the per-round ratio, the
1-minute loadavg, both engines' logits against the float64 reference on the first 64 images, and their
predictions against each other on all images.

    PYTHONPATH=. python3 benchmarks/2026-11-26-cpu-lane-layout/ab_whole.py [--presets sp18 sp19 fa19]
        [--images 10000] [--rounds 7]
"""
import argparse
import statistics
import time

import numpy as np
import torch

from convforge import engine as engine_module
from convforge.conv import cpu_parallel
from convforge.engine import Engine
from convforge.harness.check import relative_error
from convforge.models import forward_with, load_preset


MAIN_ACCUMULATORS = {16: 16, 8: 12}   # main's unpooled register tiles (before the 4 x 6 tiles)


def engine(network, new, chunk=None):
    saved = engine_module.lanes_next, cpu_parallel.REMAINDER_TILES, cpu_parallel.TILE_ACCUMULATORS
    if not new:
        engine_module.lanes_next = lambda walk, j: False
        cpu_parallel.REMAINDER_TILES = False
        cpu_parallel.TILE_ACCUMULATORS = MAIN_ACCUMULATORS[cpu_parallel.VECTOR]
    try:
        return Engine(network, impl="cpu-parallel", device="cpu", chunk=chunk)
    finally:
        engine_module.lanes_next, cpu_parallel.REMAINDER_TILES, cpu_parallel.TILE_ACCUMULATORS = saved


def loadavg():
    return float(open("/proc/loadavg").read().split()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", nargs="*", default=["fa17-high", "sp18", "sp19", "fa18", "fa19", "fa20"])
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunks", type=int, nargs="*", help="compare chunk sizes instead (this branch's engine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"whole-network A/B, {args.images} images, threads={args.threads}, rounds={args.rounds}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, loadavg {open('/proc/loadavg').read().strip()}")
    for name in args.presets:
        network = load_preset(name)
        if args.chunks:     # this branch's engine at several chunk sizes, the first one the base
            engines = {f"chunk{c}": engine(network, True, c) for c in args.chunks}
        else:
            engines = {"main": engine(network, False), "lanes": engine(network, True)}
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
            for r in range(args.rounds):
                loads.append(loadavg())
                order = list(engines.items()) if r % 2 == 0 else list(engines.items())[::-1]
                for v, e in order:
                    t0 = time.perf_counter()
                    e.forward(x, timed=False)
                    times[v].append(time.perf_counter() - t0)
        names = list(engines)
        for v in engines:
            print(f"{name:9s} {v:5s}: median {statistics.median(times[v]) * 1e3:8.1f} ms  min {min(times[v]) * 1e3:8.1f} ms"
                  f"  err {errs[v]:.1e}  loadavg {min(loads):.2f}-{max(loads):.2f}", flush=True)
        for v in names[1:]:
            same = np.array_equal(logits[names[0]].argmax(1), logits[v].argmax(1))
            ratio = [b / a for a, b in zip(times[names[0]], times[v])]
            print(f"{name:9s} {v}/{names[0]} per round: median {statistics.median(ratio):.3f} (min {min(ratio):.3f}, "
                  f"max {max(ratio):.3f}); same predictions: {same}", flush=True)


if __name__ == "__main__":
    main()
