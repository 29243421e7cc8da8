"""cuda-igemm-3xtf32 / cuda-igemm-tf32: implicit GEMM on the tensor cores for many-channel layers (``cuda/igemm.cu``).

Technique: the whole batch as one GEMM, D (maps x positions) = weights (maps x C*KH*KW) * im2col(x) (C*KH*KW
x B*HO*WO), with the im2col operand never formed: each block gathers its BK x BN tile of it straight from the
input by 4-byte cp.async, the weight tile by 16-byte cp.async, through a STAGES-deep shared-memory ring with
padded (bank-conflict-free) layouts; warps multiply WM x WN sub-tiles with ``mma.sync`` m16n8k8 TF32 and
accumulate in fp32 (threadblock / warp / instruction tiles as in CUTLASS's implicit GEMM, our own code).
"3xtf32" (precision ``tf32x3``): each operand split into TF32 big + small parts (the weights once on the host,
the input as fragments are read), three products a_small*b_big + a_big*b_small + a_big*b_big, so the result
meets the exact tolerance (1e-5 against float64) at tensor-core speed; "tf32": one product (tolerance 1e-2).
Rectangular kernels (M, C, KH, KW) are served; stride 1, no padding, bias in the epilogue.
Course step: extends the course's "fused unroll + tiled matrix multiply" (cuda-fused-gemm: implicit GEMM
from shared-memory tiles) and its "tensor cores" step (cuda-tc: per-image gather GEMM, reduced precision) to
batch-wide tiles, a cp.async pipeline and fp32 accuracy.
Bottleneck expected: tensor-core issue (three mma per product in 3xTF32) and the B-fragment splits; on few-
channel layers (KR < ~64) the gather loads and a mostly-empty k tile: use cuda-direct / cuda-tc there.
Measured (H100, benchmarks/2026-11-25-h100-igemm-3xtf32-fix, run 2): 3xTF32 meets 1e-5 on all 39 gpumode/wide
shapes (worst 2.3e-6, C*K*K = 131072) and runs gpu-mode's 256-px layers at 50 TFLOP/s, 1.38-1.39x cuDNN fp32
(38 % of the 3xTF32 ceiling, cuBLAS TF32 / 3); TF32 at 128 TFLOP/s there, 0.51-0.53x cuDNN TF32 (mma.sync and
4-byte gathers, not wgmma/TMA). The channel-innermost k order (korder) and split-K (a run-time choice per batch
size, choose_splits) made 3xTF32 1.11-2.98x faster than the first kernel on 10 of 11 sweep shapes (run 1; 0.80x
on one K = 1 shape, unexplained). TF32 above 64 maps takes a 128 x 64 tile (default_config).
Compiled once per (layer shape without the weights, tile config, split), cached like every CUDA kernel here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
import torch

from convforge import tuning
from convforge.conv import cuda_common as cc, round_tf32, split_tf32

SOURCE = "igemm.cu"
PRECISIONS = ("tf32x3", "tf32")
SMEM_OPTIN_DEFAULT = 227 * 1024
CONFIG_KEYS = ("bm", "bn", "bk", "wm", "wn", "stages", "minb", "epi", "flush", "korder", "splitk")
# Tile configs by the number of maps (the GEMM's M): blocks as tall as the maps need, 128 positions wide.
LAUNCH_CONFIGS: tuple[dict, ...] = (
    {"bm": 128, "bn": 128, "bk": 16, "wm": 64, "wn": 32, "stages": 3, "minb": 2},
    {"bm": 64, "bn": 128, "bk": 16, "wm": 32, "wn": 64, "stages": 4, "minb": 2},
    {"bm": 32, "bn": 128, "bk": 16, "wm": 32, "wn": 32, "stages": 4, "minb": 2},
    {"bm": 128, "bn": 128, "bk": 32, "wm": 64, "wn": 32, "stages": 3, "minb": 1},
    {"bm": 64, "bn": 256, "bk": 16, "wm": 32, "wn": 64, "stages": 3, "minb": 1},
    {"bm": 128, "bn": 128, "bk": 16, "wm": 64, "wn": 32, "stages": 4, "minb": 1},
    {"bm": 128, "bn": 64, "bk": 16, "wm": 64, "wn": 32, "stages": 4, "minb": 2},
    {"bm": 64, "bn": 64, "bk": 16, "wm": 32, "wn": 32, "stages": 4, "minb": 3},
)
# Narrow tiles for few maps (M <= 32) and short position runs, which the tuning sweep also times (issue #24):
# 16 x 64 (two warps), 16 x 128 with BK 32 (four warps, BK 32 for whole 16-byte A copies), 32 x 64 (two warps).
SMALL_CONFIGS: tuple[dict, ...] = (
    {"bm": 16, "bn": 64, "bk": 16, "wm": 16, "wn": 32, "stages": 4, "minb": 4},
    {"bm": 16, "bn": 128, "bk": 32, "wm": 16, "wn": 32, "stages": 4, "minb": 4},
    {"bm": 32, "bn": 64, "bk": 16, "wm": 32, "wn": 32, "stages": 4, "minb": 4},
)
# TUNING_NOTE: measured winners per layer and batch size live in convforge/tuning/cuda-igemm.json, keyed by
# (M, C, H, W, K, precision) and the entry's batch, looked up exactly (a tile and split-K tuned for one image
# would starve the GPU at 64), written by the wide-set sweep (benchmarks/2026-11-26-*-wide-set-igemm-tuned/
# sweep.py, which put the batch in the shape as "B"). A call without an explicit config whose batch, layer and
# precision have an entry runs the entry's tile config and split (compiled once per config); every other call
# keeps default_config and choose_splits.
# Measured (H100, 2026-11-26, benchmarks/2026-11-26-h100-wide-set-igemm-tuned, run 2): 8 of 25 swept wide shapes
# have an entry, 1.03-1.34x the default config in the same process (128 x 64 on six, 16 x 64 on M = 16, 64 x 64
# on one); the entries are the H100's, also used on an H200 (bench there: the same ratios to cuDNN within 10 %).
TUNING_IMPL = "cuda-igemm"
# FLUSH_NOTE: the tensor cores' fp32 accumulation truncates. Accumulating all of C*KH*KW in the mma accumulator
# (flush 0) biased every output toward zero: on an H100 (2026-11-25, benchmarks/2026-11-25-h100-igemm-3xtf32)
# 3xTF32 measured relative errors 2.8e-5 (gpumode K = 8, C*K*K = 4096), 1.2e-4 (16384), 2.2e-4 (32768) and
# 9.1e-4 (131072) against float64, over the exact tolerance 1e-5. flush 1 sums each k step's three products in a
# fresh accumulator and adds that to the running sum with an fp32 add (round to nearest), so the truncation
# errors have both signs. The host emulation models the truncation (host_emulation.h): C*K*K = 4608 gives
# 4.7e-5 with flush 0 and 4.9e-7 with the fix (tests/test_cuda_igemm.py); C*K*K = 131072 (C 128, K 32) 1.26e-3
# with flush 0 (the H100: 9.14e-4) and 2.19e-6 with the fix. On the H100 (benchmarks/2026-11-25-h100-igemm-3xtf32-fix)
# the fix measured 2.3e-6 at 131072 and at most 8.2e-7 elsewhere (flush 0 there: 4.4e-4, and 4-34x the fixed
# error on shorter reductions); flush 0 runs in 83-93 % of the fixed kernel's time (sweep config -1).
# korder: the k order of the GEMM's reduction. 0: (c, p, q), the weight tensor's order, each gathered element's
# source found by two divisions; 1: (p, q, c), channels innermost, for C a multiple of bk: a k tile is bk
# channels at one tap, its gather offset one block-uniform value plus a constant per row. KORDER_DEFAULT is what
# a layer with C % bk == 0 gets when the config does not say.
KORDER_DEFAULT = 1
# splitk: how many block rows share the reduction (split-K; a run-time choice, not compiled in). 0: chosen per
# call by choose_splits from the grid, the resident blocks and the k tiles; n >= 1: n (fewer where the k tiles
# run out). Each split writes a partial output to a workspace and conv_igemm_reduce sums them in order.
SPLITK_MAX = 32
SPLITK_MIN_KTILES = 8          # no split reduces fewer k tiles than this
SPLITK_GAIN = 0.9              # split only where the modelled time drops below this fraction
# SPLIT_NOTE: the model's rates, from the H100 sweep (benchmarks/2026-11-25-h100-igemm-3xtf32-fix): a
# multiprocessor sustains about 0.38 (3xTF32, counted as fp32 FLOPs) / 0.83 (TF32) TFLOP/s of this kernel, and a
# partial output costs 8 bytes an element (write + read) at 3 TB/s. A first model (waves of resident blocks,
# no overhead) split where the measurement showed no gain (gpu-mode 256 px: 908 blocks into 25 splits, 0 %;
# 4 x 64 x 128 px K 8: 4 splits, 3 % slower); blocks / multiprocessors balances those as measured.
SM_RATE = {"tf32x3": 0.38e12, "tf32": 0.83e12}
PARTIAL_BYTES_PER_S = 3.0e12
# minb: __launch_bounds__'s minimum blocks per SM (2 caps the 256-thread configs at 128 registers: nvcc 13.0
# sm_90, no spills, 128x128 3xTF32 139 -> 128 registers, so two blocks fit an SM)


def default_config(M: int, precision: str = "tf32x3") -> dict:
    """The tile config for M maps. TF32 above 64 maps: 128 x 64, four stages (LAUNCH_CONFIGS[6]), whose ring
    holds the staged (coalesced) epilogue where 128 x 128 (three stages, no small A part) falls back to
    fragment stores: on an H100 (benchmarks/2026-11-25-h100-igemm-3xtf32-fix, sweep.json) 1.09-1.82x faster
    than 128 x 128 on 7 of 8 sweep shapes of 128-256 maps (0.97x on gpu-mode's K = 32 layer). 3xTF32 keeps
    128 x 128 (the fastest or within 3 % of it on those shapes)."""
    if M > 64:
        return dict(LAUNCH_CONFIGS[6 if precision == "tf32" else 0], epi=1, flush=1)
    return dict(LAUNCH_CONFIGS[1] if M > 32 else LAUNCH_CONFIGS[2], epi=1, flush=1)


@dataclass(frozen=True)
class IgemmGeometry:
    """igemm.cu's constants (mirrors the constexprs at the top of the kernel)."""
    M: int
    C: int
    H: int
    W: int
    KH: int
    KW: int
    precision: str
    bm: int = 128
    bn: int = 128
    bk: int = 16
    wm: int = 64
    wn: int = 32
    stages: int = 3
    minb: int = 2
    epi: int = 1                # 1: output tile staged through shared memory (coalesced rows), 0: fragment stores
    flush: int = 1              # 3xTF32: 1 sums each k step's products apart and adds them in fp32 (FLUSH_NOTE)
    korder: int = 0             # 1: k = (p, q, c), channels innermost (C % bk == 0); 0: k = (c, p, q)
    splitk: int = 0             # split-K: 0 chosen per call (choose_splits), n >= 1 forced (run time, not compiled)

    @property
    def split(self): return 3 if self.precision == "tf32x3" else 1
    @property
    def ho(self): return self.H - self.KH + 1
    @property
    def wo(self): return self.W - self.KW + 1
    @property
    def kr(self): return self.C * self.KH * self.KW
    @property
    def kp(self): return cc.cdiv(self.kr, self.bk) * self.bk
    @property
    def kt(self): return self.kp // self.bk
    @property
    def mtiles(self): return cc.cdiv(self.M, self.bm)
    @property
    def nt(self): return 32 * (self.bm // self.wm) * (self.bn // self.wn)
    @property
    def stage_floats(self):
        return (2 if self.split == 3 else 1) * self.bm * self.bk + self.bk * (self.bn + 8)
    @property
    def smem_bytes(self): return 4 * self.stages * self.stage_floats

    def spec(self) -> cc.KernelSpec:
        return cc.KernelSpec.of(SOURCE, CF_M=self.M, CF_C=self.C, CF_H=self.H, CF_W=self.W, CF_KH=self.KH,
                                CF_KW=self.KW, CF_BM=self.bm, CF_BN=self.bn, CF_BK=self.bk, CF_WM=self.wm,
                                CF_WN=self.wn, CF_STAGES=self.stages, CF_SPLIT=self.split,
                                CF_MINB=self.minb, CF_EPI=self.epi, CF_FLUSH=self.flush if self.split == 3 else 0,
                                CF_KORDER=self.korder)


def plan(M: int, C: int, H: int, W: int, KH: int, KW: int, precision: str, config: Optional[dict] = None,
         smem_optin: int = SMEM_OPTIN_DEFAULT) -> IgemmGeometry:
    """The checked geometry for one layer (the default tile config for its map count unless ``config``)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    cfg = {**default_config(M, precision), **(config or {})}
    cfg.setdefault("splitk", 0)
    if "korder" not in cfg:
        cfg["korder"] = KORDER_DEFAULT if C % int(cfg["bk"]) == 0 else 0
    unknown = set(cfg) - set(CONFIG_KEYS)
    if unknown:
        raise ValueError(f"unknown launch parameters {sorted(unknown)} (known: {', '.join(CONFIG_KEYS)})")
    geom = IgemmGeometry(M, C, H, W, KH, KW, precision, **{k: int(cfg[k]) for k in CONFIG_KEYS})
    if "epi" not in (config or {}) and geom.bm * (geom.bn + 8) > geom.stages * geom.stage_floats:
        geom = replace(geom, epi=0)   # the staged epilogue reuses the ring; a smaller ring keeps fragment stores
    g = geom
    if (g.bm % g.wm or g.bn % g.wn or g.wm % 16 or g.wn % 8 or g.bk not in (16, 32) or g.bn % 32
            or g.nt % g.bn or g.bk % (g.nt // g.bn) or (g.bm * g.bk // 4) % g.nt or g.stages < 2 or g.nt > 1024
            or g.minb < 1 or g.epi not in (0, 1) or g.flush not in (0, 1) or (g.epi and g.bm * (g.bn + 8) > g.stages * g.stage_floats)
            or g.korder not in (0, 1) or (g.korder and C % g.bk) or g.splitk < 0):
        raise ValueError(f"bad tile config {cfg}: bm % wm == bn % wn == 0, wm % 16 == wn % 8 == 0, bk 16 or 32, "
                         "bn a multiple of 32 dividing the thread count, at least 2 stages, korder 1 only where bk divides C")
    if g.smem_bytes > smem_optin:
        raise ValueError(f"tile config {cfg} needs {g.smem_bytes} bytes of shared memory (at most {smem_optin})")
    if C * H * W > cc.INT32_MAX:
        raise ValueError(f"one image of {C}x{H}x{W} floats exceeds the kernel's 32-bit offsets")
    return geom


def choose_splits(blocks: int, kt: int, sms: int, ktile_s: float = 0.0, extra_s: float = 0.0,
                  forced: int = 0) -> tuple[int, int]:
    """(splits, k tiles per split) for a grid of ``blocks`` blocks reducing ``kt`` k tiles each on ``sms``
    multiprocessors. Model (SPLIT_NOTE): a multiprocessor works through its share of the blocks at one rate,
    ceil(blocks * splits / sms) blocks of kts k tiles at ``ktile_s`` seconds a k tile, plus ``extra_s`` seconds a
    split for the partial outputs (written once, read once by the second pass). The fewest splits of the lowest
    modelled time, taken only below SPLITK_GAIN of one split's. ``forced`` >= 1: that many (at most kt)."""
    if forced:
        kts = cc.cdiv(kt, min(forced, kt))
        return cc.cdiv(kt, kts), kts
    one = cc.cdiv(blocks, sms) * kt * ktile_s if ktile_s else cc.cdiv(blocks, sms) * kt
    best = (one, 1, kt)
    for s in range(2, min(SPLITK_MAX, kt // SPLITK_MIN_KTILES) + 1):
        kts = cc.cdiv(kt, s)
        s_eff = cc.cdiv(kt, kts)
        cost = cc.cdiv(blocks * s_eff, sms) * kts * (ktile_s or 1) + s_eff * extra_s
        if cost < best[0]:
            best = (cost, s_eff, kts)
    return (best[1], best[2]) if best[0] < SPLITK_GAIN * one else (1, kt)


def kernel_specs(M: int, C: int, H: int, W: int, K: int, precision: str = "tf32x3", config=None,
                 **_) -> list[cc.KernelSpec]:
    """What prepare() compiles for a K x K layer (for the compile tests)."""
    return [plan(M, C, H, W, K, K, precision, config).spec()]


def pack_weights(weight: torch.Tensor, geom: IgemmGeometry) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """A = weights as (M, C*KH*KW), zero-padded to (mtiles*bm, kp), as TF32 bit patterns, in fragment order
    (``fragment_order``). One product: rounded to nearest, ties away (as cvt.rna). 3xTF32: big = the weight
    truncated to TF32 and small = the rest rounded to TF32 (|w - big - small| <= 2^-21 |w|), so that small has
    w's sign: an Inf input x then contributes small*x and big*x of one sign, never Inf - Inf. Where the rest
    is zero, small = w * 2^-30 (of w's sign, a 2^-30 relative change) for the same reason; an infinite weight
    gets small = 0. (An infinite weight against an input whose two parts differ in sign gives NaN where fp32
    gives Inf: not served.) Denormal weights are zero, as the -ftz kernels read them (tests/test_fuzz.py's
    flushing reference)."""
    M = weight.shape[0]
    a = torch.zeros(geom.mtiles * geom.bm, geom.kp, dtype=torch.float32, device=weight.device)
    a[:M, :geom.kr] = (weight.permute(0, 2, 3, 1) if geom.korder else weight).reshape(M, -1)   # k = (p, q, c) or (c, p, q)
    a = torch.where(a.abs() < torch.finfo(torch.float32).tiny, torch.zeros_like(a), a)   # denormals read as zero
    if geom.split == 1:
        return fragment_order(round_tf32(a), geom), None
    big, small = split_tf32(a)
    return fragment_order(big, geom), fragment_order(torch.where(torch.isfinite(a), small, torch.zeros_like(a)), geom)


def fragment_order(a: torch.Tensor, geom: IgemmGeometry) -> torch.Tensor:
    """(mtiles*bm, kp) -> [mtile][ktile][k step of 8][16-row group][lane][a0..a3], flat: the m16n8k8 A fragment
    layout, a0 (g, t) a1 (g+8, t) a2 (g, t+4) a3 (g+8, t+4) with g = lane/4, t = lane%4."""
    mt, kt, ks, rg = geom.mtiles, geom.kp // geom.bk, geom.bk // 8, geom.bm // 16
    # rows: mtile, group, h (+8), g; columns: ktile, step, u (+4), t
    v = a.reshape(mt, rg, 2, 8, kt, ks, 2, 4)                     # [mt][rg][h][g][kt][ks][u][t]
    v = v.permute(0, 4, 5, 1, 3, 7, 6, 2)                          # [mt][kt][ks][rg][g][t][u][h]
    return v.contiguous().reshape(-1)                              # lane = g*4 + t; register = u*2 + h


def unavailable_reason() -> Optional[str]:
    return cc.tensor_core_unavailable_reason("TF32 mma.sync and cp.async")


def tuned_config(B: int, M: int, C: int, H: int, W: int, KH: int, KW: int, precision: str) -> Optional[dict]:
    """The measured config for this batch and layer (TUNING_NOTE), or None (square kernels only)."""
    if KH != KW:
        return None
    return tuning.lookup(TUNING_IMPL, batch=B, batch_match="exact", M=M, C=C, H=H, W=W, K=KH, precision=precision)


class IgemmLayer:
    """One layer's kernel for one input size: packed weights, the compiled kernel, the launch. Without an
    explicit config, a batch size with a tuning entry (TUNING_NOTE) runs its own IgemmLayer of that config."""

    def __init__(self, weight, bias, H: int, W: int, precision: str, config: Optional[dict]):
        M, C, KH, KW = weight.shape
        self.device = weight.device
        info = cc.device_info(self.device)
        self.geom = plan(M, C, H, W, KH, KW, precision, config, info.smem_per_block_optin)
        self._weight, self._tunable = weight, config is None
        self._tuned: dict[int, Optional["IgemmLayer"]] = {}
        self.a_big, self.a_small = pack_weights(weight, self.geom)
        self.bias = bias
        self.kernel = cc.kernel(self.geom.spec(), "conv_igemm", self.device)
        self.sms = info.sm_count
        self._splits: dict[int, tuple[int, int]] = {}
        self._reduce = None

    def splits(self, B: int) -> tuple[int, int]:
        """(splits, k tiles per split) for a batch of B (choose_splits, once per batch size)."""
        if B not in self._splits:
            g = self.geom
            blocks = g.mtiles * cc.cdiv(B * g.ho * g.wo, g.bn)
            ktile_s = 2 * g.bm * g.bn * g.bk / SM_RATE[g.precision]
            extra_s = 8 * B * g.M * g.ho * g.wo / PARTIAL_BYTES_PER_S
            self._splits[B] = choose_splits(blocks, g.kt, self.sms, ktile_s, extra_s, g.splitk)
        return self._splits[B]

    def for_batch(self, B: int) -> "IgemmLayer":
        """The layer that runs a batch of B: a tuned config's (TUNING_NOTE) where one is recorded, else self."""
        if not self._tunable:
            return self
        if B not in self._tuned:
            g = self.geom
            config = tuned_config(B, g.M, g.C, g.H, g.W, g.KH, g.KW, g.precision)
            self._tuned[B] = None if config is None else IgemmLayer(self._weight, self.bias, g.H, g.W,
                                                                     g.precision, config)
        return self._tuned[B] or self

    def __call__(self, x: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
        layer = self.for_batch(x.shape[0])
        if layer is not self:
            return layer(x, out)
        g = self.geom
        B = x.shape[0]
        P = g.ho * g.wo
        if B * P > cc.INT32_MAX - g.bn:
            raise ValueError(f"{B} images of {g.ho}x{g.wo} outputs exceed the kernel's 32-bit position index; "
                             "split the batch")
        y, result = cc.output(out, (B, g.M, g.ho, g.wo), x)
        if y.numel():
            blocks = g.mtiles * cc.cdiv(B * P, g.bn)
            splits, kts = self.splits(B)
            total = B * g.M * P
            dst = y if splits == 1 else torch.empty(splits * total, dtype=torch.float32, device=y.device)
            self.kernel((blocks, splits), (g.nt,), (cc.ptr(dst), cc.ptr(x), cc.ptr(self.a_big), cc.ptr(self.a_small),
                                                     cc.ptr(self.bias if splits == 1 else None), cc.i32(B),
                                                     cc.i32(kts)), shared_mem=g.smem_bytes)
            if splits > 1:
                if self._reduce is None:
                    self._reduce = cc.kernel(g.spec(), "conv_igemm_reduce", self.device)
                threads = 256
                grid = min(cc.cdiv(total, threads), 64 * self.sms)
                self._reduce((grid,), (threads,), (cc.ptr(y), cc.ptr(dst), cc.ptr(self.bias), np.uint64(total),
                                                   cc.i32(splits)))
        return cc.finish(y, result)


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, precision: str = "tf32x3", config=None,
            input_hw=None):
    weight, bias = cc.check_weight(weight, bias, square=False)
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return cc.per_input_size(weight, lambda h, w: IgemmLayer(weight, bias, h, w, precision, config), input_hw)
