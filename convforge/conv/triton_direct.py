"""triton-direct: direct convolution in Triton, a tile of output positions x all maps per program.

Technique: one program per BP = 32 x warps x R consecutive output positions, flattened over images,
rows and columns (no tile wastes lanes on a row's end). Kernel size, channels and the input's shape are
compile-time constants: every tap's offset is an immediate and the K x K taps (and the channels, when
C*K*K <= 64) are unrolled. Each lane keeps R positions x a pass of up to 24 maps of sums in registers:
per tap it loads its inputs once for all those maps, the pass's weights with uniform 16-byte loads, and
issues R x maps FMAs. M is covered by register-sized passes of at most two power-of-two groups
(50 = 2 x (16+8) + 2, 6 = 4+2, 24 = 16+8: no multiply-adds on padding). When V = 4 or 2 divides W and
W-K+1, a lane owns runs of V neighbouring positions: its stores are V-wide vectors and its input row
segments are loaded once as aligned vectors, LLVM forwarding the shifted taps' values from them (2 loads
instead of 20 per row of a 5x5 kernel). Otherwise one position per lane: a warp still reads and writes
32 neighbouring floats. The bias is added in the epilogue.
Baked weights (``TileConfig(baked=True)``, the default on the one-channel layers, C*K*K <= 64): the packed
weights are passed as a ``tl.constexpr`` tuple, so Triton compiles one kernel per weight set in which every
multiply-add takes its weight as an fp32 immediate and no weight is loaded (the Triton counterpart of
cuda-direct's constant-bank operands; the passes over the maps become static so each weight index is a
constant). It took fa18 L1 from 1.404 to 0.967 ms and fa20 L1 from 0.738 to 0.577 (H200, B = 10000). Each
prepared layer compiles once, on its first call (a few seconds); the engine's warm-up pass absorbs that.
Blocks (``TileConfig(block_rows=...)``, the default on the many-channel layers, whose channel loop runs at
run time): a lane's R positions are an RB x CB block of neighbouring outputs (4x2 on sp18, sp19, fa18 and
fa20 L2, 8x1 on fa19 L2), the lanes of a program neighbouring blocks. The block's first input goes into the
pointer and each register's offset is a constant, so LLVM sees that tap (p, q) of one position reads what
tap (p - 1, q) of the position below reads and merges the loads: (RB + K - 1) x (CB + K - 1) input loads per
channel instead of RB x CB x K x K (48 instead of 200 on fa19 L2). With fewer loads per FMA the L1 stops being
the limit (ncu on fa19 L2 before: L1 69 % busy, issue slots 57 %, two warps per scheduler at 255
registers). A map's last block row (column) moves back inside the map and its overlap is stored once.
fa18 L2 went from 8.9 to 5.54 ms, fa19 L2 3.64 to 3.31, sp18 L2 0.89 to 0.80, sp19 L2 0.45 to 0.42 (run 13;
sp18 and sp19 L2 under a 128-register cap, ``TileConfig(maxnreg=128)``). fa20 L2 gains little: 2.07 flat, 2.08
in the spill-free 4x2 blocks of 8 maps (2.01 with 16 maps, which every supported Triton spills).
Course step: milestone 3's direct kernel with milestone 4's optimisations: compile-time K and C (the
constant-memory / template tricks), register tiling over output maps (input reuse), thread coarsening
over positions, fused bias, coalesced and vectorised stores; with baked weights, the
course's "weights in constant memory" taken to compile-time constants on the first layers; the blocks are
the register tiling of the input (each loaded value feeds up to K x K x maps FMAs of its neighbours).
Bottleneck: the C = 1 layers sit at the H200's ridge (each output float costs 2*K*K FLOPs and 4 bytes
of writes): FP32 FMA issue and the DRAM write stream both run near their limits. The C = 4..12 layers
are FMA-bound: in the sm_90 SASS 84-93 % of their tap loop is FFMA with blocks (``convforge
sweep --sass``); what is left is latency with 2-4 resident warps per scheduler.
"""


from __future__ import annotations

from typing import Optional

import torch

from convforge import tuning
from convforge.conv import triton_common as common

triton, tl = common.triton, common.tl


# R positions per lane, up to max_per_pass maps per pass: R x that many accumulators per lane.
Config = common.TileConfig
# Variants that ``convforge sweep --impl triton-direct --variants`` times on a GPU (flat, baked, blocks).
SWEEP = (Config(4, 24, 4), Config(8, 12, 4),
         Config(4, 24, 4, True), Config(8, 24, 4, True), Config(4, 16, 4, True), Config(8, 12, 4, True),
         Config(8, 8, 4, True), Config(16, 8, 4, True), Config(2, 32, 4, True),
         Config(8, 8, 4, block_rows=4), Config(8, 8, 4, block_rows=4, maxnreg=128), Config(8, 12, 4, block_rows=4),
         Config(8, 16, 4, block_rows=4), Config(8, 8, 2, block_rows=8), Config(4, 16, 4, block_rows=2))


# Measured tile configs per (M, C, K) are in convforge/tuning/triton-direct.json, each with its median, GPU,
# Triton and run: baked weights on the one-channel layers (4 positions per lane but on fa19 L1, 8 positions in
# passes of 12 maps, and fa17 L1, 2 positions in passes of up to 32 maps), blocks of neighbouring outputs per
# lane on the many-channel layers (sp18/sp19 L2 4x2 blocks of 8 maps under a 128-register cap, fa18 L2 4x2 of
# 12 maps, fa19 L2 8x1 of 8 maps on 2 warps, fa20 L2 4x2 of 8 maps, which no supported Triton spills). An entry
# may hold from a Triton version on (``triton_min``): from 3.9 fa18 L2's 12-map passes spill 64 bytes, and its
# 3.9 entry takes 8-map passes. The defaults below are for shapes with no entry (not measurements).
DEFAULT_BAKED = Config(4, 24, 4, True)
DEFAULT_BLOCKS = Config(8, 8, 4, block_rows=4)


def choose_config(maps: int, channels: int, kernel: int) -> Config:
    """Per layer shape: the measured config for the Triton in use (convforge/tuning/triton-direct.json, the
    entry whose Triton range holds ``common.TRITON_VERSION``, the newest ``triton_min`` first), else baked
    weights where they can be (``common.can_bake``, the one-channel layers: DEFAULT_BAKED), else blocks of
    outputs per lane (DEFAULT_BLOCKS); ``convforge sweep --impl triton-direct --variants`` times the
    alternatives on a GPU."""
    tuned = tuning.lookup("triton-direct", triton=common.TRITON_VERSION, M=maps, C=channels, K=kernel)
    if tuned is not None:
        return Config(**tuned)
    return DEFAULT_BAKED if common.can_bake(channels, kernel) else DEFAULT_BLOCKS


if triton is not None:

    @triton.jit
    def _store(y_ptr, b_ptr, acc, y_off, valid, m0, MG: tl.constexpr, M: tl.constexpr, HOWO: tl.constexpr,
               HAS_BIAS: tl.constexpr):
        maps = m0 + tl.arange(0, MG)
        if HAS_BIAS:
            acc += tl.load(b_ptr + maps)[:, None]
        tl.store(y_ptr + y_off[None, :] + maps[:, None] * HOWO, acc, mask=valid[None, :] & (maps[:, None] < M))

    @triton.jit
    def _pass(x_ptr, w_ptr, b_ptr, y_ptr, x_off, y_off, valid, m0, GA: tl.constexpr, GB: tl.constexpr,
              WPITCH: tl.constexpr, BP: tl.constexpr, C: tl.constexpr, H: tl.constexpr, W: tl.constexpr,
              K: tl.constexpr, M: tl.constexpr, HOWO: tl.constexpr, HAS_BIAS: tl.constexpr,
              UNROLL_C: tl.constexpr, BAKED: tl.constexpr, WTS: tl.constexpr):
        acc_a, acc_b = common.conv_tile(x_ptr, w_ptr, x_off, m0, GA, GB, WPITCH, BP, C, H, W, K, UNROLL_C, BAKED,
                                        WTS)
        _store(y_ptr, b_ptr, acc_a, y_off, valid, m0, GA, M, HOWO, HAS_BIAS)
        if GB > 0:
            _store(y_ptr, b_ptr, acc_b, y_off, valid, m0 + GA, GB, M, HOWO, HAS_BIAS)

    @triton.jit
    def _direct_kernel(x_ptr, w_ptr, b_ptr, y_ptr, B,
                       C: tl.constexpr, H: tl.constexpr, W: tl.constexpr, K: tl.constexpr, M: tl.constexpr,
                       GA: tl.constexpr, GB: tl.constexpr, N: tl.constexpr, TA: tl.constexpr, TB: tl.constexpr,
                       V: tl.constexpr, BP: tl.constexpr, HAS_BIAS: tl.constexpr, UNROLL_C: tl.constexpr,
                       BAKED: tl.constexpr, WTS: tl.constexpr, RB: tl.constexpr, CB: tl.constexpr):
        HO: tl.constexpr = H - K + 1
        WO: tl.constexpr = W - K + 1
        HOWO: tl.constexpr = HO * WO
        WPITCH: tl.constexpr = (GA + GB) * N + TA + TB
        if RB > 0:
            # Each lane computes an RB x CB block of outputs; the program's NC lanes take NC neighbouring
            # blocks, flattened over images, block rows and block columns. Triton's default layout gives
            # lane t the elements t + NC * e, so e (the position inside the block) is a constant per
            # register: the taps' input addresses differ by constants and LLVM merges the loads that
            # neighbouring taps share ((RB + K - 1) x (CB + K - 1) per channel instead of RB x CB x K x K).
            NC: tl.constexpr = BP // (RB * CB)
            HG: tl.constexpr = (HO + RB - 1) // RB
            WG: tl.constexpr = (WO + CB - 1) // CB
            idx = tl.arange(0, BP)
            e = idx // NC
            blk = tl.program_id(0) * NC + idx % NC
            b = tl.minimum(blk // (HG * WG), B - 1)   # past the end: re-read the last image, store nothing
            rg = (blk % (HG * WG)) // WG
            cg = blk % WG
            # A map's last block row (column) moves back inside the map, so no read passes the image; the
            # outputs it shares with its neighbour are computed twice and stored once.
            h0 = tl.minimum(rg * RB, HO - RB)
            w0 = tl.minimum(cg * CB, WO - CB)
            er = e // CB
            ec = e % CB
            valid = (blk < B * (HG * WG)) & (h0 + er >= rg * RB) & (w0 + ec >= cg * CB)
            # The block's first input goes into the pointer and x_off keeps only the constant part, so
            # every tap's address is that pointer plus a constant and equal addresses look equal to LLVM.
            x_base = x_ptr + (b * (C * H * W) + h0 * W + w0)
            x_off = er * W + ec
            y_off = (b * (M * HOWO) + h0 * WO + w0) + (er * WO + ec)
        else:
            pos = tl.program_id(0) * BP + tl.arange(0, BP)
            valid = pos < B * HOWO
            b = tl.minimum(pos // HOWO, B - 1)      # past the end: re-read the last image, store nothing
            r = pos % HOWO
            h = r // WO
            x_base = x_ptr
            x_off = b * (C * H * W) + h * W + (r - h * WO)
            y_off = b * (M * HOWO) + r
        if V > 1:
            # V divides W and WO, so each run of V positions lies in one row and starts at a multiple of
            # V in x and in y: true hints that let every lane own V neighbouring positions, store them as
            # one vector, and load each input row segment once (LLVM forwards the shifted taps' loads
            # from the aligned vector loads).
            x_off = tl.max_contiguous(tl.multiple_of(x_off, V), V)
            y_off = tl.max_contiguous(tl.multiple_of(y_off, V), V)
        else:
            # One position per lane for loads and stores alike, as the sums' default layout: otherwise
            # the coalescing pass may widen either and shuffle every tap through shared memory.
            # (Hints must sit on values defined here, not on arguments.)
            x_off = tl.multiple_of(x_off, 1)
            y_off = tl.max_contiguous(tl.multiple_of(y_off, 1), 2)
        if BAKED:   # static passes: each pass's first map is a constant, so are its weights' indices
            for g in tl.static_range(N):
                _pass(x_base, w_ptr, b_ptr, y_ptr, x_off, y_off, valid, g * (GA + GB), GA, GB, WPITCH, BP, C, H, W,
                      K, M, HOWO, HAS_BIAS, UNROLL_C, BAKED, WTS)
        else:
            for g in range(N):
                _pass(x_base, w_ptr, b_ptr, y_ptr, x_off, y_off, valid, g * (GA + GB), GA, GB, WPITCH, BP, C, H, W,
                      K, M, HOWO, HAS_BIAS, UNROLL_C, BAKED, WTS)
        if TA > 0:
            _pass(x_base, w_ptr, b_ptr, y_ptr, x_off, y_off, valid, N * (GA + GB), TA, TB, WPITCH, BP, C, H, W, K,
                  M, HOWO, HAS_BIAS, UNROLL_C, BAKED, WTS)


def unavailable_reason() -> Optional[str]:
    return common.unavailable_reason()


def kernel_constants(maps: int, channels: int, kernel: int, height: int, width: int, has_bias: bool,
                     cfg: Config, weights: tuple = ()) -> dict:
    """Every compile-time argument of _direct_kernel (and the launch options) for one layer shape;
    ``weights``: the baked weights (``common.bake_weights``) when ``cfg.baked``."""
    plan = common.plan_maps(maps, cfg.positions_per_thread, cfg.max_per_pass)
    baked = common.bakes(cfg, channels, kernel)
    unroll = common.unroll_channels(channels, kernel)
    rows, cols = block_shape(cfg, channels, kernel, height, width)
    # num_stages=1 (launch_options): the channel loop's loads hit L1; software pipelining would stage
    # them through shared memory for nothing (seen in the SASS).
    return dict(C=channels, H=height, W=width, K=kernel, M=maps, **plan.constants(),
                V=common.vector_width(width, kernel, cfg.positions_per_thread, unroll),   # 1 with blocks
                BP=cfg.block, HAS_BIAS=has_bias, UNROLL_C=unroll, BAKED=baked, WTS=weights if baked else 0,
                RB=rows, CB=cols, **cfg.launch_options())


def block_shape(cfg: Config, channels: int, kernel: int, height: int, width: int) -> tuple[int, int]:
    """(rows, cols) of the output block each lane computes, (0, 0) for the flat layout: where the config's
    blocks do not apply (``common.uses_blocks``), or a block is larger than the output map."""
    rows, cols = cfg.block_rows, cfg.block_cols
    if not common.uses_blocks(cfg, channels, kernel) or rows > height - kernel + 1 or cols > width - kernel + 1:
        return 0, 0
    return rows, cols


def grid_size(constants: dict, batch: int, out_h: int, out_w: int) -> int:
    """Programs for one launch: BP positions each, or BP / (RB x CB) blocks."""
    rows, cols = constants["RB"], constants["CB"]
    if rows:
        return triton.cdiv(batch * -(-out_h // rows) * -(-out_w // cols), constants["BP"] // (rows * cols))
    return triton.cdiv(batch * out_h * out_w, constants["BP"])


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, config: Optional[Config] = None):
    maps, channels, kernel, kernel_w = weight.shape
    if kernel != kernel_w:
        raise ValueError(f"square kernels only, got {kernel}x{kernel_w}")
    common.check_kernel_size(kernel, "triton-direct")
    cfg = config or choose_config(maps, channels, kernel)
    plan = common.plan_maps(maps, cfg.positions_per_thread, cfg.max_per_pass)
    packed = common.pack_weights(weight, plan.width)
    packed_bias = common.pack_bias(bias, plan.width, weight)
    baked = common.bake_weights(packed) if common.bakes(cfg, channels, kernel) else ()
    launches: dict = {}   # input (H, W) -> constants: one dict lookup per call

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        common.check_input(x, channels, kernel)
        batch, _, height, width = x.shape
        ho, wo = height - kernel + 1, width - kernel + 1
        buffer, result = common.output_for(out, (batch, maps, ho, wo), x)
        constants = launches.get((height, width))
        if constants is None:
            constants = launches[(height, width)] = kernel_constants(maps, channels, kernel, height, width,
                                                                     bias is not None, cfg, baked)
        x = common.contiguous_input(x)
        for xs, ys, n in common.batch_views(x, buffer, max(channels * height * width, maps * ho * wo)):
            _direct_kernel[(grid_size(constants, n, ho, wo),)](xs, packed, packed_bias, ys, n, **constants)
        return common.finish(buffer, result)

    return run
