"""triton_common: what the Triton convolution modules share (not a registry entry).

The inner loop of the direct kernels (``conv_tile``), the fused activations, the plan that splits the M
output maps into register-sized passes, the wrapper chores (argument checks, out buffers, cutting a
batch so that every offset fits in int32). The tools that time the kernels and their tuning variants
(``convforge sweep --impl triton-direct --variants``) and report their sm_90 code (``convforge sweep --sass``)
are in the harness.

Under Triton's interpreter (TRITON_INTERPRET=1, set before Triton is imported) the same kernels run on
the CPU on CPU tensors; ``INTERPRET`` tells the modules to skip autotuning there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

from convforge.conv import ACTIVATION_CODES, finish_output, output_buffer  # noqa: F401 (the kernels' codes)

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the registry reports the missing package before we get here
    triton = None
    tl = None

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
# (major, minor) of the Triton in use: some tuned tile configs depend on it (``triton_min`` in
# convforge/tuning/triton-direct.json).
TRITON_VERSION = tuple(int(v) for v in triton.__version__.split(".")[:2]) if triton is not None else (0, 0)

# Offsets inside the kernels are int32: a launch covers at most this many elements of x or of y.
INT32_LIMIT = 2**31 - 1


def unavailable_reason() -> Optional[str]:
    if triton is None:
        return "needs the Python package 'triton': pip install 'convforge[triton]'"
    return None


# -- planning ---------------------------------------------------------------------------------------

def pow2_at_least(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass(frozen=True)
class MapPlan:
    """How a kernel covers M output maps: ``count`` passes of (a, b) maps, then one tail pass of (ta, tb).

    A pass keeps R x (a + b) running sums per lane and loads each input value once for all of its
    maps; a and b are powers of two (b, ta, tb may be 0), so the sums live in two register tiles.
    ``width`` is the packed weights' row length (M plus any zero padding).
    """
    a: int
    b: int
    count: int
    ta: int = 0
    tb: int = 0

    @property
    def width(self) -> int:
        return (self.a + self.b) * self.count + self.ta + self.tb

    def constants(self) -> dict:
        return dict(GA=self.a, GB=self.b, N=self.count, TA=self.ta, TB=self.tb)


def _pass_cost(a: int, b: int, r: int) -> float:
    """Issue slots per tap and lane: R x (a + b) FMAs, R input loads, one weight load per 4 maps."""
    return r * (a + b) + r + -(-a // 4) + -(-b // 4)


def plan_maps(maps: int, positions_per_thread: int, max_per_pass: int) -> MapPlan:
    """The cheapest cover of M maps by passes of at most ``max_per_pass`` maps (see MapPlan).

    Cost per tap: multiply-adds on padded (zero) maps are wasted, and every pass reloads its inputs;
    the plan minimises their sum, e.g. M=50 -> 2 x (16+8) + (2), M=6 -> (4+2), M=12 -> (8+4).
    """
    if maps < 1:
        raise ValueError("a convolution needs at least one output map")
    r = positions_per_thread
    pows = [1 << k for k in range(max_per_pass.bit_length()) if (1 << k) <= max_per_pass]
    shapes = [(a, b) for a in pows for b in [0] + pows if b <= a and a + b <= max_per_pass]

    def cover(m: int) -> tuple[float, tuple[int, int]]:
        """Cheapest single pass holding at least m maps."""
        fits = [(a, b) for a, b in shapes if a + b >= m]
        if not fits:
            return float("inf"), (0, 0)
        cost, _, a, b = min((_pass_cost(a, b, r), b, a, b) for a, b in fits)  # ties: one tile, not two
        return cost, (a, b)

    best = None
    for a, b in shapes:
        size = a + b
        count, rest = divmod(maps, size)
        if count == 0:
            continue
        tail_cost, (ta, tb) = cover(rest) if rest else (0.0, (0, 0))
        total = count * _pass_cost(a, b, r) + tail_cost
        key = (total, count + (1 if rest else 0), -size)
        if best is None or key < best[0]:
            best = (key, MapPlan(a, b, count, ta, tb))
    single_cost, (a, b) = cover(maps)
    if best is None or single_cost <= best[0][0]:
        return MapPlan(a, b, 1)
    return best[1]


def vector_width(width: int, kernel: int, positions_per_thread: int, unrolled: bool = True) -> int:
    """Neighbouring output positions a lane owns: the largest of 4, 2, 1 dividing W and W-K+1 (so runs
    never straddle rows and stay aligned in x and y) and the lane's positions.

    Only when the channel loop is unrolled: a run-time loop carries its sums in Triton's default layout
    (one position per lane), and a wider load layout would then be shuffled through shared memory at
    every tap (seen in the TTGIR of Triton 3.6).
    """
    if not unrolled:
        return 1
    for v in (4, 2):
        if width % v == 0 and (width - kernel + 1) % v == 0 and positions_per_thread % v == 0:
            return v
    return 1


def pack_weights(weight: torch.Tensor, width: int) -> torch.Tensor:
    """(M, C, K, K) -> (C*K*K, width) float32, tap-major, maps contiguous, zero columns past M."""
    maps = weight.shape[0]
    packed = torch.zeros((weight[0].numel(), width), dtype=torch.float32, device=weight.device)
    packed[:, :maps] = weight.detach().reshape(maps, -1).t().to(torch.float32)
    return packed.contiguous()


def pack_bias(bias: Optional[torch.Tensor], width: int, like: torch.Tensor) -> torch.Tensor:
    """Bias padded with zeros to ``width``; a one-element dummy when there is none (never read)."""
    if bias is None:
        return torch.zeros(1, dtype=torch.float32, device=like.device)
    packed = torch.zeros(width, dtype=torch.float32, device=like.device)
    packed[:bias.numel()] = bias.detach().reshape(-1).to(torch.float32)
    return packed


# -- wrapper chores ----------------------------------------------------------------------------------

def check_input(x: torch.Tensor, channels: int, kernel: int) -> None:
    if x.device.type != ("cpu" if INTERPRET else "cuda"):
        raise ValueError(f"expected input on {'the CPU (interpreter)' if INTERPRET else 'a CUDA device'}, "
                         f"got {x.device}")
    if x.dim() != 4 or x.shape[1] != channels:
        raise ValueError(f"expected input (B, {channels}, H, W), got {tuple(x.shape)}")
    if x.dtype != torch.float32:
        raise TypeError(f"expected float32 input, got {x.dtype}")
    if x.shape[2] < kernel or x.shape[3] < kernel:
        raise ValueError(f"input {x.shape[2]}x{x.shape[3]} is smaller than the {kernel}x{kernel} kernel")


@dataclass(frozen=True)
class TileConfig:
    """Launch shape of the direct and fused kernels: each lane keeps ``positions_per_thread`` (R) output
    positions for up to ``max_per_pass`` maps at a time; a program is 32 x num_warps x R positions."""
    positions_per_thread: int
    max_per_pass: int
    num_warps: int = 4
    baked: bool = False   # weights compiled into the kernel as FMA immediates (see ``bake_weights``)
    # > 0: a lane's R positions are a block of block_rows x (R / block_rows) neighbouring outputs, so
    # neighbouring taps share input loads (triton-direct and triton-fused-layer on the layers whose
    # channel loop is not unrolled; the fused kernel needs block_rows = pool).
    block_rows: int = 0
    maxnreg: int = 0      # > 0: ptxas register cap (more resident warps, less load hoisting)

    def __post_init__(self):
        r, rows = self.positions_per_thread, self.block_rows
        if rows and (rows & (rows - 1) or r % rows):
            raise ValueError(f"block_rows must be 0 or a power of two dividing positions_per_thread ({r}), "
                             f"got {rows}")

    @property
    def block(self) -> int:
        return 32 * self.num_warps * self.positions_per_thread

    @property
    def block_cols(self) -> int:
        return self.positions_per_thread // self.block_rows if self.block_rows else 0

    def launch_options(self) -> dict:
        # FMA contraction stated, not inherited: the tap loops are built to be FFMA chains, and Triton 3.9
        # announces that 3.10 turns its default off (TRITON_DEFAULT_FP_FUSION).
        return dict(num_warps=self.num_warps, num_stages=1, enable_fp_fusion=True,
                    **({"maxnreg": self.maxnreg} if self.maxnreg else {}))

    def __str__(self) -> str:
        return (f"R={self.positions_per_thread} maps<={self.max_per_pass} w={self.num_warps}"
                + (" baked" if self.baked else "")
                + (f" block={self.block_rows}x{self.block_cols}" if self.block_rows else "")
                + (f" maxnreg={self.maxnreg}" if self.maxnreg else ""))


MAX_UNROLLED_KERNEL = 11   # the direct kernels unroll every K x K tap, so their compile time grows with K*K


def check_kernel_size(kernel: int, name: str) -> None:
    """triton-direct and triton-fused-layer make every tap offset an immediate (all K x K taps unrolled): on an
    H200 triton-direct did not get through the four long-reduction layers of tests/test_fuzz.py (K 9 to 32) in
    420 s, so kernels past 11 x 11 are refused with a pointer to the implicit-GEMM entries, whose reduction loop
    runs at run time (benchmarks/2026-11-26-h200-igemm-tc-sanitize-fuzz)."""
    if kernel > MAX_UNROLLED_KERNEL:
        raise ValueError(f"{name} unrolls all {kernel}x{kernel} taps at compile time and serves kernels up to "
                         f"{MAX_UNROLLED_KERNEL}x{MAX_UNROLLED_KERNEL}; use triton-gemm or cuda-igemm-3xtf32 here")


UNROLL_MAX_TAPS = 64   # C*K*K up to which the channel loop is unrolled too: the one-channel layers


def unroll_channels(channels: int, kernel: int) -> bool:
    """Unroll the channel loop too when that keeps the code small (at most 64 taps: the C = 1 layers)."""
    return channels * kernel * kernel <= UNROLL_MAX_TAPS


def can_bake(channels: int, kernel: int) -> bool:
    """Weights can be compile-time constants only where every tap index is: where the channel loop is
    unrolled. Unrolling sp18 L2 (150 taps) to bake it was tried: 0.970 ms against 0.890 with loaded weights,
    and minutes to compile (benchmarks/2026-11-21-h200-triton-baked-weights/triton_sweep_baked5.txt)."""
    return unroll_channels(channels, kernel)


def bakes(cfg: "TileConfig", channels: int, kernel: int) -> bool:
    """Whether a kernel with this config and layer shape takes its weights baked in."""
    return cfg.baked and can_bake(channels, kernel)


def uses_blocks(cfg: "TileConfig", channels: int, kernel: int) -> bool:
    """Whether a config's blocks apply to a layer: they serve the layers whose channel loop runs at run
    time (the unrolled one-channel layers use vector loads or baked weights instead). The kernels add
    their own shape conditions (``triton_direct.block_shape``, ``triton_fused_layer.uses_blocks``)."""
    return cfg.block_rows > 0 and not unroll_channels(channels, kernel)


def bake_weights(packed: torch.Tensor) -> tuple:
    """The packed weights as a tuple of Python floats, for a ``tl.constexpr`` argument: Triton then
    specialises the kernel on them and every multiply-add takes its weight as an fp32 immediate (the
    Triton counterpart of cuda-direct's constant-bank operands; fp32 values convert to float and back
    exactly). One compiled kernel per weight set."""
    return tuple(packed.detach().float().cpu().reshape(-1).tolist())


# The out= buffer protocol is the registry's, shared with the CUDA C wrappers.
output_for = output_buffer
finish = finish_output


def batch_slices(batch: int, per_image: int, slack: int = 1 << 16) -> list[tuple[int, int]]:
    """Cut the batch so that each launch's x and y stay under int32 offsets (one slice almost always)."""
    step = max(1, (INT32_LIMIT - slack) // max(1, per_image))
    return [(start, min(batch, start + step)) for start in range(0, batch, step)]


def batch_views(x: torch.Tensor, y: torch.Tensor, per_image: int):
    """(x, y, images) for each launch: the whole batch when its offsets fit int32 (almost always), else
    consecutive slices of it (batch_slices); per_image = the larger of one image's input and output floats."""
    batch = x.shape[0]
    for b0, b1 in batch_slices(batch, per_image):
        yield (x, y, batch) if (b0, b1) == (0, batch) else (x[b0:b1], y[b0:b1], b1 - b0)


def contiguous_input(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_contiguous() else x.contiguous()


# -- device code shared by the direct and fused kernels -------------------------------------------------

if triton is not None:

    @triton.jit
    def _baked(WTS: tl.constexpr, base, G: tl.constexpr):
        """(G,) weights WTS[base .. base+G-1] as constants: the selects fold away, leaving immediates."""
        idx = tl.arange(0, G)
        wv = tl.zeros([G], dtype=tl.float32)
        for m in tl.static_range(G):
            wv = tl.where(idx == m, WTS[base + m], wv)
        return wv

    @triton.jit
    def _tap(x_ptr, w_ptr, x_off, tap_x, tap_w, m0, maps_a, maps_b, acc_a, acc_b, GA: tl.constexpr,
             GB: tl.constexpr, BAKED: tl.constexpr, WTS: tl.constexpr):
        xv = tl.load(x_ptr + x_off + tap_x)[None, :]
        if BAKED:   # tap_w and m0 are compile-time constants here
            acc_a += _baked(WTS, tap_w + m0, GA)[:, None] * xv
            if GB > 0:
                acc_b += _baked(WTS, tap_w + m0 + GA, GB)[:, None] * xv
        else:
            acc_a += tl.load(w_ptr + tap_w + maps_a)[:, None] * xv
            if GB > 0:
                acc_b += tl.load(w_ptr + tap_w + maps_b)[:, None] * xv
        return acc_a, acc_b

    @triton.jit
    def conv_tile(x_ptr, w_ptr, x_off, m0, GA: tl.constexpr, GB: tl.constexpr, WPITCH: tl.constexpr,
                  BP: tl.constexpr, C: tl.constexpr, H: tl.constexpr, W: tl.constexpr, K: tl.constexpr,
                  UNROLL_C: tl.constexpr, BAKED: tl.constexpr, WTS: tl.constexpr):
        """sum over c, p, q of x[x_off + c*H*W + p*W + q] * w[(c,p,q), m], for the maps m0 .. m0+GA-1
        (first tile, (GA, BP)) and m0+GA .. m0+GA+GB-1 (second tile, (max(GB, 1), BP); unused if GB = 0).

        ``x_off`` (BP,) holds each output position's top-left input offset from ``x_ptr`` (a pointer, or
        per-lane pointers for blocks). The tiles are laid out maps x positions, so every map of a lane's positions
        is in that lane's registers: per tap a lane loads its inputs once (one per position; a V-wide hinted
        x_off turns them into vector loads shared across taps), one uniform 16-byte weight load per 4 maps, and
        GA + GB FMAs per position. The K x K taps are unrolled (immediate offsets); the channels too when
        UNROLL_C. With BAKED (needs UNROLL_C and a compile-time m0: the caller's pass loop is static) the
        weights come from the constexpr tuple WTS (``bake_weights``) as FMA immediates and no weight is loaded.
        The caller's hints decide the layout: it must match the sums' (see the kernels' comments).
        """
        maps_a = m0 + tl.arange(0, GA)
        maps_b = m0 + GA + tl.arange(0, GB if GB > 0 else 1)
        acc_a = tl.zeros([GA, BP], dtype=tl.float32)
        acc_b = tl.zeros([GB if GB > 0 else 1, BP], dtype=tl.float32)
        if UNROLL_C:
            for c in tl.static_range(C):
                for p in tl.static_range(K):
                    for q in tl.static_range(K):
                        acc_a, acc_b = _tap(x_ptr, w_ptr, x_off, c * H * W + p * W + q,
                                            ((c * K + p) * K + q) * WPITCH, m0, maps_a, maps_b, acc_a, acc_b,
                                            GA, GB, BAKED, WTS)
        else:
            for c in range(C):
                # The run-time channel offset goes on the pointer first, so each tap adds a constant.
                x_c = x_ptr + c * H * W
                for p in tl.static_range(K):
                    for q in tl.static_range(K):
                        acc_a, acc_b = _tap(x_c, w_ptr, x_off, p * W + q,
                                            ((c * K + p) * K + q) * WPITCH, m0, maps_a, maps_b, acc_a, acc_b,
                                            GA, GB, False, 0)
        return acc_a, acc_b

    @triton.jit
    def activation(v, ACT: tl.constexpr):
        """0: none, 1: tanh, 2: relu, 3: sigmoid; chosen at compile time, so no branch at run time.

        exp2 and the fast 2-ulp division (tl.fdiv): about 9 instructions for tanh in SASS where tl.exp
        and "/" take 15; absolute error ~1e-7.
        """
        if ACT == 1:   # tanh(v) = 1 - 2 / (1 + e^(2v)): e^(2v) = inf gives 1, 0 gives -1
            v = 1.0 - tl.fdiv(tl.full(v.shape, 2.0, tl.float32), 1.0 + tl.exp2(v * 2.8853900817779268))
        elif ACT == 2:
            v = tl.maximum(v, 0.0, propagate_nan=tl.PropagateNan.ALL)   # relu(NaN) = NaN, as in torch
        elif ACT == 3:  # 1 / (1 + e^-v)
            v = tl.fdiv(tl.full(v.shape, 1.0, tl.float32), 1.0 + tl.exp2(v * -1.4426950408889634))
        return v
