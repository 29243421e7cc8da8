"""A/B test: does the NVML sampling thread (harness/gpu_clocks) shift the timed calls?

    python scripts/sampler_ab.py [--layer "fa17 L1"] [--impl cuda-direct,torch] [--rounds 8]

Times each implementation on one preset layer at B = 10000 with bench's ``time_calls``, alternating
rounds with the sampler on (``load={}``) and off (``load=None``), and prints the median of each round's
median per setting. Development tool, not part of the package.
"""
import argparse
import statistics

import torch

from convforge import conv
from convforge.harness.sweep import preset_layers
from convforge.harness.timing import rotated_inputs, time_calls

p = argparse.ArgumentParser()
p.add_argument("--layer", default="fa17 L1")
p.add_argument("--impl", default="cuda-direct,torch")
p.add_argument("--rounds", type=int, default=8)
p.add_argument("--repeat", type=int, default=50)
a = p.parse_args()
torch.backends.cudnn.allow_tf32 = False
torch.backends.cudnn.benchmark = True
spec = next(s for s in preset_layers() if s.label == a.layer)
label = spec.label
M, C, H, W, K = spec.shape.M, spec.shape.C, spec.shape.H, spec.shape.W, spec.shape.K
g = torch.Generator().manual_seed(0)
x = (torch.rand(10000, C, H, W, generator=g) * 255).cuda()
w = (torch.randn(M, C, K, K, generator=g) * 0.05).cuda()
inputs = rotated_inputs(x)
for name in a.impl.split(","):
    fn = conv.get(name).prepare(w, None)
    medians = {"on": [], "off": []}
    for r in range(a.rounds):
        for setting in (("on", "off") if r % 2 == 0 else ("off", "on")):
            load = {} if setting == "on" else None
            t = time_calls(fn, inputs, "cuda", warmup=5, repeat=a.repeat, load=load, timing="call")   # as recorded
            medians[setting].append(float(sorted(t)[len(t) // 2]) * 1e3)
    on, off = statistics.median(medians["on"]), statistics.median(medians["off"])
    print(f"{label} {name}: sampler on {on:.4f} ms, off {off:.4f} ms, on/off {on / off:.4f}; "
          f"rounds on {['%.4f' % v for v in medians['on']]} off {['%.4f' % v for v in medians['off']]}", flush=True)
