"""Experiment (not in the package): the first dense layer reading the lane layout, with both 8-image tiles of a
16-image stripe run back to back per group of W's panels ("pair" order: the group's KC x 48 slice of W read
from L2 once per stripe, the second tile finding it in L1 when it fits with the stripe's inputs, KC = 128:
24 KiB + 8 KiB) against cpu_dense's order (each tile runs over every group: W streamed from L2 per tile), at
KC 256 and 128. B = 2048 in the lane layout (fresh random data, 59-88 MB), 2 threads, cpu_dense's work items;
interleaved rounds, per-round ratio to "cur256"; outputs compared bitwise with it (the KC slicing keeps the
fp32 k-order sum) and with float64.

    PYTHONPATH=. python3 benchmarks/2026-11-26-cpu-whole-fa17-sp18-sp19/ab_dense_pair.py [--rounds 11]
"""
import argparse
import statistics
import time

import numpy as np
import torch
from numba import njit

from convforge import cpu_dense
from convforge.cpu_dense import dense_tile
from convforge.harness.probes import fma_peak_gflops

@njit(inline="always")
def prefetch_share(start, lines, u, nt):
    """As in cpu_dense's generated kernel: tile u of nt's share of ``lines`` cache lines from ``start`` on."""
    chunk = (lines + nt - 1) // nt
    if u * chunk >= lines:
        return start, 1
    return start + u * chunk * 16, min(chunk, lines - u * chunk)


tile = dense_tile(8, 0, 3, 16)
tile_r1 = dense_tile(8, 0, 1, 16)
tile_r2 = dense_tile(8, 0, 2, 16)


def make_pair(KC, NC):
    @njit(nogil=True, fastmath={"contract"})
    def dense(x, ldx, K, wp, bias, c, ldc, panels, r0, r1, xp, cs):
        gw = 48
        groups = panels // 3
        rem = panels - groups * 3
        for b0 in range(r0, r1, NC):
            b1 = min(b0 + NC, r1)
            stripes = (b1 - b0 + 15) // 16
            for k0 in range(0, K, KC):
                kc = min(KC, K - k0)
                first = 1 if k0 == 0 else 0
                last = 1 if k0 + kc >= K else 0
                k0n = 0 if last else k0 + kc
                kcn = min(KC, K - k0n)
                nt = stripes * 2
                for t in range(stripes):
                    for g in range(groups + (1 if rem else 0)):
                        for i in range(2):
                            row = b0 + t * 16 + i * 8
                            x0 = ((b0 // 16 + t) * K + k0) * 16 + i * 8
                            u = t * 2 + i
                            c0 = row * ldc
                            if g < groups:
                                pf, pfn = prefetch_share((g * K + k0n) * gw, kcn * 3, u, nt)
                                tile(x, x0, wp, (g * K + k0) * gw, gw, kc, bias, g * gw, c, c0 + g * gw, ldc, first,
                                     last, pf, pfn, 0, 0)
                            elif rem == 2:
                                pf, pfn = prefetch_share(groups * gw * K + k0n * 32, kcn * 2, u, nt)
                                tile_r2(x, x0, wp, groups * gw * K + k0 * 32, 32, kc, bias, groups * gw, c,
                                        c0 + groups * gw, ldc, first, last, pf, pfn, 0, 0)
                            else:
                                pf, pfn = prefetch_share(groups * gw * K + k0n * 16, kcn, u, nt)
                                tile_r1(x, x0, wp, groups * gw * K + k0 * 16, 16, kc, bias, groups * gw, c,
                                        c0 + groups * gw, ldc, first, last, pf, pfn, 0, 0)
    return dense


LAYERS = {"fa17 fc1": (7200, 500), "sp18 fc1": (10816, 140), "sp19 fc1": (5184, 140)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--layers", nargs="*", default=list(LAYERS))
    args = ap.parse_args()
    torch.set_num_threads(2)
    rows = 2048
    print(f"dense pair order, lanes, B={rows}, 2 threads, {args.rounds} rounds, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, loadavg {open('/proc/loadavg').read().strip()}")
    for name in args.layers:
        k, n = LAYERS[name]
        g = torch.Generator().manual_seed(k)
        w, b = torch.randn(n, k, generator=g) * 0.01, torch.randn(n, generator=g)
        layers = {}
        for v, kc, pair in (("cur256", 256, False), ("cur128", 128, False), ("pair128", 128, True),
                            ("pair256", 256, True)):
            layers[v] = cpu_dense.DenseLayer(w, b, None, blocking=(kc, 192), lanes=True)
            if pair:
                layers[v].kernel = make_pair(kc, layers[v].nc)
        x = torch.randn(rows, k, generator=g)
        lanes = x.reshape(rows // 16, 16, k).permute(0, 2, 1).contiguous().reshape(-1).numpy()
        outs = {v: np.full((rows, cpu_dense.padded(n)), np.nan, np.float32) for v in layers}
        for v in layers:
            layers[v](lanes, k, outs[v])
        ref = torch.nn.functional.linear(x.double(), w.double(), b.double()).numpy()
        errs = {v: float(np.abs(outs[v][:, :n] - ref).max() / np.abs(ref).max()) for v in layers}
        same = {v: bool(np.array_equal(outs[v], outs["cur256"])) for v in layers}
        t = {v: [] for v in layers}
        peaks, loads = [], []
        order = list(layers)
        for r in range(args.rounds):
            loads.append(float(open("/proc/loadavg").read().split()[0]))
            for v in (order if r % 2 == 0 else order[::-1]):
                best = 1e9
                for _ in range(3):
                    t0 = time.perf_counter()
                    layers[v](lanes, k, outs[v])
                    best = min(best, time.perf_counter() - t0)
                t[v].append(best)
            peaks.append(fma_peak_gflops(2, 0.2) or float("nan"))
        flops = 2 * rows * k * n
        pk = statistics.median(peaks)
        for v in layers:
            ratio = [a / c for a, c in zip(t[v], t["cur256"])]
            m = statistics.median(t[v])
            print(f"{name} {v:8s} {m * 1e3:7.2f} ms {flops / m / 1e9:6.1f} GFLOP/s ({100 * flops / m / 1e9 / pk:.0f} % of "
                  f"probe {pk:.1f})  /cur256 per round {statistics.median(ratio):.3f} (min {min(ratio):.3f}, max "
                  f"{max(ratio):.3f})  err {errs[v]:.1e}  bitwise as cur256: {same[v]}  loadavg {min(loads):.2f}-{max(loads):.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
