"""Issue #21: dense_gemv.cu's row group at 10 rows. The engine runs 10 rows as one group of CF_ROWS = 16 (six
rows of padding, 175 blocks for fa18's 17496 -> 160 layer); here also CF_ROWS = 8 (two groups: 350 blocks, the
weights read twice, the second time mostly from L2) and 4 (three groups), for fa18's and fa19's first dense
layer, GPU time (CUDA events, inputs rotated past L2, median of 200 after 20), checked against float64.
Usage: python3 gemv_groups.py"""
import statistics

import torch

from convforge import gpu_dense
from convforge.conv import cuda_common as cc
from convforge.conv.torch_conv import exact_fp32
from convforge.harness.timing import rotated_inputs, time_calls

exact_fp32()
print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)


def gemv(x, w, b, group):
    rows, depth = x.shape
    outputs = w.shape[0]
    spec = cc.KernelSpec.of("dense_gemv.cu", CF_ROWS=group)
    slices = cc.cdiv(depth, gpu_dense.GEMV_SLICE)
    part, y = torch.empty((slices, rows, outputs), device=x.device), torch.empty((rows, outputs), device=x.device)
    cc.kernel(spec, "dense_gemv_part", x.device)(
        (cc.cdiv(outputs, gpu_dense.GEMV_OUTPUTS), slices, cc.cdiv(rows, group)), (256,),
        (cc.ptr(x), cc.ptr(w), cc.ptr(part), cc.i32(rows), cc.i32(depth), cc.i32(outputs)))
    cc.kernel(spec, "dense_gemv_sum", x.device)(
        (cc.cdiv(rows * outputs, 256),), (256,),
        (cc.ptr(part), cc.ptr(b), cc.ptr(y), cc.i32(rows), cc.i32(outputs), cc.i32(slices), cc.i32(1)))
    return y


for name, depth in (("fa18", 24 * 27 * 27), ("fa19", 24 * 29 * 29)):
    g = torch.Generator(device="cuda").manual_seed(1)
    w = torch.randn(160, depth, device="cuda", generator=g) / depth ** 0.5
    b = torch.randn(160, device="cuda", generator=g)
    for rows in (10, 16):
        x = torch.randn(rows, depth, device="cuda", generator=g)
        ref = x.double() @ w.double().t() + b.double()
        inputs = rotated_inputs(x)
        line = []
        for group in (16, 8, 4):
            err = float((gemv(x, w, b, group).double() - ref).abs().max() / ref.abs().max())
            us = 1e6 * statistics.median(time_calls(lambda xi: gemv(xi, w, b, group), inputs, "cuda", warmup=20,
                                                    repeat=200).tolist())
            line.append(f"CF_ROWS={group} ({cc.cdiv(rows, group)} groups) {us:.1f} us err {err:.0e}")
        print(f"{name} fc1 {depth}->160, {rows} rows, part + sum: " + "; ".join(line), flush=True)
