"""Probe (call 11): triton-igemm's split-K (SPLIT_NOTE) on and off, on the gpu-mode and wide shapes it splits.

usage: splitk.py OUT.json
For each shape whose chosen tile gives fewer programs than the SMs (SPLIT_BELOW set to 1.0 here; the module's is
0.55): cuDNN fp32 and TF32, then both triton-igemm precisions with split-K on and off, in one process; relative error of image 0 against float64
(output poisoned with NaN). GPU time: harness.timing.time_calls (spin lead, inputs rotated past L2, median).
"""
import json, sys, time
import torch
import torch.nn.functional as F
from convforge.harness.timing import time_calls, rotated_inputs
from convforge.harness.bench import SHAPE_SETS
from convforge.conv import triton_igemm as ti

env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
           triton=ti.triton.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
print(env, flush=True)
torch.backends.cudnn.benchmark = True
sms = torch.cuda.get_device_properties(0).multi_processor_count
ti.SPLIT_BELOW = 1.0
rows = []


def timed(fn, xs):
    t = time_calls(fn, xs, "cuda", warmup=2, budget_s=0.3)
    return float(sorted(t)[len(t) // 2]) * 1e3


for s in SHAPE_SETS["gpumode"] + SHAPE_SETS["wide"]:
    B, M, C, H, W, K = s
    HO, WO = H - K + 1, W - K + 1
    split = {p: ti.choose_tile(p, B, M, C, HO, WO, K, K, sms) for p in ti.PRECISIONS}
    if all(ti.programs(t, B, M, HO, WO) >= ti.SPLIT_BELOW * sms for t in split.values()):
        continue
    g = torch.Generator(device="cuda").manual_seed(B + M + C + H + K)
    x = torch.randn(B, C, H, W, device="cuda", generator=g)
    w = torch.randn(M, C, K, K, device="cuda", generator=g) / (C * K * K) ** 0.5
    xs = rotated_inputs(x)
    ref0 = F.conv2d(x[:1].double(), w.double())
    row = dict(shape=s, **env)
    torch.backends.cudnn.allow_tf32 = False
    row["cudnn_fp32_ms"] = timed(lambda t: F.conv2d(t, w), xs)
    torch.backends.cudnn.allow_tf32 = True
    row["cudnn_tf32_ms"] = timed(lambda t: F.conv2d(t, w), xs)
    torch.backends.cudnn.allow_tf32 = False
    for p in ti.PRECISIONS:
        for on in (False, True):
            layer = ti.prepare(w, None, p)
            layer.split_k = on
            t = layer.tile(B, HO, WO)
            steps = K * K * layer.channels_padded(t.bk) // t.bk
            out = torch.full_like(ref0, float("nan"), dtype=torch.float32)
            layer(x[:1], out=out)
            key = f"{p}_{'split' if on else 'one'}"
            row[key + "_err_img0"] = ((out.double() - ref0).norm() / ref0.norm()).item()
            row[key + "_ms"] = timed(layer, xs)
            row[key + "_splits"] = layer.splits_for(t, B, HO, WO, steps) if on else 1
            row[p + "_tile"] = list(t)
    rows.append(row)
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if k not in env}), flush=True)
    json.dump(rows, open(sys.argv[1], "w"), indent=1)
    del x, xs
