"""cpu-parallel: direct convolution on 16 images at once, one AVX-512 lane per image, Numba, all cores.

Technique: images are taken 16 at a time (one float32 lane of a 512-bit register each) and repacked so the 16
images' copies of a pixel are adjacent: xp[c, row, col * 16 + lane]. Every output row is then a perfectly
vectorisable sum with no edge cases (any W, any K, 100 % of the lanes in use). An output row is computed in
register tiles of TW columns x MB maps x VECTOR lanes (per ISA, TILES: AVX-512 up to 24 zmm accumulators of
16 lanes; AVX2 up to 12 ymm accumulators of 8 lanes, the tile run once per half of the 16-image group; MB
chosen to pad M as little as possible, then for the most FMAs per load: 4 x 6 (16 maps) and 6 x 4 (12, 24)
on AVX-512, 4 x 3 on AVX2; a row's last Wo % TW columns by a tile that wide): the accumulators start at the bias and stay in registers over the whole
C x K x K reduction; for each (c, p, q) the TW input vectors are loaded, then the MB weights broadcast from L1
(packed per call as [block][c][p][q][map]) one at a time, each feeding TW fused multiply-adds (accumulators +
TW + 1 live registers: no spill within AVX2's 16). A row's last Wo % TW columns get a tile that wide
(REMAINDER_TILES; before 2026-11-26 a whole tile ending at Wo, overlapping its neighbour: sp19's second layer
computed 20 columns for 18). The tile is an LLVM intrinsic (tile_kernel: Numba has no vector types and
vectorises only innermost loops, so a Numba loop cannot keep accumulators in registers across the reduction),
generated per (K, MB, TW). Before 2026-11-21 the weights of one (c, p), MB x K of them, sat in registers
instead (MB <= 25 / K, so only 2 maps for 16 maps of 7x7) and the accumulators made a round trip through L1
for every (c, p); the A/B at B = 10000 (benchmarks/2026-11-21-cpu-parallel-register-tiles/ab_cpu_parallel_tiles.txt, from
ab_cpu_parallel.py against a64d3fc) has the tiles 3-16 % faster on every course layer (fa20 L2 319 -> 297 ms). A tile of 24 accumulators spills on K = 7 and is
far slower. The finished tiles go to a band of output rows (up to ACC_BYTES, the whole Ho x Wo plane on every
course layer, layout [row][col][map][lane]), which is then written back as one run of each (image, map) plane,
contiguous in y: 16-float chunks of the flattened plane, so only a plane's last chunk overlaps its neighbour
(with per-row chunks, rows of 18 to 34 floats wrote up to 44 % of their chunks twice) and cache lines fill in
order. The input is repacked the same way, each channel plane flattened. Into and out of the lane layout is a
transpose both ways, done 16 x 16 in registers by a small LLVM intrinsic (transposed_store), twice as fast as
the gathers Numba makes of the scalar loops. Threads: work items (runs of 16-image groups, or map blocks of a
group when the batch is small) go to a pool of torch.get_num_threads() Python threads running the nogil
kernel, rather than a Numba prange: the kernel compiles about 3x faster without the parfor pass, items are
handed out as threads free up (the load balances when other work shares the cores), and the harness's
--threads applies as it does to torch. The sum is fp32, contracted to fused multiply-adds
(``fastmath={'contract'}`` only: rounding once per multiply-add instead of twice; no reassociation, no
approximate functions), within about 5e-7 of the float64 reference on the course layers.
Fused (prepare_fused, the CPU engine's default where a max pool follows): the band holds whole pool windows;
once its tiles are done, pool_kernel (an LLVM intrinsic, as a Numba loop it stayed scalar at 3x the cost)
takes the max of each window's 16-lane vectors for MB maps and applies the activation in registers (max
pooling commutes with the non-decreasing activations, so the activation runs on the pooled values only: tanh as
a clamped rational fit within 3.3e-7 of float64, relu, sigmoid from tanh), and only the pooled map is written
back: fa17's layer writes 4x less and never reads its activations back. With a 2 x 2 pool on AVX-512 (every
preset's one-channel first layer) the pool goes into the register tile itself (pooled_tile_kernel: 2 conv rows
x 4 columns x 2 maps, pooled and activated in registers, only pooled vectors stored; no band of conv rows, no
pool pass), and each pooled row's output lines are fetched for writing (PREFETCHW) while the band's later rows
compute: 0.73-0.88x main's time on the six first layers (2 threads, B = 2048,
benchmarks/2026-11-25-cpu-first-conv-one-channel/). When the layer writes the lane layout (the CPU engine) the
pooled tile stores its vectors straight into y (no band, no copy: the copy was scalar, 16 VMOVSS loads and
stores a vector), the 2x2 max is 3 MAXPS + one NaN fix-up (12 instructions before), and the next group's input
is prefetched into L2 during this group's rows: 0.78-0.88x the previous kernel on the six first layers, outputs
bitwise identical (benchmarks/2026-11-26-cpu-first-conv-tile/). The unpooled layers that write the lane layout
(the second convs of sp18, sp19, fa18, fa19 in the engine) store from their tiles into y too (DIRECT_STORES: no
band, no lane-by-lane copy), and a first layer writing it takes the raw uint8 images, converted exactly in its
input transposes (the engine's chunk is not copied to float32 first): 0.79-0.92x main's engine on five presets
(benchmarks/2026-11-26-cpu-whole-fa17-sp18-sp19/). The ISA comes from
cpu_loops.vector_lanes (CONVFORGE_CPU_VECTOR_LANES=8 or 16 forces either; both tile kinds run correctly on
either CPU, which is how the tests check both).
Course step: the CPU side of the optimisation milestones: loop reordering for SIMD, register tiling, compile-
time kernel sizes and multi-threading, the CPU analogue of the GPU's per-thread output tiles.
Bottleneck: the FMA units for the many-channel layers (with a preallocated output at B = 2000 the whole layer
reaches 380-460 GFLOP/s of the ~520 peak, fa20 L2 420 against 387 before the register tiles); for the one-
channel first layers, writing the output (only K*K multiply-adds per output element). At B = 10000 a fresh
output's first-touch page faults cost about as much as the convolution itself on this machine: the output is a
plain torch.empty like torch's own, so both pay them (THP_MEM_ALLOC_ENABLE=1 makes them cheap for both).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import numpy as np
import torch

from convforge.conv import ACTIVATION_CODES, finish_output, output_buffer
from convforge.conv.cpu_loops import check_input, jit_generated, vector_lanes

LANES = 16          # images per group: the lane layout of the repacked input and of the accumulators

# The register tile, per ISA (VECTOR: float32 lanes of one register, the tile's vector width): at most
# TILE_ACCUMULATORS accumulators (TW * MB), MAX_BLOCK maps, and accumulators + TW input vectors + one weight
# broadcast within REGISTERS; the pooled tile (2 rows) at most POOLED_ACCUMULATORS.
# AVX-512 (32 zmm): 24 accumulators of 16 lanes (4 maps x 6 columns on the 16-map layers, 6 x 4 on the 24-map
# ones: 24 + TW + 1 <= 32, no spill since the tile loads its inputs before one broadcast at a time; per-layer
# A/B at 2 threads, B = 2048, 4 x 6 / 4 x 4: sp18 L2 0.981, sp19 L2 0.961, fa19 L2 0.940-0.950, fa18 L2
# 0.955-0.978, fa20 L2 0.967; benchmarks/2026-11-26-cpu-lane-layout/ab_layers_tiles_*.txt; 16 before), MB at
# most 8; the pooled tile keeps 16 (24 spilled there: 1.3-1.5x slower, benchmarks/2026-11-25-cpu-first-conv-one-channel).
# AVX2 (16 ymm): 12 accumulators of 8 lanes, the tile run twice per position (the group's lanes 0-7, then
# 8-15), so that 12 + TW + 1 fit the 16 ymm. Before 2026-11-25 the AVX2 tile was the AVX-512 one with 6
# accumulators of 16 lanes, but MB = 8 maps (TW = 1) on the 16- and 24-map layers, i.e. 16 ymm of
# accumulators alone, which spilled: 40-45 GFLOP/s of the ~92 peak on an AVX2-only Zen 3. The A/B is in
# benchmarks/2026-11-25-cpu-whole-network-avx2-tiles/.
# VECTOR -> (TILE_ACCUMULATORS, MAX_BLOCK, REGISTERS, POOLED_ACCUMULATORS)
TILES = {16: (24, 8, 32, 16), 8: (12, 12, 16, 12)}
TILE_NAMES = ("TILE_ACCUMULATORS", "MAX_BLOCK", "REGISTERS", "POOLED_ACCUMULATORS")
VECTOR = vector_lanes()
TILE_ACCUMULATORS, MAX_BLOCK, REGISTERS, POOLED_ACCUMULATORS = TILES[VECTOR]
# 2 x 2 pools fused into the register tile (pooled_tile_kernel) by default with AVX-512; the AVX2 path keeps the
# band of conv rows and pool_kernel (no AVX2-only CPU to time the pooled tile on; it is tested through config).
POOLED_TILES = True
PREFETCH_OUTPUT = True  # pooled tiles into the band: PREFETCHW of each pooled row's output lines (A/B toggle)
PREFETCH_INPUT = True  # pooled tiles: PREFETCHT1 of the next group's input lines, spread over this group's rows
STREAM_OUTPUT = False  # pooled tiles into y's lane layout: non-temporal stores (the A/B toggles it)
FAST_POOL_MAX = True  # pooled tiles: the 2x2 max as MAXPS + one NaN fix-up (the A/B toggles it)
REMAINDER_TILES = True  # a row's last Wo % TW columns by a tile that wide (the A/B toggles it)
DIRECT_STORES = True  # unpooled tiles into y's lane layout: stored from the tile, no band copy (A/B toggle)
ACC_BYTES = 256 << 10  # accumulators of one band of output rows (the whole plane on the course layers), in L2


def choose_width(block: int) -> int:
    """Output columns per register tile for MB = ``block`` maps: TW * MB accumulators within
    TILE_ACCUMULATORS, and with the TW input vectors and one weight broadcast within REGISTERS."""
    return max(1, min(TILE_ACCUMULATORS // block, (REGISTERS - 1) // (block + 1)))


def choose_block(maps: int, kernel: int) -> int:
    """Maps per register tile: at most MAX_BLOCK, the fewest padded maps, then the most FMAs per load
    (a (c, p, q) step loads MB broadcasts and TW input vectors for MB * TW FMAs: 4 x 4 beats 8 x 2), then the
    largest (any K: the weights are broadcast from L1, not held in registers)."""
    cap = max(1, min(MAX_BLOCK, maps))

    def density(mb):
        tw = choose_width(mb)
        return mb * tw / (mb + tw)
    return min(range(1, cap + 1), key=lambda mb: (-(-maps // mb) * mb, -density(mb), -mb))


def transposed_store():
    """The Numba intrinsic ``store_transposed16(src, s0, s_step, dst, d0, d_step)`` (Numba imported here).

    It does dst[d0 + l * d_step + c] = src[s0 + c * s_step + l] for 0 <= l, c < 16: 16 vector loads of
    16 floats (or of 16 bytes converted to float, exactly, when src is uint8: the engine's raw images), a
    16 x 16 transpose in registers (4 rounds of 16 two-register shuffles, each swapping the off-diagonal
    halves of 2^k blocks) and 16 vector stores. Numba has no vector types, and the
    equivalent scalar loop compiles to gathers at half the speed.
    """
    global _TRANSPOSED_STORE
    if _TRANSPOSED_STORE is None:
        from llvmlite import ir
        from numba import types
        from numba.extending import intrinsic

        @intrinsic
        def store_transposed16(typingctx, src, src_start, src_step, dst, dst_start, dst_step):
            sig = types.void(src, src_start, src_step, dst, dst_start, dst_step)

            def codegen(context, builder, signature, args):
                i64 = ir.IntType(64)
                vec = ir.VectorType(ir.FloatType(), LANES)
                mask = ir.VectorType(ir.IntType(32), LANES)

                def pointers(array_arg, start_arg, step_arg, kind=vec):
                    data = context.make_array(signature.args[array_arg])(context, builder, args[array_arg]).data
                    start = context.cast(builder, args[start_arg], signature.args[start_arg], types.int64)
                    step = context.cast(builder, args[step_arg], signature.args[step_arg], types.int64)
                    offsets = [builder.add(start, builder.mul(step, ir.Constant(i64, n))) for n in range(LANES)]
                    return [builder.bitcast(builder.gep(data, [offset], inbounds=True), kind.as_pointer())
                            for offset in offsets]

                if signature.args[0].dtype == types.uint8:   # 16 bytes a row, converted exactly to float
                    bytes16 = ir.VectorType(ir.IntType(8), LANES)
                    rows = [builder.uitofp(builder.load(builder.bitcast(ptr, bytes16.as_pointer()), align=1), vec)
                            for ptr in pointers(0, 1, 2, bytes16)]
                else:
                    rows = [builder.load(ptr, align=4) for ptr in pointers(0, 1, 2)]
                for k in range(4):
                    d = 1 << k
                    keep_low = ir.Constant(mask, [l if not l & d else LANES + l - d for l in range(LANES)])
                    keep_high = ir.Constant(mask, [l + d if not l & d else LANES + l for l in range(LANES)])
                    new = list(rows)
                    for a in (a for a in range(LANES) if not a & d):
                        new[a] = builder.shuffle_vector(rows[a], rows[a | d], keep_low)
                        new[a | d] = builder.shuffle_vector(rows[a], rows[a | d], keep_high)
                    rows = new
                for row, ptr in zip(rows, pointers(3, 4, 5)):
                    builder.store(row, ptr, align=4)
                return context.get_dummy_value()

            return sig, codegen

        _TRANSPOSED_STORE = store_transposed16
    return _TRANSPOSED_STORE


_TRANSPOSED_STORE = None
TRANSPOSE_VERSION = 2  # part of the generated source, so a change here recompiles the cached kernels


class VectorCodegen:
    """What each vector intrinsic's codegen here starts from (tile_kernel, pooled_tile_kernel, cpu_winograd's
    transform_kernel): Numba's ``(context, builder, signature, args)`` with ``lanes``-wide float vectors, and
    the helpers they all use. One place, so the kernels cannot drift apart in how they read their arguments."""

    def __init__(self, context, builder, signature, args, lanes: int):
        from llvmlite import ir
        from numba.core import cgutils
        self.context, self.builder, self.signature, self.args = context, builder, signature, args
        self.i64, self.i32 = ir.IntType(64), ir.IntType(32)
        self.vec = ir.VectorType(ir.FloatType(), lanes)
        self.vptr = self.vec.as_pointer()
        self.undef = ir.Constant(self.vec, ir.Undefined)
        self._splat_mask = ir.Constant(ir.VectorType(self.i32, lanes), [0] * lanes)
        self.fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(self.vec, [self.vec] * 3),
                                                  f"llvm.fma.v{lanes}f32")

    def data(self, i: int):
        """The data pointer of array argument ``i``."""
        return self.context.make_array(self.signature.args[i])(self.context, self.builder, self.args[i]).data

    def as64(self, i: int):
        """Scalar argument ``i`` as an int64."""
        from numba import types
        return self.context.cast(self.builder, self.args[i], self.signature.args[i], types.int64)

    def const(self, n: int):
        from llvmlite import ir
        return ir.Constant(self.i64, n)

    def broadcast(self, value):
        """A vector of ``value`` (a float) in every lane."""
        from llvmlite import ir
        one = self.builder.insert_element(self.undef, value, ir.Constant(self.i32, 0))
        return self.builder.shuffle_vector(one, self.undef, self._splat_mask)

    def splat(self, ptr):
        """The float at ``ptr``, loaded once and broadcast to every lane."""
        return self.broadcast(self.builder.load(ptr, align=4))


def tile_kernel(kernel: int, block: int, width: int, vector: int = LANES, direct: bool = False,
                rows: Optional[int] = None):
    """The Numba intrinsic ``conv_tile(x, x0, row, chan, C, w, w0, bias, b0, acc, a0)`` for K = ``kernel``,
    MB = ``block`` maps, TW = ``width`` output columns and ``vector`` lanes (all baked in): one generator for
    the AVX-512 tile (16 lanes, the whole group) and the AVX2 one (8 lanes, half a group per call, the
    caller offsetting x0 and a0 by 8 for the other half; the 16-lane layout is the same).

    It computes one output tile, TW columns x MB maps x ``vector`` lanes, entirely in registers: the TW * MB
    accumulators start at the bias, and for every channel c < C (runtime loop), kernel row p < K (runtime
    loop) and column q < K (unrolled) the MB weights w[w0 + ((c * K + p) * K + q) * MB + mm] are broadcast
    and each of the TW input vectors x[x0 + c * chan + p * row + (jj + q) * 16 ...] feeds MB fused
    multiply-adds; the tile is then stored to acc[a0 + (jj * MB + mm) * 16 ...]. Numba has no vector types
    and its vectoriser only handles innermost loops, so a Numba loop cannot keep the accumulators in
    registers across the (c, p, q) reduction.

    ``rows``: kernel rows KH when not ``kernel`` (KH x K taps, weights [c][p][q][mm]); cpu_winograd's 1 x K
    products run on it.

    ``direct``: the intrinsic takes three more arguments, ``conv_tile(..., acc, a0, js, ms, valid)``, and
    stores map mm < valid of column jj to acc[a0 + jj * js + mm * ms ...] (maps from ``valid`` on, padding,
    are not stored): the unpooled layer writes y's lane layout from the tile itself (js = 16, ms = a map
    plane), with no band and no copy (DIRECT_STORES).
    """
    key = (kernel, block, width, vector, bool(direct), rows or kernel)
    if key not in _TILES:
        from numba import types
        from numba.core import cgutils
        from numba.extending import intrinsic
        K, MB, TW, V, DIRECT, KH = key

        def conv_tile(typingctx, x, x0, row, chan, C, w, w0, bias, b0, acc, a0, *strides):
            sig = types.void(x, x0, row, chan, C, w, w0, bias, b0, acc, a0, *strides)

            def codegen(context, builder, signature, args):
                cg = VectorCodegen(context, builder, signature, args, V)
                vec, vptr, fma = cg.vec, cg.vptr, cg.fma
                data, as64, const, splat = cg.data, cg.as64, cg.const, cg.splat

                xd, wd, bd, ad = data(0), data(5), data(7), data(9)
                x0v, rowv, chanv, cv, w0v, b0v, a0v = (as64(i) for i in (1, 2, 3, 4, 6, 8, 10))
                accs = [[cgutils.alloca_once(builder, vec) for _ in range(MB)] for _ in range(TW)]
                for mm in range(MB):
                    start = splat(builder.gep(bd, [builder.add(b0v, const(mm))], inbounds=True))
                    for jj in range(TW):
                        builder.store(start, accs[jj][mm])
                with cgutils.for_range(builder, cv) as cl:
                    xc = builder.add(x0v, builder.mul(cl.index, chanv))
                    wc = builder.add(w0v, builder.mul(cl.index, const(KH * K * MB)))
                    with cgutils.for_range(builder, const(KH)) as pl:
                        xr = builder.add(xc, builder.mul(pl.index, rowv))
                        wr = builder.add(wc, builder.mul(pl.index, const(K * MB)))
                        with cgutils.for_range(builder, const(K)) as ql:
                            xq = builder.add(xr, builder.mul(ql.index, const(LANES)))
                            wq = builder.add(wr, builder.mul(ql.index, const(MB)))
                            # The TW input vectors, then one weight broadcast at a time feeding TW FMAs: live
                            # registers are the accumulators + TW + 1. Broadcasting all MB weights first (before
                            # 2026-11-25) needed accumulators + TW + MB, which on AVX2's 16 ymm spilled the
                            # broadcasts to the stack every (c, p, q).
                            xs = [builder.load(builder.bitcast(builder.gep(xd, [builder.add(xq, const(jj * LANES))],
                                                                           inbounds=True), vptr), align=4)
                                  for jj in range(TW)]
                            for mm in range(MB):
                                wv = splat(builder.gep(wd, [builder.add(wq, const(mm))], inbounds=True))
                                for jj in range(TW):
                                    a = builder.load(accs[jj][mm])
                                    builder.store(builder.call(fma, [xs[jj], wv, a]), accs[jj][mm])
                if DIRECT:      # map mm of column jj to acc[a0 + jj * js + mm * ms], maps < valid only
                    jsv, msv, validv = (as64(i) for i in (11, 12, 13))
                    for mm in range(MB):
                        with cgutils.if_likely(builder, builder.icmp_signed("<", const(mm), validv)):
                            mbase = builder.add(a0v, builder.mul(msv, const(mm)))
                            for jj in range(TW):
                                ptr = builder.gep(ad, [builder.add(mbase, builder.mul(jsv, const(jj)))], inbounds=True)
                                builder.store(builder.load(accs[jj][mm]), builder.bitcast(ptr, vptr), align=4)
                    return context.get_dummy_value()
                for jj in range(TW):
                    for mm in range(MB):
                        ptr = builder.gep(ad, [builder.add(a0v, const((jj * MB + mm) * LANES))], inbounds=True)
                        builder.store(builder.load(accs[jj][mm]), builder.bitcast(ptr, vptr), align=4)
                return context.get_dummy_value()

            return sig, codegen

        if DIRECT:
            def conv_tile_direct(typingctx, x, x0, row, chan, C, w, w0, bias, b0, acc, a0, js, ms, valid):
                return conv_tile(typingctx, x, x0, row, chan, C, w, w0, bias, b0, acc, a0, js, ms, valid)
            _TILES[key] = intrinsic(conv_tile_direct)
        else:
            def conv_tile_band(typingctx, x, x0, row, chan, C, w, w0, bias, b0, acc, a0):
                return conv_tile(typingctx, x, x0, row, chan, C, w, w0, bias, b0, acc, a0)
            _TILES[key] = intrinsic(conv_tile_band)
    return _TILES[key]


_TILES: dict = {}
TILE_VERSION = 8  # part of the generated source, like TRANSPOSE_VERSION


def choose_pooled(maps: int) -> tuple[int, int]:
    """(MB, TW) of the pooled tile (pooled_tile_kernel, 2 x 2 pools): TW even, 2 * TW * MB accumulators within
    POOLED_ACCUMULATORS and, with the 2 * TW input vectors and one broadcast, within REGISTERS; the fewest
    padded maps, then the most accumulators, then MB nearest 2. Measured on the one-channel first layers
    (benchmarks/2026-11-25-cpu-first-conv-one-channel/, 1 thread): 2 maps x 4 columns beat 4 x 2, 1 x 8,
    1 x 6, 2 x 2 and 1 x 4 on every layer but fa19's (1 x 6 equal); 24 accumulators (6 x 2, 3 x 4, 2 x 6)
    spill and run 1.3-1.5x slower."""
    options = [(mb, tw) for mb in range(1, max(1, min(MAX_BLOCK, maps)) + 1) for tw in range(2, 17, 2)
               if 2 * tw * mb <= POOLED_ACCUMULATORS and 2 * tw * mb + 2 * tw + 1 <= REGISTERS]
    return min(options, key=lambda o: (-(-maps // o[0]) * o[0], -2 * o[1] * o[0], abs(o[0] - 2)))


def pooled_tile_kernel(kernel: int, block: int, width: int, vector: int, act: int, stream: bool = False):
    """The Numba intrinsic ``conv_ptile(x, x0, row, chan, C, w, w0, bias, b0, out, d0)``: tile_kernel's
    register tile over 2 output rows x TW = ``width`` (even) columns x MB = ``block`` maps x ``vector`` lanes,
    followed in registers by the 2 x 2 max pool and activation ``act`` (pool_kernel's NaN-propagating max and
    vector_activation), so only the TW / 2 x MB pooled vectors are stored, to out[d0 + (pc * MB + mm) * 16
    ...]: no round trip of the conv rows through a band of accumulators, no separate pool pass. For the
    one-channel first layers (fused with a 2 x 2 pool on every preset), where that pass and the band's stores
    and loads cost as much as a quarter of the layer next to K * K multiply-adds per output. Per (c, p, q):
    the 2 * TW input vectors (the two rows share the weights), then one weight broadcast at a time feeding
    2 * TW FMAs."""
    key = (kernel, block, width, vector, act, FAST_POOL_MAX, bool(stream))
    if key not in _PTILES:
        from llvmlite import ir
        from numba import types
        from numba.core import cgutils
        from numba.extending import intrinsic
        K, MB, TW, V = kernel, block, width, vector
        assert TW % 2 == 0
        FAST_MAX = FAST_POOL_MAX

        @intrinsic
        def conv_ptile(typingctx, x, x0, row, chan, C, w, w0, bias, b0, out, d0, ps, ms, mv):
            sig = types.void(x, x0, row, chan, C, w, w0, bias, b0, out, d0, ps, ms, mv)

            def codegen(context, builder, signature, args):
                cg = VectorCodegen(context, builder, signature, args, V)
                i32, vec, vptr, fma = cg.i32, cg.vec, cg.vptr, cg.fma
                data, as64, const, splat = cg.data, cg.as64, cg.const, cg.splat

                xd, wd, bd, od = data(0), data(5), data(7), data(9)
                x0v, rowv, chanv, cv, w0v, b0v, d0v, psv, msv, mvv = (as64(i) for i in (1, 2, 3, 4, 6, 8, 10, 11, 12, 13))
                accs = [[[cgutils.alloca_once(builder, vec) for _ in range(MB)] for _ in range(TW)] for _ in range(2)]
                for mm in range(MB):
                    start = splat(builder.gep(bd, [builder.add(b0v, const(mm))], inbounds=True))
                    for r in range(2):
                        for jj in range(TW):
                            builder.store(start, accs[r][jj][mm])
                with cgutils.for_range(builder, cv) as cl:
                    xc = builder.add(x0v, builder.mul(cl.index, chanv))
                    wc = builder.add(w0v, builder.mul(cl.index, const(K * K * MB)))
                    with cgutils.for_range(builder, const(K)) as pl:
                        xr = builder.add(xc, builder.mul(pl.index, rowv))
                        wr = builder.add(wc, builder.mul(pl.index, const(K * MB)))
                        with cgutils.for_range(builder, const(K)) as ql:
                            xq = builder.add(xr, builder.mul(ql.index, const(LANES)))
                            wq = builder.add(wr, builder.mul(ql.index, const(MB)))
                            xs = [[builder.load(builder.bitcast(builder.gep(
                                xd, [builder.add(builder.add(xq, builder.mul(rowv, const(r))), const(jj * LANES))],
                                inbounds=True), vptr), align=4) for jj in range(TW)] for r in range(2)]
                            for mm in range(MB):
                                wv = splat(builder.gep(wd, [builder.add(wq, const(mm))], inbounds=True))
                                for r in range(2):
                                    for jj in range(TW):
                                        a = builder.load(accs[r][jj][mm])
                                        builder.store(builder.call(fma, [xs[r][jj], wv, a]), accs[r][jj][mm])
                for pc in range(TW // 2):
                    for mm in range(MB):
                        window = [builder.load(accs[r][2 * pc + j][mm]) for r in range(2) for j in range(2)]
                        if FAST_MAX:
                            # MAXPS three times (select(a > b, a, b) is exactly MAXPS(a, b): b when either is NaN),
                            # then a NaN wherever the window held one (two unordered compares): 7 instructions
                            # where the compare-compare-or-blend select per element took 12.
                            best = window[0]
                            for v in window[1:]:
                                best = builder.select(builder.fcmp_ordered(">", best, v), best, v)
                            nan = builder.or_(builder.fcmp_unordered("uno", window[0], window[1]),
                                              builder.fcmp_unordered("uno", window[2], window[3]))
                            best = builder.select(nan, ir.Constant(vec, [ir.Constant(ir.FloatType(), float("nan"))] * V), best)
                        else:
                            best = window[0]
                            for v in window[1:]:    # pool_kernel's order: rows, then columns
                                # v if v > best or v is NaN (a NaN in a window pools to NaN)
                                take = builder.or_(builder.fcmp_ordered(">", v, best), builder.fcmp_unordered("uno", v, v))
                                best = builder.select(take, v, best)
                        best = vector_activation(builder, best, act)
                        # pooled column pc of map mm at out[d0 + pc * ps + mm * ms]: into the band (ps = MB * 16,
                        # ms = 16) or straight into y's lane layout (ps = 16, ms = one map plane); maps mm >= mv
                        # (the padding of a last partial block) are not stored
                        offset = builder.add(d0v, builder.add(builder.mul(psv, const(pc)), builder.mul(msv, const(mm))))
                        ptr = builder.bitcast(builder.gep(od, [offset], inbounds=True), vptr)

                        def put():
                            if stream:  # a whole aligned line written around the caches (VMOVNTPS)
                                store = builder.store(best, ptr, align=64)
                                store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(i32, 1)]))
                            else:
                                builder.store(best, ptr, align=4)
                        if mm == 0:
                            put()
                        else:
                            with builder.if_then(builder.icmp_signed(">", mvv, const(mm)), likely=True):
                                put()
                return context.get_dummy_value()

            return sig, codegen

        _PTILES[key] = conv_ptile
    return _PTILES[key]


_PTILES: dict = {}
PTILE_VERSION = 2


def prefetch_write():
    """The Numba intrinsic ``prefetchw(array, index)``: llvm.prefetch for writing (PREFETCHW on x86) of the
    cache line holding array[index], so that a later store finds it in the cache instead of waiting for it."""
    return _prefetch_intrinsic(write=1, locality=3)


def prefetch_read():
    """The Numba intrinsic ``prefetchr(array, index)``: llvm.prefetch for reading into L2 (PREFETCHT1) of the
    cache line holding array[index]: the next 16-image group's input, fetched while this group computes."""
    return _prefetch_intrinsic(write=0, locality=2)


def _prefetch_intrinsic(write: int, locality: int):
    """``prefetch(array, index)``: llvm.prefetch of array[index]'s cache line with llvm's rw and locality
    arguments (one intrinsic per pair, made once)."""
    key = (write, locality)
    if key not in _PREFETCH:
        from llvmlite import ir
        from numba import types
        from numba.core import cgutils
        from numba.extending import intrinsic

        @intrinsic
        def prefetch(typingctx, array, index):
            sig = types.void(array, index)

            def codegen(context, builder, signature, args):
                i32, i8p = ir.IntType(32), ir.IntType(8).as_pointer()
                data = context.make_array(signature.args[0])(context, builder, args[0]).data
                offset = context.cast(builder, args[1], signature.args[1], types.int64)
                ptr = builder.bitcast(builder.gep(data, [offset], inbounds=True), i8p)
                fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                                    "llvm.prefetch.p0i8")
                builder.call(fn, [ptr, ir.Constant(i32, write), ir.Constant(i32, locality), ir.Constant(i32, 1)])
                return context.get_dummy_value()

            return sig, codegen

        _PREFETCH[key] = prefetch
    return _PREFETCH[key]


_PREFETCH: dict = {}


def vector_activation(builder, value, act: int):
    """LLVM IR applying activation ``act`` (ACTIVATION_CODES) to the float vector ``value``: the same
    formulas for every kernel (relu a max; tanh the clamped rational fit above; sigmoid from tanh)."""
    from llvmlite import ir
    if act == 0:
        return value
    vec = value.type
    count = vec.count

    def splat(number):
        return ir.Constant(vec, [ir.Constant(ir.FloatType(), float(number))] * count)

    # Unordered compares: a NaN ``a`` is kept (relu(NaN) and tanh(NaN) are NaN in torch; an ordered compare
    # would turn it into the bound: found by tests/test_fuzz.py).
    def maximum(a, b):
        return builder.select(builder.fcmp_unordered(">", a, b), a, b)

    def minimum(a, b):
        return builder.select(builder.fcmp_unordered("<", a, b), a, b)

    if act == 2:
        return maximum(value, splat(0.0))
    t = value if act == 1 else builder.fmul(value, splat(0.5))
    t = minimum(maximum(t, splat(-TANH_CLAMP)), splat(TANH_CLAMP))
    s = builder.fmul(t, t)

    def horner(coefficients):
        acc = splat(coefficients[-1])
        for coef in reversed(coefficients[:-1]):
            acc = builder.fadd(builder.fmul(acc, s), splat(coef), flags=("contract",))
        return acc

    t = builder.fdiv(builder.fmul(t, horner(TANH_P)), horner(TANH_Q))
    if act == 3:
        t = builder.fadd(builder.fmul(t, splat(0.5)), splat(0.5), flags=("contract",))
    return t


def pool_kernel(pool: int, block: int, act: int):
    """The Numba intrinsic ``pool_act(acc, s0, wrow, pacc, d0)``: for the MB = ``block`` maps of one pooled
    position, the max over the pool x pool window of 16-lane accumulator vectors acc[s0 + i * wrow + (j * MB
    + mm) * 16 ...], then activation ``act``, stored to pacc[d0 + mm * 16 ...] (all in vector registers; the
    same as a Numba loop, which Numba left scalar at 3x the cost)."""
    key = (pool, block, act)
    if key not in _POOLS:
        from llvmlite import ir
        from numba import types
        from numba.extending import intrinsic
        P, MB = pool, block

        @intrinsic
        def pool_act(typingctx, acc, s0, wrow, out, d0):
            sig = types.void(acc, s0, wrow, out, d0)

            def codegen(context, builder, signature, args):
                i64 = ir.IntType(64)
                vec = ir.VectorType(ir.FloatType(), LANES)
                ad = context.make_array(signature.args[0])(context, builder, args[0]).data
                od = context.make_array(signature.args[3])(context, builder, args[3]).data
                s0v, wrowv, d0v = (context.cast(builder, args[i], signature.args[i], types.int64) for i in (1, 2, 4))

                def load(offset):
                    ptr = builder.gep(ad, [offset], inbounds=True)
                    return builder.load(builder.bitcast(ptr, vec.as_pointer()), align=4)

                for mm in range(MB):
                    best = None
                    for i in range(P):
                        row = builder.add(s0v, builder.mul(wrowv, ir.Constant(i64, i)))
                        for j in range(P):
                            v = load(builder.add(row, ir.Constant(i64, (j * MB + mm) * LANES)))
                            # v if v > best or v is NaN, else best (which stays NaN once it is): a NaN in a
                            # window pools to NaN, as in torch (found by tests/test_fuzz.py)
                            if best is None:
                                best = v
                            else:
                                take = builder.or_(builder.fcmp_ordered(">", v, best), builder.fcmp_unordered("uno", v, v))
                                best = builder.select(take, v, best)
                    best = vector_activation(builder, best, act)
                    ptr = builder.gep(od, [builder.add(d0v, ir.Constant(i64, mm * LANES))], inbounds=True)
                    builder.store(best, builder.bitcast(ptr, vec.as_pointer()), align=4)
                return context.get_dummy_value()

            return sig, codegen

        _POOLS[key] = pool_act
    return _POOLS[key]


_POOLS: dict = {}
POOL_VERSION = 1


# Activation codes are convforge.conv.ACTIVATION_CODES: 0 none, 1 tanh, 2 relu, 3 sigmoid.
# tanh(x) = x P(x^2) / Q(x^2) on |x| <= TANH_CLAMP (beyond it tanh rounds to +-1 in float32): a rational
# minimax-style fit (iteratively reweighted least squares for relative error, made for convforge), within
# 3.3e-7 of float64 tanh over all float32 inputs. Plain multiply-adds and one division: it vectorises,
# where libm's tanhf is a scalar call per element (Numba here has no SVML). sigmoid(x) = (1 + tanh(x/2)) / 2.
TANH_CLAMP = 7.90531110763549805
TANH_P = (0.9999999987387712, 0.1313253099916881, 0.00315863074579562, 1.174431814912408e-05,
          -2.277100878791554e-08, 6.619522256118305e-11, -1.2344319065127366e-13)
TANH_Q = (1.0, 0.46465863000440627, 0.024711530850971303, 0.0002626729299975575)


def kernel_source(kernel: int, block: int, pool: int = 0, act: int = 0, width: Optional[int] = None,
                  vector: Optional[int] = None, pooled_tile: bool = False, lanes_in: bool = False,
                  lanes_out: bool = False) -> str:
    """Python source of the Numba kernel for K = ``kernel``, MB = ``block``, TW = ``width`` (default
    choose_width) and the tile's ``vector`` lanes (default VECTOR), all baked in; with ``pool`` > 0 it also
    applies activation ``act`` and a pool x pool max pool (stride pool) and writes only the pooled map. Max
    pooling commutes with the (non-decreasing) activations, so the max is taken first and the activation runs
    on the pooled values only. ``pooled_tile`` (pool 2, TW even): the conv rows never leave the registers,
    pooled_tile_kernel pools and activates them and stores the pooled vectors only. ``lanes_in`` / ``lanes_out``:
    x / y in the lane layout (lane_shape) instead of (B, C, H, W): no transposes on that side."""
    K, MB, L, ACC_FLOATS = kernel, block, LANES, ACC_BYTES // 4
    TW = width or choose_width(block)
    V = vector or VECTOR
    P = pool
    if P:
        pooled = f'''
                # Max pool {P}x{P} then activation {act}, into pacc[((row * Wp + col) * MB + mm) * 16 + lane].
                for ph in range((h1 - h0) // {P}):
                    for pw in range(Wp):
                        pool_act(acc, (ph * {P} * Wo + pw * {P}) * {MB * L}, Wo * {MB * L}, pacc, (ph * Wp + pw) * {MB * L})
                run = (h1 - h0) // {P} * Wp
                r0 = h0 // {P} * Wp'''
    else:
        pooled = """
                run = (h1 - h0) * Wo
                r0 = h0 * Wo"""
    res = "pacc" if P else "acc"
    PT = bool(pooled_tile)
    DIRECT = bool(DIRECT_STORES and lanes_out and not P and not PT)   # unpooled tiles store into y's lanes
    PREFETCH = PREFETCH_OUTPUT
    if PT:
        assert P == 2 and TW % 2 == 0, (P, TW)
        half = TW // 2
        if lanes_out:   # no PREFETCHW of y's lines: the tiles store to them directly (fetching the next pooled
            # row's lines ahead measured 1.05-1.10x slower per layer, benchmarks/2026-11-26-cpu-first-conv-tile)
            prefetch = ""
        else:
            prefetch = f'''                    if {PREFETCH} and nb == {L}:
                        # This pooled row's lines of y, for the band's write-back: fetched for writing now,
                        # while the next rows compute, instead of one cache miss after another at its end.
                        for mm in range(min({MB}, M - m0)):
                            for lane in range({L}):
                                row0 = (b0 * M + m0 + mm) * plane + (h0 // 2 + ph) * Wp + lane * out_image
                                for e in range(0, Wp + {L - 1}, {L}):
                                    prefetchw(yf, row0 + min(e, Wp - 1))'''
        STREAM = bool(STREAM_OUTPUT and lanes_out and V == LANES)
        if PREFETCH_INPUT and not lanes_in:
            prefetch += f'''
                    if g + 1 < g1 and nb == {L}:
                        # A slice of the next group's input (its 16 images are one contiguous run of x, image
                        # lines of 16 floats), one slice per pooled row of each map block, into L2.
                        slices = (mb1 - mb0) * (Hc // 2)
                        per = -(-image // slices)
                        start = (b0 + {L}) * image + ((mb - mb0) * (Hc // 2) + h0 // 2 + ph) * per * {L}
                        stop = min(start + per * {L}, min(b0 + {2 * L}, B) * image)
                        for e in range(start, stop, {4 * L} // xf.itemsize):   # one a cache line
                            prefetchr(xf, e)'''
        if lanes_out:   # the pooled vectors straight into y's lane layout: no band, no copy
            dest, pstride, mstride = "yf", str(L), f"plane * {L}"
            base = "(g * M + m0) * plane + (h0 // 2 + ph) * Wp"
            valid = f"min({MB}, M - m0)"
        else:           # into the band, which the write-back transposes out
            dest, pstride, mstride, base, valid = "pacc", str(MB * L), str(L), "ph * Wp", str(MB)
        tiles = f'''                for ph in range((h1 - h0) // 2):
                    # Pooled row ph of the band: tiles of {TW} conv columns ({half} pooled) x 2 rows x {MB} maps,
                    # summed over all (c, p, q), pooled and activated in registers; the last tile ends at Wp,
                    # overlapping its neighbour (same values). With {V}-lane tiles, {L // V} calls per tile.
                    h = h0 + 2 * ph
{prefetch}
                    if Wp >= {half}:
                        for t in range((Wp + {half - 1}) // {half}):
                            pc0 = min(t * {half}, Wp - {half})
                            for s in range(0, {L}, {V}):
                                if {STREAM} and aligned:
                                    conv_ptile_nt(src, so + (h * W + 2 * pc0) * {L} + s, W * {L}, H * W * {L}, C, wp,
                                                  (mb - mb0) * nw, bias, m0, {dest}, ({base} + pc0) * {MB if not lanes_out else 1} * {L} + s,
                                                  {pstride}, {mstride}, {valid})
                                else:
                                    conv_ptile(src, so + (h * W + 2 * pc0) * {L} + s, W * {L}, H * W * {L}, C, wp,
                                               (mb - mb0) * nw, bias, m0, {dest}, ({base} + pc0) * {MB if not lanes_out else 1} * {L} + s,
                                               {pstride}, {mstride}, {valid})
                    else:
                        for pc0 in range(Wp):
                            for s in range(0, {L}, {V}):
                                conv_ptile2(src, so + (h * W + 2 * pc0) * {L} + s, W * {L}, H * W * {L}, C, wp,
                                            (mb - mb0) * nw, bias, m0, {dest}, ({base} + pc0) * {MB if not lanes_out else 1} * {L} + s,
                                            {pstride}, {mstride}, {valid})
                run = (h1 - h0) // 2 * Wp
                r0 = h0 // 2 * Wp'''
        pooled = ""
        stream_line = f"conv_ptile_nt = pooled_tile_kernel({K}, {MB}, {TW}, {V}, {act}, True)\n" if STREAM else ""
    else:
        stream_line = ""
        # The last Wo % TW columns by a tile that wide (REMAINDER_TILES), not by a whole tile overlapping its
        # neighbour, which recomputes up to TW - 1 columns (sp19's 18 columns: 20 computed with TW = 4).
        REM = REMAINDER_TILES and TW > 1

        def dest(col):  # the tile's output: straight into y's lane layout (DIRECT) or into the band
            if DIRECT:
                return f"yf, ((g * M + m0) * plane + h * Wo + {col}) * {L} + s, {L}, plane * {L}, min({MB}, M - m0)"
            return f"acc, ((h - h0) * Wo + {col}) * {MB * L} + s"
        remainder = "".join(f'''
                        {"if" if r == 1 else "elif"} Wo % {TW} == {r}:
                            col0 = Wo - {r}
                            for s in range(0, {L}, {V}):
                                conv_tile_r{r}(src, so + (h * W + col0) * {L} + s, W * {L}, H * W * {L}, C, wp,
                                          (mb - mb0) * nw, bias, m0, {dest("col0")})'''
                            for r in range(1, TW)) if REM else ""
        tiles = f'''                for h in range(h0, h1):
                    # Tiles of {TW} columns x {MB} maps, each summed over all (c, p, q) in registers; the
                    # last {"Wo % " + str(TW) + " columns by a tile that wide" if REM else "tile ends at Wo, overlapping its neighbour (same values)"}.
                    # With {V}-lane tiles, {L // V} calls per tile, one per {V} lanes of the group.
                    if Wo >= {TW}:
                        for t in range({f"Wo // {TW}" if REM else f"(Wo + {TW - 1}) // {TW}"}):
                            col0 = {f"t * {TW}" if REM else f"min(t * {TW}, Wo - {TW})"}
                            for s in range(0, {L}, {V}):
                                conv_tile(src, so + (h * W + col0) * {L} + s, W * {L}, H * W * {L}, C, wp,
                                          (mb - mb0) * nw, bias, m0, {dest("col0")}){remainder}
                    else:
                        for col0 in range(Wo):
                            for s in range(0, {L}, {V}):
                                conv_tile1(src, so + (h * W + col0) * {L} + s, W * {L}, H * W * {L}, C, wp,
                                           (mb - mb0) * nw, bias, m0, {dest("col0")})'''
    if lanes_in:    # x[g, c, r, col, lane]: the tiles read it in place
        shape_line = f"    C, H, W = x.shape[1], x.shape[2], x.shape[3]\n    B = {'x.shape[0] * ' + str(L) if lanes_out else 'y.shape[0]'}"
        input_side = """        src, so = xf, g * nx                      # this group's lane-layout input"""
        repack_line = ""
    else:
        shape_line = "    B, C, H, W = x.shape"
        repack_line = "    xp = buf[o:o + nxp].reshape((C, H, W * {L}))  # xp[c, r, col * 16 + lane] = x[b0 + lane, c, r, col]".replace("{L}", str(L))
        input_side = f"""        if nb == {L} and H * W >= {L}:
            for c in range(C):                    # each channel's plane, flattened, 16 floats at a time
                for v in range((H * W + {L - 1}) // {L}):
                    c0 = min(v * {L}, last_in)
                    store_transposed16(xf, (b0 * C + c) * H * W + c0, image, buf, o + (c * H * W + c0) * {L}, {L})
        else:
            xp[:] = 0.0
            for c in range(C):
                for r in range(H):
                    xr = xp[c, r]
                    for lane in range(nb):
                        for col in range(W):
                            xr[col * {L} + lane] = x[b0 + lane, c, r, col]
        src, so = buf, o"""
    if lanes_out and (PT or DIRECT):    # the tiles stored into y themselves
        output_side = ""
    elif lanes_out:   # y[g, m, r, col, lane]: the band's vectors copied as they are, every lane (a last partial
        # group's extra lanes hold the conv of the zero or stale inputs there, never read as an image)
        output_side = f"""                # Into y's lane layout: each map's run of the band, vector by vector (whole aligned lines).
                for mm in range(min({MB}, M - m0)):
                    first = ((g * M + m0 + mm) * plane + r0) * {L}
                    for i in range(run):
                        for lane in range({L}):
                            yf[first + i * {L} + lane] = {res}[(i * {MB} + mm) * {L} + lane]"""
    else:
        output_side = f"""                # Back to y's layout, the band's rows as one run of each (image, map) plane.
                for mm in range(min({MB}, M - m0)):
                    first = (b0 * M + m0 + mm) * plane + r0
                    if nb == {L} and run >= {L}:
                        for v in range((run + {L - 1}) // {L}):
                            c0 = min(v * {L}, run - {L})
                            store_transposed16({res}, (c0 * {MB} + mm) * {L}, {MB * L}, yf, first + c0, out_image)
                    else:
                        for lane in range(nb):
                            dst = first + lane * out_image
                            for i in range(run):
                                yf[dst + i] = {res}[(i * {MB} + mm) * {L} + lane]"""
    layout_doc = (" x in the lane layout." if lanes_in else "") + (" y in the lane layout." if lanes_out else "")
    return f'''"""Generated by convforge.conv.cpu_parallel for K={K}, MB={MB}, TW={TW}, vector={V}, pool={P}, act={act} (transpose v{TRANSPOSE_VERSION}, tile v{TILE_VERSION}, pool v{POOL_VERSION}, pooled tile {PT} v{PTILE_VERSION} fast max {FAST_POOL_MAX} stream {STREAM_OUTPUT}, prefetch {PREFETCH} input {PREFETCH_INPUT}, lanes in {lanes_in} out {lanes_out}, remainder tiles {REMAINDER_TILES}, direct stores {DIRECT})."""
import numpy as np

from convforge.conv.cpu_parallel import (pool_kernel, pooled_tile_kernel, prefetch_read, prefetch_write, tile_kernel,
                                         transposed_store)

store_transposed16 = transposed_store()
prefetchw = prefetch_write()
prefetchr = prefetch_read()
conv_tile = tile_kernel({K}, {MB}, {TW}, {V}, {DIRECT})
conv_tile1 = tile_kernel({K}, {MB}, 1, {V}, {DIRECT})
{"".join(f"conv_tile_r{r} = tile_kernel({K}, {MB}, {r}, {V}, {DIRECT})" + chr(10) for r in range(1, TW)) if REMAINDER_TILES and not PT else ""}conv_ptile = pooled_tile_kernel({K}, {MB}, {TW}, {V}, {act}) if {PT} else None
conv_ptile2 = pooled_tile_kernel({K}, {MB}, 2, {V}, {act}) if {PT} else None
{stream_line}pool_act = pool_kernel({max(P, 1)}, {MB}, {act})


def conv(x, w, bias, y, M, g0, g1, mb0, mb1):
    """y[b, m] for the 16-image groups g0 <= g < g1 and map blocks mb0 <= mb < mb1 ({MB} maps each).{layout_doc}"""
{shape_line}
    Ho = H - {K} + 1
    Wo = W - {K} + 1
    Hp = Ho // {max(P, 1)}                          # output rows and columns (pooled when fused)
    Wp = Wo // {max(P, 1)}
    Hc = Hp * {max(P, 1)}                           # conv rows computed (whole pool windows)
    plane = max(Hp, 0) * max(Wp, 0)               # floats of one (image, map) output plane
    nx = C * H * W * {L}
    nr = max(Wo, 1) * {MB * L}                    # accumulators of one output row block
    band = max(1, min(Hc, max(-(-{L} // max(Wo, 1)), {ACC_FLOATS} // nr)))  # conv rows per band
    band = max({max(P, 1)}, band // {max(P, 1)} * {max(P, 1)})  # whole pool windows
    na = band * nr
    nxp = {0 if lanes_in else "nx"}                  # the repacked input's floats (none: x is in the lane layout)
    buf = np.empty(nxp + na + {L}, np.float32)
    pacc = np.empty(max(band // {max(P, 1)} * max(Wp, 1) * {MB * L}, {L}) if {P} else 1, np.float32)
    o = (-(buf.ctypes.data >> 2)) & {L - 1}       # 64-byte aligned: whole-cache-line vector loads
{repack_line}
    acc = buf[o + nxp:o + nxp + na]               # acc[((h - h0) * Wo + col) * MB + mm) * 16 + lane]: a band
    nw = C * {K * K * MB}                         # packed weights of one map block
    wp = np.empty(max(mb1 - mb0, 0) * nw, np.float32)  # wp[(((mb - mb0) * C + c) * K + p) * K + q) * MB + mm]
    for mb in range(mb0, mb1):
        for c in range(C):
            for p in range({K}):
                for q in range({K}):
                    for mm in range({MB}):
                        wp[(mb - mb0) * nw + ((c * {K} + p) * {K} + q) * {MB} + mm] = w[mb * {MB} + mm, c, p, q]
    xf = x.reshape(-1)
    yf = y.reshape(-1)
    aligned = (yf.ctypes.data & 63) == 0          # whole-line stores possible (non-temporal, STREAM_OUTPUT)
    image = C * H * W                             # floats from one image to the next, in x and in y
    out_image = M * plane
    last_in = max(H * W - {L}, 0)                 # 16-float chunks of a plane; the last one ends at the
    for g in range(g0, g1):                       # plane's end, overlapping its neighbour (same values)
        b0 = g * {L}
        nb = min({L}, B - b0)
{input_side}
        for mb in range(mb0, mb1):
            m0 = mb * {MB}
            for h0 in range(0, Hc, band):
                h1 = min(h0 + band, Hc)
{tiles}{pooled}
{output_side}
'''


_KERNELS: dict = {}
_LOCK = threading.Lock()


def get_kernel(kernel: int, block: int, pool: int = 0, act: int = 0, width: Optional[int] = None,
               vector: Optional[int] = None, pooled_tile: bool = False, lanes_in: bool = False,
               lanes_out: bool = False):
    """The compiled kernel for (K, MB[, pool, activation, TW, vector lanes, pooled tile, lane layouts]),
    compiled (or loaded from the disk cache) once per process."""
    width, vector = width or choose_width(block), vector or VECTOR
    with _LOCK:
        key = (kernel, block, pool, act, width, vector, bool(pooled_tile), bool(lanes_in), bool(lanes_out),
               PREFETCH_OUTPUT, REMAINDER_TILES, FAST_POOL_MAX, STREAM_OUTPUT, PREFETCH_INPUT, DIRECT_STORES)
        if key not in _KERNELS:
            name = (f"cpu_parallel_k{kernel}_mb{block}_tw{width}_v{vector}" + (f"_p{pool}_a{act}" if pool else "")
                    + ("_pt" if pooled_tile else "") + ("_li" if lanes_in else "") + ("_lo" if lanes_out else "")
                    + ("" if REMAINDER_TILES else "_norem") + ("" if PREFETCH_OUTPUT else "_nopf")
                    + ("" if FAST_POOL_MAX else "_slowmax") + ("_nt" if STREAM_OUTPUT else "")
                    + ("" if PREFETCH_INPUT else "_nopfin") + ("" if DIRECT_STORES else "_band"))
            source = kernel_source(kernel, block, pool, act, width, vector, pooled_tile, bool(lanes_in),
                                   bool(lanes_out))
            _KERNELS[key] = jit_generated(name, source, "conv", nogil=True, fastmath={"contract"})
        return _KERNELS[key]


def lane_shape(rows: int, shape: tuple) -> tuple:
    """The lane layout of ``rows`` images of per-image ``shape`` (C, H, W): (groups, C, H, W, 16), image
    g * 16 + lane's value at [g, c, h, w, lane], the layout the tiles compute in. Between two cpu-parallel
    layers (lanes_out, then lanes_in) it replaces the transposes out of and back into it; a last partial
    group's extra lanes hold values of no image."""
    return (-(-rows // LANES), *shape, LANES)


def to_lanes(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) as the lane layout (lane_shape); a last partial group's extra lanes NaN, so that any mixing
    of lanes shows."""
    groups = -(-x.shape[0] // LANES)
    padded = torch.full((groups * LANES, *x.shape[1:]), float("nan"), dtype=x.dtype)
    padded[:x.shape[0]] = x
    return padded.reshape(groups, LANES, *x.shape[1:]).permute(0, 2, 3, 4, 1).contiguous()


def from_lanes(y: torch.Tensor, rows: int) -> torch.Tensor:
    """The first ``rows`` images of a lane-layout tensor as (rows, C, H, W) (a view)."""
    return y.permute(0, 4, 1, 2, 3).reshape(-1, *y.shape[1:4])[:rows]


_POOL: Optional[ThreadPoolExecutor] = None
_POOL_SIZE = 0
_POOL_LOCK = threading.Lock()


def _pool(threads: int) -> ThreadPoolExecutor:
    """The shared worker threads, as many as torch.get_num_threads() says now."""
    global _POOL, _POOL_SIZE
    with _POOL_LOCK:
        if _POOL is None or _POOL_SIZE != threads:
            if _POOL is not None:
                _POOL.shutdown(wait=False)
            _POOL = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="convforge-cpu")
            _POOL_SIZE = threads
        return _POOL


def work_items(groups: int, blocks: int, threads: int) -> list[tuple[int, int, int, int]]:
    """(g0, g1, mb0, mb1) pieces: about 8 per thread, runs of whole groups when the batch allows, else
    map blocks of single groups (each piece repacks its group, cheap next to its arithmetic)."""
    if groups == 0:
        return []
    if threads <= 1:
        return [(0, groups, 0, blocks)]
    want = 8 * threads
    if groups >= want:
        edges = [groups * i // want for i in range(want + 1)]
        return [(edges[i], edges[i + 1], 0, blocks) for i in range(want)]
    parts = min(blocks, -(-want // groups))
    return [(g, g + 1, blocks * i // parts, blocks * (i + 1) // parts) for g in range(groups) for i in range(parts)]


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, config=None):
    """``config``: (MB, TW[, vector lanes]), the register tile's maps, columns and width instead of
    choose_block's, choose_width's and VECTOR (for A/B measurements)."""
    return _prepare(weight, bias, None, 0, config)


def prepare_fused(weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str], pool: int,
                  config=None, lanes_in: bool = False, lanes_out: bool = False, raw_input: bool = False):
    """conv + bias, then a pool x pool max pool (stride pool) and the activation, in one pass: only the
    pooled map is written (the conv rows stay in the band of accumulators, in L2). ``lanes_in`` /
    ``lanes_out`` / ``raw_input``: see prepare_lanes."""
    if activation not in ACTIVATION_CODES:
        raise ValueError(f"unknown activation {activation!r}; cpu-parallel fuses {sorted(map(str, ACTIVATION_CODES))}")
    if pool < 1:
        raise ValueError(f"pool must be 1 or more, got {pool}")
    return _prepare(weight, bias, activation, pool, config, lanes_in, lanes_out, raw_input)


def prepare_lanes(weight: torch.Tensor, bias: Optional[torch.Tensor], lanes_in: bool, lanes_out: bool,
                  config=None, raw_input: bool = False):
    """prepare with x and/or y in the lane layout (lane_shape): the returned ``fn(x, out, rows)`` takes x as a
    (groups, C, H, W, 16) tensor when ``lanes_in`` (else (B, C, H, W), float32, or uint8 when ``lanes_out``:
    raw images, converted exactly in the input transposes), writes ``out``, a (groups, M, Ho, Wo,
    16) tensor when ``lanes_out`` (else (B, M, Ho, Wo)), for ``rows`` images. The CPU engine's arena uses it
    between layers; prepare_fused(..., lanes_in=, lanes_out=) is the fused form. ``raw_input``: the uint8
    form is compiled here too (the engine's first layer with engine.RAW_INPUT); else at its first uint8 call."""
    return _prepare(weight, bias, None, 0, config, lanes_in, lanes_out, raw_input)


def _run_items(fn, args: tuple, items: list) -> None:
    """fn(*args, *item) for every work item, on the shared pool when there are several."""
    if len(items) == 1:
        fn(*args, *items[0])
    elif items:
        for future in [_pool(torch.get_num_threads()).submit(fn, *args, *item) for item in items]:
            future.result()


def _prepare(weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str], pool: int, config=None,
             lanes_in: bool = False, lanes_out: bool = False, raw_input: bool = False):
    maps, channels, kernel, kernel_w = weight.shape
    if kernel != kernel_w:
        raise ValueError(f"square kernels only, got {kernel}x{kernel_w}")
    if config:      # (MB, TW[, vector lanes[, pooled tile]])
        block, width, vector, pooled_tile = (tuple(config) + (None, None))[:4]
        pooled_tile = bool(pooled_tile)
    elif pool == 2 and POOLED_TILES and VECTOR == 16:
        (block, width), vector, pooled_tile = choose_pooled(maps), None, True
    else:
        block, width, vector, pooled_tile = choose_block(maps, kernel), None, None, False
    padded = -(-maps // block) * block  # maps rounded up to whole blocks: zero weights, never written out
    w = np.zeros((padded, channels, kernel, kernel), np.float32)
    w[:maps] = weight.detach().to(torch.float32).numpy()
    b = np.zeros(padded, np.float32)
    if bias is not None:
        b[:maps] = bias.detach().to(torch.float32).numpy()
    fn = get_kernel(kernel, block, pool, ACTIVATION_CODES[activation] if pool else 0, width, vector, pooled_tile,
                    lanes_in, lanes_out)
    blocks = padded // block
    # Compile now (a one-image call of the same types), so the first timed call runs compiled code.
    fn(np.zeros(lane_shape(1, (channels, kernel, kernel)) if lanes_in else (1, channels, kernel, kernel), np.float32),
       w, b, np.empty(lane_shape(1, (maps, 1, 1)) if lanes_out else (1, maps, 1, 1), np.float32), maps, 0, 1, 0, blocks)
    if raw_input and lanes_out and not lanes_in:    # the engine's first layer takes its raw uint8 images
        fn(np.zeros((1, channels, kernel, kernel), np.uint8), w, b, np.empty(lane_shape(1, (maps, 1, 1)), np.float32),
           maps, 0, 1, 0, blocks)

    def out_shape(rows: int, height: int, width: int) -> tuple:
        ho, wo = height - kernel + 1, width - kernel + 1
        if pool:
            ho, wo = ho // pool, wo // pool
        return (rows, maps, ho, wo)

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        xn, shape = check_input(x, weight.shape)
        target, result = output_buffer(out, out_shape(*shape[:1], *x.shape[2:]), x)
        if shape[0] == 0:
            return finish_output(target, result)
        groups = -(-shape[0] // LANES)
        _run_items(fn, (xn, w, b, target.numpy(), maps), work_items(groups, blocks, max(1, torch.get_num_threads())))
        return finish_output(target, result)

    def run_lanes(x: torch.Tensor, out: torch.Tensor, rows: int, groups: Optional[list] = None) -> torch.Tensor:
        """``groups``: only these 16-image groups (cpu_winograd's out-of-range ones), else all."""
        only, groups = groups, -(-rows // LANES)
        height, width = (x.shape[2], x.shape[3])
        if lanes_in:
            if x.dim() != 5 or x.shape[0] < groups or x.shape[1] != channels or x.shape[4] != LANES:
                raise ValueError(f"x must be a lane-layout ({groups}, {channels}, H, W, {LANES}) tensor, got {tuple(x.shape)}")
            xn = x[:groups].contiguous().numpy()
        elif x.dtype == torch.uint8:    # raw images (the CPU engine's input): converted in the transposes
            if x.dim() != 4 or x.shape[1] != channels:
                raise ValueError(f"x must be a (B, {channels}, H, W) tensor, got {tuple(x.shape)}")
            xn = x[:rows].contiguous().numpy()
        else:
            xn = check_input(x[:rows], weight.shape)[0]
        shape = out_shape(rows, height, width)
        want = lane_shape(rows, shape[1:]) if lanes_out else shape
        if tuple(out.shape) != want or out.dtype != torch.float32 or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous float32 {want} tensor, got {out.dtype} {tuple(out.shape)}")
        items = work_items(groups, blocks, max(1, torch.get_num_threads())) if only is None else \
            [(g, g + 1, 0, blocks) for g in only]
        if rows:
            _run_items(fn, (xn, w, b, out.numpy(), maps), items)
        return out

    return run_lanes if (lanes_in or lanes_out) else run
