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
from convforge.harness.sweep import preset_layers
from convforge.harness.timing import rotated_inputs, time_calls
from convforge.harness.gpu_clocks import device_uuid

p = argparse.ArgumentParser()
p.add_argument("--layers", default="fa17 L1,sp18 L1,sp19 L1")
p.add_argument("--impl", default="cuda-direct")
p.add_argument("--loads", type=int, default=3, help="freshly prepared modules per layer")
p.add_argument("--repeat", type=int, default=60)
p.add_argument("--busy", action="store_true",
               help="also time each call with bench's 'gpu' timing (a spin kernel ahead of the start event), so "
                    "the events bracket GPU time only, not the host's launch work")
a = p.parse_args()


def median_ms(fn, inputs, timing):
    t = time_calls(fn, inputs, "cuda", warmup=5, repeat=a.repeat, timing=timing)
    return float(sorted(t)[len(t) // 2]) * 1e3


torch.backends.cudnn.allow_tf32 = False
out = [f"pid {os.getpid()} {device_uuid(0)}"]
keep = []
for spec in preset_layers():
    label, (M, C, H, W, K) = spec.label, (spec.shape.M, spec.shape.C, spec.shape.H, spec.shape.W, spec.shape.K)
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
        times.append(median_ms(fn, inputs, "call"))
    torch_fn = conv.get("torch").prepare(w, None)
    line = (f"{label}: {a.impl} " + " ".join(f"{v:.4f}" for v in times) +
            f" ms; torch {median_ms(torch_fn, inputs, 'call'):.4f}")
    if a.busy:
        line += (f"; busy-start: {a.impl} {median_ms(keep[-1], inputs, 'gpu'):.4f}, "
                 f"torch {median_ms(torch_fn, inputs, 'gpu'):.4f}")
    out.append(line)
    del inputs, x
print(" | ".join(out), flush=True)
