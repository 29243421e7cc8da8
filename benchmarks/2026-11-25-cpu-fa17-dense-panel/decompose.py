"""Where fa17's 7200 -> 500 dense layer spends its time, one thread (the other core left to the machine's other
work): this branch's kernel (full) against variants of its generated source, each compiled apart and called in
turn: without the pack (nopack: the tiles read whatever the scratch holds), the pack alone (packonly: no tile
calls), and W's slice fixed at the first (noW: every slice's tiles read the same, L2-resident slice of W; with
and without the pack); and the bare tile (tile: the 8 x 3 register tile run over L1/L2-resident packed data,
11 groups of panels) next to the FMA peak probe. Timings only: the variants compute wrong sums on purpose.

    PYTHONPATH=. python3 benchmarks/2026-11-25-cpu-fa17-dense-panel/decompose.py [--batch 384] [--rounds 9]
"""
import argparse
import statistics
import time

import numba
import numpy as np
import torch

from convforge import cpu_dense
from convforge.conv.cpu_loops import jit_generated
from convforge.harness import probes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=384)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    torch.set_num_threads(1)
    B, K, N = args.batch, 7200, 500
    src = cpu_dense.kernel_source(0)
    pack_loop = "            for t in range(stripes):\n                base"
    tile_loop = "                    for g in range(groups):"
    w_slice = "tile(xp, x0, wp, (g * K + k0) * gw,"
    for needle in (pack_loop, tile_loop, w_slice):
        assert src.count(needle) == 1, needle
    variants = {
        "full": src,
        "nopack": src.replace(pack_loop, pack_loop.replace("range(stripes)", "range(0)")),
        "packonly": src.replace(tile_loop, tile_loop.replace("range(groups)", "range(0)")).replace("if rem ==", "if rem == -"),
        "noW": src.replace(w_slice, "tile(xp, x0, wp, (g * K) * gw,"),
    }
    variants["nopack_noW"] = variants["nopack"].replace(w_slice, "tile(xp, x0, wp, (g * K) * gw,")
    x = np.random.default_rng(0).standard_normal((B, K), dtype=np.float32)
    layer = cpu_dense.DenseLayer(torch.randn(N, K), torch.randn(N), None)
    out = np.empty((B, layer.np), np.float32)
    kernels = {name: jit_generated("decompose_" + name, s, "dense", nogil=True, fastmath={"contract"})
               for name, s in variants.items()}

    R, P, S = cpu_dense.MR, cpu_dense.PR, cpu_dense.stripe_of(cpu_dense.MR)
    tile = cpu_dense.dense_tile(R, 0, P, S)

    @numba.njit(nogil=True, fastmath={"contract"})
    def bare(xp, wp, bias, c, kc, reps, groups):
        for i in range(reps):
            for g in range(groups):
                tile(xp, 0, wp, g * kc * 16 * P, 16 * P, kc, bias, 0, c, 0, 16 * P, 1 if i == 0 else 0, 0, 0, 1)

    kc, groups = cpu_dense.KC, layer.panels // P
    xp = np.random.standard_normal(kc * S).astype(np.float32)
    wp = np.random.standard_normal(kc * 16 * P * groups).astype(np.float32)
    bias, c = np.zeros(16 * P, np.float32), np.zeros(S * 16 * P, np.float32)
    reps = 40
    bare(xp, wp, bias, c, kc, 1, groups)
    times = {name: [] for name in list(kernels) + ["tile"]}
    peaks, loads = [], []
    for name, kernel in kernels.items():
        layer.kernel = kernel
        layer(x, K, out)
    for _ in range(args.rounds):
        loads.append(float(open("/proc/loadavg").read().split()[0]))
        for name, kernel in kernels.items():
            layer.kernel = kernel
            t0 = time.perf_counter()
            layer(x, K, out)
            times[name].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        bare(xp, wp, bias, c, kc, reps, groups)
        times["tile"].append(time.perf_counter() - t0)
        peaks.append(probes.fma_peak_gflops(1, 0.05))
    flops = {name: 2 * B * K * layer.np for name in kernels}
    flops["tile"] = 2 * R * 16 * P * kc * groups * reps
    print(f"fa17 fc1 decomposition, B={B}, 1 thread, rounds={args.rounds}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, loadavg {min(loads):.2f}-{max(loads):.2f}; "
          f"FMA peak probe 1 thread: median {statistics.median(peaks):.1f} GFLOP/s")
    for name, t in times.items():
        print(f"{name:11s} min {min(t) * 1e3:8.2f} ms  median {statistics.median(t) * 1e3:8.2f} ms  "
              f"{flops[name] / min(t) / 1e9:6.1f} GFLOP/s-equivalent (min, padded outputs)")


if __name__ == "__main__":
    main()
