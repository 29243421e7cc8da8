"""Whole-network A/B in one process: the CPU engine (cpu-parallel + the arena, Engine.run on the Fashion-MNIST
test images, course-resized per preset) built with main's cpu_parallel (cpu_parallel_main.py here, frozen at
b9110f6, swapped in for convforge.conv.cpu_parallel while that engine is built) and with this branch's, in
variants of its flags (set while built); the engines called in turn round after round, alternating the order,
so that load from other work hits all alike. Per variant: median / min of Engine.run's total time and of the
first conv's Op Time, the per-round ratio to main, predictions against main's on all images, accuracy; per
preset the loadavg range and the steal share of /proc/stat over its rounds.

    PYTHONPATH=. python3 benchmarks/2026-11-26-cpu-first-conv-tile/ab_whole.py [--presets sp18 sp19] [--rounds 7]
        [--variants main new nt]
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_parallel_main  # noqa: E402

import convforge.conv  # noqa: E402
from convforge import data  # noqa: E402
from convforge.conv import cpu_parallel  # noqa: E402
from convforge.engine import Engine  # noqa: E402
from convforge.models import load_preset  # noqa: E402

VARIANTS = {"main": (cpu_parallel_main, {}), "new": (cpu_parallel, {}),
            "nt": (cpu_parallel, {"STREAM_OUTPUT": True}), "regular": (cpu_parallel, {"STREAM_OUTPUT": False}),
            "pf": (cpu_parallel, {"PREFETCH_OUTPUT": True, "STREAM_OUTPUT": False}),
            "pfin": (cpu_parallel, {"PREFETCH_INPUT": True, "STREAM_OUTPUT": False}),
            "nt-pfin": (cpu_parallel, {"PREFETCH_INPUT": True, "STREAM_OUTPUT": True})}


def cpu_times():
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:]]


def build(network, variant):
    module, flags = VARIANTS[variant]
    saved = {k: getattr(module, k) for k in flags}
    for k, v in flags.items():
        setattr(module, k, v)
    convforge.conv.cpu_parallel = module
    try:
        return Engine(network, impl="cpu-parallel", device="cpu")
    finally:
        convforge.conv.cpu_parallel = cpu_parallel
        for k, v in saved.items():
            setattr(module, k, v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", nargs="*", default=["fa17-high", "sp18", "sp19", "fa18", "fa19", "fa20"])
    ap.add_argument("--variants", nargs="*", default=["main", "new"])
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"whole-network A/B (Engine.run, Fashion-MNIST test), {args.images} images, threads={args.threads}, "
          f"rounds={args.rounds}, {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, "
          f"loadavg {open('/proc/loadavg').read().strip()}")
    for name in args.presets:
        network = load_preset(name)
        ds = data.load("test", network.architecture.input_size, args.images)
        engines = {v: build(network, v) for v in args.variants}
        results = {v: e.run(ds.images, ds.labels) for v, e in engines.items()}   # warm-up
        times = {v: [] for v in engines}
        first = {v: [] for v in engines}
        loads = []
        s0 = cpu_times()
        for r in range(args.rounds):
            loads.append(float(open("/proc/loadavg").read().split()[0]))
            for v in (args.variants if r % 2 == 0 else args.variants[::-1]):
                res = engines[v].run(ds.images, ds.labels)
                times[v].append(res.total_time_s)
                first[v].append(res.layers[0].op_time_s)
                results[v] = res
        d = [b - a for a, b in zip(s0, cpu_times())]
        steal = d[7] / max(1, sum(d[:8]))
        base = args.variants[0]
        for v in args.variants:
            ratio = [t / u for t, u in zip(times[v], times[base])]
            same = np.array_equal(results[v].predictions, results[base].predictions)
            print(f"{name:9s} {v:8s} total median {statistics.median(times[v]) * 1e3:7.1f} ms min {min(times[v]) * 1e3:7.1f}"
                  f"  first conv median {statistics.median(first[v]) * 1e3:6.1f} ms  x{statistics.median(ratio):.3f} "
                  f"(min {min(ratio):.3f}, max {max(ratio):.3f})  accuracy {results[v].correctness:.4f}  "
                  f"predictions {'identical' if same else 'DIFFER'}  loadavg {min(loads):.2f}-{max(loads):.2f}  "
                  f"steal {100 * steal:.1f} %", flush=True)


if __name__ == "__main__":
    main()
