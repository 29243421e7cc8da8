"""Per-layer A/B of cpu-parallel's register tile on this CPU: each variant's (MB, TW, vector lanes) on the
conv layers of the presets, B images (the CPU engine's chunk), 2 threads, preallocated output; variants
interleaved round by round, median and min of the rounds (the min: the machine is shared); loadavg printed with every layer.

    PYTHONPATH=. python3 benchmarks/2026-11-25-cpu-whole-network-avx2-tiles/ab_layers.py [--layers ...]
"""
import argparse
import statistics
import time

import torch

from convforge import conv
from convforge.conv.reference import conv2d_float64
from convforge.harness.check import relative_error

LAYERS = {  # name: (M, C, H, W, K, activation, pool); pool 0 = unfused
    "sp18-L2": (16, 6, 30, 30, 5, None, 0),
    "sp19-L2": (16, 6, 22, 22, 5, None, 0),
    "fa18-L2": (24, 12, 33, 33, 7, None, 0),
    "fa19-L2": (24, 12, 33, 33, 5, None, 0),
    "fa18-L1": (12, 1, 72, 72, 7, "tanh", 2),
    "fa19-L1": (12, 1, 70, 70, 5, "tanh", 2),
    "fa17-L1": (50, 1, 28, 28, 5, "tanh", 2),
    "sp18-L1": (6, 1, 64, 64, 5, "tanh", 2),
    "sp19-L1": (6, 1, 48, 48, 5, "tanh", 2),
    "fa20-L1": (4, 1, 86, 86, 7, "relu", 2),
    "fa20-L2": (16, 4, 40, 40, 7, "relu", 4),
}


def old_config(maps):
    """The tile before this change on AVX2: MB at most 8, fewest padded maps then largest; TW = 6 // MB;
    16-lane vectors."""
    block = min(range(1, min(8, maps) + 1), key=lambda mb: (-(-maps // mb) * mb, -mb))
    return (block, max(1, 6 // block), 16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", nargs="*", default=list(LAYERS))
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--variants", nargs="*", default=None, help="MB,TW,V triples; 'old' and 'new' (the default choice)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    impl = conv.get("cpu-parallel")
    for name in args.layers:
        M, C, H, W, K, act, pool = LAYERS[name]
        g = torch.Generator().manual_seed(1)
        x = torch.randn(args.batch, C, H, W, generator=g)
        w = torch.randn(M, C, K, K, generator=g) / (C * K * K) ** 0.5
        b = torch.randn(M, generator=g)
        variants = args.variants or ["old", "new"]
        fns = {}
        for v in variants:
            cfg = old_config(M) if v == "old" else None if v == "new" else tuple(int(t) for t in v.split(","))
            fns[v] = (impl.prepare_fused(w, b, act, pool, config=cfg) if pool else impl.prepare(w, b, config=cfg))
        Ho, Wo = H - K + 1, W - K + 1
        out_shape = (args.batch, M, Ho // pool, Wo // pool) if pool else (args.batch, M, Ho, Wo)
        out = torch.empty(out_shape)
        # exactness on a slice against float64
        xs = x[:37]
        ref = torch.from_numpy(conv2d_float64(xs.numpy(), w.numpy(), b.numpy()))
        if pool:
            from convforge.models import ACTIVATIONS
            ref = torch.nn.functional.max_pool2d(ACTIVATIONS[act](ref) if act else ref, pool, pool)
        errs = {v: relative_error(fn(xs), ref.numpy()) for v, fn in fns.items()}
        times = {v: [] for v in variants}
        for v, fn in fns.items():
            fn(x, out)  # warm
        for _ in range(args.rounds):
            for v, fn in fns.items():
                t0 = time.perf_counter()
                fn(x, out)
                times[v].append(time.perf_counter() - t0)
        flops = 2 * args.batch * M * C * K * K * Ho * Wo
        load = open("/proc/loadavg").read().split()[0]
        for v in variants:
            ms, best = statistics.median(times[v]) * 1e3, min(times[v]) * 1e3
            print(f"{name:8s} B={args.batch} {v:>8s}: median {ms:8.2f} ms  min {best:8.2f} ms  "
                  f"{flops / best / 1e6:6.1f} GFLOP/s (min)  err {errs[v]:.1e}  loadavg {load}", flush=True)


if __name__ == "__main__":
    main()
