"""Per-layer A/B of cpu-parallel variants in one process, as the CPU engine calls its layers (the engine's chunk of
2048 images, 2 threads, preallocated outputs): called in turn round after round on the same input, the per-round
ratio to the first variant, its median and quartiles, with the 1-minute loadavg. Every variant is first checked
against float64 on 37 images (a partial group), NaN-poisoned output.

Variants: main (x and y as (B, C, H, W), overlapping last tiles: main's kernels), lanes (x and/or y in the lane
layout where the engine now uses it), lanes+rem (and a row's last Wo % TW columns by a tile that wide),
lanes-nopf / main-nopf (lanes+rem / main without the pooled tiles' PREFETCHW of their output lines),
cfg:MB,TW[,16,1] (lanes+rem with that register tile; 16,1: the pooled tile).

    PYTHONPATH=. python3 benchmarks/2026-11-26-cpu-lane-layout/ab_layers.py [--layers sp18-L2 ...] [--rounds 11]
"""
import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from convforge.conv import cpu_parallel
from convforge.conv.reference import conv2d_float64
from convforge.harness.check import poisoned, random_case, relative_error
from convforge.models import ACTIVATIONS

# name: (M, C, H, W, K, activation, pool, lanes_in, lanes_out) as the engine runs them now
LAYERS = {
    "fa17-L1": (50, 1, 28, 28, 5, "tanh", 2, False, True),
    "sp18-L1": (6, 1, 64, 64, 5, "tanh", 2, False, True),
    "sp18-L2": (16, 6, 30, 30, 5, None, 0, True, True),
    "sp19-L1": (6, 1, 48, 48, 5, "tanh", 2, False, True),
    "sp19-L2": (16, 6, 22, 22, 5, None, 0, True, True),
    "fa18-L1": (12, 1, 72, 72, 7, "tanh", 2, False, True),
    "fa18-L2": (24, 12, 33, 33, 7, None, 0, True, True),
    "fa19-L1": (12, 1, 70, 70, 5, "tanh", 2, False, True),
    "fa19-L2": (24, 12, 33, 33, 5, None, 0, True, True),
    "fa20-L1": (4, 1, 86, 86, 7, "relu", 2, False, True),
    "fa20-L2": (16, 4, 40, 40, 7, "relu", 4, True, True),
}
# (lanes, remainder tiles, PREFETCHW of the pooled tiles' output lines)
VARIANTS = {"main": (False, False, True), "lanes": (True, False, True), "lanes+rem": (True, True, True),
            "lanes-nopf": (True, True, False), "main-nopf": (False, False, False)}


def to_lanes(x):
    groups = -(-x.shape[0] // 16)
    padded = torch.zeros((groups * 16, *x.shape[1:]))
    padded[:x.shape[0]] = x
    return padded.reshape(groups, 16, *x.shape[1:]).permute(0, 2, 3, 4, 1).contiguous()


def from_lanes(y, rows):
    return y.permute(0, 4, 1, 2, 3).reshape(-1, *y.shape[1:4])[:rows]


def prepared(spec, w, b, variant):
    """(fn, lanes_in, lanes_out, per-image output shape) of one variant."""
    maps, channels, height, width, kernel, activation, pool, lanes_in, lanes_out = spec
    config = None
    if variant.startswith("cfg:"):     # cfg:MB,TW[,pooled]: lanes+rem with that register tile
        config = tuple(int(v) for v in variant[4:].split(","))
        variant = "lanes+rem"
    lanes, remainder, prefetch = VARIANTS[variant]
    lanes_in, lanes_out = lanes_in and lanes, lanes_out and lanes
    saved = cpu_parallel.REMAINDER_TILES, cpu_parallel.PREFETCH_OUTPUT
    cpu_parallel.REMAINDER_TILES, cpu_parallel.PREFETCH_OUTPUT = remainder, prefetch
    try:
        if pool:
            fn = cpu_parallel.prepare_fused(w, b, activation, pool, config=config, lanes_in=lanes_in, lanes_out=lanes_out)
        else:
            fn = cpu_parallel.prepare_lanes(w, b, lanes_in, lanes_out, config=config)
    finally:
        cpu_parallel.REMAINDER_TILES, cpu_parallel.PREFETCH_OUTPUT = saved
    ho, wo = height - kernel + 1, width - kernel + 1
    if not (lanes_in or lanes_out):      # prepare's fn(x, out): the rows are x's
        fn = (lambda plain: lambda x, out, rows: plain(x, out))(fn)
    return fn, lanes_in, lanes_out, ((maps, ho // pool, wo // pool) if pool else (maps, ho, wo))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", nargs="*", default=list(LAYERS))
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"per-layer A/B, B={args.batch}, threads={args.threads}, rounds={args.rounds}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, loadavg {open('/proc/loadavg').read().strip()}")
    for name in args.layers:
        spec = LAYERS[name]
        maps, channels, height, width, kernel, activation, pool = spec[:7]
        x, w, b = random_case((args.batch, channels, height, width), (maps, channels, kernel, kernel), seed=26, bias=True)
        ref = torch.from_numpy(conv2d_float64(x[:37].numpy(), w.numpy(), b.numpy()))
        ref = (F.max_pool2d(ACTIVATIONS[activation](ref) if activation else ref, pool, pool) if pool else ref).numpy()
        calls, errs = {}, {}
        for v in args.variants:
            fn, lanes_in, lanes_out, per_image = prepared(spec, w, b, v)
            check = poisoned(cpu_parallel.lane_shape(37, per_image) if lanes_out else (37, *per_image))
            fn(to_lanes(x[:37]) if lanes_in else x[:37], check, 37)
            errs[v] = relative_error(from_lanes(check, 37) if lanes_out else check, ref)
            # the layer's input as the engine hands it over, the output allocated once
            out = torch.empty(cpu_parallel.lane_shape(args.batch, per_image) if lanes_out else (args.batch, *per_image))
            calls[v] = (fn, to_lanes(x) if lanes_in else x, out)
            fn(calls[v][1], out, args.batch)      # warm-up (first touch)
        times = {v: [] for v in args.variants}
        loads = []
        for r in range(args.rounds):
            loads.append(float(open("/proc/loadavg").read().split()[0]))
            for v in (args.variants if r % 2 == 0 else args.variants[::-1]):
                fn, xin, out = calls[v]
                t0 = time.perf_counter()
                fn(xin, out, args.batch)
                times[v].append(time.perf_counter() - t0)
        flops = 2.0 * args.batch * maps * (height - kernel + 1) * (width - kernel + 1) * channels * kernel * kernel
        base = args.variants[0]
        line = [f"{name:8s}"]
        for v in args.variants:
            ratio = sorted(t / u for t, u in zip(times[v], times[base]))
            q = statistics.quantiles(ratio, n=4) if len(ratio) > 1 else [ratio[0]] * 3
            line.append(f"{v} {statistics.median(times[v]) * 1e3:7.2f} ms ({flops / min(times[v]) / 1e9:5.1f} GF/s at min, "
                        f"x{statistics.median(ratio):.3f} [{q[0]:.3f}-{q[2]:.3f}], err {errs[v]:.1e})")
        print("  ".join(line) + f"  loadavg {min(loads):.2f}-{max(loads):.2f}", flush=True)


if __name__ == "__main__":
    main()
