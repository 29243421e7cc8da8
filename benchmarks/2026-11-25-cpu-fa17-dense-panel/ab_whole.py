"""Whole-network A/B in one process: the CPU engine (cpu-parallel, the arena) with main's dense layers (v2,
dense_v2.py here) and with this branch's (v3: packed stripes), the two engines called in turn round after
round on the same images (random 0..255 pixels; the time does not depend on them), so that load from other
work on the machine hits both alike. Median and min of the rounds, the 1-minute loadavg, and the two engines'
logits against each other and against the float64 reference on the first 64 images.

    PYTHONPATH=. python3 benchmarks/2026-11-25-cpu-fa17-dense-panel/ab_whole.py [--presets fa17-high fa18]
        [--images 10000] [--rounds 7]
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dense_v2  # noqa: E402
from convforge import cpu_dense  # noqa: E402
from convforge.engine import Engine  # noqa: E402
from convforge.harness.check import relative_error  # noqa: E402
from convforge.models import forward_with, load_preset  # noqa: E402


def engine_with(network, dense_class):
    saved = cpu_dense.DenseLayer
    cpu_dense.DenseLayer = dense_class
    try:
        return Engine(network, impl="cpu-parallel", device="cpu")
    finally:
        cpu_dense.DenseLayer = saved


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", nargs="*", default=["fa17-high", "fa18"])
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"whole-network A/B, {args.images} images, threads={args.threads}, rounds={args.rounds}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, loadavg {open('/proc/loadavg').read().strip()}")
    for name in args.presets:
        network = load_preset(name)
        engines = {"v2": engine_with(network, dense_v2.DenseLayer), "v3": engine_with(network, cpu_dense.DenseLayer)}
        assert type(engines["v2"].steps[-1].dense) is dense_v2.DenseLayer
        assert type(engines["v3"].steps[-1].dense) is cpu_dense.DenseLayer
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
        same = np.array_equal(logits["v2"].argmax(1), logits["v3"].argmax(1))
        for v in engines:
            print(f"{name:9s} {v}: median {statistics.median(times[v]) * 1e3:8.1f} ms  min {min(times[v]) * 1e3:8.1f} ms"
                  f"  err {errs[v]:.1e}  loadavg {min(loads):.2f}-{max(loads):.2f}", flush=True)
        ratio = [b / a for a, b in zip(times["v2"], times["v3"])]
        print(f"{name:9s} v3/v2 per round: median {statistics.median(ratio):.3f} (min {min(ratio):.3f}, "
              f"max {max(ratio):.3f}); same predictions: {same}", flush=True)


if __name__ == "__main__":
    main()
