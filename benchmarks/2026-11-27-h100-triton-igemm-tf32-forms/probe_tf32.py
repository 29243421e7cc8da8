"""Probe (issue #24, TF32): triton-igemm-tf32's chosen tile and other tile forms against cuDNN's TF32, one process.

usage: probe_tf32.py OUT.json [SETS...]     (default sets: gpumode wide)
Per shape: cuDNN with TF32 on (the torch-tf32 entry: float32 NCHW in and out, nothing to convert), cuDNN TF32 on
channels-last tensors (its tensor-core layout, stricter), triton-igemm-tf32's chosen tile, and each form of FORMS
fitted to the layer by triton_igemm.tile_for. GPU time: harness.timing.time_calls (spin lead, inputs rotated past
L2), median; random normal data. Evidence for the TF32 tile rule (TILE_NOTE); no code reads this folder.
"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

from convforge import conv
from convforge.conv import triton_igemm as ti
from convforge.harness.bench import SHAPE_SETS
from convforge.harness.timing import rotated_inputs, time_calls

# (positions, maps, warps, stages): the TF32 forms of FORMS and BF16's measured additions, all with 32-channel steps
FORMS = [(256, 128, 8, 3), (128, 128, 8, 4), (128, 128, 8, 3), (128, 64, 4, 4), (128, 256, 8, 3), (256, 32, 8, 3),
         (256, 64, 8, 3), (64, 128, 4, 3)]
out_path, sets = sys.argv[1], sys.argv[2:] or ["gpumode", "wide"]
env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
           cudnn=torch.backends.cudnn.version(), triton=ti.triton.__version__,
           date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
print(env, flush=True)
rows = []


def median_ms(fn, xs):
    t = time_calls(fn, xs, "cuda", warmup=2, budget_s=float(os.environ.get("BUDGET", "0.12")))
    return float(sorted(t)[len(t) // 2]) * 1e3


def save(row):
    rows.append(row)
    print(json.dumps({k: v for k, v in row.items() if k not in env}), flush=True)
    with open(out_path, "w") as f:
        json.dump(rows, f, indent=1)


for name in sets:
    for s in SHAPE_SETS[name]:
        B, M, C, H, W, K = s
        HO, WO = H - K + 1, W - K + 1
        flops = 2.0 * B * M * C * K * K * HO * WO
        g = torch.Generator(device="cuda").manual_seed(B * 7 + M + C + H + K)
        x = torch.randn(B, C, H, W, device="cuda", generator=g)
        w = torch.randn(M, C, K, K, device="cuda", generator=g) / (C * K * K) ** 0.5
        base = dict(set=name, shape=list(s), gflop=flops / 1e9, **env)
        xs = rotated_inputs(x)
        with torch.inference_mode():
            ms = median_ms(conv.get("torch-tf32").prepare(w), xs)
            save(dict(base, entry="torch-tf32", ms=ms, tflops=flops / ms / 1e9))
            xl = [t.contiguous(memory_format=torch.channels_last) for t in xs]
            wl = w.contiguous(memory_format=torch.channels_last)
            with torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False, allow_tf32=True):
                ms = median_ms(lambda t: F.conv2d(t, wl), xl)
            save(dict(base, entry="cudnn-tf32-nhwc", ms=ms, tflops=flops / ms / 1e9))
            del xl
            layer = ti.prepare(w, None, "tf32")
            chosen = layer.tile(B, HO, WO)
            ms = median_ms(layer, xs)
            save(dict(base, entry="triton-igemm-tf32", tile=list(chosen), chosen=True, ms=ms, tflops=flops / ms / 1e9))
            seen = {chosen}
            for form in FORMS:
                tile = ti.tile_for(*form, M, C, WO)
                if tile in seen:
                    continue
                seen.add(tile)
                try:
                    ms = median_ms(ti.prepare(w, None, "tf32", config=tile), xs)
                    save(dict(base, entry="triton-igemm-tf32", form=list(form), tile=list(tile), ms=ms,
                              tflops=flops / ms / 1e9))
                except Exception as e:   # e.g. out of shared memory: recorded, not fatal
                    save(dict(base, entry="triton-igemm-tf32", form=list(form), tile=list(tile),
                              error=str(e).splitlines()[0][:200]))
        del xs, x
        torch.cuda.empty_cache()
