"""Where does the cross-process spread come from? Time a few preset layers in this process, several times,
each time with a freshly prepared layer (a new CUDA module instance, so new code and constant-bank
addresses) while the earlier ones stay loaded, and print the GPU's UUID.

    for i in 1 2 3; do python3 scripts/spread_probe.py; done

Run in several processes on one machine: if the processes disagree while the re-prepared modules within one
process agree, the spread is per process, not per module load; the UUID tells machines apart. Development
tool, not part of the package.
"""
import argparse
import os

import torch

from convforge import conv
from convforge.conv.cuda_smoke import preset_layers
from convforge.harness.bench import rotated_inputs, time_calls

p = argparse.ArgumentParser()
p.add_argument("--layers", default="fa17 L1,sp18 L1,sp19 L1")
p.add_argument("--impl", default="cuda-direct")
p.add_argument("--loads", type=int, default=3, help="freshly prepared modules per layer")
p.add_argument("--repeat", type=int, default=60)
p.add_argument("--busy", action="store_true",
               help="also time each call with the GPU kept busy (torch.cuda._sleep) while the host issues it, so the "
                    "events bracket GPU time only, not the host's launch work")
a = p.parse_args()


def busy_ms(fn, inputs, repeat, spin_cycles=400_000):
    """Median ms of fn with a sleep kernel queued ahead of the start event: the start event fires only when
    the sleep ends, by which time the host has queued fn's kernels, so the host's work is not counted."""
    times = []
    for i in range(repeat + 5):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(spin_cycles)
        start.record()
        fn(inputs[i % len(inputs)])
        end.record()
        end.synchronize()
        if i >= 5:
            times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]
torch.backends.cudnn.allow_tf32 = False
uuid = torch.cuda.get_device_properties(0).uuid
out = [f"pid {os.getpid()} GPU-{uuid}"]
keep = []
for label, (M, C, H, W, K), _ in preset_layers():
    if label not in a.layers.split(","):
        continue
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(10000, C, H, W, generator=g) * 255).cuda()
    w = (torch.randn(M, C, K, K, generator=g) * 0.05).cuda()
    inputs = rotated_inputs(x)
    times = []
    for _ in range(a.loads):
        fn = conv.get(a.impl).prepare(w, None)
        keep.append(fn)   # stays loaded: the next prepare gets a new module instance
        t = time_calls(fn, inputs, "cuda", warmup=5, repeat=a.repeat)
        times.append(float(sorted(t)[len(t) // 2]) * 1e3)
    torch_fn = conv.get("torch").prepare(w, None)
    torch_t = time_calls(torch_fn, inputs, "cuda", warmup=5, repeat=a.repeat)
    line = (f"{label}: {a.impl} " + " ".join(f"{v:.4f}" for v in times) +
            f" ms; torch {float(sorted(torch_t)[len(torch_t) // 2]) * 1e3:.4f}")
    if a.busy:
        line += f"; busy-start: {a.impl} {busy_ms(keep[-1], inputs, a.repeat):.4f}, torch {busy_ms(torch_fn, inputs, a.repeat):.4f}"
    out.append(line)
    del inputs, x
print(" | ".join(out), flush=True)
