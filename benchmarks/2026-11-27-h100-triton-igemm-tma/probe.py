"""Probe: triton-igemm (TMA from a channels-last split copy) against cuDNN fp32 / TF32 and cuda-igemm.

usage: probe.py OUT.json [shape-set ...]   (sets: gpumode, wide6, wide: bench's 35; env BUDGET, NO_IGEMM=1)
Per shape: accuracy of every timed entry against float64 on image 0 (output poisoned with NaN first),
then GPU time (harness.timing.time_calls, spin lead, inputs rotated past L2, median).
"""
import json, sys, time, traceback
import torch
import torch.nn.functional as F
from convforge.harness.timing import time_calls, rotated_inputs
from convforge.conv import triton_igemm as ti
from convforge.conv import cuda_igemm
from convforge.harness.bench import SHAPE_SETS
import os
BUDGET = float(os.environ.get("BUDGET", "1.0"))

SETS = {
    "gpumode": [(4, 64, 64, 128, 128, 8), (4, 64, 64, 128, 128, 16), (2, 128, 128, 256, 256, 16),
                (1, 128, 128, 256, 256, 32)],
    "wide6": [(8, 128, 128, 64, 64, 5), (64, 64, 64, 56, 56, 3), (32, 128, 128, 28, 28, 3),
              (16, 128, 32, 1024, 1024, 3), (1, 512, 256, 32, 32, 7), (8, 512, 512, 16, 16, 3)],
}
SETS["wide"] = list(SHAPE_SETS["wide"])
# (positions, maps, warps, stages) per precision; rows x columns and BK follow from the layer (tiles_for)
FORMS = {
    "tf32x3": [(128, 128, 8, 3), (128, 64, 4, 4), (64, 128, 4, 3)],
    "tf32": [(128, 128, 8, 4), (256, 128, 8, 3), (128, 64, 4, 4)],
}


def tiles_for(precision, M, C, WO):
    out = []
    for bn, bm, warps, stages in FORMS[precision]:
        if bm > 64 and M <= 64:
            continue
        tw = min(bn, max(8, 1 << (WO - 1).bit_length()))
        bk = 16 if C <= 16 else 32
        bm = min(bm, max(16, 1 << (M - 1).bit_length()))
        tile = ti.Tile(bn // tw, tw, bm, bk, warps, stages)
        if tile not in out:
            out.append(tile)
    return out


def rel(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


def main():
    out_path = sys.argv[1]
    sets = sys.argv[2:] or ["gpumode"]
    rows = []
    env = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
               triton=ti.triton.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    print(env, flush=True)
    torch.backends.cudnn.benchmark = True
    for name in sets:
        for (B, M, C, H, W, K) in SETS[name]:
            g = torch.Generator(device="cuda").manual_seed(B * 7 + M + C + H + K)
            x = torch.randn(B, C, H, W, device="cuda", generator=g)
            w = torch.randn(M, C, K, K, device="cuda", generator=g) / (C * K * K) ** 0.5
            flops = 2.0 * B * M * C * K * K * (H - K + 1) * (W - K + 1)
            ref0 = F.conv2d(x[:1].double(), w.double())
            xs = rotated_inputs(x)

            def record(entry, fn, precision, tile=None, check=None):
                row = dict(shape=[B, M, C, H, W, K], entry=entry, tile=list(tile) if tile else None, **env)
                try:
                    t0 = time.perf_counter()
                    y0 = fn(x)                                 # compile + first call
                    torch.cuda.synchronize()
                    row["first_call_s"] = time.perf_counter() - t0
                    if precision != "none":
                        if check is None:
                            row["rel_err_img0"] = rel(fn(x[:1]), ref0)
                        else:   # our kernels: into an output poisoned with NaN
                            poisoned = torch.full_like(ref0, float("nan"), dtype=torch.float32)
                            check(x[:1], poisoned)
                            row["rel_err_img0"] = rel(poisoned, ref0)
                    times = time_calls(fn, xs, "cuda", warmup=2, budget_s=BUDGET)
                    ms = float(sorted(times)[len(times) // 2]) * 1e3
                    row.update(ms=ms, tflops=flops / ms / 1e9, n=len(times))
                except Exception as e:  # a failing config is a row, not the end of the probe
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    traceback.print_exc()
                rows.append(row)
                print(json.dumps({k: row.get(k) for k in ("shape", "entry", "tile", "ms", "tflops", "rel_err_img0", "first_call_s", "error")}), flush=True)
                with open(out_path, "w") as f:
                    json.dump(rows, f, indent=1)

            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            record("cudnn-fp32", lambda t: F.conv2d(t, w), "fp32")
            torch.backends.cudnn.allow_tf32 = True
            record("cudnn-tf32", lambda t: F.conv2d(t, w), "tf32")
            torch.backends.cudnn.allow_tf32 = False
            if not os.environ.get("NO_IGEMM"):
                ig = cuda_igemm.prepare(w, None, "tf32x3")
                record("cuda-igemm-3xtf32", lambda t: ig(t, None), "tf32x3", check=ig)
            for precision in FORMS:
                for tile in tiles_for(precision, M, C, W - K + 1):
                    layer = ti.prepare(w, None, precision, 0, tile)
                    record(f"triton-igemm-{precision}", layer, precision, tile, check=layer)
            record("prologue-tf32", layer.channels_last, "none")
            pro = ti.prepare(w, None, "tf32x3", 0, tiles_for("tf32x3", M, C, W - K + 1)[0])
            record("prologue-3xtf32", pro.channels_last, "none")
            del xs, x


main()
