"""triton-fused-layer: conv + bias + activation + max pool in one Triton kernel, writing only the pooled map.

Technique: the direct convolution of triton-direct (compile-time shapes, unrolled taps, a lane holding
R conv positions x a pass of up to 16 maps in registers, weights loaded once per tap for all of them)
over the conv positions that the pooling windows cover, indexed (window row, window column, pooled
output) so that Triton's default layout spreads pooled outputs over the lanes and keeps each lane's
pool x pool window in its registers: both maxima are register operations, neighbouring taps of a lane
read the same inputs (LLVM merges those loads: 36 loads instead of 100 per 2x2 window of a 5x5 conv),
and no shared memory is used (when R < pool^2 the window's columns go to neighbouring lanes and their
max is a warp shuffle). Bias and activation (tanh / relu / sigmoid, picked by a tl.constexpr, so no
branch at run time) are applied once per pooled output: all three are monotone, so
act(max(conv) + bias) = max(act(conv + bias)). Only the pooled map is written (pool^2 fewer bytes).
Windows follow F.max_pool2d's floor semantics: rows and columns past the last whole window are never
computed. A pool that is not a power of two loops over the window with a running max. ``prepare``
(pool 1, no activation) is the plain convolution with the bias fused. On the one-channel layers the
weights are baked into the kernel as FMA immediates, as in triton-direct (``TileConfig(baked=True)``): fa18
from 1.351 to 0.963 ms, fa19 from 0.718 to 0.522, sp18 from 0.358 to 0.240 (H200, B = 10000).
On the many-channel layers with a pool of 2 or 4 a lane holds a whole window as a block (as triton-direct's
blocks: the block's first input in the pointer, constant offsets, merged loads; ``TileConfig(block_rows=
pool)``; the default is the whole window, so its max needs no shuffle): fa20 L2 (relu + pool 4) from 2.45
to 1.42 ms (run 13).
Course step: milestone 4's kernel fusion ("fuse the unrolling, the matrix multiply and the pooling"),
with the compile-time shapes and register tiling of the direct kernels.
Bottleneck: FP32 FMA issue: with the output cut by pool^2 every course layer becomes compute-bound
(the fused floor is the FLOP term). In the sm_90 SASS 76-86 % of the issued instructions are FFMA
(``convforge sweep --sass``); the rest are input and weight loads and the
epilogue. The layers with 4-6 maps also lean on L1: a warp's input loads are strided by the pool.
"""


from __future__ import annotations

from typing import Optional

import torch

from convforge.conv import triton_common as common

triton, tl = common.triton, common.tl


# R conv positions per lane; R x maps sums + R x maps / pool running maxima per pass.
Config = common.TileConfig
DEFAULT = Config(4, 16, 4)
SWEEP = (Config(4, 16, 4), Config(8, 8, 4), Config(4, 24, 4), Config(8, 12, 4), Config(4, 12, 4),
         Config(4, 16, 8), Config(16, 8, 4),
         Config(4, 16, 4, True), Config(8, 8, 4, True), Config(4, 24, 4, True), Config(8, 12, 4, True),
         Config(16, 8, 4, True), Config(16, 8, 4, block_rows=4), Config(8, 16, 4, block_rows=4),
         Config(4, 8, 4, block_rows=2))


def choose_config(maps: int, channels: int, kernel: int, pool: int) -> Config:
    """Per layer shape: baked weights where they can be (``common.can_bake``; measured on an H200,
    benchmarks/2026-11-21-h200-triton-baked-weights/triton_sweep_baked*.txt: 8 positions per lane for few maps, sp18 L1
    0.236 ms; else 4 positions and passes of up to 12 maps, fa17 0.348 against 0.371 with 16); with a
    run-time channel loop and a pool of 2 or 4, a whole window per lane as a block (session 8); else
    DEFAULT (from the SASS: FFMA share, registers, no spills); ``python -m convforge.conv.triton_common
    bench --sweep`` times the alternatives on a GPU."""
    if common.can_bake(channels, kernel):
        return Config(8, 8, 4, True) if maps <= 8 and pool <= 2 else Config(4, 12, 4, True)
    if _is_pow2(pool) and 2 <= pool <= 4:
        # A whole window per lane, passes of 8 maps: fa20 L2 (relu + pool 4) 1.420 ms against 2.450 with
        # DEFAULT (benchmarks/2026-11-21-h200-triton-blocks-many-channel/sweep2_fused.txt).
        return Config(pool * pool, 8, 4, block_rows=pool)
    return DEFAULT


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


if triton is not None:

    @triton.jit
    def _pool_store(y_ptr, b_ptr, best, y_off, valid, m0, MG: tl.constexpr, M: tl.constexpr, HPWP: tl.constexpr,
                    HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
        maps = m0 + tl.arange(0, MG)
        if HAS_BIAS:
            best += tl.load(b_ptr + maps)[:, None]
        best = common.activation(best, ACT)
        tl.store(y_ptr + y_off[None, :] + maps[:, None] * HPWP, best, mask=valid[None, :] & (maps[:, None] < M))

    @triton.jit
    def _max_nan(a, b):
        """max that keeps NaN (tl.max and plain tl.maximum drop it): a NaN in a window pools to NaN, as in torch."""
        return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)

    @triton.jit
    def _window_max(best, acc, MG: tl.constexpr, PI: tl.constexpr, BPP: tl.constexpr, PJ: tl.constexpr,
                    JL: tl.constexpr):
        """Max over the window rows and columns that the tile holds side by side: (MG, PI*PJ*BPP) sums
        -> (MG, BPP). Rows sit in each lane's registers; columns too, or in neighbouring lanes (JL)."""
        if JL:
            acc = tl.reduce(tl.reduce(tl.reshape(acc, [MG, PI, BPP, PJ]), 3, _max_nan), 1, _max_nan)
        else:
            acc = tl.reduce(tl.reduce(tl.reshape(acc, [MG, PI, PJ, BPP]), 2, _max_nan), 1, _max_nan)
        return _max_nan(best, acc)

    @triton.jit
    def _pass(x_ptr, w_ptr, b_ptr, y_ptr, x_off, y_off, valid, m0, GA: tl.constexpr, GB: tl.constexpr,
              WPITCH: tl.constexpr, BP: tl.constexpr, BPP: tl.constexpr, C: tl.constexpr, H: tl.constexpr,
              W: tl.constexpr, K: tl.constexpr, M: tl.constexpr, HPWP: tl.constexpr, P: tl.constexpr,
              PI: tl.constexpr, PJ: tl.constexpr, JL: tl.constexpr, NI: tl.constexpr, NJ: tl.constexpr,
              HAS_BIAS: tl.constexpr, ACT: tl.constexpr, UNROLL_C: tl.constexpr, BAKED: tl.constexpr,
              WTS: tl.constexpr):
        GBX: tl.constexpr = GB if GB > 0 else 1
        best_a = tl.full([GA, BPP], float("-inf"), tl.float32)
        best_b = tl.full([GBX, BPP], float("-inf"), tl.float32)
        # Window rows and columns the tile does not hold side by side (NI, NJ > 1 when the lane's
        # positions do not span the window, or for a pool that is not a power of two): loops with a
        # running max.
        for ii in range(NI):
            for jj in tl.static_range(NJ):
                acc_a, acc_b = common.conv_tile(x_ptr, w_ptr, x_off + (ii * W + jj), m0, GA, GB, WPITCH, BP,
                                                C, H, W, K, UNROLL_C, BAKED, WTS)
                best_a = _window_max(best_a, acc_a, GA, PI, BPP, PJ, JL)
                if GB > 0:
                    best_b = _window_max(best_b, acc_b, GBX, PI, BPP, PJ, JL)
        _pool_store(y_ptr, b_ptr, best_a, y_off, valid, m0, GA, M, HPWP, HAS_BIAS, ACT)
        if GB > 0:
            _pool_store(y_ptr, b_ptr, best_b, y_off, valid, m0 + GA, GBX, M, HPWP, HAS_BIAS, ACT)

    @triton.jit
    def _fused_kernel(x_ptr, w_ptr, b_ptr, y_ptr, B,
                      C: tl.constexpr, H: tl.constexpr, W: tl.constexpr, K: tl.constexpr, M: tl.constexpr,
                      P: tl.constexpr, PI: tl.constexpr, PJ: tl.constexpr, JL: tl.constexpr, NI: tl.constexpr,
                      NJ: tl.constexpr, RB: tl.constexpr, CB: tl.constexpr, ACT: tl.constexpr,
                      GA: tl.constexpr, GB: tl.constexpr, N: tl.constexpr, TA: tl.constexpr, TB: tl.constexpr,
                      BP: tl.constexpr, HAS_BIAS: tl.constexpr, UNROLL_C: tl.constexpr, BAKED: tl.constexpr,
                      WTS: tl.constexpr):
        HP: tl.constexpr = (H - K + 1) // P
        WP: tl.constexpr = (W - K + 1) // P
        HPWP: tl.constexpr = HP * WP
        BPP: tl.constexpr = BP // (PI * PJ)          # pooled outputs per program
        WPITCH: tl.constexpr = (GA + GB) * N + TA + TB
        # The tile's BP conv positions, indexed by window row i < PI, window column j < PJ and pooled
        # output k < BPP, with k fastest (or k, j when JL). Triton's default layout spreads the fastest
        # index over lanes and warps and gives each lane the rest in registers: the window's rows (and
        # columns) are then side by side in a lane and both maxima need no shared memory; with the
        # columns in registers, neighbouring taps of a lane read the same inputs (LLVM merges those
        # loads), with JL a warp reads 32 neighbouring input columns and the columns' max is a shuffle.
        idx = tl.arange(0, BP)
        if JL:
            i = idx // (BPP * PJ)
            k = (idx // PJ) % BPP
            j = idx % PJ
        else:
            i = idx // (PJ * BPP)
            j = (idx // BPP) % PJ
            k = idx % BPP
        pp = tl.program_id(0) * BPP + k
        b = tl.minimum(pp // HPWP, B - 1)            # past the end: re-read the last image, store nothing
        r = pp % HPWP
        ph = r // WP
        if RB > 0:
            # Blocks (the many-channel layers; JL): i < PI = P * CB indexes a P x CB block of one window
            # (down its rows first) and the window's PJ = P / CB blocks sit in neighbouring lanes. The
            # block's first input goes into the pointer and x_off keeps a constant per register, so LLVM
            # sees the taps' equal addresses and merges their loads (as in triton-direct's blocks).
            x_base = x_ptr + (b * (C * H * W) + P * ph * W + P * (r - ph * WP) + j * CB)
            x_off = (i % RB) * W + i // RB
        else:
            x_base = x_ptr
            x_off = b * (C * H * W) + (P * ph + i) * W + P * (r - ph * WP) + j
        # One position per lane, as the sums' default layout: Triton would otherwise prove some columns
        # contiguous, widen the loads, and shuffle every tap's input through shared memory.
        x_off = tl.multiple_of(x_off, 1)
        opos = tl.program_id(0) * BPP + tl.arange(0, BPP)
        valid = opos < B * HPWP
        ob = tl.minimum(opos // HPWP, B - 1)
        y_off = tl.max_contiguous(tl.multiple_of(ob * (M * HPWP) + opos % HPWP, 1), 2)
        if BAKED:   # static passes: each pass's first map is a constant, so are its weights' indices
            for g in tl.static_range(N):
                _pass(x_base, w_ptr, b_ptr, y_ptr, x_off, y_off, valid, g * (GA + GB), GA, GB, WPITCH, BP, BPP,
                      C, H, W, K, M, HPWP, P, PI, PJ, JL, NI, NJ, HAS_BIAS, ACT, UNROLL_C, BAKED, WTS)
        else:
            for g in range(N):
                _pass(x_base, w_ptr, b_ptr, y_ptr, x_off, y_off, valid, g * (GA + GB), GA, GB, WPITCH, BP, BPP,
                      C, H, W, K, M, HPWP, P, PI, PJ, JL, NI, NJ, HAS_BIAS, ACT, UNROLL_C, BAKED, WTS)
        if TA > 0:
            _pass(x_base, w_ptr, b_ptr, y_ptr, x_off, y_off, valid, N * (GA + GB), TA, TB, WPITCH, BP, BPP,
                  C, H, W, K, M, HPWP, P, PI, PJ, JL, NI, NJ, HAS_BIAS, ACT, UNROLL_C, BAKED, WTS)


def unavailable_reason() -> Optional[str]:
    return common.unavailable_reason()


def window_split(pool: int, positions_per_thread: int) -> tuple[int, int, bool]:
    """(PI, PJ, JL): window rows and columns a tile holds side by side, and whether the columns sit in
    neighbouring lanes (JL) rather than in each lane's registers.

    A lane's R positions take a window's rows, then its columns when R >= pool^2; otherwise the columns
    go to neighbouring lanes. A pool that is not a power of two (or rows that do not fit) falls back to
    loops with a running max (PI = 1 and/or PJ = 1).
    """
    if not _is_pow2(pool):
        return 1, 1, False
    if positions_per_thread % (pool * pool) == 0:
        return pool, pool, False
    return (pool if positions_per_thread % pool == 0 else 1), pool, True


def kernel_constants(maps: int, channels: int, kernel: int, height: int, width: int, has_bias: bool,
                     activation: Optional[str], pool: int, cfg: Config, weights: tuple = ()) -> dict:
    """Every compile-time argument of _fused_kernel (and the launch options) for one layer shape;
    ``weights``: the baked weights (``common.bake_weights``) when ``cfg.baked``."""
    plan = common.plan_maps(maps, cfg.positions_per_thread, cfg.max_per_pass)
    baked = common.bakes(cfg, channels, kernel)
    if uses_blocks(cfg, channels, kernel, pool):
        cols = cfg.block_cols
        tiling = dict(PI=pool * cols, PJ=pool // cols, JL=True, NI=1, NJ=1, RB=pool, CB=cols)
    else:
        rows, cols, cols_in_lanes = window_split(pool, cfg.positions_per_thread)
        tiling = dict(PI=rows, PJ=cols, JL=cols_in_lanes, NI=pool // rows, NJ=pool // cols, RB=0, CB=0)
    return dict(C=channels, H=height, W=width, K=kernel, M=maps, P=pool, **tiling,
                ACT=common.ACTIVATION_CODES[activation], **plan.constants(), BP=cfg.block, HAS_BIAS=has_bias,
                UNROLL_C=common.unroll_channels(channels, kernel), BAKED=baked, WTS=weights if baked else 0,
                **cfg.launch_options())


def uses_blocks(cfg: Config, channels: int, kernel: int, pool: int) -> bool:
    """Blocks (``TileConfig.block_rows``) serve the layers whose channel loop runs at run time, when a block
    is a window's full height and a power-of-two share of its width."""
    return (common.uses_blocks(cfg, channels, kernel) and cfg.block_rows == pool and _is_pow2(pool)
            and pool % cfg.block_cols == 0)


def _prepare(weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str], pool: int,
             config: Optional[Config]):
    maps, channels, kernel, kernel_w = weight.shape
    if kernel != kernel_w:
        raise ValueError(f"square kernels only, got {kernel}x{kernel_w}")
    common.check_kernel_size(kernel, "triton-fused-layer")
    if activation not in common.ACTIVATION_CODES:
        raise ValueError(f"unknown activation {activation!r}; choose tanh, relu, sigmoid or None")
    if pool < 1:
        raise ValueError(f"pool must be at least 1, got {pool}")
    cfg = config or choose_config(maps, channels, kernel, pool)
    plan = common.plan_maps(maps, cfg.positions_per_thread, cfg.max_per_pass)
    packed = common.pack_weights(weight, plan.width)
    packed_bias = common.pack_bias(bias, plan.width, weight)
    baked = common.bake_weights(packed) if common.bakes(cfg, channels, kernel) else ()
    launches: dict = {}   # input (H, W) -> constants: one dict lookup per call

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        common.check_input(x, channels, kernel)
        batch, _, height, width = x.shape
        hp, wp = (height - kernel + 1) // pool, (width - kernel + 1) // pool
        buffer, result = common.output_for(out, (batch, maps, hp, wp), x)
        if hp == 0 or wp == 0 or batch == 0:
            return common.finish(buffer, result)
        constants = launches.get((height, width))
        if constants is None:
            constants = launches[(height, width)] = kernel_constants(
                maps, channels, kernel, height, width, bias is not None, activation, pool, cfg, baked)
        x = common.contiguous_input(x)
        block_out = constants["BP"] // (constants["PI"] * constants["PJ"])   # pooled outputs per program
        for xs, ys, n in common.batch_views(x, buffer, max(channels * height * width, maps * hp * wp)):
            _fused_kernel[(triton.cdiv(n * hp * wp, block_out),)](xs, packed, packed_bias, ys, n, **constants)
        return common.finish(buffer, result)

    return run


def prepare_fused(weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str], pool: int,
                  config: Optional[Config] = None):
    """activation(conv(x) + bias), max-pooled over pool x pool windows of stride pool: only that is written."""
    return _prepare(weight, bias, activation, int(pool), config)


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, config: Optional[Config] = None):
    """The plain convolution (+ bias) through the same kernel: pool 1, no activation."""
    return _prepare(weight, bias, None, 1, config)
