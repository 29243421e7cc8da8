"""Probe: triton-igemm's 3xTF32 accumulation variants and TF32 tiles for layers of <= 64 maps (call 4).

usage: variants.py OUT.json [sums]
Run 1 (call 4, H200, at the kernel of that time): 3xTF32 with FLUSH (k steps summed in the tensor cores'
accumulator before each fp32 add) 1 / 2 / 4, each with the small cross terms in the per-flush sum or apart in
their own accumulator (CROSS_APART), on the chosen tile; TF32 tile forms on layers of <= 64 maps, with cuDNN
TF32 in the same process. Run 2 ("sums", call 5): the kernel's SUMS modes 0 / 1 / 2 (SUMS_NOTE) instead.
Relative error of image 0 against float64 (output poisoned with NaN). GPU time: harness.timing.time_calls
(spin lead, inputs rotated past L2).
"""
import json, sys, time
import torch
import torch.nn.functional as F
from convforge.harness.timing import time_calls, rotated_inputs
from convforge.conv import triton_igemm as ti

X3 = [(2, 128, 128, 256, 256, 16), (1, 128, 128, 256, 256, 32), (8, 128, 128, 64, 64, 5), (4, 128, 128, 64, 64, 9),
      (2, 64, 64, 256, 256, 7), (4, 64, 64, 128, 128, 8)]
TF = [(4, 64, 64, 128, 128, 8), (4, 64, 64, 128, 128, 16), (64, 64, 64, 56, 56, 3), (2, 64, 64, 256, 256, 7),
      (16, 32, 32, 128, 128, 9), (32, 64, 32, 64, 64, 5)]
TF_FORMS = [(128, 64, 4, 4), (256, 64, 8, 3), (256, 64, 4, 3), (128, 64, 4, 6), (64, 64, 4, 4), (128, 64, 8, 4)]
rows = []
env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
           triton=ti.triton.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
print(env, flush=True)
torch.backends.cudnn.benchmark = True


def case(s):
    B, M, C, H, W, K = s
    g = torch.Generator(device="cuda").manual_seed(B * 7 + M + C + H + K)
    x = torch.randn(B, C, H, W, device="cuda", generator=g)
    w = torch.randn(M, C, K, K, device="cuda", generator=g) / (C * K * K) ** 0.5
    return x, w, 2.0 * B * M * C * K * K * (H - K + 1) * (W - K + 1)


def timed(fn, xs):
    t = time_calls(fn, xs, "cuda", warmup=2, budget_s=0.3)
    return float(sorted(t)[len(t) // 2]) * 1e3


def save(row):
    rows.append(row)
    print(json.dumps(row), flush=True)
    json.dump(rows, open(sys.argv[1], "w"), indent=1)


for s in X3:
    x, w, flops = case(s)
    xs = rotated_inputs(x)
    ref0 = F.conv2d(x[:1].double(), w.double())
    torch.backends.cudnn.allow_tf32 = False
    save(dict(shape=s, entry="cudnn-fp32", ms=timed(lambda t: F.conv2d(t, w), xs), **env))
    for sums in (0, 1, 2):
        if True:
            layer = ti.prepare(w, None, "tf32x3")
            layer.sums = sums
            try:
                out = torch.full_like(ref0, float("nan"), dtype=torch.float32)
                layer(x[:1], out=out)
                err = ((out.double() - ref0).norm() / ref0.norm()).item()
                ms = timed(layer, xs)
                save(dict(shape=s, entry="triton-igemm-3xtf32", sums=sums, tile=list(layer.tile(s[0], s[3] - s[5] + 1, s[4] - s[5] + 1)), ms=ms,
                          tflops=flops / ms / 1e9, rel_err_img0=err, **env))
            except Exception as e:
                save(dict(shape=s, entry="triton-igemm-3xtf32", sums=sums, error=str(e)[:300]))
    del xs, x

for s in ([] if sys.argv[2:] == ["sums"] else TF):
    x, w, flops = case(s)
    xs = rotated_inputs(x)
    B, M, C, H, W, K = s
    torch.backends.cudnn.allow_tf32 = True
    save(dict(shape=s, entry="cudnn-tf32", ms=timed(lambda t: F.conv2d(t, w), xs), **env))
    torch.backends.cudnn.allow_tf32 = False
    for form in TF_FORMS:
        tile = ti.tile_for(*form, M, C, W - K + 1)
        layer = ti.prepare(w, None, "tf32", config=tile)
        try:
            ms = timed(layer, xs)
            save(dict(shape=s, entry="triton-igemm-tf32", form=form, tile=list(tile), ms=ms,
                      tflops=flops / ms / 1e9, **env))
        except Exception as e:
            save(dict(shape=s, entry="triton-igemm-tf32", form=form, error=str(e)[:300]))
    del xs, x
