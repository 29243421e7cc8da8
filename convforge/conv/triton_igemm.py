"""triton-igemm-3xtf32 / -tf32 / -bf16: implicit GEMM fed by TMA from a channels-last copy of the input.

Technique: the layer as one GEMM, D (positions x maps) = im2col(x) (positions x KH*KW*C) * W^T, with the
reduction ordered (p, q, c), channels innermost. A prologue kernel writes the input once as channels-last
(B*Hp, Wp, Cp), zero-padded in space (the layer's padding) and in channels (Cp a multiple of the k step),
already in the operand format: split into its TF32 parts, or rounded to bfloat16. A program's R output rows x
TW columns then read, for tap (p, q) and channels c0.., the box [R, TW, BK] at (b*Hp + oh0 + p, ow0 + q, c0):
every operand tile of the implicit GEMM is a plain box that the Tensor Memory Accelerator copies into shared
memory (host-side tensor descriptors, zero fill past the ends), and tl.dot takes it from there, K-major as
wgmma wants it (sm_90). Columns past a row's end read zeros, rows past an image's end the next image: those
outputs are never stored. The weights are packed once per tile shape as (Mp, KH*KW*Cp) operands.
"3xtf32": each operand is big + small, both TF32 values (big truncated, small the rest rounded, as
cuda-igemm's weights), and each k step sums a_s*b_b + a_b*b_s + a_b*b_b in a fresh accumulator that is then
added to the running sum in fp32: the tensor cores' accumulation truncates, and a long reduction summed in
their accumulator drifts toward zero (cuda_igemm's FLUSH_NOTE); fp32-accurate, held to the exact tolerance.
"tf32": one product, big rounded to nearest (reduced precision).
"bf16": one product of bfloat16 operands (rounded to nearest even), fp32 accumulation (reduced precision); the
copy and the boxes are half the bytes, and a k step takes 64 channels (a 128-byte box row, as TF32's 32).
Input and output stay float32 (the registry's contract).
Zero padding comes from the prologue, the bias from the epilogue; rectangular kernels, stride 1.
1x1 layers without padding skip the prologue: one GEMM per image on the NCHW input, its operands rounded or split
in registers (POINTWISE_NOTE; 3xTF32 only up to 64 channels).
Course step: the course's "unroll fused into a tiled matrix multiply" and "tensor cores" steps, with the
unrolling done by the copy engine's addressing instead of index arithmetic.
Bottleneck expected: tensor-core issue (three products a step in 3xTF32) on many-channel layers; the prologue's
read and write(s) of the input (memory bound) on small ones, where cuda-igemm / fft / cuDNN should win.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from convforge.conv import round_tf32, split_tf32, triton_common as common

triton, tl = common.triton, common.tl

PRECISIONS = ("tf32x3", "tf32", "bf16")
OPERAND_DTYPES = {"tf32x3": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}


class Tile(NamedTuple):
    """One launch shape: R output rows x TW columns (BN = R*TW positions) x BM maps per program, BK channels a
    k step, and the launch's warps and pipeline stages."""
    r: int
    tw: int
    bm: int
    bk: int
    warps: int
    stages: int

    @property
    def bn(self) -> int:
        return self.r * self.tw


# (positions, maps, warps, stages) per program, in order of preference (TILE_NOTE).
FORMS = {
    "tf32x3": ((128, 128, 8, 3), (128, 64, 4, 4), (64, 128, 4, 3)),
    "tf32": ((256, 128, 8, 3), (128, 128, 8, 4), (128, 64, 4, 4), (64, 128, 4, 3), (128, 256, 8, 3)),
    "bf16": ((256, 128, 8, 3), (128, 128, 8, 3), (128, 64, 4, 4)),
}
BF16_WIDE_MAPS = (128, 256, 8, 3)    # BF16_NOTE: layers of > 128 maps (TF32 too, TF32_NOTE)
BF16_FEW_MAPS = (256, 32, 8, 3)      # BF16_NOTE: layers of <= 32 maps
BK_MAX = {"tf32x3": 32, "tf32": 32, "bf16": 64}   # channels a k step: a box row of 128 bytes at most
# TILE_NOTE: measured on an H100 (benchmarks/2026-11-27-h100-triton-igemm-tma, call 2: 3 forms per precision on
# gpu-mode's 4 and the wide set's 35 shapes; layers of <= 64 maps took 128 x 64). 3xTF32: 128 x 128 won wherever
# it gives at least ~0.6 programs an SM (81 programs on 132 SMs still won; 54 and 64 lost by 1.5-1.8x), then
# 128 x 64; below that, the form with the most programs (64 x 128 on a tie) was within 6 % of the best.
# TF32: 256 x 128 won on long reductions (C*KH*KW >= 1024) with a full wave, 128 x 128 elsewhere, 128 x 64 where
# fewer than half the SMs would get a program. Maps per program shrink to the layer (16-64 for few maps), and
# 64 replaces 128 where 128 pads more (192 maps: three 64s, not two 128s). Columns per program: the power of two
# that holds an output row (8-TW), rows R = BN / columns, so that small images fill the tile.
# BF16_NOTE: H100 (benchmarks/2026-11-27-h100-triton-igemm-bf16, call 1: 5 forms with 64- or 32-channel k steps
# on gpu-mode's 4 and the wide set's 35 shapes). 64 channels a step beat 32 on every layer of > 32 channels but one
# (1.05-1.71x; 1.7x on the 256-px ones; the one: 1x1, see 3 stages below); TF32's rule then picked the best of the
# five on 18 of 39 layers and one within 8 % of it on 29.
# Measured changes: 128 x 128 with 3 stages, not 4 (16 images of 1024 px, 1x1, 64 channels: 6.44 against 7.81 ms,
# a one-step reduction, where 4 stages' 128 kB of shared memory a program leave one program an SM; elsewhere
# within 3 %, but on the 256-px layers, which take 256 x 128); 128 positions x 256 maps where maps > 128,
# C*KH*KW >= 1024 and it still fills 0.9 of a wave (192 maps, 128 px, K 5: 0.206 against 0.280 ms; 64 images of
# 16 px, 256 maps: 0.070 against 0.082; under 0.9 of a wave it took 1.05-1.17x the time on five of six layers,
# 0.80x on one); 256 positions x <= 32 maps, 8 warps (four layers of 16-32 maps: 3-15 % faster than 128 x 32,
# 4 warps; at 64 maps it lost 2-49 %).
# TF32_NOTE: H100 (benchmarks/2026-11-27-h100-triton-igemm-tf32-forms: 8 forms on gpu-mode's 4 and the wide set's
# 35 layers against cuDNN TF32). Above 64 maps the rule above picked the best form on 6 of 26 layers (wide median
# 0.87x cuDNN TF32); 64 positions x 128 maps (4 warps, 3 stages) was the best on 17 and within 7 % on 5 more. Now,
# above 64 maps: 256 x 128 for the long reductions (C*KH*KW >= 16384) with a full wave (gpu-mode's 256-px layers,
# 1.5-1.9x faster than 64 x 128 there); 128 x 256 as BF16 takes it (> 128 maps, C*KH*KW >= 1024, 0.9 of a wave:
# 1.19-1.38x on two layers); 128 x 128, 8 warps, 4 stages for C*KH*KW >= 4096 with 4 waves of programs (96 maps,
# K 11: 1.27x); 64 x 128 elsewhere. Replayed on that probe's times: wide median 0.99x, 13 of 35 >= 1.1x (the best
# form per layer: 1.01x); at most 1.06x the best form's time above 64 maps.
# SUMS_NOTE: the tensor cores' fp32 accumulation truncates (cuda_igemm's FLUSH_NOTE). Summing all of C*KH*KW in
# the dot's accumulator (SUMS 1) measured 2.2e-5 - 9.2e-4 relative error against float64 on image 0 of six
# layers with C*KH*KW of 3136-131072 (H200, benchmarks/2026-11-27-h100-triton-igemm-tma, call 5), over the exact
# tolerance; a fresh sum per k step added in fp32 (SUMS 0) measured 2.8e-7 - 1.2e-6 on the same layers, and
# takes 0.98-1.17x SUMS 1's time (the add waits for the step's products). Adding the big product one step late
# with the cross terms in a long-lived accumulator kept the accuracy but was 4-9 % slower still (not kept).
# Call 4's first try of that wrote the big product as `acc += tl.dot(xb, wb.T)`: Triton's dot-add combining made
# it an in-accumulator sum, with SUMS 1's errors. A fresh sum must not be one dot from zero added to acc.
# SPLIT_NOTE: where a layer's tiles give fewer programs than SPLIT_BELOW x the SMs, the k steps are cut into
# splits, each summed into its own copy of the output, the copies added by torch.sum in a fixed order
# (deterministic). H100 (benchmarks/2026-11-27-h100-triton-igemm-tma, call 11, the wide set's layers under one
# wave): at 16, 28 and 56 programs (one image of 16-32 px, 256-512 maps) 3xTF32 ran 1.4-3.9x and TF32 2.2-5.3x
# faster; at 81-128 programs splitting lost on 7 of 7 layers in 3xTF32 and on 4 of 7 in TF32 (gains of
# 1.2-1.6x on the other three), so the cut stays at about half a wave.
# INTERP_NOTE: Triton's interpreter (3.9) keeps bfloat16 as uint16 bits: its tl.dot multiplies those bits as numbers,
# and its fp32 -> bf16 cast truncates. So the prologue rounds on the bits itself (the same result on a GPU), and
# under the interpreter the bf16 operands are widened to fp32 before tl.dot (exact products of the same values;
# the GPU sums them in its fp32 accumulator instead).
SPLIT_K = True
SPLIT_BELOW, MAX_SPLITS, MIN_SPLIT_STEPS = 0.55, 16, 8
# POINTWISE_NOTE: a 1x1 layer without padding is a plain GEMM per image, y[b] = W x[b], on the NCHW input as it
# is; the prologue's channels-last copy is most of such a layer's bytes. _pointwise_kernel reads x directly and
# rounds or splits it in registers. H200 (benchmarks/2026-11-28-h200-igemm-pointwise-1x1, call 1: the wide set's
# six 1x1 layers and two odd ones, one process), against the prologue path: TF32 1.04-1.83x faster on 6 of 8
# (0.94-0.97x on two), BF16 1.07-1.89x on 7 of 8 (0.77x on 100 maps of 57 x 43), 3xTF32 0.98-1.94x up to 64
# channels but 0.73-0.94x at 128-512, where the prologue's pre-split operands cost less than a split per use: 3xTF32
# keeps the prologue there. It does not catch cuDNN: TF32 0.71-1.01x cuDNN TF32 on the six wide layers (cuDNN reads
# the 56-px layer at 3.3 TB/s, this kernel at 2.5; the 1024-px ones are write-bound for both), BF16 0.45-0.58x pure
# bf16 (which writes half the bytes). Launch shape: 64 positions x up to 128 maps, 4 warps, 3 stages was the best
# of 11 shapes or within 10 % of it on 17 of 24 rows, within 1.21x but on one (1.47x; 128 and 256 positions
# lost up to 1.5x). A persistent form (weights loaded once a program, walking position tiles) and TF32 without the
# rounding (the tensor cores dropping the bits) did not beat it (call 2).
POINTWISE = True
POINTWISE_MODES = {"tf32": 0, "tf32x3": 1, "bf16": 2}
POINTWISE_POSITIONS = 64
POINTWISE_3XTF32_MAX_C = 64
INTERPRETER_TILE = (1, 16, 16, 16, 4, 1)   # R, TW, BM, BK, warps, stages: small, for the interpreter's tests


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def tile_for(bn: int, bm: int, warps: int, stages: int, M: int, C: int, WO: int, bk_max: int = 32) -> Tile:
    """The form (bn positions x bm maps) fitted to a layer: maps and channels a step trimmed to the layer,
    columns the power of two that holds an output row (at most bn), rows the rest of bn."""
    bm = min(bm, max(16, _pow2_at_least(M)))
    tw = min(bn, max(8, _pow2_at_least(WO)))
    return Tile(bn // tw, tw, bm, min(bk_max, max(16, _pow2_at_least(C))), warps, stages)


def programs(tile: Tile, B: int, M: int, HO: int, WO: int) -> int:
    return B * -(-HO // tile.r) * -(-WO // tile.tw) * -(-M // tile.bm)


def choose_tile(precision: str, B: int, M: int, C: int, HO: int, WO: int, KH: int, KW: int, sms: int) -> Tile:
    """The launch shape for a layer and batch (TILE_NOTE)."""
    bk_max = BK_MAX[precision]
    if M <= 64:
        return tile_for(*(BF16_FEW_MAPS if precision == "bf16" and M <= 32 else (128, 64, 4, 4)), M, C, WO, bk_max)
    if precision == "bf16" and M > 128 and C * KH * KW >= 1024:
        wide = tile_for(*BF16_WIDE_MAPS, M, C, WO, bk_max)
        if programs(wide, B, M, HO, WO) >= 0.9 * sms:
            return wide
    if precision == "tf32":
        return _tf32_tile(B, M, C, HO, WO, C * KH * KW, sms)
    tiles = [tile_for(*form, M, C, WO, bk_max) for form in FORMS[precision]]
    fill = [programs(t, B, M, HO, WO) for t in tiles]
    padded = [-(-M // t.bm) * t.bm for t in tiles]
    if precision == "bf16":
        if C * KH * KW >= 1024 and fill[0] >= sms and padded[0] <= padded[1]:
            return tiles[0]
        return tiles[1] if fill[1] * 2 >= sms and padded[1] <= padded[2] else tiles[2]
    for tile, count, pad in zip(tiles, fill, padded):
        if count >= 0.55 * sms and pad <= min(padded):
            return tile
    return max(reversed(tiles[1:]), key=lambda t: programs(t, B, M, HO, WO))


def _tf32_tile(B: int, M: int, C: int, HO: int, WO: int, depth: int, sms: int) -> Tile:
    """TF32's tile for a layer of more than 64 maps, ``depth`` = C*KH*KW (TF32_NOTE)."""
    long_sum, wide, square, small = (tile_for(*form, M, C, WO, BK_MAX["tf32"]) for form in
                                      ((256, 128, 8, 3), BF16_WIDE_MAPS, (128, 128, 8, 4), (64, 128, 4, 3)))
    if depth >= 16384 and programs(long_sum, B, M, HO, WO) >= sms:
        return long_sum
    if M > 128 and depth >= 1024 and programs(wide, B, M, HO, WO) >= 0.9 * sms:
        return wide
    if depth >= 4096 and programs(square, B, M, HO, WO) >= 4 * sms:
        return square
    return small


def choose_pointwise_tile(precision: str, M: int, C: int) -> Tile:
    """POINTWISE_NOTE's launch shape for a 1x1 layer: (1, positions, maps, channels a step, warps, stages); one
    shape for every batch and image size (the measured rule needs neither)."""
    bk = min(BK_MAX[precision], max(16, _pow2_at_least(C)))
    if common.INTERPRET:
        return Tile(1, 16, 16, bk, 4, 1)
    return Tile(1, POINTWISE_POSITIONS, min(128, max(16, _pow2_at_least(M))), bk, 4, 3)


if triton is not None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    @triton.jit
    def _step_coords(step, csteps, KW, CP, BK: tl.constexpr):
        """k step -> (kernel row p, kernel column q, first channel, weight column): k = (p, q, c)."""
        tap = step // csteps
        c0 = (step - tap * csteps) * BK
        p = tap // KW
        return p, tap - p * KW, c0, tap * CP + c0

    @triton.jit
    def _igemm_kernel(xb_desc, xs_desc, wb_desc, ws_desc, y_ptr, bias_ptr, M, HO, WO, HP, KH, KW, CP,
                      steps_per_split, split_stride,
                      R: tl.constexpr, TW: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
                      SPLIT3: tl.constexpr, HAS_BIAS: tl.constexpr, SUMS: tl.constexpr = 0,
                      UPCAST: tl.constexpr = False):
        BN: tl.constexpr = R * TW
        pid = tl.program_id(0)
        col_tiles = tl.cdiv(WO, TW)
        row_tiles = tl.cdiv(HO, R)
        ow0 = (pid % col_tiles) * TW
        t = pid // col_tiles
        b = t // row_tiles
        oh0 = (t - b * row_tiles) * R
        m0 = tl.program_id(1) * BM
        x_row0 = b * HP + oh0
        csteps = CP // BK
        acc = tl.zeros([BN, BM], dtype=tl.float32)
        split = tl.program_id(2)     # split-K: this program's share of the k steps, its sums to y[split]
        first = split * steps_per_split
        for step in range(first, tl.minimum(first + steps_per_split, KH * KW * csteps)):
            p, q, c0, k0 = _step_coords(step, csteps, KW, CP, BK)
            xb = xb_desc.load([x_row0 + p, ow0 + q, c0]).reshape(BN, BK)
            wb = wb_desc.load([m0, k0])
            if SPLIT3:
                xs = xs_desc.load([x_row0 + p, ow0 + q, c0]).reshape(BN, BK)
                ws = ws_desc.load([m0, k0])
                if SUMS == 0:     # SUMS_NOTE: the step's three products in a fresh sum, added in fp32
                    part = tl.dot(xs, wb.T, input_precision="tf32")
                    part = tl.dot(xb, ws.T, part, input_precision="tf32")
                    part = tl.dot(xb, wb.T, part, input_precision="tf32")
                    acc += part
                else:             # SUMS 1: everything in the tensor cores' accumulator, a known-wrong fixture
                    acc = tl.dot(xs, wb.T, acc, input_precision="tf32")
                    acc = tl.dot(xb, ws.T, acc, input_precision="tf32")
                    acc = tl.dot(xb, wb.T, acc, input_precision="tf32")
            else:                 # one product, reduced precision: the running sum stays in the accumulator
                if UPCAST:        # INTERP_NOTE: exact fp32 products of the bf16 values instead
                    xb, wb = xb.to(tl.float32), wb.to(tl.float32)
                acc = tl.dot(xb, wb.T, acc, input_precision="tf32")   # (the precision applies to fp32 operands)
        i = tl.arange(0, BN)
        oh = oh0 + i // TW
        ow = ow0 + i % TW
        m = m0 + tl.arange(0, BM)
        if HAS_BIAS:
            if split == 0:   # once: by the first split
                acc += tl.load(bias_ptr + m, mask=m < M, other=0.0)[None, :]
        y_off = split.to(tl.int64) * split_stride + ((b * M + m[None, :]).to(tl.int64) * HO + oh[:, None]) * WO \
            + ow[:, None]
        tl.store(y_ptr + y_off, acc, mask=(oh[:, None] < HO) & (ow[:, None] < WO) & (m[None, :] < M))

    @triton.jit
    def _tf32_parts(v, SPLIT3: tl.constexpr):
        """v's TF32 operand(s): (big, small) of the 3xTF32 split (big truncated, small the rest rounded, as
        cuda-igemm's weights), or (rounded to nearest, unused) for one product; Inf and NaN stay in big."""
        bits = v.to(tl.int32, bitcast=True)
        finite = (bits & 0x7F800000) != 0x7F800000
        if SPLIT3:
            big = tl.where(finite, bits & -8192, bits).to(tl.float32, bitcast=True)
            rest = tl.where(finite, v - big, 0.0)
            rest_bits = rest.to(tl.int32, bitcast=True)
            small = tl.where(finite, (rest_bits + 4096) & -8192, rest_bits).to(tl.float32, bitcast=True)
            small = tl.where(rest == 0.0, v * 9.313225746154785e-10, small)      # 2^-30: small keeps v's sign
        else:
            big = tl.where(finite, (bits + 4096) & -8192, bits).to(tl.float32, bitcast=True)
            small = big
        return big, small

    @triton.jit
    def _bf16_high_bits(v):
        """v rounded to bfloat16 (to nearest even, on the bits: INTERP_NOTE) as int32 holding the 16 bits; a NaN
        stays a (quiet) NaN, never Inf."""
        bits = v.to(tl.int32, bitcast=True)
        finite = (bits & 0x7F800000) != 0x7F800000
        return tl.where(finite, (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16,
                        (bits >> 16) | tl.where((bits & 0x7FFFFF) != 0, 0x40, 0))

    @triton.jit
    def _channels_last_kernel(x_ptr, big_ptr, small_ptr, C, H, W, HP, WP, CP, PAD_H, PAD_W,
                              BC: tl.constexpr, BW: tl.constexpr, SPLIT3: tl.constexpr, BF16: tl.constexpr):
        """One padded row (b, hp) of the channels-last copy: BW columns x BC channels, every element written
        (zeros in the padding), as TF32 parts or as bfloat16 bits (big_ptr then points to int16)."""
        row = tl.program_id(0)
        b = row // HP
        h = row - b * HP - PAD_H
        wp = tl.program_id(1) * BW + tl.arange(0, BW)
        c = tl.program_id(2) * BC + tl.arange(0, BC)
        w = wp - PAD_W
        hv = h + tl.zeros([BW], tl.int32)               # a vector: the interpreter's masks are tensors only
        h_inside = (hv >= 0) & (hv < H)
        load_mask = (c[:, None] < C) & (w[None, :] >= 0) & (w[None, :] < W) & h_inside[None, :]
        src = ((b * C + c[:, None]).to(tl.int64) * H + h) * W + w[None, :]
        v = tl.trans(tl.load(x_ptr + src, mask=load_mask, other=0.0))          # (BW, BC)
        dst = (row.to(tl.int64) * WP + wp[:, None]) * CP + c[None, :]
        store_mask = (wp[:, None] < WP) & (c[None, :] < CP)
        if BF16:
            tl.store(big_ptr + dst, _bf16_high_bits(v).to(tl.int16), mask=store_mask)
        else:
            big, small = _tf32_parts(v, SPLIT3)
            if SPLIT3:
                tl.store(small_ptr + dst, small, mask=store_mask)
            tl.store(big_ptr + dst, big, mask=store_mask)

    @triton.jit
    def _pointwise_kernel(x_ptr, wb_ptr, ws_ptr, y_ptr, bias_ptr, M, C, P, CP, m_tiles, p_tiles,
                          BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, MODE: tl.constexpr,
                          HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr):
        """POINTWISE_NOTE: a 1x1 layer without padding, y[b] (M x P) = W (M x C) x[b] (C x P), read from the
        NCHW input itself: BM maps x BN positions of one image a program, the maps' programs of a position tile
        next to each other (they read the same input tile), then the image's position tiles, then the images,
        all on the grid's first axis (any batch: the others stop at 65535). MODE 0: TF32 (x rounded to nearest in registers),
        1: 3xTF32 (x split in registers, a fresh sum per k step: SUMS_NOTE), 2: BF16. The weights come packed
        (Mp, Cp) and zero-padded: their loads need no mask."""
        pid = tl.program_id(0)
        m = (pid % m_tiles) * BM + tl.arange(0, BM)
        tile = pid // m_tiles
        b = tile // p_tiles
        p = (tile - b * p_tiles) * BN + tl.arange(0, BN)
        x_img = x_ptr + b.to(tl.int64) * C * P
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for c0 in range(0, CP, BK):
            c = c0 + tl.arange(0, BK)
            v = tl.load(x_img + c[:, None].to(tl.int64) * P + p[None, :],
                        mask=(c[:, None] < C) & (p[None, :] < P), other=0.0)
            w_off = m[:, None] * CP + c[None, :]
            wb = tl.load(wb_ptr + w_off)
            if MODE == 2:
                xb = (_bf16_high_bits(v) << 16).to(tl.float32, bitcast=True)   # a bf16 value: casts are exact
                if UPCAST:
                    acc = tl.dot(wb.to(tl.float32), xb, acc, input_precision="tf32")
                else:
                    acc = tl.dot(wb, xb.to(tl.bfloat16), acc)
            else:
                xb, xs = _tf32_parts(v, MODE == 1)
                if MODE == 1:
                    ws = tl.load(ws_ptr + w_off)
                    part = tl.dot(ws, xb, input_precision="tf32")
                    part = tl.dot(wb, xs, part, input_precision="tf32")
                    part = tl.dot(wb, xb, part, input_precision="tf32")
                    acc += part
                else:
                    acc = tl.dot(wb, xb, acc, input_precision="tf32")
        if HAS_BIAS:
            acc += tl.load(bias_ptr + m, mask=m < M, other=0.0)[:, None]
        y_off = (b * M + m[:, None]).to(tl.int64) * P + p[None, :]
        tl.store(y_ptr + y_off, acc, mask=(m[:, None] < M) & (p[None, :] < P))


def unavailable_reason() -> Optional[str]:
    reason = common.unavailable_reason()
    if reason is None and not common.INTERPRET:
        if not torch.cuda.is_available():
            return "needs a CUDA GPU"
        if torch.cuda.get_device_capability() < (9, 0):
            return "needs the Tensor Memory Accelerator of an sm_90 (Hopper) or newer GPU"
    return reason


class IgemmTmaLayer:
    """One layer: the packed weight parts per maps-per-program, the tile per batch and input size."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], precision: str,
                 padding: tuple[int, int], tile: Optional[Tile]):
        M, C, KH, KW = weight.shape
        self.M, self.C, self.KH, self.KW = M, C, KH, KW
        self.pad_h, self.pad_w = padding
        self.precision = precision
        self.parts = 3 if precision == "tf32x3" else 1
        self.dtype = OPERAND_DTYPES[precision]
        self.fixed_tile = tile
        self.weight = weight.detach()
        self.bias = bias.detach().contiguous().float() if bias is not None else None
        self._packed: dict[tuple[int, int], tuple] = {}        # (bm, bk) -> (big, small)
        self._descriptors: dict[tuple[int, int], tuple] = {}   # (bm, bk) -> their TMA descriptors (implicit GEMM)
        self._tiles: dict[tuple[int, int, int], Tile] = {}
        self.sms = torch.cuda.get_device_properties(weight.device).multi_processor_count \
            if weight.is_cuda else 1

    pointwise = POINTWISE   # off: 1x1 layers take the prologue and the implicit GEMM (A/B runs)
    sums = 0    # how 3xTF32 sums its products (SUMS_NOTE); 1 is the known-wrong fixture
    split_k = SPLIT_K   # off: one program per tile whatever the grid (A/B runs)

    def channels_padded(self, bk: int) -> int:
        return -(-self.C // bk) * bk

    def packed(self, tile: Tile) -> tuple[torch.Tensor, torch.Tensor]:
        """Weight parts (big, small) as (Mp, KH*KW*Cp), k = (p, q, c), padded to this tile's blocks."""
        key = (tile.bm, tile.bk)
        if key not in self._packed:
            M, KH, KW = self.M, self.KH, self.KW
            cp = self.channels_padded(tile.bk)
            mp = -(-M // tile.bm) * tile.bm
            w = torch.zeros(mp, KH, KW, cp, dtype=torch.float32, device=self.weight.device)
            w[:M, :, :, :self.C] = self.weight.permute(0, 2, 3, 1)
            w = w.reshape(mp, KH * KW * cp)
            w = torch.where(w.abs() < torch.finfo(torch.float32).tiny, torch.zeros_like(w), w)  # denormals: 0
            if self.dtype == torch.bfloat16:
                big = small = w.to(torch.bfloat16)       # to nearest even
            else:
                big, small = split_tf32(w) if self.parts == 3 else (round_tf32(w),) * 2
            self._packed[key] = (big, small)
        return self._packed[key]

    def descriptors(self, tile: Tile) -> tuple:
        """The weight parts' TMA descriptors for this tile's blocks (the implicit GEMM's; the pointwise kernel
        loads the parts by pointer)."""
        key = (tile.bm, tile.bk)
        if key not in self._descriptors:
            self._descriptors[key] = tuple(TensorDescriptor.from_tensor(part, [tile.bm, tile.bk])
                                           for part in self.packed(tile))
        return self._descriptors[key]

    def tile(self, B: int, HO: int, WO: int) -> Tile:
        if self.fixed_tile is not None:
            return self.fixed_tile
        if common.INTERPRET:
            return Tile(*INTERPRETER_TILE)._replace(bk=min(BK_MAX[self.precision], max(16, _pow2_at_least(self.C))))
        key = (B, HO, WO)
        if key not in self._tiles:
            self._tiles[key] = choose_tile(self.precision, B, self.M, self.C, HO, WO, self.KH, self.KW, self.sms)
        return self._tiles[key]

    def channels_last(self, x: torch.Tensor, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x as (B*Hp, Wp, Cp) channels-last operands: TF32 parts (big, small; small is big in one-product mode)
        or bfloat16 (both the same tensor)."""
        B, C, H, W = x.shape
        HP, WP = H + 2 * self.pad_h, W + 2 * self.pad_w
        cp = self.channels_padded(bk)
        big = torch.empty(B * HP, WP, cp, dtype=self.dtype, device=x.device)
        small = torch.empty_like(big) if self.parts == 3 else big
        bc = min(32, cp)
        grid = (B * HP, triton.cdiv(WP, 64), triton.cdiv(cp, bc))
        bf16 = self.dtype == torch.bfloat16
        _channels_last_kernel[grid](x, big.view(torch.int16) if bf16 else big, small, C, H, W, HP, WP, cp,
                                    self.pad_h, self.pad_w, BC=bc, BW=64, SPLIT3=self.parts == 3, BF16=bf16,
                                    num_warps=4)
        return big, small

    def __call__(self, x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        common.check_input(x, self.C, 1)
        x = common.contiguous_input(x)
        B, C, H, W = x.shape
        HP, WP = H + 2 * self.pad_h, W + 2 * self.pad_w
        HO, WO = HP - self.KH + 1, WP - self.KW + 1
        if HO < 1 or WO < 1:
            raise ValueError(f"input {H}x{W} (padded {HP}x{WP}) is smaller than the {self.KH}x{self.KW} kernel")
        y, result = common.output_for(out, (B, self.M, HO, WO), x)
        if y.numel() and self.is_pointwise():
            self.pointwise_call(x, y, self.pointwise_tile())
        elif y.numel():
            t = self.tile(B, HO, WO)
            wb_desc, ws_desc = self.descriptors(t)
            xb, xs = self.channels_last(x, t.bk)
            xb_desc = TensorDescriptor.from_tensor(xb, [t.r, t.tw, t.bk])
            xs_desc = TensorDescriptor.from_tensor(xs, [t.r, t.tw, t.bk])
            steps = self.KH * self.KW * (self.channels_padded(t.bk) // t.bk)
            splits = self.splits_for(t, B, HO, WO, steps) if self.split_k else 1
            per = -(-steps // splits)
            splits = -(-steps // per)
            dst = y if splits == 1 else torch.empty((splits,) + tuple(y.shape), dtype=torch.float32, device=y.device)
            _igemm_kernel[(programs(t, B, 1, HO, WO), triton.cdiv(self.M, t.bm), splits)](
                xb_desc, xs_desc, wb_desc, ws_desc, dst, self.bias, self.M, HO, WO, HP, self.KH, self.KW,
                self.channels_padded(t.bk), per, y.numel(), R=t.r, TW=t.tw, BM=t.bm, BK=t.bk,
                SPLIT3=self.parts == 3, HAS_BIAS=self.bias is not None, SUMS=self.sums,
                UPCAST=common.INTERPRET and self.dtype == torch.bfloat16, num_warps=t.warps, num_stages=t.stages)
            if splits > 1:
                torch.sum(dst, dim=0, out=y)   # a fixed order: the same sums every call
        return common.finish(y, result)

    def is_pointwise(self) -> bool:
        """A 1x1 layer without padding whose tile is not fixed by the caller: POINTWISE_NOTE's kernel."""
        return self.pointwise and self.KH == self.KW == 1 and self.pad_h == self.pad_w == 0 \
            and self.fixed_tile is None and (self.precision != "tf32x3" or self.C <= POINTWISE_3XTF32_MAX_C)

    def pointwise_tile(self) -> Tile:
        return choose_pointwise_tile(self.precision, self.M, self.C)

    def pointwise_call(self, x: torch.Tensor, y: torch.Tensor, tile: Tile) -> None:
        """y = conv1x1(x) by _pointwise_kernel in ``tile`` (r 1, tw positions, bm maps, bk channels a step)."""
        B = x.shape[0]
        positions = x.shape[2] * x.shape[3]
        wb, ws = self.packed(tile)
        m_tiles, p_tiles = triton.cdiv(self.M, tile.bm), triton.cdiv(positions, tile.tw)
        _pointwise_kernel[(m_tiles * p_tiles * B,)](
            x, wb, ws, y, self.bias, self.M, self.C, positions, self.channels_padded(tile.bk), m_tiles, p_tiles,
            BN=tile.tw, BM=tile.bm, BK=tile.bk, MODE=POINTWISE_MODES[self.precision],
            HAS_BIAS=self.bias is not None, UPCAST=common.INTERPRET and self.dtype == torch.bfloat16,
            num_warps=tile.warps, num_stages=tile.stages)

    def splits_for(self, tile: Tile, B: int, HO: int, WO: int, steps: int) -> int:
        """Split-K (SPLIT_NOTE): enough splits that the programs fill about one wave of the SMs, each split
        at least MIN_SPLIT_STEPS k steps, at most MAX_SPLITS."""
        count = programs(tile, B, self.M, HO, WO)
        if count >= SPLIT_BELOW * self.sms:
            return 1
        return max(1, min(MAX_SPLITS, -(-self.sms // count), steps // MIN_SPLIT_STEPS))


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, precision: str = "tf32x3",
            padding=0, config: Optional[Tile] = None):
    """conv2d(x, weight, bias, padding=padding) for float32 NCHW x; ``config``: a Tile instead of choose_tile's."""
    if precision not in PRECISIONS:
        raise ValueError(f"triton-igemm serves {', '.join(PRECISIONS)}, not {precision!r}")
    pad = (padding, padding) if isinstance(padding, int) else tuple(int(p) for p in padding)
    if len(pad) != 2 or min(pad) < 0:
        raise ValueError(f"padding must be one or two non-negative integers, got {padding!r}")
    tile = Tile(*config) if config is not None else None
    return IgemmTmaLayer(weight, bias, precision, pad, tile)
