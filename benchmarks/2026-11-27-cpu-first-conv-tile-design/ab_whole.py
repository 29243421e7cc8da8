"""Whole-network A/B in one process: the CPU engine (Engine.run on the Fashion-MNIST test images, 2 threads)
built with cpu_parallel's flags set per variant while it is built (ab_layers.py's names: narrow, wide, fin,
wide-fin), the engines called in turn round after round, the order reversed every round, an FMA probe
(fma_peak_gflops, 2 threads, 0.2 s) after every round. Per variant: median / min of the total time and of the
first conv's Op Time, the per-round ratio to the first variant (median, min-max), the first conv's share of the
probe median, predictions against the first variant's on every image, accuracy; per preset the loadavg range and
the steal share of /proc/stat over its rounds.

    PYTHONPATH=. python3 benchmarks/2026-11-27-cpu-first-conv-tile-design/ab_whole.py [--presets sp18 sp19]
        [--variants narrow wide fin wide-fin] [--rounds 7] [--images 10000]
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_layers import FLAGS  # noqa: E402

from convforge import data  # noqa: E402
from convforge.conv import cpu_parallel  # noqa: E402
from convforge.engine import Engine  # noqa: E402
from convforge.harness.probes import fma_peak_gflops  # noqa: E402
from convforge.models import load_preset  # noqa: E402


def cpu_times():
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:]]


def build(network, variant):
    flags = FLAGS[variant]
    saved = {k: getattr(cpu_parallel, k) for k in flags}
    for k, v in flags.items():
        setattr(cpu_parallel, k, v)
    try:
        return Engine(network, impl="cpu-parallel", device="cpu")
    finally:
        for k, v in saved.items():
            setattr(cpu_parallel, k, v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", nargs="*", default=["fa17-high", "sp18", "sp19", "fa18", "fa19", "fa20"])
    ap.add_argument("--variants", nargs="*", default=["narrow", "wide", "wide-fin"])
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
        for v, e in engines.items():     # what each engine's first step was built with
            fn = e.steps[0].conv_fn
            print(f"  {v}: first step raw uint8 input {e.steps[0].raw_input}, pooled tile without the NaN fix-up "
                  f"{getattr(fn, 'finite_raw', None)}, tile (MB, TW) {cpu_parallel.choose_pooled(network.architecture.conv_shapes(1)[0].M, wide=FLAGS[v]['WIDE_POOLED_TILES'])}")
        results = {v: e.run(ds.images, ds.labels) for v, e in engines.items()}   # warm-up
        times = {v: [] for v in engines}
        first = {v: [] for v in engines}
        loads, peaks = [], []
        s0 = cpu_times()
        for r in range(args.rounds):
            loads.append(float(open("/proc/loadavg").read().split()[0]))
            for v in (args.variants if r % 2 == 0 else args.variants[::-1]):
                res = engines[v].run(ds.images, ds.labels)
                times[v].append(res.total_time_s)
                first[v].append(res.layers[0].op_time_s)
                results[v] = res
            peaks.append(fma_peak_gflops(args.threads, 0.2) or float("nan"))
        d = [b - a for a, b in zip(s0, cpu_times())]
        steal = d[7] / max(1, sum(d[:8]))
        pk = statistics.median(peaks)
        flops = results[args.variants[0]].layers[0].shape.flops     # the first conv's (pool and activation: 0)
        base = args.variants[0]
        for v in args.variants:
            ratio = [t / u for t, u in zip(times[v], times[base])]
            fratio = [t / u for t, u in zip(first[v], first[base])]
            same = np.array_equal(results[v].predictions, results[base].predictions)
            fm = statistics.median(first[v])
            print(f"{name:9s} {v:8s} total median {statistics.median(times[v]) * 1e3:7.1f} ms min {min(times[v]) * 1e3:7.1f}"
                  f"  x{statistics.median(ratio):.3f} (min {min(ratio):.3f}, max {max(ratio):.3f})  first conv median "
                  f"{fm * 1e3:6.1f} ms ({100 * flops / fm / 1e9 / pk:.0f} % of probe {pk:.1f}) x{statistics.median(fratio):.3f}"
                  f"  accuracy {results[v].correctness:.4f}  predictions {'identical' if same else 'DIFFER'}  loadavg "
                  f"{min(loads):.2f}-{max(loads):.2f}  steal {100 * steal:.1f} %", flush=True)


if __name__ == "__main__":
    main()
