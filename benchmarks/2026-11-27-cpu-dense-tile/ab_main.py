"""Whole-network A/B against main's engine: one worker process per variant, each with its own convforge tree on
sys.path ("main" = a `git archive d108630` copy, the others this tree), each holding one CPU engine
(Engine.run on the 10000 Fashion-MNIST test images, 2 threads); this driver tells them to run one at a time,
round after round, the order alternating per round, and probes the FMA peak (0.2 s, 2 threads) after every
round. Per variant: median total, per-round ratio to the first variant, per-step split (convs' Op Time; dense
layers timed around their calls; "glue" = total minus the steps), each step's % of the round's probe;
predictions compared with the first variant's. Only one process computes at a time.

    PYTHONPATH=. python3 benchmarks/2026-11-27-cpu-dense-tile/ab_main.py --main /tmp/c26/main \\
        [--presets sp18 sp19 fa17-high] [--rounds 7] [--variants main branch branch:384:128]

Variant "branch:KC:NC": this tree with cpu_dense's blocking (KC, NC) set before the engine is built.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

WORKER = r'''
import json, sys, time, hashlib
import numpy as np, torch
torch.set_num_threads(2)
from convforge import data, cpu_dense
from convforge.engine import Engine
from convforge.models import load_preset
preset, images, blocking = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if blocking:
    cpu_dense.KC, cpu_dense.NC = (int(v) for v in blocking.split(":"))

class Timed:
    def __init__(self, dense):
        self.dense, self.seconds = dense, 0.0
        self.n, self.k, self.np = dense.n, dense.k, dense.np
    def __call__(self, *a):
        t0 = time.perf_counter()
        out = self.dense(*a)
        self.seconds += time.perf_counter() - t0
        return out

network = load_preset(preset)
ds = data.load("test", network.architecture.input_size, images)
engine = Engine(network, impl="cpu-parallel", device="cpu")
for s in engine.steps:
    if s.dense is not None:
        s.dense = Timed(s.dense)
flops = []
for s in engine.steps:
    if s.result is not None:
        sh = s.result.shape
        flops.append(("conv", 2 * images * sh.M * sh.C * sh.K * sh.K * (sh.H - sh.K + 1) * (sh.W - sh.K + 1)))
    elif s.dense is not None:
        flops.append(("dense", 2 * images * s.dense.k * s.dense.n))
engine.run(ds.images, ds.labels)   # warm-up
print(json.dumps({"ready": True, "flops": flops, "wp_mod64": [s.dense.dense.wp.ctypes.data % 64 for s in engine.steps
                                                               if s.dense is not None]}), flush=True)
for line in sys.stdin:
    for s in engine.steps:
        if s.dense is not None:
            s.dense.seconds = 0.0
    res = engine.run(ds.images, ds.labels)
    per = [s.result.op_time_s if s.result is not None else s.dense.seconds
           for s in engine.steps if s.result is not None or s.dense is not None]
    preds = np.asarray(res.predictions)
    print(json.dumps({"total": res.total_time_s, "steps": per + [res.total_time_s - sum(per)],
                      "acc": res.correctness, "preds": hashlib.sha256(preds.tobytes()).hexdigest()}), flush=True)
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--main", required=True, help="a copy of main's tree (git archive d108630)")
    ap.add_argument("--presets", nargs="*", default=["sp18", "sp19", "fa17-high"])
    ap.add_argument("--variants", nargs="*", default=["main", "branch"])
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    from convforge.harness.probes import fma_peak_gflops
    print(f"whole-network A/B against main (worker processes, Engine.run, Fashion-MNIST test), {args.images} images, "
          f"threads=2, rounds={args.rounds}, {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, loadavg "
          f"{open('/proc/loadavg').read().strip()}", flush=True)
    for name in args.presets:
        workers, info = {}, {}
        for v in args.variants:
            tree = args.main if v.startswith("main") else ROOT   # "main", "main-2": main's tree
            blocking = v.split(":", 1)[1] if ":" in v else ""   # "branch-2": a second process of the same
            env = dict(os.environ, PYTHONPATH=tree)
            workers[v] = subprocess.Popen([sys.executable, "-c", WORKER, name, str(args.images), blocking], cwd=tree,
                                          env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            info[v] = json.loads(workers[v].stdout.readline())     # built and warmed up, one at a time
        runs = {v: [] for v in workers}
        peaks, loads = [], []
        for r in range(args.rounds):
            loads.append(float(open("/proc/loadavg").read().split()[0]))
            for v in (args.variants if r % 2 == 0 else args.variants[::-1]):
                workers[v].stdin.write("run\n")
                workers[v].stdin.flush()
                runs[v].append(json.loads(workers[v].stdout.readline()))
            peaks.append(fma_peak_gflops(2, 0.2) or float("nan"))
        for w in workers.values():
            w.stdin.close()
            w.wait()
        base = args.variants[0]
        pk = statistics.median(peaks)
        flops = info[base]["flops"]
        total_flops = sum(f for _, f in flops)
        for v in args.variants:
            times = [x["total"] for x in runs[v]]
            ratio = [t / u["total"] for t, u in zip(times, runs[base])]
            same = all(x["preds"] == runs[base][0]["preds"] for x in runs[v])
            med = statistics.median(times)
            print(f"{name:9s} {v:15s} total median {med * 1e3:7.1f} ms min {min(times) * 1e3:7.1f}  "
                  f"x{statistics.median(ratio):.3f} (min {min(ratio):.3f}, max {max(ratio):.3f})  "
                  f"{total_flops / med / 1e9:5.1f} GFLOP/s = {100 * total_flops / med / 1e9 / pk:.0f} % of the probe "
                  f"median {pk:.1f} (max {max(peaks):.1f})  accuracy {runs[v][0]['acc']:.4f}  predictions "
                  f"{'identical' if same else 'DIFFER'}  W at {info[v]['wp_mod64']} mod 64  loadavg "
                  f"{min(loads):.2f}-{max(loads):.2f}", flush=True)
            cols = list(zip(*[x["steps"] for x in runs[v]]))
            parts = []
            for (kind, f), c in zip(flops + [("glue", 0)], cols):
                m = statistics.median(c)
                parts.append(f"{kind} {m * 1e3:.1f} ms" + (f" ({100 * f / m / 1e9 / pk:.0f} %)" if f else ""))
            print(f"{'':9s} {v:15s} split: " + "; ".join(parts), flush=True)


if __name__ == "__main__":
    main()
