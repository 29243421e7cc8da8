"""Where the one-channel first convolutions (fused with activation + 2x2 max pool) spend their time: the
kernel as main generates it (full) against variants of its generated source, compiled apart and called in
turn on the same images into the same output: without the activation (noact), without the pool + activation
(nopool: the band's conv rows are not pooled), without the input transposes (noin: the tiles read whatever
the scratch holds), without the write-back (noout), every group's write-back into the first group's
images (ysame: the stores hit the cache), and the tiles alone (tiles: no transposes, no pool, no
write-back). Timings only: the variants compute wrong results on purpose. B images, 1 thread by default.

    PYTHONPATH=. python3 benchmarks/2026-11-25-cpu-first-conv-one-channel/decompose.py [--batch 1024] [--rounds 9]
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
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", nargs="*", default=list(LAYERS))
    ap.add_argument("--pooled", action="store_true", help="the pooled tile (this branch's default) instead of "
                    "main's band + pool pass; no nopool variant then")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    peak = probes.fma_peak_gflops(args.threads, 0.3)
    print(f"decompose, B={args.batch}, threads={args.threads}, FMA peak {peak:.1f} GFLOP/s, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, loadavg {open('/proc/loadavg').read().strip()}")
    for name in args.layers:
        M, K, H, act = LAYERS[name]
        if args.pooled:
            MB, TW = cp.choose_pooled(M)
            src, noact = cp.kernel_source(K, MB, 2, act, TW, 16, True), cp.kernel_source(K, MB, 2, 0, TW, 16, True)
        else:
            MB, TW = cp.choose_block(M, K), cp.choose_width(cp.choose_block(M, K))
            src, noact = cp.kernel_source(K, MB, 2, act), cp.kernel_source(K, MB, 2, 0)
        repack = "            for c in range(C):                    # each channel's plane"
        pool = "                for ph in range((h1 - h0) // 2):"
        back = "                for mm in range(min("
        for needle in (repack, back) if args.pooled else (repack, pool, back):
            assert src.count(needle) == 1, needle
        off = lambda s, n: s.replace(n, n.replace("range(", "range(0 * ", 1))
        variants = {"full": src, "noact": noact, "nopool": off(src, pool),
                    "noin": off(src, repack), "noout": off(src, back),
                    "tiles": off(off(off(src, repack), pool), back),
                    "ysame": src.replace("first = (b0 * M", "first = (0 * M")}
        if args.pooled:
            del variants["nopool"]
            variants["tiles"] = off(off(src, repack), back)
        kernels = {v: jit_generated(f"decomp_{v}_k{K}_mb{MB}_tw{TW}", s, "conv", nogil=True, fastmath={"contract"})
                   for v, s in variants.items()}
        rng = np.random.default_rng(0)
        x = rng.integers(0, 256, (args.batch, 1, H, H)).astype(np.float32)
        Mp = -(-M // MB) * MB
        w = rng.standard_normal((Mp, 1, K, K)).astype(np.float32) * 0.01
        b = np.zeros(Mp, np.float32)
        Ho = H - K + 1
        y = np.empty((args.batch, M, Ho // 2, Ho // 2), np.float32)
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
        for _ in range(args.rounds):
            for v, fn in kernels.items():
                t0 = time.perf_counter()
                call(fn)
                times[v].append(time.perf_counter() - t0)
        flops = 2 * args.batch * M * Ho * Ho * K * K
        full = statistics.median(times["full"])
        row = "  ".join(f"{v} {statistics.median(t) * 1e3:6.2f} ms ({statistics.median(t) / full:4.2f})"
                        for v, t in times.items())
        print(f"{name}: MB={MB} TW={TW}{' pooled tile' if args.pooled else ''}  full {flops / full / 1e9:6.1f} GFLOP/s "
              f"({100 * flops / full / 1e9 / peak:3.0f} % of peak)  {row}  loadavg "
              f"{open('/proc/loadavg').read().split()[0]}", flush=True)


if __name__ == "__main__":
    main()
