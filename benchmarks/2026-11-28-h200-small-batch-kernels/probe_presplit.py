"""The exact dense layer's tensor-core part (gpu_dense_tc.dense_tc_part) with the weights split once on the host
(big = truncated to TF32, small = the rest, both stored as fp32) against Triton's tf32x3, which splits both operands
in registers every k step (and must write the weights' parts back to shared memory for wgmma). Per preset fc1 at
10-10000 rows, the engine's three tc3 shapes, GPU time, median of 30; each checked against float64.
"presplit": the step's three products in a fresh sum added in fp32; "presplit-acc": all in the accumulator (call 4
ran that one alone, as "presplit").

    python3 probe_presplit.py OUT.json [fresh-only]
"""
import json
import sys

import numpy as np
import torch
import triton
import triton.language as tl

from convforge import gpu_dense
from convforge.conv import cuda_common as cc
from convforge.gpu_dense_tc import launch_part
from convforge.harness.timing import time_calls
from convforge.models import load_preset


@triton.jit
def part_presplit(x_ptr, wb_ptr, ws_ptr, part_ptr, M, K, N, slice_len, x_row_vecs, stride_xk, w_row_vecs,
                  X_VEC: tl.constexpr, W_VEC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  FRESH: tl.constexpr):
    stride_xm = x_row_vecs * X_VEC
    stride_wn = w_row_vecs * W_VEC
    pid_n = tl.program_id(0)
    s = tl.program_id(1)
    pid_m = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    k_begin = s * slice_len
    k_end = tl.minimum(w_row_vecs * W_VEC, k_begin + slice_len)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk,
                    mask=(rm[:, None] < M) & (rk[None, :] < k_end), other=0.0)
        wmask = (rn[None, :] < N) & (rk[:, None] < k_end)
        bb = tl.load(wb_ptr + rn[None, :] * stride_wn + rk[:, None], mask=wmask, other=0.0)
        bs = tl.load(ws_ptr + rn[None, :] * stride_wn + rk[:, None], mask=wmask, other=0.0)
        ab = (a.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)   # truncated to TF32
        a_s = a - ab
        if FRESH:   # the step's three products in a fresh sum, added in fp32 (triton_igemm's SUMS_NOTE)
            step = tl.dot(a_s, bb, input_precision="tf32")
            step = tl.dot(ab, bs, step, input_precision="tf32")
            step = tl.dot(ab, bb, step, input_precision="tf32")
            acc += step
        else:       # all in the tensor cores' accumulator (call 4: up to 9.7e-5 at 10000 rows)
            acc = tl.dot(a_s, bb, acc, input_precision="tf32")
            acc = tl.dot(ab, bs, acc, input_precision="tf32")
            acc = tl.dot(ab, bb, acc, input_precision="tf32")
    offsets = (s * M + rm[:, None]).to(tl.int64) * N + rn[None, :]
    tl.store(part_ptr + offsets, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def split(w):
    big = (w.view(torch.int32) & -8192).view(torch.float32)
    return big.contiguous(), (w - big).contiguous()


def launch_presplit(x, wb, ws, part, slice_len, block, warps, stages, fresh=True):
    rows, depth = x.shape
    outputs = wb.shape[0]
    bm, bn, bk = block
    x_vec = 4 if x.stride(0) % 4 == 0 and x.stride(1) == 1 else 1
    w_vec = 4 if depth % 4 == 0 else 1
    grid = (triton.cdiv(outputs, bn), triton.cdiv(depth, slice_len), triton.cdiv(rows, bm))
    part_presplit[grid](x, wb, ws, part, rows, depth, outputs, slice_len, x.stride(0) // x_vec, x.stride(1),
                        depth // w_vec, X_VEC=x_vec, W_VEC=w_vec, BM=bm, BN=bn, BK=bk, FRESH=fresh, num_warps=warps,
                        num_stages=stages)


rows_out = []
sm = cc.device_info(torch.device("cuda")).sm_count
for name in ("fa17-high", "sp18", "sp19", "fa18", "fa19", "fa20"):
    net = load_preset(name)
    w = net.params["fc1.weight"].cuda().contiguous()
    wb, ws = split(w)
    for rows in (10, 100, 1000, 10000):
        x = torch.rand((rows, w.shape[1]), device="cuda") * 3
        ref = x.double() @ w.double().T
        for form in gpu_dense.TC:
            f = gpu_dense.TC[form]
            slices, length = gpu_dense.tc_slices(rows, w.shape[0], w.shape[1], sm, form)
            block = (gpu_dense.tc_rows_per_block(rows, form), f.bn, f.bk)
            part = torch.full((slices, rows, w.shape[0]), float("nan"), device="cuda")
            runs = {"tf32x3": lambda: launch_part(x, w, part, length, block, gpu_dense.TC_WARPS, f.stages),
                    "presplit": lambda: launch_presplit(x, wb, ws, part, length, block, gpu_dense.TC_WARPS, f.stages),
                    "presplit-acc": lambda: launch_presplit(x, wb, ws, part, length, block, gpu_dense.TC_WARPS,
                                                            f.stages, False)}
            if len(sys.argv) > 2 and sys.argv[2] == "fresh-only":
                del runs["presplit-acc"]
            for kind, run in runs.items():
                part.fill_(float("nan"))
                run()
                err = float((part.double().sum(0) - ref).norm() / ref.norm())
                us = float(np.median(time_calls(lambda _: run(), [x], "cuda", warmup=5, repeat=30, timing="gpu"))) * 1e6
                rows_out.append(dict(model=name, rows=rows, form=form, kind=kind, us=us, error=err, slices=slices))
                print(f"{name:9s} {rows:6d} {form:9s} {kind:8s} {us:9.2f} us err {err:.1e} slices {slices}", flush=True)
json.dump(rows_out, open(sys.argv[1], "w"), indent=1)
