"""Run one implementation on one preset layer once inside a cudaProfilerStart/Stop window (for ncu).

    ncu --profile-from-start off --clock-control none --section ... \
        python3 scripts/ncu_layer.py --impl cuda-fused-gemm --layer "fa17 L1" [--fused] [--batch 10000]

Development tool, not part of the package: the kernel is compiled and warmed up before the window opens,
so the profiled launch is the steady-state one.
"""
import argparse

import torch

from convforge import conv
from convforge.harness.sweep import preset_layers

p = argparse.ArgumentParser()
p.add_argument("--impl", required=True)
p.add_argument("--layer", required=True)
p.add_argument("--batch", type=int, default=10000)
p.add_argument("--fused", action="store_true")
p.add_argument("--config", default="", help="launch config as JSON (implementations that take config=)")
a = p.parse_args()
spec = next(s for s in preset_layers() if s.label == a.layer)
label, fusion = spec.label, spec.fusion
M, C, H, W, K = spec.shape.M, spec.shape.C, spec.shape.H, spec.shape.W, spec.shape.K
torch.manual_seed(0)
x = torch.rand(a.batch, C, H, W, device="cuda") * 255
w = torch.randn(M, C, K, K, device="cuda") * 0.05
b = torch.randn(M, device="cuda")
impl = conv.get(a.impl)
kwargs = {}
if a.config:
    import json
    kwargs["config"] = json.loads(a.config)
if kwargs:  # a launch config goes straight to the module (the registry's prepare takes none)
    module = impl._module()
    fn = (module.prepare_fused(w, b, *fusion[:2], input_hw=(H, W), **kwargs) if a.fused
          else module.prepare(w, b, input_hw=(H, W), **kwargs))
elif a.fused:
    fn = impl.prepare_fused(w, b, *fusion[:2], input_hw=(H, W))
else:
    fn = impl.prepare(w, b, input_hw=(H, W))
for _ in range(3):
    fn(x)
torch.cuda.synchronize()
torch.cuda.profiler.start()
fn(x)
torch.cuda.synchronize()
torch.cuda.profiler.stop()
print(a.impl, a.layer, "fused" if a.fused else "plain", "done")
