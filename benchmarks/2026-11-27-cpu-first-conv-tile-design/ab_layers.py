"""Per-layer A/B of the one-channel first convolutions' pooled tile (fused tanh/relu + 2x2 max pool, lane layout
out, raw uint8 images in: the CPU engine's first step), one process, this tree's cpu_parallel in variants of its
flags (set while each is prepared):
  narrow      WIDE_POOLED_TILES off, FINITE_RAW_POOL off: main's tile (2 maps x 4 columns on all six presets)
  wide        WIDE_POOLED_TILES on: 6 x 2 (sp18, sp19, fa18, fa19), 5 x 2 (fa17), 4 x 2 (fa20)
  fin         FINITE_RAW_POOL on (the 2x2 max without its NaN fix-up for raw images), narrow tile
  wide-fin    both
  MBxTW       an explicit pooled tile, e.g. 3x2 or 4x2 (config=(MB, TW, 16, True)), fix-up kept
Called in turn, the order reversed every round, best of --calls calls per variant per round into preallocated
outputs, an FMA probe (fma_peak_gflops, 2 threads, 0.2 s) after every round; per-round ratio to the first
variant (median, min-max), GFLOP/s at the median and its share of the probe median of the same rounds; outputs
compared bitwise with the first variant's, and every variant against float64 on 37 images (NaN-poisoned lanes)
first; loadavg range and the steal share of /proc/stat over each layer's rounds.

    PYTHONPATH=. python3 benchmarks/2026-11-27-cpu-first-conv-tile-design/ab_layers.py [--layers sp18 ...]
        [--variants narrow wide fin wide-fin] [--rounds 11] [--batch 2048] [--float]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from convforge.conv import cpu_parallel
from convforge.conv.reference import conv2d_float64
from convforge.harness.check import random_case, relative_error
from convforge.harness.probes import fma_peak_gflops
from convforge.models import ACTIVATIONS

LAYERS = {  # name: (M, H, W, K, activation)
    "sp18": (6, 64, 64, 5, "tanh"), "sp19": (6, 48, 48, 5, "tanh"), "fa17": (50, 28, 28, 5, "tanh"),
    "fa18": (12, 72, 72, 7, "tanh"), "fa19": (12, 70, 70, 5, "tanh"), "fa20": (4, 86, 86, 7, "relu"),
}
FLAGS = {"narrow": {"WIDE_POOLED_TILES": False, "FINITE_RAW_POOL": False},
         "wide": {"WIDE_POOLED_TILES": True, "FINITE_RAW_POOL": False},
         "fin": {"WIDE_POOLED_TILES": False, "FINITE_RAW_POOL": True},
         "wide-fin": {"WIDE_POOLED_TILES": True, "FINITE_RAW_POOL": True}}


def cpu_times():
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:]]


def prepared(variant, w, b, activation):
    flags, config = FLAGS.get(variant, {"WIDE_POOLED_TILES": False, "FINITE_RAW_POOL": False}), None
    if variant not in FLAGS:
        mb, tw = map(int, variant.split("x"))
        config = (mb, tw, 16, True)
    saved = {k: getattr(cpu_parallel, k) for k in flags}
    for k, v in flags.items():
        setattr(cpu_parallel, k, v)
    try:
        return cpu_parallel.prepare_fused(w, b, activation, 2, config=config, lanes_out=True, raw_input=True)
    finally:
        for k, v in saved.items():
            setattr(cpu_parallel, k, v)


def lanes_to_rows(y, rows):
    return y.permute(0, 4, 1, 2, 3).reshape(-1, *y.shape[1:4])[:rows]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", nargs="*", default=list(LAYERS))
    ap.add_argument("--variants", nargs="*", default=["narrow", "wide", "fin", "wide-fin"])
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--float", action="store_true", help="float32 images instead of the engine's raw uint8")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"pooled first-layer A/B, B={args.batch}, {'float32' if args.float else 'uint8'} input, threads="
          f"{args.threads}, rounds={args.rounds}, best of {args.calls}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, loadavg {open('/proc/loadavg').read().strip()}")
    for name in args.layers:
        maps, height, width, kernel, activation = LAYERS[name]
        _, w, b = random_case((1, 1, height, width), (maps, 1, kernel, kernel), seed=27, bias=True)
        g = torch.Generator().manual_seed(27)
        x = torch.randint(0, 256, (args.batch, 1, height, width), generator=g, dtype=torch.uint8)
        if args.float:
            x = x.float()
        few = min(37, args.batch)      # the float64 check's images (a partial 16-image group at 37)
        ref = torch.from_numpy(conv2d_float64(x[:few].double().numpy(), w.numpy(), b.numpy()))
        ref = F.max_pool2d(ACTIVATIONS[activation](ref), 2, 2).numpy()
        per_image = (maps, (height - kernel + 1) // 2, (width - kernel + 1) // 2)
        calls, errs, tiles = {}, {}, {}
        for v in args.variants:
            fn = prepared(v, w, b, activation)
            check = torch.full(cpu_parallel.lane_shape(few, per_image), float("nan"))
            fn(x[:few], check, few)
            errs[v] = relative_error(lanes_to_rows(check, few).numpy(), ref)
            out = torch.empty(cpu_parallel.lane_shape(args.batch, per_image))
            fn(x, out, args.batch)      # warm-up (first touch)
            calls[v] = (fn, out)
            tiles[v] = "finite" if fn.finite_raw and not args.float else ""   # float32 keeps the NaN fix-up
        base = args.variants[0]
        same = {v: torch.equal(calls[v][1], calls[base][1]) for v in args.variants}
        times = {v: [] for v in args.variants}
        loads, peaks = [], []
        s0 = cpu_times()
        for r in range(args.rounds):
            loads.append(float(open("/proc/loadavg").read().split()[0]))
            for v in (args.variants if r % 2 == 0 else args.variants[::-1]):
                fn, out = calls[v]
                best = 1e9
                for _ in range(args.calls):
                    t0 = time.perf_counter()
                    fn(x, out, args.batch)
                    best = min(best, time.perf_counter() - t0)
                times[v].append(best)
            peaks.append(fma_peak_gflops(args.threads, 0.2) or float("nan"))
        d = [b1 - a1 for a1, b1 in zip(s0, cpu_times())]
        steal = d[7] / max(1, sum(d[:8]))
        flops = 2.0 * args.batch * maps * (height - kernel + 1) * (width - kernel + 1) * kernel * kernel
        pk = statistics.median(peaks)
        for v in args.variants:
            ratio = [t / u for t, u in zip(times[v], times[base])]
            m = statistics.median(times[v])
            mb, tw = (cpu_parallel.choose_pooled(maps, wide=FLAGS[v]["WIDE_POOLED_TILES"]) if v in FLAGS
                      else tuple(map(int, v.split("x"))))
            print(f"{name} {v:8s} {mb}x{tw} {tiles[v]:7s} {m * 1e3:7.2f} ms {flops / m / 1e9:6.1f} GFLOP/s "
                  f"({100 * flops / m / 1e9 / pk:.0f} % of probe {pk:.1f})  /{base} per round {statistics.median(ratio):.3f} "
                  f"(min {min(ratio):.3f}, max {max(ratio):.3f})  err {errs[v]:.1e}  bitwise as {base}: {same[v]}  "
                  f"loadavg {min(loads):.2f}-{max(loads):.2f}  steal {100 * steal:.1f} %", flush=True)


if __name__ == "__main__":
    main()
