"""Per-layer A/B of the one-channel first convolutions (fused tanh/relu + 2x2 max pool, output in the lane layout,
as the CPU engine runs them): main's module (cpu_parallel_main.py here, frozen at b9110f6) against this branch's,
plus this branch's with one change undone (nofast: the select-chain 2x2 max; nopf: no PREFETCHW of y's lines; nopfin: no prefetch of the next
group's input) or with one added (nt: non-temporal stores of the pooled vectors).
Called in turn, alternating the order every round, on the same input into preallocated outputs; per-round
ratio to main, median and quartiles, loadavg and the steal share of /proc/stat over the layer's rounds. Every
variant first checked against float64 on 37 images (a partial group), NaN-poisoned output.

    PYTHONPATH=. python3 benchmarks/2026-11-26-cpu-first-conv-tile/ab_layers.py [--layers sp18-L1 ...] [--rounds 9]

History: ab_layers_1-3.txt ran while the lane-layout path still had a PREFETCHW of y's lines (nopf turned it off;
it has been removed since, so nopf now changes nothing on this path); div (ab_layers_4.txt) and horner
(ab_layers_5.txt) were the baselines of two reverted experiments (RECIPROCAL_TANH, ESTRIN_TANH: "new" there),
whose flags no longer exist.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_parallel_main  # noqa: E402

from convforge.conv import cpu_parallel  # noqa: E402
from convforge.conv.reference import conv2d_float64  # noqa: E402
from convforge.harness.check import poisoned, random_case, relative_error  # noqa: E402
from convforge.models import ACTIVATIONS  # noqa: E402

LAYERS = {  # name: (M, H, W, K, activation)
    "fa17-L1": (50, 28, 28, 5, "tanh"), "sp18-L1": (6, 64, 64, 5, "tanh"), "sp19-L1": (6, 48, 48, 5, "tanh"),
    "fa18-L1": (12, 72, 72, 7, "tanh"), "fa19-L1": (12, 70, 70, 5, "tanh"), "fa20-L1": (4, 86, 86, 7, "relu"),
}
# variant: (module, {flag: value} set while preparing)
VARIANTS = {"main": (cpu_parallel_main, {}), "new": (cpu_parallel, {}),
            "nofast": (cpu_parallel, {"FAST_POOL_MAX": False}), "nopf": (cpu_parallel, {"PREFETCH_OUTPUT": False}),
            "div": (cpu_parallel, {"RECIPROCAL_TANH": False}), "horner": (cpu_parallel, {"ESTRIN_TANH": False}),  # reverted experiments
            "nopfin": (cpu_parallel, {"PREFETCH_INPUT": False}), "nt": (cpu_parallel, {"STREAM_OUTPUT": True}),
            "nt-nopfin": (cpu_parallel, {"STREAM_OUTPUT": True, "PREFETCH_INPUT": False})}


def cpu_times():
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:]]


def steal_share(t0, t1):
    d = [b - a for a, b in zip(t0, t1)]
    return d[7] / max(1, sum(d[:8]))


def prepared(spec, w, b, variant):
    maps, height, width, kernel, activation = spec
    module, flags = VARIANTS[variant]
    saved = {k: getattr(module, k) for k in flags}
    for k, v in flags.items():
        setattr(module, k, v)
    try:
        return module.prepare_fused(w, b, activation, 2, lanes_out=True)
    finally:
        for k, v in saved.items():
            setattr(module, k, v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", nargs="*", default=list(LAYERS))
    ap.add_argument("--variants", nargs="*", default=["main", "new"])
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"per-layer A/B, B={args.batch}, threads={args.threads}, rounds={args.rounds}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, loadavg {open('/proc/loadavg').read().strip()}")
    for name in args.layers:
        spec = LAYERS[name]
        maps, height, width, kernel, activation = spec
        x, w, b = random_case((args.batch, 1, height, width), (maps, 1, kernel, kernel), seed=26, bias=True)
        ref = torch.from_numpy(conv2d_float64(x[:37].numpy(), w.numpy(), b.numpy()))
        ref = F.max_pool2d(ACTIVATIONS[activation](ref), 2, 2).numpy()
        per_image = (maps, (height - kernel + 1) // 2, (width - kernel + 1) // 2)
        calls, errs = {}, {}
        for v in args.variants:
            fn = prepared(spec, w, b, v)
            check = poisoned(cpu_parallel.lane_shape(37, per_image))
            fn(x[:37], check, 37)
            got = check.permute(0, 4, 1, 2, 3).reshape(-1, *per_image)[:37]
            errs[v] = relative_error(got, ref)
            out = torch.empty(cpu_parallel.lane_shape(args.batch, per_image))
            calls[v] = (fn, out)
            fn(x, out, args.batch)      # warm-up (first touch)
        same = all(torch.equal(calls[v][1], calls[args.variants[0]][1]) for v in args.variants)
        times = {v: [] for v in args.variants}
        loads = []
        s0 = cpu_times()
        for r in range(args.rounds):
            loads.append(float(open("/proc/loadavg").read().split()[0]))
            for v in (args.variants if r % 2 == 0 else args.variants[::-1]):
                fn, out = calls[v]
                t0 = time.perf_counter()
                fn(x, out, args.batch)
                times[v].append(time.perf_counter() - t0)
        steal = steal_share(s0, cpu_times())
        flops = 2.0 * args.batch * maps * (height - kernel + 1) * (width - kernel + 1) * kernel * kernel
        base = args.variants[0]
        line = [f"{name:8s}"]
        for v in args.variants:
            ratio = sorted(t / u for t, u in zip(times[v], times[base]))
            q = statistics.quantiles(ratio, n=4) if len(ratio) > 1 else [ratio[0]] * 3
            line.append(f"{v} {statistics.median(times[v]) * 1e3:7.2f} ms ({flops / min(times[v]) / 1e9:5.1f} GF/s at min, "
                        f"x{statistics.median(ratio):.3f} [{q[0]:.3f}-{q[2]:.3f}], err {errs[v]:.1e})")
        print("  ".join(line) + f"  outputs {'identical' if same else 'DIFFER'}  loadavg {min(loads):.2f}-{max(loads):.2f}"
              f"  steal {100 * steal:.1f} %", flush=True)


if __name__ == "__main__":
    main()
