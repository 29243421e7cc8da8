"""Probe (issue #24, BF16): triton-igemm-bf16's tile forms and k steps against cuDNN bf16, in one process.

usage: probe.py OUT.json [variants|final] [SETS...]
Per shape of the named sets (default gpumode wide): cuDNN on pure bfloat16 tensors (x and weights already bf16,
bf16 output: no conversion), NCHW and channels-last (NHWC, cuDNN's tensor-core layout), the torch-bf16 entry (float32 in and out, conversions counted), and
triton-igemm-bf16: its chosen tile ("final") or, with "variants", also each of VARIANTS fitted to the layer.
GPU time: harness.timing.time_calls (spin lead, inputs rotated past L2), median; random normal data (never zeros).
"""
import json, sys, time
import torch
import torch.nn.functional as F
from convforge import conv
from convforge.conv import triton_igemm as ti
from convforge.harness.bench import SHAPE_SETS
from convforge.harness.timing import rotated_inputs, time_calls

# (positions, maps, warps, stages, bk)
VARIANTS = [(256, 128, 8, 3, 64), (128, 128, 8, 4, 64), (128, 64, 4, 4, 64), (128, 128, 8, 4, 32),
            (128, 256, 8, 3, 64)]
out_path, mode = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "final")
sets = sys.argv[3:] or ["gpumode", "wide"]
env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
           cudnn=torch.backends.cudnn.version(), triton=ti.triton.__version__,
           date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
print(env, flush=True)
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = False
rows = []


def timed(fn, xs):
    t = time_calls(fn, xs, "cuda", warmup=2, budget_s=float(__import__("os").environ.get("BUDGET", "0.15")))
    return float(sorted(t)[len(t) // 2]) * 1e3


def save(row):
    rows.append(row)
    print(json.dumps({k: v for k, v in row.items() if k not in env}), flush=True)
    json.dump(rows, open(out_path, "w"), indent=1)


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
        xb = rotated_inputs(x.to(torch.bfloat16))
        wb = w.to(torch.bfloat16)
        with torch.inference_mode():
            ms = timed(lambda t: F.conv2d(t, wb), xb)
            save(dict(base, entry="cudnn-bf16-pure", ms=ms, tflops=flops / ms / 1e9))
            # stricter still: cuDNN's own tensor-core layout (NHWC), bf16 in and out, no conversion either
            xb = [t.contiguous(memory_format=torch.channels_last) for t in xb]
            wl = wb.contiguous(memory_format=torch.channels_last)
            ms = timed(lambda t: F.conv2d(t, wl), xb)
            save(dict(base, entry="cudnn-bf16-nhwc", ms=ms, tflops=flops / ms / 1e9))
            del xb
            ms = timed(conv.get("torch-bf16").prepare(w), xs)
            save(dict(base, entry="torch-bf16", ms=ms, tflops=flops / ms / 1e9))
            layer = ti.prepare(w, None, "bf16")
            chosen = layer.tile(B, HO, WO)
            ms = timed(layer, xs)
            save(dict(base, entry="triton-igemm-bf16", tile=list(chosen), chosen=True, ms=ms, tflops=flops / ms / 1e9))
            seen = {chosen}
            for v in (VARIANTS if mode == "variants" else []):
                tile = ti.tile_for(*v[:4], M, C, WO, bk_max=v[4])
                if tile in seen:
                    continue
                seen.add(tile)
                try:
                    ms = timed(ti.prepare(w, None, "bf16", config=tile), xs)
                    save(dict(base, entry="triton-igemm-bf16", form=list(v), tile=list(tile), ms=ms,
                              tflops=flops / ms / 1e9))
                except Exception as e:   # e.g. out of shared memory: recorded, not fatal
                    save(dict(base, entry="triton-igemm-bf16", form=list(v), tile=list(tile),
                              error=str(e).splitlines()[0][:200]))
        del xs, x
        torch.cuda.empty_cache()
