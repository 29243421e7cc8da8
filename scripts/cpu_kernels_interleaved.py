"""Interleaved CPU timing of the CPU convolutions (cpu-loops, cpu-parallel, cpu-gemm) against torch's F.conv2d.

A development tool, not the benchmark of record (that is ``convforge bench``): a quick comparison used while
writing the CPU kernels (it was benchmarks/cpu_kernels_scratch.py until the benchmarks/ reorganisation).
Every layer of every preset at B = 10000 by default; the implementations are called in turn, round after round
(so that load from other work on the machine hits them alike), without ``out`` as the
engine calls them; median wall time (perf_counter) and median CPU time of the process (process_time,
all threads) per implementation, and the speedup of each over torch in both. On a machine shared with
other work compare the minima too, and prefer ``convforge bench`` (back-to-back calls) for records.
Output allocation matters on this machine: at B = 10000 the first-touch page faults of each fresh
output cost about as much as the convolution; THP_MEM_ALLOC_ENABLE=1 (transparent huge pages for
torch's allocations, which all these implementations use) makes them cheap for every implementation.

    python scripts/cpu_kernels_interleaved.py [--impl torch cpu-parallel cpu-gemm] [--layer fa17:1 sp18:2]
        [--batch 10000] [--rounds 5] [--threads 2] [--out] [--check]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's convforge, not another install


def all_layers(batch: int) -> dict:
    from convforge.models import PRESETS
    layers = {}
    for name, preset in PRESETS.items():
        for i, shape in enumerate(preset.architecture.conv_shapes(batch), start=1):
            layers.setdefault(f"{name.split('-')[0]}:{i}", shape)
    return layers


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", nargs="+", default=["torch", "cpu-parallel", "cpu-gemm"])
    parser.add_argument("--layer", nargs="+", default=None, help="e.g. fa17:1 sp18:2 (default: all)")
    parser.add_argument("--batch", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", action="store_true", help="pass a preallocated out= (default: none, as the engine)")
    parser.add_argument("--check", action="store_true", help="compare with the float64 reference on 4 images")
    parser.add_argument("--bias", action="store_true")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    from convforge import conv
    from convforge.conv.reference import conv2d_float64
    from convforge.harness import check

    layers = all_layers(args.batch)
    print(f"B={args.batch} threads={args.threads} rounds={args.rounds} out={'given' if args.out else 'none'}; "
          "median ms (wall / CPU of all threads)")
    for key in args.layer or list(layers):
        s = layers[key]
        x, w, b = check.random_case((s.B, s.C, s.H, s.W), (s.M, s.C, s.K, s.K), seed=1, bias=args.bias)
        out = torch.empty((s.B, s.M) + s.out_hw) if args.out else None
        fns, prep = {}, {}
        for name in args.impl:
            t0 = time.perf_counter()
            fns[name] = conv.get(name).prepare(w, b)
            prep[name] = time.perf_counter() - t0
            if args.check:
                small = x[:4].contiguous()
                ref = conv2d_float64(small.numpy(), w.numpy(), None if b is None else b.numpy())
                err = check.relative_error(fns[name](small, check.poisoned(ref.shape)), ref)
                print(f"  {key} {name}: relative error {err:.1e}")
            fns[name](x, out)  # warm-up
        wall = {n: [] for n in fns}
        cpu = {n: [] for n in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                gc.collect()
                t0, c0 = time.perf_counter(), time.process_time()
                y = fn(x, out)
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
                del y
        med_w = {n: statistics.median(v) * 1e3 for n, v in wall.items()}
        med_c = {n: statistics.median(v) * 1e3 for n, v in cpu.items()}
        for name in fns:
            line = (f"{key:7s} {str(s):34s} {name:13s} {med_w[name]:8.1f} / {med_c[name]:8.1f} ms "
                    f"(min {min(wall[name]) * 1e3:8.1f})  {s.flops / med_w[name] / 1e6:6.1f} GFLOP/s"
                    f"  prepare {prep[name]:5.2f} s")
            if "torch" in fns and name != "torch":
                line += f"  speedup {med_w['torch'] / med_w[name]:5.2f}x wall, {med_c['torch'] / med_c[name]:5.2f}x cpu"
            print(line, flush=True)
        del x, out, fns


if __name__ == "__main__":
    main()
