"""Issue #21: each preset's first dense layer alone at 10/100/1000/10000 rows in every GpuDense form (the
tensor-core tc3 forms included), a small sweep of other Triton 3xTF32 block shapes, and cuda-igemm-3xtf32 on the
layer as a 1x1 convolution of a 1x1 image. GPU time: CUDA events after a spin (engine.median_seconds), median of 7
medians of one call per weight copy, the weights rotated over copies that together exceed twice the L2 cache.
Every form checked against float64 first (relative error printed, <= 1e-5 asserted for the exact forms).
Usage: PYTHONPATH=. python3 benchmarks/2026-11-27-h100-dense-3xtf32/dense_forms.py [preset ...] [rows ...]"""
import statistics
import sys

import torch

from convforge import gpu_dense, gpu_dense_tc
from convforge.conv import cuda_common as cc, get
from convforge.engine import LEAD_CYCLES, median_seconds
from convforge.gpu_dense import GpuDense
from convforge.models import PRESETS, load_preset

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
L2 = torch.cuda.get_device_properties(0).L2_cache_size
SM = torch.cuda.get_device_properties(0).multi_processor_count
ROWS = [int(r) for r in sys.argv[1:] if r.isdigit()] or [10, 100, 1000, 10000]
ONLY = [a for a in sys.argv[1:] if not a.isdigit()]   # presets to time (default: all)
# extra Triton shapes: (BM, BN, BK, min slice, blocks per SM, warps, stages)
SWEEP = [(None, 32, 64, 256, 8, 4, 3), (None, 64, 64, 512, 4, 4, 3), (None, 32, 32, 256, 16, 4, 4),
         (None, 64, 32, 256, 8, 4, 4), (128, 128, 32, 512, 2, 8, 3), (64, 128, 32, 512, 4, 4, 3)]


def first_dense_layers():
    seen = {}
    for preset in PRESETS:
        if preset == "fa17-low" or (ONLY and preset not in ONLY):
            continue
        params = load_preset(preset).params
        for name, w in params.items():
            if name.endswith(".weight") and w.dim() == 2:
                seen.setdefault(tuple(w.shape), (preset, name, w.float(), params.get(name[:-len("weight")] + "bias")))
                break
    return seen.values()


def sweep_call(dense, x, cfg):
    bm, bn, bk, min_slice, per_sm, warps, stages = cfg
    rows, depth = x.shape
    outputs = dense.weight.shape[0]
    bm = bm or gpu_dense.tc_rows_per_block(rows)
    tiles = cc.cdiv(rows, bm) * cc.cdiv(outputs, bn)
    wanted = max(1, min(per_sm * SM // tiles, depth // min_slice))
    length = cc.cdiv(cc.cdiv(depth, wanted), bk) * bk
    slices = cc.cdiv(depth, length)
    part = gpu_dense.scratch((slices, rows, outputs), x.device)
    gpu_dense_tc.launch_part(x, dense.weight, part, length, (bm, bn, bk), warps, stages)
    return dense._sum(gpu_dense.kernel_specs()[0], part, rows, outputs, slices)


def timed(fns, copies):
    state = {"i": 0}

    def call():
        fns[state["i"] % copies]()
        state["i"] += 1
    for f in fns:
        f()
    return statistics.median(median_seconds(call, "cuda", copies) for _ in range(7)) * 1e6


def main():
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}, L2 {L2 / 2**20:.0f} MiB, {SM} SMs, "
          f"spin {LEAD_CYCLES}", flush=True)
    igemm = get("cuda-igemm-3xtf32")
    for preset, name, w, b in first_dense_layers():
        w, b = w.cuda(), b.float().cuda()
        outputs, depth = w.shape
        copies = max(2, int(2 * L2 // w.numel() // 4) + 1)
        denses = [GpuDense(w + 0.0 if i == 0 else w * (1 + 1e-3 * i), b, median_seconds) for i in range(copies)]
        print(f"\n{preset} {name} {depth} -> {outputs}  ({copies} weight copies)", flush=True)
        for rows in ROWS:
            x = torch.rand(rows, depth, device="cuda") * 255
            ref = torch.nn.functional.linear(x.double(), w.double(), b.double())
            results = []
            forms = [(v, (lambda d, v=v: d.run(v, x))) for v in GpuDense.VARIANTS if denses[0].serves(v, rows)]
            forms += [(f"sweep{cfg}", (lambda d, cfg=cfg: sweep_call(d, x, cfg))) for cfg in SWEEP
                      if denses[0].has_tc]
            if igemm.unavailable_reason("cuda") is None:
                convs = [igemm.prepare(d.weight.view(outputs, depth, 1, 1), b, input_hw=(1, 1)) for d in denses]
                forms.append(("cuda-igemm-3xtf32 1x1", None))
            for label, fn in forms:
                if fn is None:   # the 1x1 convolution
                    xi = x.view(rows, depth, 1, 1)
                    out = convs[0](xi).view(rows, outputs)
                    fns = [lambda c=c: c(xi) for c in convs]
                else:
                    out = fn(denses[0])
                    fns = [lambda d=d, fn=fn: fn(d) for d in denses]
                err = ((out.double() - ref).norm() / ref.norm()).item()
                assert err <= 1e-5, (preset, rows, label, err)
                us = timed(fns, copies)
                results.append((us, label, err))
            best = min(results)
            flops = 2 * rows * depth * outputs
            for us, label, err in results:
                mark = " <- best" if (us, label, err) == best else ""
                print(f"  rows {rows:6d} {label:40s} {us:10.1f} us  {flops / us / 1e6:8.1f} TFLOP/s  "
                      f"err {err:.1e}{mark}", flush=True)


if __name__ == "__main__":
    main()
