"""The gather kernel (cuda/tc.cu, cuda-tc-fp16) on the presets' unfused second convs at 1-1000 images, with its
small-batch grid.y split and without (one block an image, as before), and the exact kernel (cuda-auto) beside:
GPU time (CUDA events, a spin ahead, median of 100, inputs rotated past L2). Usage: python3 gather_split.py
"""
import numpy as np
import torch

from convforge import conv
from convforge.conv import cuda_tc
from convforge.conv.torch_conv import exact_fp32
from convforge.harness.sweep import preset_layers
from convforge.harness.timing import rotated_inputs, time_calls

exact_fp32()
one_block_an_image = lambda self, B: (min(B, self.grid_cap),)   # noqa: E731  (the grid before the split)
split = cuda_tc.TcLayer.grid
for spec in preset_layers(["sp18 L2", "sp19 L2", "fa18 L2", "fa19 L2"]):
    s = spec.shape
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(s.M, s.C, s.K, s.K, device="cuda", generator=g) * 0.1
    b = torch.randn(s.M, device="cuda", generator=g)
    fast = conv.get("cuda-tc-fp16").prepare(w, b, input_hw=(s.H, s.W))
    exact = conv.get("cuda-auto").prepare(w, b, input_hw=(s.H, s.W))
    layer = fast.layer_for(s.H, s.W)
    for batch in (1, 10, 100, 1000):
        x = torch.rand(batch, s.C, s.H, s.W, device="cuda", generator=g)
        inputs = rotated_inputs(x)
        row = []
        for label, fn, grid in (("split", fast, split), ("one block an image", fast, one_block_an_image),
                                ("exact", exact, split)):
            cuda_tc.TcLayer.grid = grid
            ms = float(np.median(time_calls(lambda xi: fn(xi), inputs, "cuda", repeat=100, timing="gpu"))) * 1e3
            row.append(f"{label} {ms * 1e3:7.1f} us")
        cuda_tc.TcLayer.grid = split
        print(f"{spec.label:8s} {layer.kind:6s} B {batch:5d}  grid {layer.grid(batch)}  " + "  ".join(row), flush=True)
