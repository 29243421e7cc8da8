"""Probe (issue #24, reduced precision on 1x1 layers): triton-igemm's pointwise kernel (POINTWISE_NOTE: a 1x1
layer read from the NCHW input itself, no channels-last prologue) in several launch shapes, against the prologue +
implicit GEMM path it replaces and cuDNN (fp32, TF32, pure bf16) on the wide set's six 1x1 layers and two odd
ones. One process; GPU time from harness.timing.time_calls (spin lead, inputs rotated past L2), median; random
normal data; every variant checked against float64 on image 0 first (relative error printed).

usage: probe.py OUT.json
"""
import json
import sys
import time

import torch
import torch.nn.functional as F

from convforge.conv import triton_igemm as ti
from convforge.conv.triton_igemm import Tile
from convforge.harness.timing import rotated_inputs, time_calls

LAYERS = [(64, 64, 64, 56, 56), (32, 256, 128, 28, 28), (16, 128, 16, 1024, 1024), (8, 512, 512, 16, 16),
          (4, 256, 256, 64, 64), (16, 128, 64, 1024, 1024), (3, 100, 36, 57, 43), (2, 24, 5, 9, 13)]
# (positions, maps, warps, stages); maps trimmed to the layer, channels a step from the chooser
FORMS = [(128, 128, 8, 3), (256, 128, 8, 3), (128, 64, 4, 3), (64, 128, 4, 3), (64, 64, 4, 3), (256, 64, 8, 3),
         (128, 128, 4, 3), (128, 128, 8, 2), (64, 128, 4, 4), (128, 256, 8, 2), (32, 128, 4, 3)]
out_path = sys.argv[1]
env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
           cudnn=torch.backends.cudnn.version(), triton=ti.triton.__version__,
           date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
print(env, flush=True)
torch.backends.cudnn.benchmark = True
rows = []


def timed(fn, xs):
    with torch.inference_mode():
        fn(xs[0])
        t = time_calls(fn, xs, "cuda", warmup=2, budget_s=0.3)
    return float(sorted(t)[len(t) // 2]) * 1e3


def cudnn(tf32):
    def run(x, w):
        with torch.backends.cudnn.flags(enabled=True, benchmark=True, allow_tf32=tf32):
            return F.conv2d(x, w)
    return run


def record(row):
    rows.append(row)
    print(json.dumps({k: v for k, v in row.items() if k not in env}), flush=True)
    with open(out_path, "w") as f:
        json.dump(dict(env=env, rows=rows), f, indent=1)


for B, M, C, H, W in LAYERS:
    g = torch.Generator(device="cuda").manual_seed(B * 7 + M)
    x = torch.randn(B, C, H, W, device="cuda", generator=g)
    w = torch.randn(M, C, 1, 1, device="cuda", generator=g) / C ** 0.5
    ref = F.conv2d(x[:1].double(), w.double())
    xs = rotated_inputs(x)
    bytes_moved = 4.0 * B * (C + M) * H * W
    shape = [B, M, C, H, W]

    def check(y):
        return float((y[:1].double() - ref).norm() / ref.norm())

    for name, tf32 in (("cudnn-fp32", False), ("cudnn-tf32", True)):
        fn = cudnn(tf32)
        ms = timed(lambda v: fn(v, w), xs)
        record(dict(shape=shape, variant=name, ms=ms, tbps=bytes_moved / ms / 1e9, rel_err=check(fn(x, w)), **env))
    xh, wh = x.bfloat16(), w.bfloat16()
    ms = timed(lambda v: F.conv2d(v, wh), rotated_inputs(xh))
    record(dict(shape=shape, variant="cudnn-pure-bf16", ms=ms, rel_err=check(F.conv2d(xh, wh).float()), **env))
    for precision in ("tf32", "bf16", "tf32x3"):
        old = ti.prepare(w, None, precision)
        old.pointwise = False
        try:
            record(dict(shape=shape, variant=f"{precision} prologue+igemm", ms=timed(old, xs), rel_err=check(old(x)),
                        **env))
        except Exception as e:
            record(dict(shape=shape, variant=f"{precision} prologue+igemm", error=str(e).splitlines()[0][:200], **env))
        layer = ti.prepare(w, None, precision)
        chosen = layer.pointwise_tile()
        tiles = [chosen] + [t for t in dict.fromkeys(
            Tile(1, bn, min(bm, max(16, ti._pow2_at_least(M))), chosen.bk, wp, st) for bn, bm, wp, st in FORMS)
            if t != chosen]
        for tile in tiles:
            row = dict(shape=shape, variant=f"{precision} pointwise", tile=list(tile), chosen=tile == chosen, **env)
            try:
                def run(v, tile=tile):
                    y = torch.empty(B, M, H, W, device="cuda")
                    layer.pointwise_call(v, y, tile)
                    return y
                row["rel_err"] = check(run(x))
                row["ms"] = timed(run, xs)
                row["tbps"] = bytes_moved / row["ms"] / 1e9
            except Exception as e:
                row["error"] = str(e).splitlines()[0][:200]
            record(row)
