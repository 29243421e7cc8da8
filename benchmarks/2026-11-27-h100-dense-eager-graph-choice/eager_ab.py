"""The engine's eager forward (no CUDA graph, host launch work included) at 10 and 100 images: main's dense forms
before the 3xTF32 merge ("main": GpuDense.VARIANTS without the tc forms, as an instance attribute) against every
form with the eager choice counting launch work ("all"), and every form chosen by GPU time alone as before this
change ("gpu-time": eager calls inside gpu_dense.for_graph), three engines per preset in one process, interleaved
rounds (order alternating), each round a median of 50 calls between CUDA events; logits compared; the forms each
engine chose for eager calls printed. Usage: PYTHONPATH=. python3 eager_ab.py OUT.json [rounds]"""
import json
import statistics
import sys

import contextlib

import torch

from convforge import gpu_dense
from convforge.engine import Engine
from convforge.gpu_dense import TC, GpuDense
from convforge.conv.torch_conv import exact_fp32
from convforge.models import PRESETS, load_preset

MAIN = tuple(v for v in GpuDense.VARIANTS if v not in TC)


def call_ms(fn, x, calls=50):
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    out, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 7
    exact_fp32()
    rows = []
    for name in [p for p in PRESETS if p != "fa17-low"]:
        network = load_preset(name)
        arch = network.architecture
        engines = {k: Engine(network, impl="auto", device="cuda") for k in ("main", "all", "gpu-time")}
        mode = {k: (gpu_dense.for_graph if k == "gpu-time" else contextlib.nullcontext) for k in engines}
        for step in engines["main"].steps:
            if step.gpu_dense is not None:
                step.gpu_dense.VARIANTS = MAIN
        for batch in (10, 100):
            g = torch.Generator(device="cuda").manual_seed(batch)
            x = torch.randint(0, 256, (batch, arch.in_channels, arch.input_size, arch.input_size), generator=g,
                              device="cuda").to(torch.float32)
            with torch.inference_mode():
                logits = {}
                for k, e in engines.items():
                    with mode[k]():
                        logits[k] = e.forward(x, timed=False).clone()
                per = {k: [] for k in engines}
                for r in range(rounds):
                    for k in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
                        with mode[k]():
                            per[k].append(call_ms(lambda xi: engines[k].forward(xi, timed=False), x))
            ratios = [a / m for a, m in zip(per["all"], per["main"])]
            old = [a / m for a, m in zip(per["all"], per["gpu-time"])]
            choices = {k: [(s.gpu_dense.graph_choice if k == "gpu-time" else s.gpu_dense.choice).get(batch)
                           for s in e.steps if s.gpu_dense is not None] for k, e in engines.items()}
            row = dict(model=name, batch=batch, main_ms=statistics.median(per["main"]),
                       all_ms=statistics.median(per["all"]), ratio_median=statistics.median(ratios),
                       ratio_min=min(ratios), ratio_max=max(ratios), gpu_time_ms=statistics.median(per["gpu-time"]),
                       all_over_gpu_time=statistics.median(old), choices=choices,
                       same_argmax=bool(torch.equal(logits["main"].argmax(1), logits["all"].argmax(1))),
                       max_abs_diff=float((logits["main"] - logits["all"]).abs().max()))
            rows.append(row)
            print(f"{name:9s} B={batch:4d} eager main {row['main_ms']:.4f} all {row['all_ms']:.4f} ms  all/main "
                  f"{row['ratio_median']:.3f} ({row['ratio_min']:.3f}-{row['ratio_max']:.3f})  gpu-time "
                  f"{row['gpu_time_ms']:.4f} (all/gpu-time {row['all_over_gpu_time']:.3f})  choices {choices}  "
                  f"argmax equal {row['same_argmax']}  max|diff| {row['max_abs_diff']:.1e}", flush=True)
    with open(out, "w") as handle:
        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), handle, indent=1)


if __name__ == "__main__":
    main()
