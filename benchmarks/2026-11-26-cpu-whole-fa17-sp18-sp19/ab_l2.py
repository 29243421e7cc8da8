"""Per-layer A/B of the unpooled second convs (lane layout in and out, as the CPU engine calls them; B = 2048,
2 threads): the band + copy into y (DIRECT_STORES off, main's kernel) against the tiles storing into y
(DIRECT_STORES on), called in turn, the order alternating per round; per-round ratio, median. Outputs compared
bitwise; the FMA peak probed (0.2 s) after every round.

    PYTHONPATH=. python3 benchmarks/2026-11-26-cpu-whole-fa17-sp18-sp19/ab_l2.py [--rounds 15]
"""
import argparse
import statistics
import time

import torch

from convforge.conv import cpu_parallel as cp
from convforge.harness.probes import fma_peak_gflops

LAYERS = {"sp18 L2": (6, 16, 30, 5), "sp19 L2": (6, 16, 22, 5), "fa18 L2": (12, 24, 33, 7),
          "fa19 L2": (12, 24, 33, 5)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--layers", nargs="*", default=list(LAYERS))
    args = ap.parse_args()
    torch.set_num_threads(2)
    print(f"unpooled second convs, lanes in/out, B={args.batch}, 2 threads, {args.rounds} rounds, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, loadavg {open('/proc/loadavg').read().strip()}")
    for name in args.layers:
        C, M, H, K = LAYERS[name]
        torch.manual_seed(0)
        w, b = torch.randn(M, C, K, K) * 0.1, torch.randn(M)
        rows = args.batch
        x = torch.randn(cp.lane_shape(rows, (C, H, H)))
        fns, outs = {}, {}
        for v, d in (("band", False), ("direct", True)):
            cp.DIRECT_STORES = d
            fns[v] = cp.prepare_lanes(w, b, True, True)
            outs[v] = torch.full(cp.lane_shape(rows, (M, H - K + 1, H - K + 1)), float("nan"))
            fns[v](x, outs[v], rows)
        cp.DIRECT_STORES = True
        same = torch.equal(outs["band"], outs["direct"])
        flops = 2 * rows * M * C * K * K * (H - K + 1) ** 2
        t = {v: [] for v in fns}
        peaks = []
        loads = []
        for r in range(args.rounds):
            loads.append(float(open("/proc/loadavg").read().split()[0]))
            for v in (("band", "direct") if r % 2 == 0 else ("direct", "band")):
                best = 1e9
                for _ in range(3):
                    t0 = time.perf_counter()
                    fns[v](x, outs[v], rows)
                    best = min(best, time.perf_counter() - t0)
                t[v].append(best)
            peaks.append(fma_peak_gflops(2, 0.2) or float("nan"))
        ratio = [a / b_ for a, b_ in zip(t["direct"], t["band"])]
        pk = statistics.median(peaks)
        print(f"{name}: band {statistics.median(t['band']) * 1e3:6.2f} ms ({flops / statistics.median(t['band']) / 1e9:5.1f} GFLOP/s)"
              f"  direct {statistics.median(t['direct']) * 1e3:6.2f} ms ({flops / statistics.median(t['direct']) / 1e9:5.1f} GFLOP/s)"
              f"  direct/band per round median {statistics.median(ratio):.3f} (min {min(ratio):.3f}, max {max(ratio):.3f})"
              f"  FMA probe median {pk:.1f} (max {max(peaks):.1f})  direct at {100 * flops / statistics.median(t['direct']) / 1e9 / pk:.0f} % of it"
              f"  outputs bitwise {'identical' if same else 'DIFFER'}  loadavg {min(loads):.2f}-{max(loads):.2f}", flush=True)


if __name__ == "__main__":
    main()
