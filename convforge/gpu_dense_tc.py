"""The GPU dense layer on tensor cores, fp32-accurate: split-TF32 ("3xTF32") products, split over the reduction
(and, for the fast path, the same kernel on FP16 operands).

``dense_tc_part`` (Triton) computes a BM x BN tile of the partial product ``x[:, slice] W[:, slice]^T`` for one
slice of the reduction in split TF32: each operand is a TF32 big part plus a TF32 small part (a = a_big + a_small),
and each k step's three TF32 products (small*big, big*small, big*big) go to a fresh sum that is added to the tile's
fp32 sum, which holds the project's exact tolerance (1e-5 relative to float64; plain TF32 does not, see
tests/test_engine.py). The weights come split once (``split_tf32``: the layer keeps both parts), so their tiles go
from memory to the tensor cores as they are; x is split in registers. Against ``tl.dot(...,
input_precision="tf32x3")``, which splits both operands every step, this ran 1.01-1.43x faster for the best of the
three tile shapes on every preset's first dense layer at 10-10000 rows (H200; fa17's at 10000: 0.92 against 1.14
ms), at the same errors (benchmarks/2026-11-28-h200-small-batch-kernels, call 5). The three products summed straight
into the running sum instead measured up to 9.7e-5 at 10000 rows (call 4): the tensor cores' accumulation truncates
(cuda_igemm's FLUSH_NOTE). The partial sums go to ``part[slice][row][output]``, the layout of dense_gemv.cu's
``dense_gemv_sum``, which adds the slices in a fixed order with the bias and activation (deterministic, as the other
split-K forms). With one slice the kernel may write the layer's output itself, the bias (HAS_BIAS) and the
activation (ACT) applied in its epilogue: the fp32 addition dense_gemv_sum makes for one slice, the Triton kernels'
own activation (triton_common.activation); the sum kernel's launch and its pass over the output are saved. Imported
only when a GPU dense layer runs a tensor-core form: Triton is an optional extra and a CPU machine never loads it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from convforge.conv import split_tf32
from convforge.conv.triton_common import activation


@triton.jit
def dense_tc_part(x_ptr, w_ptr, ws_ptr, part_ptr, bias_ptr, M, K, N, slice_len, x_row_vecs, stride_xk, w_row_vecs,
                  X_VEC: tl.constexpr, W_VEC: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
                  HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    # PRECISION "tf32x3": w_ptr / ws_ptr hold the weights' big / small TF32 parts. Otherwise w_ptr holds the
    # weights (fp32 or FP16) and tl.dot takes them in that precision; ws_ptr is not read.
    # The row strides as (vectors of *_VEC floats) x *_VEC: with K % 4 == 0 but not % 16 (fa18's 17496, fa19's
    # 20184) Triton would otherwise not know that rows start 16 bytes apart, and load one float at a time
    # (fa18's layer at 100 rows on an H100: 106 us, against 31 us for fa17's, whose K is a multiple of 16;
    # 42 us with the strides alone).
    stride_xm = x_row_vecs * X_VEC
    stride_wn = w_row_vecs * W_VEC
    pid_n = tl.program_id(0)
    s = tl.program_id(1)
    pid_m = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    k_begin = s * slice_len
    # K as vectors too: the mask k < k_end then holds per 4 columns, else the masked loads stay scalar
    k_end = tl.minimum(w_row_vecs * W_VEC, k_begin + slice_len)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk,
                    mask=(rm[:, None] < M) & (rk[None, :] < k_end), other=0.0)
        w_off = rn[None, :] * stride_wn + rk[:, None]
        w_mask = (rn[None, :] < N) & (rk[:, None] < k_end)
        b = tl.load(w_ptr + w_off, mask=w_mask, other=0.0)
        if PRECISION == "tf32x3":
            bs = tl.load(ws_ptr + w_off, mask=w_mask, other=0.0)
            # x's parts: big truncated, small the rest (the tensor cores drop its low bits: ~2^-21 of x). Two
            # instructions an element: triton_igemm's tf32_parts (rounded small, Inf and NaN kept in big) takes
            # about six times that, which at 10000 rows cost more than the split weights saved (call 6).
            ab = (a.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
            a_small = a - ab
            step = tl.dot(a_small, b, input_precision="tf32")   # a fresh sum: not one dot from zero added to acc
            step = tl.dot(ab, bs, step, input_precision="tf32")
            step = tl.dot(ab, b, step, input_precision="tf32")
            acc += step
        else:
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
    if HAS_BIAS:   # one slice only (launch_part checks): y = act(part + bias), as dense_gemv_sum adds them
        acc = acc + tl.load(bias_ptr + rn, mask=rn < N, other=0.0)[None, :]
    acc = activation(acc, ACT)
    offsets = (s * M + rm[:, None]).to(tl.int64) * N + rn[None, :]
    tl.store(part_ptr + offsets, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def launch_part(x: torch.Tensor, weight: torch.Tensor, part: torch.Tensor, slice_len: int, block: tuple,
                warps: int, stages: int, precision: str = "tf32x3", bias: torch.Tensor | None = None,
                act: int = 0, parts: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """part[s] = x[:, s-th slice] @ weight[:, s-th slice]^T for every slice; ``block`` = (BM, BN, BK);
    ``weight`` contiguous, ``x`` any strides. ``precision``: tf32x3 for fp32 operands (tf32 only for the tests'
    wrong form); FP16 operands (the fast path's layer, x and weight both FP16) ignore it. tf32x3 reads the
    weights' ``parts`` (``split_tf32(weight)``, split here when not given: a caller that calls again keeps
    them). With one slice (``slice_len`` >= K) ``part`` may be the layer's output y (rows x outputs) with ``bias``
    (contiguous, or None) and ``act`` (an ACTIVATION_CODES value) applied in the epilogue; with several, neither."""
    rows, depth = x.shape
    outputs = weight.shape[0]
    bm, bn, bk = block
    slices = triton.cdiv(depth, slice_len)
    if slices > 1 and (bias is not None or act):
        raise ValueError(f"bias and activation need one slice of the reduction, not {slices}")
    vec = 16 // x.element_size()   # elements of a 16-byte load
    x_vec = vec if x.stride(0) % vec == 0 and x.stride(1) == 1 else 1
    w_vec = vec if depth % vec == 0 else 1
    grid = (triton.cdiv(outputs, bn), slices, triton.cdiv(rows, bm))
    split = precision == "tf32x3" and weight.dtype == torch.float32
    if split:
        weight, small = parts if parts is not None else split_tf32(weight)
    else:
        precision, small = ("tf32" if precision == "tf32x3" else precision), weight   # FP16: ignored
    dense_tc_part[grid](x, weight, small, part, part if bias is None else bias, rows, depth, outputs, slice_len,
                        x.stride(0) // x_vec, x.stride(1), depth // w_vec, X_VEC=x_vec, W_VEC=w_vec,
                        BM=bm, BN=bn, BK=bk, PRECISION=precision, HAS_BIAS=bias is not None, ACT=act,
                        num_warps=warps, num_stages=stages)
