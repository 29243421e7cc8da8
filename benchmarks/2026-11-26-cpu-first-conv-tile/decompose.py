"""Where the one-channel first convolutions spend their time as the engine runs them now (pooled tile, 2x2 pool
and activation in registers, output in the lane layout): the generated kernel (full) against variants of its
source compiled apart and called in turn on the same images into the same output: noact (no activation),
noin (no input transposes: the tiles read whatever the scratch holds), noout (main: no copy of the band of
pooled vectors into y), nopf (main: no PREFETCHW of y's lines), nopfin (this branch: no prefetch of the next
group's input), tiles (all of those off: the register tiles, their pool/activation epilogue and, on this
branch, their stores into y). --module main: main's kernel source (cpu_parallel_main.py here). Timings only: the variants compute wrong results on purpose.

    PYTHONPATH=. python3 benchmarks/2026-11-26-cpu-first-conv-tile/decompose.py [--batch 2048] [--rounds 7] [--threads 2]
"""
import argparse
import statistics
import time

import numpy as np
import torch

from convforge.conv import cpu_parallel as cp
from convforge.conv.cpu_loops import jit_generated
from convforge.harness import probes

LAYERS = {  # name: (M, K, H, activation code)
    "fa17 L1": (50, 5, 28, 1), "sp18 L1": (6, 5, 64, 1), "sp19 L1": (6, 5, 48, 1),
    "fa18 L1": (12, 7, 72, 1), "fa19 L1": (12, 5, 70, 1), "fa20 L1": (4, 7, 86, 2),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", nargs="*", default=list(LAYERS))
    ap.add_argument("--module", choices=["new", "main"], default="new")
    args = ap.parse_args()
    if args.module == "main":
        import os
        import sys
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import cpu_parallel_main
        global cp
        cp = cpu_parallel_main
    torch.set_num_threads(args.threads)
    peak = probes.fma_peak_gflops(args.threads, 0.3)
    print(f"decompose ({args.module}), B={args.batch}, threads={args.threads}, FMA peak {peak:.1f} GFLOP/s, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, loadavg {open('/proc/loadavg').read().strip()}")
    for name in args.layers:
        M, K, H, act = LAYERS[name]
        MB, TW = cp.choose_pooled(M)
        src = cp.kernel_source(K, MB, 2, act, TW, 16, True, False, True)
        noact = cp.kernel_source(K, MB, 2, 0, TW, 16, True, False, True)
        repack = "            for c in range(C):                    # each channel's plane"
        back = "                for mm in range(min({MB}, M - m0)):\n                    first".replace("{MB}", str(MB))
        pf = "                    if True:\n"
        pfin = "                    if g + 1 < g1 and nb == 16:\n"
        off = lambda s, n: (s.replace(n, n.replace("range(", "range(0 * ", 1)) if "range(" in n else
                            s.replace(n, n.replace("True", "False").replace("if g + 1", "if False and g + 1")))
        variants = {"full": src, "noact": noact, "noin": off(src, repack)}
        tiles = off(src, repack)
        for label, needle in (("noout", back), ("nopf", pf), ("nopfin", pfin)):
            if src.count(needle) == 1:      # main's kernel has the copy and the PREFETCHW, this branch's the input prefetch
                variants[label] = off(src, needle)
                tiles = off(tiles, needle)
        variants["tiles"] = tiles
        kernels = {v: jit_generated(f"decomp26_{args.module}_{v}_k{K}_mb{MB}_tw{TW}_a{act}", s, "conv", nogil=True, fastmath={"contract"})
                   for v, s in variants.items()}
        rng = np.random.default_rng(0)
        x = rng.integers(0, 256, (args.batch, 1, H, H)).astype(np.float32)
        Mp = -(-M // MB) * MB
        w = rng.standard_normal((Mp, 1, K, K)).astype(np.float32) * 0.01
        b = np.zeros(Mp, np.float32)
        Ho = H - K + 1
        y = np.empty(cp.lane_shape(args.batch, (M, Ho // 2, Ho // 2)), np.float32)
        groups = -(-args.batch // 16)
        items = cp.work_items(groups, Mp // MB, args.threads)

        def call(fn):
            if len(items) == 1:
                fn(x, w, b, y, M, *items[0])
            else:
                for f in [cp._pool(args.threads).submit(fn, x, w, b, y, M, *it) for it in items]:
                    f.result()
        for fn in kernels.values():
            call(fn)
        times = {v: [] for v in kernels}
        order = list(kernels)
        for r in range(args.rounds):
            for v in (order if r % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                call(kernels[v])
                times[v].append(time.perf_counter() - t0)
        flops = 2 * args.batch * M * Ho * Ho * K * K
        full = statistics.median(times["full"])
        row = "  ".join(f"{v} {statistics.median(t) * 1e3:6.2f} ms ({statistics.median([a / b for a, b in zip(t, times['full'])]):4.2f})"
                        for v, t in times.items())
        print(f"{name}: MB={MB} TW={TW}  full {flops / full / 1e9:6.1f} GFLOP/s ({100 * flops / full / 1e9 / peak:3.0f} % of peak)"
              f"  {row}  loadavg {open('/proc/loadavg').read().split()[0]}", flush=True)


if __name__ == "__main__":
    main()
