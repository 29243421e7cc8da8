"""Per-layer A/B in one process: the one-channel first convolutions fused with activation + 2x2 max pool, main's
cpu-parallel (cpu_parallel_main.py here, main at 92b8734) against this branch's, called in turn round after
round on the same random images (0..255) into the same preallocated output (as the engine's arena does).
Before timing, each is checked against the float64 reference (fresh random weights and bias, output
poisoned with NaN). Median of the rounds, the per-round ratio new / main, GFLOP/s, loadavg.

    PYTHONPATH=. python3 benchmarks/2026-11-25-cpu-first-conv-one-channel/ab_layers.py [--batch 2048]
        [--rounds 11] [--threads 2] [--layers "sp18 L1" ...]
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_parallel_main  # noqa: E402
from convforge.conv import cpu_parallel  # noqa: E402
from convforge.harness.check import relative_error  # noqa: E402
from convforge.models import ACTIVATIONS  # noqa: E402

LAYERS = {  # name: (M, K, H, activation)
    "fa17 L1": (50, 5, 28, "tanh"), "sp18 L1": (6, 5, 64, "tanh"), "sp19 L1": (6, 5, 48, "tanh"),
    "fa18 L1": (12, 7, 72, "tanh"), "fa19 L1": (12, 5, 70, "tanh"), "fa20 L1": (4, 7, 86, "relu"),
}


def loadavg():
    return float(open("/proc/loadavg").read().split()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", nargs="*", default=list(LAYERS))
    ap.add_argument("--noprefetch", action="store_true", help="also this branch without PREFETCH_OUTPUT")
    ap.add_argument("--configs", nargs="*", default=[],
                    help="extra pooled-tile variants of this branch, MB,TW (AVX-512 lanes), e.g. 6,2 3,4")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"first-conv A/B, B={args.batch}, threads={args.threads}, rounds={args.rounds}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, loadavg {open('/proc/loadavg').read().strip()}")
    mods = {"main": cpu_parallel_main, "new": cpu_parallel}
    for name in args.layers:
        M, K, H, act = LAYERS[name]
        rng = np.random.default_rng(len(name) + M)
        # correctness: fresh random data, odd batch (a partial group), float64 reference, poisoned output
        n = 37
        xc = torch.from_numpy(rng.integers(0, 256, (n, 1, H, H)).astype(np.float32))
        w = torch.from_numpy(rng.standard_normal((M, 1, K, K)).astype(np.float32) * 0.01)
        b = torch.from_numpy(rng.standard_normal(M).astype(np.float32) * 0.1)
        ref = F.max_pool2d(ACTIVATIONS[act](F.conv2d(xc.double(), w.double(), b.double())), 2, 2).numpy()
        fns = {v: m.prepare_fused(w, b, act, 2) for v, m in mods.items()}
        if args.noprefetch:    # this branch without the PREFETCHW of the output rows
            cpu_parallel.PREFETCH_OUTPUT, saved = False, dict(cpu_parallel._KERNELS)
            cpu_parallel._KERNELS.clear()
            fns["new-nopf"] = cpu_parallel.prepare_fused(w, b, act, 2)
            cpu_parallel.PREFETCH_OUTPUT = True
            cpu_parallel._KERNELS.clear()
            cpu_parallel._KERNELS.update(saved)
        for c in args.configs:
            mb, tw = map(int, c.split(","))
            fns[f"new:{mb}x{tw}"] = cpu_parallel.prepare_fused(w, b, act, 2, config=(mb, tw, 16, True))
        errs = {}
        for v, fn in fns.items():
            out = torch.full(ref.shape, float("nan"))
            fn(xc, out)
            errs[v] = relative_error(out, ref)
            assert errs[v] <= 1e-5, (name, v, errs[v])
        x = torch.from_numpy(rng.integers(0, 256, (args.batch, 1, H, H)).astype(np.float32))
        out = torch.empty((args.batch, M, (H - K + 1) // 2, (H - K + 1) // 2))
        for fn in fns.values():
            fn(x, out)
        times = {v: [] for v in fns}
        loads = []
        for _ in range(args.rounds):
            loads.append(loadavg())
            for v, fn in fns.items():
                t0 = time.perf_counter()
                fn(x, out)
                times[v].append(time.perf_counter() - t0)
        flops = 2 * args.batch * M * (H - K + 1) ** 2 * K * K
        ratios = {v: [b / a for a, b in zip(times["main"], times[v])] for v in fns if v != "main"}
        ratio = ratios["new"]
        q = statistics.quantiles(ratio, n=4)
        extra = "".join(f"  {v}/main {statistics.median(r):.3f}" for v, r in ratios.items() if v != "new")
        if "new-nopf" in times:
            extra += "  new/new-nopf {:.3f}".format(statistics.median([a / b for a, b in zip(times["new"], times["new-nopf"])]))
        cells = "  ".join(f"{v} {statistics.median(t) * 1e3:7.2f} ms ({flops / statistics.median(t) / 1e9:5.1f} GFLOP/s, "
                          f"err {errs[v]:.1e})" for v, t in times.items())
        print(f"{name}: {cells}  new/main per round median {statistics.median(ratio):.3f} "
              f"(quartiles {q[0]:.3f}-{q[2]:.3f}){extra}  loadavg {min(loads):.2f}-{max(loads):.2f}", flush=True)


if __name__ == "__main__":
    main()
