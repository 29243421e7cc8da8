"""Probe (issue #24, 3xTF32 ceiling): triton-igemm-3xtf32 with x's TF32 parts made in the kernel (XREG_NOTE) and
several k steps a fresh sum (PER_SUM_NOTE), against the prologue-split kernel, on gpu-mode's four layers. One
process; GPU time from harness.timing.time_calls (spin lead, inputs rotated past L2), median; random normal data;
each variant checked against float64 on image 0 first (relative error recorded).

usage: probe.py OUT.json [layer-index ...]
"""
import itertools
import json
import sys
import time

import torch
import torch.nn.functional as F

from convforge.conv import triton_igemm as ti
from convforge.conv.triton_igemm import Tile
from convforge.harness.probes import measure_ceilings
from convforge.harness.timing import rotated_inputs, time_calls

LAYERS = ((4, 64, 64, 128, 8), (4, 64, 64, 128, 16), (2, 128, 128, 256, 16), (1, 128, 128, 256, 32))
# per layer: (R, TW, BM, BK, warps) launch forms; each with stages 2-4, x split in the prologue or in the kernel,
# and 1, 2 or 4 k steps a fresh sum (4 with x in the kernel only)
FORMS = {128: ((1, 128, 64, 32, 4), (1, 128, 128, 32, 8)), 256: ((1, 128, 128, 32, 8), (1, 64, 128, 32, 4))}
out_path = sys.argv[1]
pick = [int(a) for a in sys.argv[2:]] or range(len(LAYERS))
env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
           triton=ti.triton.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
print(env, flush=True)
tf32_tflops = measure_ceilings("cuda").tf32_gflops / 1e3
print(f"tf32 matmul {tf32_tflops:.1f} TFLOP/s; 3xTF32 ceiling {tf32_tflops / 3:.1f}", flush=True)
rows = []
for B, M, C, H, K in (LAYERS[i] for i in pick):
    HO = H - K + 1
    flops = 2.0 * B * M * C * K * K * HO * HO
    g = torch.Generator(device="cuda").manual_seed(B + K)
    x = torch.randn(B, C, H, H, device="cuda", generator=g)
    w = torch.randn(M, C, K, K, device="cuda", generator=g) / (C * K * K) ** 0.5
    ref = F.conv2d(x[:1].double(), w.double())
    xs = rotated_inputs(x)
    chosen = ti.prepare(w, None, "tf32x3").tile(B, HO, HO)
    variants = [(chosen, False, 1)]
    for form, stages, xreg, per_sum in itertools.product(FORMS[H], (2, 3, 4), (False, True), (1, 2, 4)):
        tile = Tile(*form, stages)
        if (per_sum == 4 and not xreg) or (tile, xreg, per_sum) in variants:
            continue
        variants.append((tile, xreg, per_sum))
    for tile, xreg, per_sum in variants:
        row = dict(shape=[B, M, C, H, H, K], tile=list(tile), x_in_registers=xreg, steps_per_sum=per_sum,
                   chosen=(tile, xreg, per_sum) == (chosen, False, 1), **env)
        try:
            layer = ti.prepare(w, None, "tf32x3", config=tile)
            layer.x_in_registers, layer.steps_per_sum = xreg, per_sum
            with torch.inference_mode():
                y = layer(x)
                row["rel_err"] = float((y[:1].double() - ref).norm() / ref.norm())
                t = time_calls(layer, xs, "cuda", warmup=1, budget_s=0.4)
            row["ms"] = float(sorted(t)[len(t) // 2]) * 1e3
            row["tflops"] = flops / row["ms"] / 1e9
            row["pct_of_3xtf32_ceiling"] = 100 * row["tflops"] / (tf32_tflops / 3)
        except Exception as e:   # e.g. out of shared memory: recorded, not fatal
            row["error"] = str(e).splitlines()[0][:200]
        rows.append(row)
        print(f"{B} {M} {C} {H} {K} | {','.join(map(str, tile))} x{int(xreg)} s{per_sum} | "
              + (f"{row['ms']:.3f} ms {row['pct_of_3xtf32_ceiling']:.1f} % err {row['rel_err']:.1e}"
                 + (" chosen" if row["chosen"] else "") if "ms" in row else row["error"][:60]), flush=True)
        with open(out_path, "w") as f:
            json.dump(dict(tf32_matmul_tflops=tf32_tflops, rows=rows), f, indent=1)
