"""Probe (issue #24, 3xTF32 ceiling): triton-igemm-3xtf32's chosen tile and other launch shapes on gpu-mode's two
256-px layers, the compute-bound ones whose % of the 3xTF32 ceiling the issue asks for (57 % and 65 % at the last
record). One process; GPU time from harness.timing.time_calls (spin lead, inputs rotated past L2), median;
random normal data; each tile checked against float64 on image 0 first (relative error printed).

usage: probe_3xtf32.py OUT.json
"""
import json
import sys
import time

import torch
import torch.nn.functional as F

from convforge.conv import triton_igemm as ti
from convforge.conv.triton_igemm import Tile
from convforge.harness.probes import measure_ceilings
from convforge.harness.timing import rotated_inputs, time_calls

# (R, TW, BM, BK, warps, stages); the chosen tile is added in front
TILES = [Tile(1, 128, 128, 32, 8, 4), Tile(1, 128, 128, 16, 8, 4), Tile(1, 128, 128, 16, 8, 6),
         Tile(1, 256, 128, 16, 8, 3), Tile(1, 256, 128, 32, 8, 2), Tile(1, 128, 256, 16, 8, 3),
         Tile(1, 128, 128, 32, 4, 3), Tile(1, 256, 64, 32, 8, 3), Tile(1, 64, 128, 32, 4, 3)]
out_path = sys.argv[1]
env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
           triton=ti.triton.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
print(env, flush=True)
# the harness's TF32 ceiling as bench measures it (probes.measure_ceilings: the best rate this machine recorded)
tf32_tflops = measure_ceilings("cuda").tf32_gflops / 1e3
print(f"tf32 matmul {tf32_tflops:.1f} TFLOP/s; 3xTF32 ceiling {tf32_tflops / 3:.1f}", flush=True)
rows = []
for B, M, C, H, K in ((2, 128, 128, 256, 16), (1, 128, 128, 256, 32)):
    HO = H - K + 1
    flops = 2.0 * B * M * C * K * K * HO * HO
    g = torch.Generator(device="cuda").manual_seed(B + K)
    x = torch.randn(B, C, H, H, device="cuda", generator=g)
    w = torch.randn(M, C, K, K, device="cuda", generator=g) / (C * K * K) ** 0.5
    ref = F.conv2d(x[:1].double(), w.double())
    xs = rotated_inputs(x)
    chosen = ti.prepare(w, None, "tf32x3").tile(B, HO, HO)
    for tile in [chosen] + [t for t in TILES if t != chosen]:
        row = dict(shape=[B, M, C, H, H, K], tile=list(tile), chosen=tile == chosen, **env)
        try:
            layer = ti.prepare(w, None, "tf32x3", config=tile)
            with torch.inference_mode():
                y = layer(x)
                row["rel_err"] = float((y[:1].double() - ref).norm() / ref.norm())
                t = time_calls(layer, xs, "cuda", warmup=1, budget_s=1.0)
            row["ms"] = float(sorted(t)[len(t) // 2]) * 1e3
            row["tflops"] = flops / row["ms"] / 1e9
            row["pct_of_3xtf32_ceiling"] = 100 * row["tflops"] / (tf32_tflops / 3)
        except Exception as e:   # e.g. out of shared memory: recorded, not fatal
            row["error"] = str(e).splitlines()[0][:200]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in env}), flush=True)
        with open(out_path, "w") as f:
            json.dump(dict(tf32_matmul_tflops=tf32_tflops, rows=rows), f, indent=1)
