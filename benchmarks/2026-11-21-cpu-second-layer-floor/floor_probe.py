"""A lower bound on any CPU kernel's time for the second layers at B = 10000 with a fresh output, against torch.

    python benchmarks/2026-11-21-cpu-second-layer-floor/floor_probe.py [--repeat 5] > floor_probe.txt

For each many-channel preset layer (the four where issue 4's 2x goal is missed), on torch's threads (2 here):
- fault_ms: the cost of first-touching a fresh output of the layer's size, paid by any implementation that
  returns a fresh tensor: a 2-thread ``fill_`` of a fresh ``torch.empty`` minus the same fill of an already
  touched buffer (so the stores themselves, which a kernel overlaps with its arithmetic, are not counted).
- compute_ms: the layer's FLOPs at the FMA peak measured in this process (probes.fma_peak_gflops, the best of
  repeated runs of 12 independent 16-lane FMA chains per thread): no kernel does its arithmetic faster.
- floor_ms = fault_ms + compute_ms; the two are serial on the same cores (faults are kernel work on the
  faulting thread). torch_ms and cpu-parallel's ms in the same process, medians of ``--repeat`` calls.
2x torch needs ms <= torch_ms / 2; where floor_ms is above that, no implementation with a fresh output can.
"""
import argparse
import statistics
import time

import torch

from convforge import conv
from convforge.harness.probes import fma_peak_gflops
from convforge.models import ConvShape

LAYERS = {"sp18 L2": (16, 6, 30, 30, 5), "sp19 L2": (16, 6, 22, 22, 5), "fa18 L2": (24, 12, 33, 33, 7),
          "fa20 L2": (16, 4, 40, 40, 7)}


def median_ms(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--batch", type=int, default=10000)
    a = p.parse_args()
    threads = torch.get_num_threads()
    peak = fma_peak_gflops(threads)
    print(f"threads {threads}, FMA peak {peak:.0f} GFLOP/s, torch {torch.__version__}, B = {a.batch}", flush=True)
    print("| layer | output MB | fault ms | compute ms at FMA peak | floor ms | torch ms | torch / 2 | "
          "cpu-parallel ms | floor <= torch / 2 |")
    print("|---|---|---|---|---|---|---|---|---|")
    parallel = conv.get("cpu-parallel")
    g = torch.Generator().manual_seed(0)
    for label, (M, C, H, W, K) in LAYERS.items():
        shape = ConvShape(a.batch, M, C, H, W, K)
        ho, wo = shape.out_hw
        out_elems = a.batch * M * ho * wo
        touched = torch.zeros(out_elems)
        fresh_ms = median_ms(lambda: torch.empty(out_elems).fill_(1.0), a.repeat)
        warm_ms = median_ms(lambda: touched.fill_(1.0), a.repeat)
        fault_ms = fresh_ms - warm_ms
        compute_ms = shape.flops / (peak * 1e9) * 1e3
        x = torch.rand(a.batch, C, H, W, generator=g) * 255
        w = torch.randn(M, C, K, K, generator=g) * 0.05
        torch_ms = median_ms(lambda: torch.nn.functional.conv2d(x, w), a.repeat)
        fn = parallel.prepare(w, None)
        fn(x[:32])
        ours_ms = median_ms(lambda: fn(x), a.repeat)
        floor = fault_ms + compute_ms
        print(f"| {label} | {4 * out_elems / 1e6:.0f} | {fault_ms:.1f} | {compute_ms:.1f} | {floor:.1f} | "
              f"{torch_ms:.1f} | {torch_ms / 2:.1f} | {ours_ms:.1f} | {'yes' if floor <= torch_ms / 2 else 'no'} |",
              flush=True)
        del touched, x


if __name__ == "__main__":
    main()
