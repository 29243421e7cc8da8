"""Issue #21: bench --whole's GPU rows (whole.bench_network: convforge exact eager and CUDA graph, fast, torch
eager and its CUDA graph; logits checked against float64) per preset at the given batches, twice in one
process: with main's dense forms ("main": GpuDense.VARIANTS without tc3/tc3-wide) and with this branch's
("tc3"), then #21's small-batch yardstick measured in the same process: 2 x (one empty kernel launch + the
input's copy from pinned host memory), each a median of 200 calls between CUDA events, host work included.
torch.compile is left out (compile_batches empty: minutes per preset; it is no part of the small-batch goals).
Usage: PYTHONPATH=. python3 .../whole_rows.py OUT.json [batches...]"""
import json
import statistics
import sys

import torch

from convforge.gpu_dense import TC, GpuDense
from convforge.harness import whole
from convforge.harness.probes import measure_ceilings
from convforge.conv.torch_conv import exact_fp32
from convforge.models import PRESETS, load_preset

ALL = GpuDense.VARIANTS
SETS = {"main": tuple(v for v in ALL if v not in TC), "tc3": ALL}


def call_ms(fn, repeat=200):
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[repeat // 10:])


def main():
    out = sys.argv[1]
    batches = [int(b) for b in sys.argv[2:]] or [10, 100, 10000]
    exact_fp32()
    ceilings = measure_ceilings("cuda")
    print(f"{torch.cuda.get_device_name()} ceilings: {ceilings.describe()}", flush=True)
    rows = []
    empty = torch.empty(1, device="cuda")
    for name in [p for p in PRESETS if p != "fa17-low"]:
        for label, variants in SETS.items():
            GpuDense.VARIANTS = variants
            print(f"-- {name} dense forms: {label}", flush=True)
            rows += [dict(row, dense_set=label) for row in whole.bench_network(name, batches, ceilings, (), 20)]
        GpuDense.VARIANTS = ALL
        arch = load_preset(name).architecture
        for batch in batches:
            if batch > 100:
                continue
            host = (torch.rand(batch, arch.in_channels, arch.input_size, arch.input_size) * 255).pin_memory()
            dev = torch.empty(host.shape, device="cuda")
            launch, copy = call_ms(lambda: empty.fill_(0)), call_ms(lambda: dev.copy_(host, non_blocking=True))
            rows.append(dict(model=name, batch=batch, candidate="yardstick", empty_launch_ms=launch,
                             input_copy_ms=copy, ms=2 * (launch + copy)))
            print(f"{name:9s} {batch:6d} yardstick 2 x ({launch:.4f} + {copy:.4f}) = {2 * (launch + copy):.4f} ms",
                  flush=True)
        with open(out, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
