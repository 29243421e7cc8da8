"""Run GpuDense's tiles form once per layer inside a cudaProfilerStart/Stop window, for ncu (warmed up before):
    ncu --profile-from-start off --section ... python3 ncu_dense.py [--rows 100]
Layers: fa18 fc1 (17496 -> 160) and fa17 fc1 (7200 -> 500)."""
import argparse

import torch

from convforge import gpu_dense
from convforge.engine import median_seconds

p = argparse.ArgumentParser()
p.add_argument("--rows", type=int, default=100)
a = p.parse_args()
gen = torch.Generator(device="cuda").manual_seed(1)
calls = []
for outputs, depth in ((160, 17496), (500, 7200)):
    weight = torch.randn(outputs, depth, device="cuda", generator=gen) / depth ** 0.5
    dense = gpu_dense.GpuDense(weight, None, median_seconds)
    x = torch.rand(a.rows, depth, device="cuda", generator=gen)
    for _ in range(3):
        dense.run("tiles", x)
    calls.append((dense, x))
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for dense, x in calls:
    dense.run("tiles", x)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
