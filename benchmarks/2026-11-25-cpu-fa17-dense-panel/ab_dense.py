"""A/B of the dense layers, interleaved in one process: main's cpu_dense (v2: rows read in place, dense_v2.py
here) against this branch's (v3: packed input panels), and v3 blockings (KC, NC). The presets' first dense
layers at B images (the CPU engine's chunk), 2 threads; per round each variant once, in turn; median and min
of the rounds, the float64 check (NaN-poisoned output, fresh random data) and the 1-minute loadavg.

    PYTHONPATH=. python3 benchmarks/2026-11-25-cpu-fa17-dense-panel/ab_dense.py [--variants v2 v3 v3:t12,2 v3:b384,192]
        (v3 options: tTILE_MR,PR and bKC,NC)
        [--layers fa17-fc1 ...] [--rounds 15] [--batch 2048]
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dense_v2  # noqa: E402
from convforge import cpu_dense  # noqa: E402
from convforge.harness.check import relative_error  # noqa: E402

LAYERS = {  # name: (K inputs, N outputs, activation)
    "fa17-fc1": (50 * 12 * 12, 500, "tanh"),
    "fa17-fc2": (500, 10, None),
    "sp18-fc1": (16 * 26 * 26, 140, "tanh"),
    "sp19-fc1": (16 * 18 * 18, 140, "tanh"),
    "fa18-fc1": (24 * 27 * 27, 160, "tanh"),
    "fa19-fc1": (24 * 29 * 29, 160, "tanh"),
    "fa20-fc1": (16 * 8 * 8, 32, "relu"),
}


def make(variant, w, b, act):
    if variant == "v2":
        return dense_v2.DenseLayer(w, b, act)
    if variant.startswith("file="):     # another cpu_dense.py (a development step), e.g. file=/tmp/dense_v4.py
        import importlib.util
        spec = importlib.util.spec_from_file_location("dense_" + str(abs(hash(variant))), variant[5:])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.DenseLayer(w, b, act)
    opts = dict((o[0], tuple(int(v) for v in o[1:].split(","))) for o in variant.split(":")[1:])
    return cpu_dense.DenseLayer(w, b, act, tile=opts.get("t"), blocking=opts.get("b"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", nargs="*", default=list(LAYERS))
    ap.add_argument("--variants", nargs="*", default=["v2", "v3"])
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"cpu_dense A/B, B={args.batch}, threads={args.threads}, rounds={args.rounds}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, loadavg {open('/proc/loadavg').read().strip()}")
    for name in args.layers:
        k, n, act = LAYERS[name]
        g = torch.Generator().manual_seed(k * 7 + n)
        x = torch.randn(args.batch, k, generator=g)
        w, b = torch.randn(n, k, generator=g) / k ** 0.5, torch.randn(n, generator=g)
        check = 100
        ref = torch.nn.functional.linear(x[:check].double(), w.double(), b.double())
        ref = {"tanh": torch.tanh, "relu": torch.relu, None: lambda t: t}[act](ref).numpy()
        layers = {v: make(v, w, b, act) for v in args.variants}
        npad = cpu_dense.padded(n)
        out = np.full((args.batch, npad), np.nan, np.float32)
        xn = x.numpy()
        errs = {}
        for v, layer in layers.items():
            out.fill(np.nan)
            layer(xn, k, out)
            errs[v] = relative_error(out[:check, :n], ref)
            assert np.isfinite(out[:, :n]).all(), v
        times = {v: [] for v in layers}
        loads = []
        for _ in range(args.rounds):
            loads.append(float(open("/proc/loadavg").read().split()[0]))
            for v, layer in layers.items():
                t0 = time.perf_counter()
                layer(xn, k, out)
                times[v].append(time.perf_counter() - t0)
        flops = 2 * args.batch * k * n
        for v in layers:
            med, best = statistics.median(times[v]) * 1e3, min(times[v]) * 1e3
            print(f"{name:9s} {v:12s} median {med:8.2f} ms  min {best:8.2f} ms  {flops / med / 1e6:6.1f} GFLOP/s "
                  f"(median) {flops / best / 1e6:6.1f} (min)  err {errs[v]:.1e}  loadavg {min(loads):.2f}-{max(loads):.2f}",
                  flush=True)
        first = next(iter(layers))
        for v in list(layers)[1:]:
            ratio = sorted(b / a for a, b in zip(times[first], times[v]))
            print(f"{name:9s} {v} / {first} per round: median {statistics.median(ratio):.3f} "
                  f"(quartiles {ratio[len(ratio) // 4]:.3f}-{ratio[3 * len(ratio) // 4]:.3f})", flush=True)


if __name__ == "__main__":
    main()
