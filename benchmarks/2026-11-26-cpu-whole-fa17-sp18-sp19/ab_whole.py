"""Whole-network A/B in one process: CPU engines (Engine.run on the Fashion-MNIST test images) built with
cpu_parallel's and the engine's flags per variant (VARIANTS: "band" = main's engine, "direct" = the tiles storing
into y's lane layout, "raw" = that + the first conv reading the uint8 images,
"xpf" = + the dense layers prefetching the next stripe's inputs, "small" = + the small output layers as one work
item, "all" = both; missing flags: the module's default), called in turn
round after round, the order alternating; the FMA peak probed (0.2 s, 2 threads) after every round. Per variant:
median total, per-round ratio to the first variant, per-step split (convs' Op Time; dense layers timed around
their calls; "glue" = total minus the steps: the input copy, argmax, Python), each step's GFLOP/s and its % of
the round's probe; predictions compared.

    PYTHONPATH=. python3 benchmarks/2026-11-26-cpu-whole-fa17-sp18-sp19/ab_whole.py [--presets sp18 sp19 fa17-high]
        [--rounds 7] [--variants band direct raw]
"""
import argparse
import statistics
import time

import numpy as np
import torch

from convforge import data
from convforge import cpu_dense, engine as engine_module
from convforge.conv import cpu_parallel
from convforge.engine import Engine
from convforge.harness.probes import fma_peak_gflops
from convforge.models import load_preset

VARIANTS = {"band": {"DIRECT_STORES": False, "RAW_INPUT": False, "X_PREFETCH": False, "SMALL_WORK": 0},  # main
            "direct": {"DIRECT_STORES": True, "RAW_INPUT": False, "X_PREFETCH": False, "SMALL_WORK": 0},  # 9bedcaf
            "raw": {"DIRECT_STORES": True, "RAW_INPUT": True,        # + the first conv reads the uint8 images
                    "X_PREFETCH": False, "SMALL_WORK": 0},
            "xpf": {"DIRECT_STORES": True, "RAW_INPUT": True,        # + the dense layers prefetch the next
                    "X_PREFETCH": True, "SMALL_WORK": 0},            # stripe's inputs
            "small": {"DIRECT_STORES": True, "RAW_INPUT": True,      # + the small output layers as one item
                      "X_PREFETCH": False, "SMALL_WORK": 1 << 25},
            "all": {"DIRECT_STORES": True, "RAW_INPUT": True, "X_PREFETCH": True, "SMALL_WORK": 1 << 25}}


class Timed:
    """Wraps a dense layer's __call__, summing its seconds."""

    def __init__(self, dense):
        self.dense, self.seconds = dense, 0.0
        self.n, self.k, self.np = dense.n, dense.k, dense.np

    def __call__(self, *a):
        t0 = time.perf_counter()
        out = self.dense(*a)
        self.seconds += time.perf_counter() - t0
        return out


def build(network, variant):
    flags = VARIANTS[variant]
    where = {k: (engine_module if k == "RAW_INPUT" else cpu_dense if k in ("X_PREFETCH", "SMALL_WORK")
                 else cpu_parallel) for k in flags}
    saved = {k: getattr(where[k], k) for k in flags}
    for k, v in flags.items():
        setattr(where[k], k, v)
    try:
        engine = Engine(network, impl="cpu-parallel", device="cpu")
    finally:
        for k, v in saved.items():
            setattr(where[k], k, v)
    for step in engine.steps:
        if step.dense is not None:
            step.dense = Timed(step.dense)
    return engine


def step_flops(engine, n):
    out = []
    for step in engine.steps:
        if step.result is not None:
            s = step.result.shape
            out.append(("conv", 2 * n * s.M * s.C * s.K * s.K * (s.H - s.K + 1) * (s.W - s.K + 1)))
        elif step.dense is not None:
            out.append(("dense", 2 * n * step.dense.k * step.dense.n))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", nargs="*", default=["sp18", "sp19", "fa17-high"])
    ap.add_argument("--variants", nargs="*", default=["band", "direct"])
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(2)
    print(f"whole-network A/B (Engine.run, Fashion-MNIST test), {args.images} images, threads=2, rounds={args.rounds}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, loadavg {open('/proc/loadavg').read().strip()}")
    for name in args.presets:
        network = load_preset(name)
        ds = data.load("test", network.architecture.input_size, args.images)
        engines = {v: build(network, v) for v in args.variants}
        results = {v: e.run(ds.images, ds.labels) for v, e in engines.items()}   # warm-up
        times = {v: [] for v in engines}
        steps = {v: [] for v in engines}
        peaks, loads = [], []
        for r in range(args.rounds):
            loads.append(float(open("/proc/loadavg").read().split()[0]))
            for v in (args.variants if r % 2 == 0 else args.variants[::-1]):
                e = engines[v]
                for s in e.steps:
                    if s.dense is not None:
                        s.dense.seconds = 0.0
                res = e.run(ds.images, ds.labels)
                times[v].append(res.total_time_s)
                per = [s.result.op_time_s if s.result is not None else s.dense.seconds
                       for s in e.steps if s.result is not None or s.dense is not None]
                steps[v].append(per + [res.total_time_s - sum(per)])
                results[v] = res
            peaks.append(fma_peak_gflops(2, 0.2) or float("nan"))
        base = args.variants[0]
        pk = statistics.median(peaks)
        total_flops = sum(f for _, f in step_flops(engines[base], args.images))
        for v in args.variants:
            ratio = [t / u for t, u in zip(times[v], times[base])]
            same = np.array_equal(results[v].predictions, results[base].predictions)
            med = statistics.median(times[v])
            print(f"{name:9s} {v:7s} total median {med * 1e3:7.1f} ms min {min(times[v]) * 1e3:7.1f}  x{statistics.median(ratio):.3f} "
                  f"(min {min(ratio):.3f}, max {max(ratio):.3f})  {total_flops / med / 1e9:5.1f} GFLOP/s = {100 * total_flops / med / 1e9 / pk:.0f} % "
                  f"of the probe median {pk:.1f} (max {max(peaks):.1f})  accuracy {results[v].correctness:.4f}  "
                  f"predictions {'identical' if same else 'DIFFER'}  loadavg {min(loads):.2f}-{max(loads):.2f}", flush=True)
            cols = list(zip(*steps[v]))
            parts = []
            for (kind, f), c in zip(step_flops(engines[v], args.images) + [("glue", 0)], cols):
                m = statistics.median(c)
                parts.append(f"{kind} {m * 1e3:.1f} ms" + (f" ({f / m / 1e9:.0f} GFLOP/s, {100 * f / m / 1e9 / pk:.0f} %)" if f else ""))
            print(f"{'':9s} {v:7s} split: " + "; ".join(parts), flush=True)


if __name__ == "__main__":
    main()
