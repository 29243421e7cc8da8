"""(Call 5, on the general kernel of mma3_v3_general.patch, whose MMA3 had "mma3" and "mma3-wide".)
One call of each dense form at fa18's first dense layer (17496 -> 160) and fa17's (7200 -> 500), 100 rows, for
Nsight Compute (device.sh ncu): mma3, mma3-wide and tc3, random weights and inputs.

    ncu ... python3 ncu_mma3.py
"""
import torch

from convforge import gpu_dense
from convforge.engine import median_seconds

for outputs, depth in ((160, 17496), (500, 7200)):
    weight = torch.randn(outputs, depth, device="cuda") / depth ** 0.5
    dense = gpu_dense.GpuDense(weight, torch.randn(outputs, device="cuda"), median_seconds, "tanh")
    x = torch.rand(100, depth, device="cuda")
    for variant in ("mma3", "mma3-wide", "tc3"):
        dense.run(variant, x)
        torch.cuda.synchronize()
