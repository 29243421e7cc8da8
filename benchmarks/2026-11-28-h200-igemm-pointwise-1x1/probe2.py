"""Probe 2 (issue #24, 1x1 layers): variants of triton-igemm's pointwise kernel, against the landed one in its best
call-1 shape (64 positions x 128 maps, 4 warps, 3 stages) and cuDNN, on the wide set's six 1x1 layers and one odd one.
- "persistent": a program keeps one maps tile and walks position tiles (grid: a few programs an SM); where the
  reduction fits one k step (channels <= 128; 64 for 3xTF32) the weights are loaded once, before the walk;
- "truncate" (TF32 only): x goes to tl.dot as loaded, the tensor cores dropping its low bits, not rounded in
  registers first.
One process; GPU time from harness.timing.time_calls (spin lead, inputs rotated past L2), median; every variant
checked against float64 on image 0 first. usage: probe2.py OUT.json
"""
import json
import sys
import time

import torch
import torch.nn.functional as F

from convforge.conv import triton_igemm as ti
from convforge.conv.triton_igemm import Tile, _bf16_high_bits, _tf32_parts
from convforge.harness.timing import rotated_inputs, time_calls

triton, tl = ti.triton, ti.tl
LAYERS = [(64, 64, 64, 56, 56), (32, 256, 128, 28, 28), (16, 128, 16, 1024, 1024), (8, 512, 512, 16, 16),
          (4, 256, 256, 64, 64), (16, 128, 64, 1024, 1024), (3, 100, 36, 57, 43)]


@triton.jit
def persistent_kernel(x_ptr, wb_ptr, ws_ptr, y_ptr, M, C, P, CP, p_tiles, items, NPROG,
                      BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, MODE: tl.constexpr,
                      ONE_STEP: tl.constexpr, TRUNC: tl.constexpr):
    m = tl.program_id(1) * BM + tl.arange(0, BM)
    c_first = tl.arange(0, BK)
    if ONE_STEP:
        wb1 = tl.load(wb_ptr + m[:, None] * CP + c_first[None, :])
        if MODE == 1:
            ws1 = tl.load(ws_ptr + m[:, None] * CP + c_first[None, :])
    for item in range(tl.program_id(0), items, NPROG):
        b = item // p_tiles
        p = (item - b * p_tiles) * BN + tl.arange(0, BN)
        x_img = x_ptr + b.to(tl.int64) * C * P
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for c0 in range(0, CP, BK):
            c = c0 + c_first
            v = tl.load(x_img + c[:, None].to(tl.int64) * P + p[None, :],
                        mask=(c[:, None] < C) & (p[None, :] < P), other=0.0)
            if ONE_STEP:
                wb = wb1
            else:
                wb = tl.load(wb_ptr + m[:, None] * CP + c[None, :])
            if MODE == 2:
                xb = (_bf16_high_bits(v) << 16).to(tl.float32, bitcast=True)
                acc = tl.dot(wb, xb.to(tl.bfloat16), acc)
            elif MODE == 1:
                if ONE_STEP:
                    ws = ws1
                else:
                    ws = tl.load(ws_ptr + m[:, None] * CP + c[None, :])
                xb, xs = _tf32_parts(v, True)
                part = tl.dot(ws, xb, input_precision="tf32")
                part = tl.dot(wb, xs, part, input_precision="tf32")
                part = tl.dot(wb, xb, part, input_precision="tf32")
                acc += part
            else:
                if TRUNC:
                    xb = v
                else:
                    xb, _ = _tf32_parts(v, False)
                acc = tl.dot(wb, xb, acc, input_precision="tf32")
        y_off = (b * M + m[:, None]).to(tl.int64) * P + p[None, :]
        tl.store(y_ptr + y_off, acc, mask=(m[:, None] < M) & (p[None, :] < P))


def persistent_call(layer, x, y, tile, per_sm, trunc=False):
    B, positions = x.shape[0], x.shape[2] * x.shape[3]
    wb, ws = layer.packed(tile)
    cp = layer.channels_padded(tile.bk)
    m_tiles = triton.cdiv(layer.M, tile.bm)
    p_tiles = triton.cdiv(positions, tile.tw)
    items = B * p_tiles
    nprog = max(1, min(items, per_sm * layer.sms // m_tiles))
    persistent_kernel[(nprog, m_tiles)](x, wb, ws, y, layer.M, layer.C, positions, cp, p_tiles, items, nprog,
                                        BN=tile.tw, BM=tile.bm, BK=tile.bk, MODE=ti.POINTWISE_MODES[layer.precision],
                                        ONE_STEP=cp == tile.bk, TRUNC=trunc, num_warps=tile.warps,
                                        num_stages=tile.stages)


out_path = sys.argv[1]
env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
           cudnn=torch.backends.cudnn.version(), triton=triton.__version__,
           date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
print(env, flush=True)
rows = []


def timed(fn, xs):
    with torch.inference_mode():
        fn(xs[0])
        t = time_calls(fn, xs, "cuda", warmup=2, budget_s=0.3)
    return float(sorted(t)[len(t) // 2]) * 1e3


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
    shape = [B, M, C, H, W]
    bytes_moved = 4.0 * B * (C + M) * H * W

    def check(y):
        return float((y[:1].double() - ref).norm() / ref.norm())

    for name, tf32 in (("cudnn-fp32", False), ("cudnn-tf32", True)):
        def fn(v, tf32=tf32):
            with torch.backends.cudnn.flags(enabled=True, benchmark=True, allow_tf32=tf32):
                return F.conv2d(v, w)
        record(dict(shape=shape, variant=name, ms=timed(fn, xs), rel_err=check(fn(x)), **env))
    wh = w.bfloat16()
    record(dict(shape=shape, variant="cudnn-pure-bf16", ms=timed(lambda v: F.conv2d(v, wh), rotated_inputs(x.bfloat16())),
                **env))
    for precision in ("tf32", "bf16", "tf32x3"):
        layer = ti.prepare(w, None, precision)
        bk_max = {"tf32": 128, "bf16": 128, "tf32x3": 64}[precision]
        one = min(bk_max, max(16, ti._pow2_at_least(C)))
        bm = min(128, max(16, ti._pow2_at_least(M)))
        base_bk = layer.pointwise_tile().bk
        variants = [("landed", Tile(1, 64, bm, base_bk, 4, 3), None, False)]
        for bn, warps, stages in ((64, 4, 3), (128, 4, 3), (128, 8, 3), (64, 4, 4), (128, 8, 4), (32, 4, 4)):
            for per_sm in (2, 4):
                variants.append(("persistent", Tile(1, bn, bm, one, warps, stages), per_sm, False))
        if precision == "tf32":
            variants += [("persistent truncate", Tile(1, bn, bm, one, w_, st), 4, True)
                         for bn, w_, st in ((64, 4, 3), (128, 8, 3), (128, 4, 3))]
        for kind, tile, per_sm, trunc in variants:
            row = dict(shape=shape, variant=f"{precision} {kind}", tile=list(tile), per_sm=per_sm, bytes=bytes_moved,
                       **env)
            try:
                def run(v, tile=tile, per_sm=per_sm, trunc=trunc):
                    y = torch.empty(B, M, H, W, device="cuda")
                    if per_sm is None:
                        layer.pointwise_call(v, y, tile)
                    else:
                        persistent_call(layer, v, y, tile, per_sm, trunc)
                    return y
                row["rel_err"] = check(run(x))
                row["ms"] = timed(run, xs)
            except Exception as e:
                row["error"] = str(e).splitlines()[0][:200]
            record(row)
