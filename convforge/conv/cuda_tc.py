"""cuda-tc-tf32 / cuda-tc-fp16: implicit GEMM on the tensor cores (``cuda/tc.cu``), fp32 accumulate.

Technique: warp-level ``mma.sync`` (m16n8k8 TF32, m16n8k16 FP16) through inline PTX (no headers, so NVRTC
needs no CUDA include path; the fragment layouts are the PTX ISA's, written out in the kernel). Output
positions are the GEMM's M dimension (16-row tiles, CF_RM per warp), maps its N (8-column tiles, M padded
to 8), and the reduction C*K*K is padded to the instruction's k with zero weights. Each lane gathers its A
fragment straight from the image staged in shared memory (a per-block table of k -> byte offset); the
weights are packed on the host in fragment order, converted (TF32 rounding in the kernel, FP16 on the
host) and staged once per block. Blocks loop over images.
Course step: beyond the course's fp32 kernels, its "tensor cores" / "FP16" optimisations (reduced
precision, declared: tolerance 1e-2).
Bottleneck: the A-fragment gathers (one shared load, one add and a conversion per element; 8 per k step
per 16 rows), not the tensor cores: fa18 L2 has 48 FLOPs per gathered element. ``xh=1`` (FP16, even widths)
stages the image as FP16 pairs, one shared load per A register (tc.cu's header): sp18 L2 0.342 against 0.401 ms
for its best fp32-image launch, sp19 L2 0.183 against 0.198 (H100,
benchmarks/2026-11-27-h100-fast-sp18-sp19-second-conv).
FP16 input (``prepare(..., in_dtype=torch.float16)``, CF_IN_HALF): the gather kernel also takes x as FP16, the
output of a producer that writes FP16 (cuda-direct's ``out_dtype``; the engine's fast path after a tanh or sigmoid
first conv): half the input bytes, and with ``xh=1`` the FP16 words go to shared memory as they are, no conversion.
The rows and pairs kernels read fp32: an FP16 x is widened for them first (exact, one extra pass).

cuda-tc-3xtf32 (precision ``tf32x3``, the gather kernel only): split TF32, the technique of
cuda-igemm-3xtf32 on this kernel's gathers. The weights are split on the host into big + small TF32 parts (B
fragments of four registers), each gathered input is split in registers, and a k step's three products
a_small*b_big + a_big*b_small + a_big*b_big go to a fresh sum added to the accumulator in fp32 (the tensor cores'
accumulation truncates: cuda_igemm's FLUSH_NOTE). fp32-accurate, held to the exact tolerance (1e-5), so cuda-auto
may choose it for the exact path's unfused layers; it reads and writes float32. Measured on an H200
(benchmarks/2026-11-28-h200-tc-3xtf32-second-convs): 1.37-1.47x cuda-auto's FMA kernels on sp18 and sp19 L2 at
10 images (its entries there), 0.61-0.96x on the presets' second convs at 100-10000 images.

Three kernels, chosen per layer (``config={"kernel": "gather" | "rows" | "pairs"}``; default: the measured
winner in ``convforge/tuning/cuda-tc.json``, else ``default_kernel``). ``cuda/tc_rows.cu`` treats each filter row as a banded (Toeplitz)
matrix: A fragments are plain rows of the staged image (no gather, no address table), one per k column,
shared by every map of the warp; B is a zero-padded filter row read at a lane-dependent offset. Only K/16 of
its tensor-core work is useful, which these layers can afford (see the kernel's header).
``cuda/tc_pairs.cu`` (K <= 7, few maps x channels) makes each mma row an adjacent pair of output columns: one
kernel row of the pair reads K + 1 <= 8 input columns, exactly one TF32 k step, and B's 8 columns are 4 maps
x 2 column shifts, so K/8 of the work is useful (88 % at K = 7) and B lives in registers. It halves the
mmas of the rows kernel and needs no gather; it won the one-channel layers of 6 to 12 maps (fa18 L1 TF32
0.797 ms against the gather kernel's 1.196, and 1.39x cuda-direct), while on fa20 L1's 4 maps each A
fragment serves only one mma and the rows kernel stays faster.

Fused (``prepare_fused``: conv + bias + activation + max pool): ``cuda/tc_pool.cu`` serves FP16 with a 2x2 pool
and K <= 9 (``pool_serves``). It is the rows kernel's banded product with the 16 mma rows ordered as the two conv
rows of 8 pooled rows, so each lane's four accumulators are one 2x2 window and only the pooled map is stored (a
quarter of the rows kernel's output bytes); its epilogue's tanh is ``tanh.approx``. Launch shapes: the measured
winner in ``convforge/tuning/cuda-tc-pool.json``, else ``plan_pool``'s model. H100, B = 10000: the six preset
first convs in 1.43-2.37x less time than cuda-auto's exact fused kernel (benchmarks/2026-11-28-h100-fast-first-
conv-tc-pool). Other fused layers (TF32, another pool, K > 9): the unfused kernel, then torch's pool and activation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch

from convforge import tuning
from convforge.conv import cuda_common as cc, round_tf32, split_tf32
from convforge.models import ACTIVATIONS

PRECISIONS = ("tf32", "fp16")            # every kernel's (gather, rows, pairs, pool)
GATHER_PRECISIONS = PRECISIONS + ("tf32x3",)   # the gather kernel's: also 3xTF32 (cuda-tc-3xtf32, the header)
PREC_CODES = {"tf32": 0, "fp16": 1, "tf32x3": 2}   # tc.cu's CF_PREC
SOURCE = "tc.cu"
SMEM_OPTIN_DEFAULT = 227 * 1024
LAUNCH_CONFIGS: tuple[dict, ...] = (
    {"rm": 1, "nt": 128}, {"rm": 2, "nt": 128}, {"rm": 2, "nt": 256}, {"rm": 4, "nt": 128},
    {"rm": 4, "nt": 256}, {"rm": 2, "nt": 256, "round": 0}, {"rm": 4, "nt": 256, "round": 0},
)
DEFAULT_CONFIG = {"rm": 2, "nt": 256, "round": 1}
# Measured winners (scripts/tc_sweep.py on an NVIDIA H200, B = 10000; gather, rows and pairs kernels, each with
# its launch shapes) per (M, C, H, W, K, precision) are in convforge/tuning/cuda-tc.json, each with its median
# and run: the default for those layers when no config is given (``tuned_config``); other shapes:
# ``default_kernel``. The pairs kernel won every one-channel layer of 6 to 12 maps; fa20 L1's 4 maps give each
# A fragment only one mma's work there, and the rows kernel stays ahead.
# ROUNDING: "round": 0 skips the kernels' in-place pass that rounds the staged inputs to TF32 (cvt.rna); the
# tensor core then reads the fp32 bits and ignores the low 13 mantissa bits (truncation: at most 2^-10 relative
# per input instead of 2^-11; weights are still rounded to nearest on the host). On the course's inputs, whole
# pixels 0..255 that TF32 holds exactly, both give the same products. On fa20 L1 the pass and its barrier cost
# 6-10 % (rows kernel, 0.537 against 0.571 ms in one process); measured relative error 3.5e-04 against 3.4e-04.
ROWS_SOURCE = "tc_rows.cu"
PAIRS_SOURCE = "tc_pairs.cu"
POOL_SOURCE = "tc_pool.cu"
KERNELS = ("gather", "rows", "pairs")
PAIRS_MAX_B = 96               # B fragment words per lane (NTL * C * k steps * 2)
# Registers a lane needs, estimated as B words + rt * (4 accumulators per map tile + 12 for the tile's
# positions and A fragments); nvcc -arch=sm_90 spilled at estimates of 234 (M 12, K 7, rt 8), 248 and 274
# (TF32: M 64, K 3 and M 100, K 1), and not on the tuned entries (estimates up to 126) nor at 216 (FP16: M 64,
# K 3; M 12, K 7, rt 8).
PAIRS_MAX_REGS = 230
ROWS_LAUNCH_CONFIGS: tuple[dict, ...] = (
    {"kernel": "rows", "nc": 1}, {"kernel": "rows", "nc": 2}, {"kernel": "rows", "nc": 4},
    {"kernel": "rows", "nc": 2, "nt": 256}, {"kernel": "rows", "nc": 2, "ib": 1},
)
ROWS_WROW = 24                 # padded filter row (7 zeros, K taps, zeros) as in tc_rows.cu
ROWS_MAX_ACC = 96              # MT * NC * 4 accumulators per lane


@dataclass(frozen=True)
class LayerShape:
    """The layer both tensor-core kernels are compiled for (its sizes are -D constants of either)."""
    M: int
    C: int
    H: int
    W: int
    K: int
    precision: str

    @property
    def ho(self): return self.H - self.K + 1
    @property
    def wo(self): return self.W - self.K + 1


@dataclass(frozen=True)
class TcGeometry(LayerShape):
    """tc.cu's derived constants (the gather kernel)."""
    rm: int = 2
    nt: int = 256
    round: int = 1
    xsmem: bool = True
    bsmem: bool = True
    cs: int = 0                 # 1: evict-first (streaming) output stores
    out_half: bool = False      # y in FP16 (CF_OUT_HALF): for a consumer that reads FP16 (``prepare``'s out_dtype)
    xh: int = 0                 # 1: the image staged as FP16 pairs (CF_XHALF, tc.cu's header): FP16, even W
    in_half: bool = False       # x in FP16 (CF_IN_HALF): from a producer that writes FP16 (``prepare``'s in_dtype)

    @property
    def kstep(self): return 16 if self.precision == "fp16" else 8
    @property
    def ke(self): return self.K + (self.K & 1) if self.xh else self.K   # taps per kernel row in the reduction
    @property
    def kr(self): return self.C * self.K * self.ke
    @property
    def ks(self): return cc.cdiv(self.kr, self.kstep)
    @property
    def kp(self): return self.ks * self.kstep
    @property
    def ntl(self): return cc.cdiv(self.M, 8)
    @property
    def pt(self): return cc.cdiv(self.ho * self.wo, 16 * self.rm)   # position tiles per image (a warp's step)
    @property
    def img(self): return self.C * self.H * self.W
    @property
    def xs_floats(self):
        if self.xh:
            return 2 * (self.img // 2 + 1)    # two FP16 copies of img / 2 + 1 words
        return cc.cdiv(self.img, 4) * 4 if self.xsmem else 0
    @property
    def b_words(self): return 4 if self.precision == "tf32x3" else 2   # B registers a lane per (k step, map tile)
    @property
    def bs_words(self): return self.ks * self.ntl * 32 * self.b_words if self.bsmem else 0
    @property
    def smem_bytes(self): return 4 * (self.xs_floats + self.bs_words + self.kp)

    def spec(self) -> cc.KernelSpec:
        return cc.KernelSpec.of(SOURCE, CF_M=self.M, CF_C=self.C, CF_H=self.H, CF_W=self.W, CF_K=self.K,
                                CF_PREC=PREC_CODES[self.precision], CF_RM=self.rm, CF_NT=self.nt,
                                CF_XSMEM=int(self.xsmem), CF_BSMEM=int(self.bsmem), CF_TF32_ROUND=self.round,
                                **({"CF_STREAM_STORES": 1} if self.cs else {}),
                                **({"CF_OUT_HALF": 1} if self.out_half else {}),
                                **({"CF_IN_HALF": 1} if self.in_half else {}),
                                **({"CF_XHALF": 1} if self.xh else {}))


CS_CHOICES = {0: "plain stores", 1: "evict-first"}
XH_CHOICES = {0: "fp32 image, gathered per element", 1: "FP16 image pairs"}


def _option(cfg: dict, key: str, choices: dict) -> int:
    """A launch option that takes one of a few values (the first is the default), checked."""
    value = int(cfg.get(key, next(iter(choices))))
    if value not in choices:
        raise ValueError(f"{key} must be " + " or ".join(f"{v} ({what})" for v, what in choices.items())
                         + f", got {value}")
    return value


def plan(M: int, C: int, H: int, W: int, K: int, precision: str, config: Optional[dict] = None,
         smem_optin: int = SMEM_OPTIN_DEFAULT, in_half: bool = False) -> TcGeometry:
    if precision not in GATHER_PRECISIONS:
        raise ValueError(f"precision must be one of {GATHER_PRECISIONS}, got {precision!r}")
    cfg = {**DEFAULT_CONFIG, **(config or {})}
    unknown = set(cfg) - {"rm", "nt", "round", "cs", "xh"}
    if unknown:
        raise ValueError(f"unknown launch parameters {sorted(unknown)}")
    if cfg["rm"] < 1 or cfg["nt"] % 32 or not 32 <= cfg["nt"] <= 1024:
        raise ValueError(f"bad launch parameters {cfg}")
    geom = TcGeometry(M, C, H, W, K, precision, int(cfg["rm"]), int(cfg["nt"]), int(cfg["round"]),
                      cs=_option(cfg, "cs", CS_CHOICES), xh=_option(cfg, "xh", XH_CHOICES), in_half=in_half)
    if geom.xh and (precision != "fp16" or W % 2):
        raise ValueError(f"xh=1 (FP16 image pairs) needs precision fp16 and an even input width, got {precision} "
                         f"and width {W}; leave xh out")
    for xsmem, bsmem in ((True, True), (True, False), (False, True), (False, False)):
        if (geom.xh or in_half) and not xsmem:   # the pairs, and an FP16 image, are read from shared memory only
            continue
        g = replace(geom, xsmem=xsmem, bsmem=bsmem)
        if g.smem_bytes <= smem_optin:
            return g
    raise ValueError(f"the k-offset table of C*K*K = {geom.kr} does not fit shared memory")


@dataclass(frozen=True)
class RowsGeometry(LayerShape):
    """tc_rows.cu's derived constants (mirrors the constexprs at the top of the kernel)."""
    mt: int
    nc: int
    ib: int
    nt: int = 128
    round: int = 1
    pipe: int = 1
    epi: int = 0                # 1: the epilogue stores rows through a per-warp shared scratch
    cs: int = 0                 # 1: evict-first (streaming) output stores
    @property
    def mg(self): return cc.cdiv(self.M, self.mt)
    @property
    def cg(self): return cc.cdiv(cc.cdiv(self.wo, 8), self.nc)
    @property
    def rt(self): return cc.cdiv(self.ib * self.ho, 16)
    @property
    def pitch(self):
        base = max(self.cg * self.nc * 8 + 8, self.W)
        return (base + 7) // 16 * 16 + 8 if self.precision == "fp16" else (base + 3) // 8 * 8 + 4
    @property
    def xs_floats(self): return (2 if self.pipe == 2 else 1) * cc.cdiv(self.ib * self.C * self.H * self.pitch, 4) * 4
    @property
    def ws_words(self): return self.mg * self.mt * self.C * self.K * ROWS_WROW
    @property
    def epitch(self): return self.nc * 8 if self.nc * 8 % 16 == 8 else self.nc * 8 + 8
    @property
    def epi_floats(self): return self.nt // 32 * 16 * self.epitch if self.epi else 0
    @property
    def smem_bytes(self): return 4 * (self.xs_floats + self.ws_words + self.epi_floats)
    @property
    def row_waste(self): return 1.0 - self.ib * self.ho / (16.0 * self.rt)

    def spec(self) -> cc.KernelSpec:
        return cc.KernelSpec.of(ROWS_SOURCE, CF_M=self.M, CF_C=self.C, CF_H=self.H, CF_W=self.W, CF_K=self.K,
                                CF_PREC=1 if self.precision == "fp16" else 0, CF_MT=self.mt, CF_NC=self.nc,
                                CF_IB=self.ib, CF_NT=self.nt, CF_TF32_ROUND=self.round, CF_PIPE=self.pipe,
                                CF_EPI=self.epi, **({"CF_STREAM_STORES": 1} if self.cs else {}))


@dataclass(frozen=True)
class PairsGeometry(LayerShape):
    """tc_pairs.cu's derived constants (mirrors the constexprs at the top of the kernel)."""
    ib: int = 1
    nt: int = 128
    rt: int = 2                 # 16-position tiles per warp step
    round: int = 1
    cs: int = 0
    @property
    def npr(self): return (self.wo + 1) // 2
    @property
    def ntl(self): return cc.cdiv(self.M, 4)
    @property
    def ksteps(self): return (self.K + 1) // 2 if self.precision == "fp16" else self.K
    @property
    def b_registers(self): return self.ntl * self.C * self.ksteps * 2
    @property
    def registers(self): return self.b_registers + self.rt * (4 * self.ntl + 12)
    @property
    def pitch(self): return (max(2 * self.npr + 6, self.W) + 7) // 16 * 16 + 8
    @property
    def smem_bytes(self): return 4 * cc.cdiv(self.ib * self.C * self.H * self.pitch, 4) * 4

    def spec(self) -> cc.KernelSpec:
        return cc.KernelSpec.of(PAIRS_SOURCE, CF_M=self.M, CF_C=self.C, CF_H=self.H, CF_W=self.W, CF_K=self.K,
                                CF_PREC=1 if self.precision == "fp16" else 0, CF_IB=self.ib, CF_NT=self.nt,
                                CF_RT=self.rt, CF_TF32_ROUND=self.round,
                                **({"CF_STREAM_STORES": 1} if self.cs else {}))


def plan_pairs(M: int, C: int, H: int, W: int, K: int, precision: str, config: Optional[dict] = None,
               smem_optin: int = SMEM_OPTIN_DEFAULT) -> PairsGeometry:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    cfg = dict(config or {})
    cfg.pop("kernel", None)
    unknown = set(cfg) - {"ib", "nt", "rt", "round", "cs"}
    if unknown:
        raise ValueError(f"unknown launch parameters {sorted(unknown)}")
    geom = PairsGeometry(M, C, H, W, K, precision, int(cfg.get("ib", 1)), int(cfg.get("nt", 128)),
                         int(cfg.get("rt", 2)), _option(cfg, "round", {1: "rounded", 0: "truncated"}),
                         _option(cfg, "cs", CS_CHOICES))
    if K > 7:
        raise ValueError(f"the pairs kernel needs K <= 7 (got {K}); use kernel='rows' or 'gather'")
    if geom.b_registers > PAIRS_MAX_B:
        raise ValueError(f"the pairs kernel holds B in registers: {geom.b_registers} words for {M} maps x {C} "
                         f"channels exceed {PAIRS_MAX_B}; use kernel='gather'")
    if geom.registers > PAIRS_MAX_REGS:
        raise ValueError(f"the pairs kernel would spill: about {geom.registers} registers a lane for {M} maps "
                         f"and rt={geom.rt} (at most {PAIRS_MAX_REGS}); use a smaller rt or kernel='gather'")
    if geom.ib < 1 or geom.rt < 1 or geom.nt % 32 or not 32 <= geom.nt <= 1024:
        raise ValueError(f"bad launch parameters {cfg} (ib, rt >= 1, nt a multiple of 32)")
    if geom.smem_bytes > smem_optin:
        raise ValueError(f"the pairs kernel's tile ({geom.smem_bytes} bytes) does not fit shared memory")
    return geom


def _rows_maps_per_tile(M: int, nc: int) -> int:
    """Maps per warp tile: all of them when the accumulators allow, else the fewest groups of equal size."""
    cap = max(1, ROWS_MAX_ACC // (4 * nc))
    groups = cc.cdiv(M, cap)
    return cc.cdiv(M, groups)


def plan_rows(M: int, C: int, H: int, W: int, K: int, precision: str, config: Optional[dict] = None,
              smem_optin: int = SMEM_OPTIN_DEFAULT) -> RowsGeometry:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if K > 9:
        raise ValueError(f"the rows kernel needs K <= 9 (got {K}); use kernel='gather'")
    cfg = dict(config or {})
    cfg.pop("kernel", None)
    unknown = set(cfg) - {"mt", "nc", "ib", "nt", "round", "pipe", "epi", "cs"}
    if unknown:
        raise ValueError(f"unknown launch parameters {sorted(unknown)}")
    nc = int(cfg.get("nc", 2))
    mt = int(cfg.get("mt", 0)) or _rows_maps_per_tile(M, nc)
    nt = int(cfg.get("nt", 128))
    if nc < 1 or mt < 1 or mt * nc * 4 > ROWS_MAX_ACC or nt % 32 or not 32 <= nt <= 1024:
        raise ValueError(f"bad launch parameters {cfg} (mt * nc * 4 <= {ROWS_MAX_ACC}, nt a multiple of 32)")
    pipe = _option(cfg, "pipe", {1: "one staging buffer", 2: "two"})
    epi = _option(cfg, "epi", {0: "fragment stores", 1: "rows through shared memory"})
    base = RowsGeometry(M, C, H, W, K, precision, mt, nc, 1, nt, int(cfg.get("round", 1)), pipe, epi,
                        _option(cfg, "cs", CS_CHOICES))
    if "ib" in cfg:
        geoms = [replace(base, ib=int(cfg["ib"]))]
    else:  # images per unit: the least row waste in 16-row tiles, staying small enough for several blocks per SM
        geoms = sorted((g for g in (replace(base, ib=ib) for ib in range(1, 9)) if g.smem_bytes <= smem_optin),
                       key=lambda g: (g.smem_bytes > min(smem_optin, 64 * 1024), round(g.row_waste, 3), g.ib))
        geoms = geoms or [base]
    geom = geoms[0]
    if geom.ib < 1 or geom.smem_bytes > smem_optin:
        raise ValueError(f"the rows kernel's tile ({geom.smem_bytes} bytes) does not fit shared memory")
    return geom


@dataclass(frozen=True)
class PoolGeometry(LayerShape):
    """tc_pool.cu's derived constants (mirrors the constexprs at the top of the kernel): conv + act + 2x2 pool."""
    mt: int = 4
    nc: int = 4
    ib: int = 1
    nt: int = 128
    pipe: int = 1
    cs: int = 0
    act: int = 0
    out_half: bool = False
    @property
    def hp(self): return self.ho // 2
    @property
    def wp(self): return self.wo // 2
    @property
    def ct(self): return cc.cdiv(2 * self.wp, 8)
    @property
    def cg(self): return cc.cdiv(self.ct, self.nc)
    @property
    def rt(self): return cc.cdiv(self.ib * self.hp, 8)
    @property
    def mg(self): return cc.cdiv(self.M, self.mt)
    @property
    def tiles(self): return self.rt * self.cg * self.mg
    @property
    def pitch(self): return (max(self.cg * self.nc * 8 + 8, self.W) + 3) // 8 * 8 + 4
    @property
    def xs_floats(self): return (2 if self.pipe == 2 else 1) * cc.cdiv(self.ib * self.C * self.H * self.pitch, 4) * 4
    @property
    def ws_words(self): return self.mg * self.mt * self.C * self.K * ROWS_WROW
    @property
    def smem_bytes(self): return 4 * (self.xs_floats + self.ws_words)
    @property
    def use(self):
        """Share of the unit's tensor-core rows and warp turns doing stored work (pooled rows in 8-row tiles,
        tiles over the block's warps)."""
        warps = self.nt // 32
        return self.ib * self.hp / (8.0 * self.rt) * self.tiles / (cc.cdiv(self.tiles, warps) * warps)

    def spec(self) -> cc.KernelSpec:
        return cc.KernelSpec.of(POOL_SOURCE, CF_M=self.M, CF_C=self.C, CF_H=self.H, CF_W=self.W, CF_K=self.K,
                                CF_ACT=self.act, CF_MT=self.mt, CF_NC=self.nc, CF_IB=self.ib, CF_NT=self.nt,
                                CF_PIPE=self.pipe, **({"CF_STREAM_STORES": 1} if self.cs else {}),
                                **({"CF_OUT_HALF": 1} if self.out_half else {}))


POOL_CONFIG_KEYS = ("mt", "nc", "ib", "nt", "pipe", "cs")


def pool_config(M: int, C: int, H: int, W: int, K: int) -> dict:
    """The pool kernel's launch shape for this layer (tuned, else modelled), as a config dict."""
    geom = plan_pool(M, C, H, W, K)
    return {key: getattr(geom, key) for key in POOL_CONFIG_KEYS}


def pool_serves(C: int, H: int, W: int, K: int, pool: int, precision: str) -> bool:
    """Whether tc_pool.cu computes this fused layer: FP16, a 2x2 pool with a whole window, K <= 9."""
    return precision == "fp16" and pool == 2 and K <= 9 and H - K + 1 >= 2 and W - K + 1 >= 2


def plan_pool(M: int, C: int, H: int, W: int, K: int, act: int = 0, config: Optional[dict] = None,
              smem_optin: int = SMEM_OPTIN_DEFAULT, out_half: bool = False) -> PoolGeometry:
    if not pool_serves(C, H, W, K, 2, "fp16"):
        raise ValueError(f"the pool kernel needs K <= 9 and a conv output of at least 2x2 (got K {K}, "
                         f"{H}x{W} input)")
    cfg = dict(tuning.lookup("cuda-tc-pool", M=M, C=C, H=H, W=W, K=K, pool=2) or {} if config is None else config)
    cfg.pop("kernel", None)
    unknown = set(cfg) - set(POOL_CONFIG_KEYS)
    if unknown:
        raise ValueError(f"unknown launch parameters {sorted(unknown)}")
    ct = cc.cdiv(2 * ((W - K + 1) // 2), 8)
    # column tiles per warp tile: no padded tile where 3-5 allow it (fa20 10 tiles: 5; fa17 3: 3; sp18 8: 4)
    if "nc" in cfg:
        nc = int(cfg["nc"])
    else:
        nc = ct if ct <= 2 else min((3, 4, 5), key=lambda n: (cc.cdiv(ct, n) * n - ct, -n))
    mt = int(cfg.get("mt", 0)) or _rows_maps_per_tile(M, nc)
    nt = int(cfg.get("nt", 128))
    if nc < 1 or mt < 1 or mt * nc * 4 > ROWS_MAX_ACC or nt % 32 or not 32 <= nt <= 1024:
        raise ValueError(f"bad launch parameters {cfg} (mt * nc * 4 <= {ROWS_MAX_ACC}, nt a multiple of 32)")
    base = PoolGeometry(M, C, H, W, K, "fp16", mt, nc, 1, nt, _option(cfg, "pipe", {1: "one staging buffer", 2: "two"}),
                        _option(cfg, "cs", CS_CHOICES), act, out_half)
    if "ib" in cfg:
        geoms = [replace(base, ib=int(cfg["ib"]))]
    else:  # images per unit: the most stored work per warp turn, small enough for several blocks per SM
        geoms = sorted((g for g in (replace(base, ib=ib) for ib in range(1, 9)) if g.smem_bytes <= smem_optin),
                       key=lambda g: (g.smem_bytes > min(smem_optin, 64 * 1024), -round(g.use, 3), g.ib))
        geoms = geoms or [base]
    geom = geoms[0]
    if geom.ib < 1 or geom.smem_bytes > smem_optin:
        raise TileTooLarge(f"the pool kernel's tile ({geom.smem_bytes} bytes) does not fit shared memory")
    return geom


class TileTooLarge(ValueError):
    """The pool kernel's tile (a unit's whole input images and the packed weights) outgrows shared memory."""


def tuned_config(M: int, C: int, H: int, W: int, K: int, precision: str) -> Optional[dict]:
    """The measured winner for this layer and precision (convforge/tuning/cuda-tc.json), or None."""
    return tuning.lookup("cuda-tc", M=M, C=C, H=H, W=W, K=K, precision=precision)


def stages_half_pairs(M: int, C: int, H: int, W: int, K: int, precision: str = "fp16") -> bool:
    """Whether this layer's launch (tuned or default) is the gather kernel staging FP16 image pairs (xh=1): the
    launch where an FP16 input is copied to shared memory as it is, with no conversion left. The engine hands
    FP16 from the conv before only to these (sp18 and sp19 L2: 1.033-1.039x the fast pass on an H100; on fa18 and
    fa19 L2, fp32-image launches, 1.01-1.02x, benchmarks/2026-11-28-h100-fast-first-conv-fp16-handoff)."""
    config = tuned_config(M, C, H, W, K, precision) or {}
    return (config.get("kernel") or default_kernel(C, K, M)) == "gather" and bool(config.get("xh"))


def default_kernel(C: int, K: int, M: int = 0, precision: str = "tf32") -> str:
    """The kernel for a layer with no tuned entry: pairs for one channel, K <= 7 and 6 to 24 maps (where it
    won, B still fitting in registers), rows for other one-channel layers up to K = 9, else gather; 3xTF32:
    gather (the only kernel that serves it)."""
    if precision == "tf32x3":
        return "gather"
    if C == 1 and K <= 7 and 6 <= M <= 24:
        return "pairs"
    return "rows" if C == 1 and K <= 9 else "gather"


def plan_any(M: int, C: int, H: int, W: int, K: int, precision: str, config: Optional[dict] = None,
             smem_optin: int = SMEM_OPTIN_DEFAULT, in_half: bool = False):
    """The geometry of whichever kernel ``config['kernel']`` (or the per-layer default) names; ``in_half``: the
    gather kernel reads an FP16 x (the others ignore it: they read fp32)."""
    kind = (config or {}).get("kernel") or default_kernel(C, K, M, precision)
    if kind != "gather" and precision == "tf32x3":
        raise ValueError(f"3xTF32 runs on the gather kernel only, not {kind!r}; leave 'kernel' out")
    if kind == "rows":
        return plan_rows(M, C, H, W, K, precision, config, smem_optin)
    if kind == "pairs":
        return plan_pairs(M, C, H, W, K, precision, config, smem_optin)
    if kind != "gather":
        raise ValueError(f"kernel must be one of {KERNELS}, got {kind!r}")
    return plan(M, C, H, W, K, precision, {k: v for k, v in (config or {}).items() if k != "kernel"}, smem_optin,
                in_half)


def kernel_specs(M: int, C: int, H: int, W: int, K: int, precision: str = "tf32", config=None, pool: int = 1,
                 activation: int = 0, **_) -> list[cc.KernelSpec]:
    if pool > 1 and pool_serves(C, H, W, K, pool, precision):   # prepare_fused's pool kernel
        return [plan_pool(M, C, H, W, K, activation, config).spec()]
    if pool > 1:
        config = None   # prepare_fused's unfused kernel takes no launch config
    if config is not None:
        return [plan_any(M, C, H, W, K, precision, config).spec()]
    # what prepare() runs (the tuned or default kernel) and every kernel's default: each must compile
    specs = [plan_any(M, C, H, W, K, precision, tuned_config(M, C, H, W, K, precision)).spec()]
    for kind in KERNELS:
        try:
            spec = plan_any(M, C, H, W, K, precision, {"kernel": kind}).spec()
        except ValueError:   # the rows and pairs kernels' K, register and shared-memory limits
            continue
        if spec not in specs:
            specs.append(spec)
    return specs


def pack_fragments(weight: torch.Tensor, geom: TcGeometry) -> torch.Tensor:
    """B = weights^T (C*K*KE x maps, zero padded) in fragment order: [k step][map tile][lane][register]."""
    M = weight.shape[0]
    wmat = torch.zeros(geom.ntl * 8, geom.kp, dtype=torch.float32, device=weight.device)
    # kernel rows padded with zero taps to geom.ke (xh)
    wmat[:M, :geom.kr] = torch.nn.functional.pad(weight, (0, geom.ke - geom.K)).reshape(M, -1)
    dev = weight.device
    ks = torch.arange(geom.ks, device=dev).view(-1, 1, 1, 1)
    nt = torch.arange(geom.ntl, device=dev).view(1, -1, 1, 1)
    lane = torch.arange(32, device=dev).view(1, 1, -1, 1)
    n = nt * 8 + lane // 4                                   # column (map): groupID
    if geom.precision != "fp16":
        reg = torch.arange(2, device=dev).view(1, 1, 1, -1)
        k = ks * 8 + lane % 4 + 4 * reg                      # b0: k = tig, b1: k = tig + 4
        n, k = torch.broadcast_tensors(n, k)
        frag = wmat[n, k]                                    # (KS, NTL, 32, 2)
        if geom.precision == "tf32x3":                       # (KS, NTL, 32, 4): big b0 b1, small b0 b1
            frag = torch.cat(split_tf32(frag), dim=-1)
        return frag.contiguous().view(torch.int32).reshape(-1)
    reg = torch.arange(2, device=dev).view(1, 1, 1, -1, 1)
    half = torch.arange(2, device=dev).view(1, 1, 1, 1, -1)
    k = ks.unsqueeze(-1) * 16 + 2 * (lane.unsqueeze(-1) % 4) + 8 * reg + half   # lower k in the lower half
    n, k = torch.broadcast_tensors(n.unsqueeze(-1), k)
    frag = wmat[n, k].to(torch.float16)                      # (KS, NTL, 32, 2, 2)
    return frag.contiguous().view(torch.int32).reshape(-1)


def pack_rows(weight: torch.Tensor, geom: RowsGeometry) -> torch.Tensor:
    """(M, C, K, K) -> [MG*MT][C][K][24] 32-bit words: tap q at 7 + q, zeros elsewhere. TF32: the fp32 bits
    rounded to nearest (ties away, as cvt.rna); FP16: pairs (w[j], w[j+1]) of the padded row, lower first."""
    M, C, K, _ = weight.shape
    wpad = torch.zeros(geom.mg * geom.mt, C, K, ROWS_WROW, dtype=torch.float32, device=weight.device)
    wpad[:M, :, :, 7:7 + K] = weight.float()
    if geom.precision == "tf32":
        return round_tf32(wpad).view(torch.int32).reshape(-1)
    h = wpad.to(torch.float16)
    nxt = torch.nn.functional.pad(h[..., 1:], (0, 1))
    return torch.stack((h, nxt), dim=-1).contiguous().view(torch.int32).reshape(-1)


def unavailable_reason() -> Optional[str]:
    return cc.tensor_core_unavailable_reason("TF32/FP16 mma.sync")


class TcLayer:
    """One layer's tensor-core kernel for one input size: the gather (tc.cu), rows (tc_rows.cu) or pairs
    (tc_pairs.cu) kernel; each takes (y, x, packed weights, fp32 weights, bias, B) (pairs: no packed ones) and
    loops over images (rows and pairs: units of ib images). Outputs that a non-finite input reached are
    recomputed in exact fp32 inside the kernel (cuda/nonfinite.cuh), so NaN and +-Inf land where torch puts them."""

    def __init__(self, weight, bias, H: int, W: int, precision: str, config: dict, half_output: bool = False,
                 half_input: bool = False):
        """``config``: the launch config with its "kernel" key (``layer`` fills in the default). ``half_output``:
        write y in FP16 where the kernel can (the gather kernel; the others write float32): ``self.out_dtype``.
        ``half_input``: the gather kernel reads an FP16 x (``self.in_dtype``); a call with the other dtype runs a
        second layer built for it on first use, and the rows and pairs kernels widen an FP16 x to fp32."""
        M, C, K, _ = weight.shape
        self.device = weight.device
        info = cc.device_info(self.device)
        self.kind = kind = config["kernel"]
        self.geom = plan_any(M, C, H, W, K, precision, config, info.smem_per_block_optin, half_input and kind == "gather")
        self.in_dtype = torch.float16 if half_input and kind == "gather" else torch.float32
        self._other = None   # the layer for the other input dtype (gather kernel), built on first use
        self._rebuild = lambda: TcLayer(weight, bias, H, W, precision, config, half_output, not half_input)
        half = half_output and kind == "gather"
        if half:
            self.geom = replace(self.geom, out_half=True)
        self.out_dtype = torch.float16 if half else torch.float32
        # the plain fp32 weights (a copy, as the packed ones are): the pairs kernel builds its B fragments from
        # them; every kernel's exact path for the outputs a non-finite input reached reads them
        self.weight = weight.float().contiguous().clone()
        if kind == "rows":
            self.packed, name, self.per_unit = pack_rows(weight, self.geom), "conv_tc_rows", self.geom.ib
        elif kind == "pairs":
            self.packed, name, self.per_unit = None, "conv_tc_pairs", self.geom.ib
        else:
            self.packed, name, self.per_unit = pack_fragments(weight, self.geom), "conv_tc", 1
        # weight arguments: (packed, plain) for the rows and gather kernels, (plain) for the pairs kernel
        self.weight_args = (self.weight,) if self.packed is None else (self.packed, self.weight)
        # the widest output store: 16 bytes (rows' staged epilogue, rows of 4k floats), 8 (rows and pairs
        # kernels on even rows), else 4
        self.store_alignment = (16 if kind == "rows" and self.geom.epi and self.geom.wo % 4 == 0 else
                                8 if kind in ("rows", "pairs") and self.geom.wo % 2 == 0 else 4)
        self.bias = bias
        self.kernel = cc.kernel(self.geom.spec(), name, self.device)
        self.grid_cap = info.sm_count * max(1, self.kernel.blocks_per_sm(self.geom.nt, self.geom.smem_bytes))

    def grid(self, B: int) -> tuple[int, ...]:
        """Blocks over units, and for the gather kernel with at most half as many images as resident blocks,
        blocks sharing an image's position tiles (at least one a warp). On an H200 (benchmarks/2026-11-28-h200-
        small-batch-whole, gather_split.txt) fa19's second conv at 10 images took 12.6 us so against 28.8 on one
        block an image, sp18's 10.5 against 14.0; at 1000 images two blocks an image made sp19's slower (26.8
        against 23.4 us): a block stages the whole image, whatever share of its tiles it computes."""
        units = cc.cdiv(B, self.per_unit)
        share = self.grid_cap // units if self.kind == "gather" else 1
        if share < 2:
            return (min(units, self.grid_cap),)
        return units, max(1, min(share, cc.cdiv(self.geom.pt, self.geom.nt // 32)))

    def __call__(self, x: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
        if x.dtype != self.in_dtype:
            if self.kind != "gather":
                x = x.float()     # the rows and pairs kernels read fp32 (FP16 widens exactly)
            else:
                if self._other is None:
                    self._other = self._rebuild()
                return self._other(x, out)
        g = self.geom
        B = x.shape[0]
        if B > cc.INT32_MAX - self.per_unit:   # the kernel counts units of per_unit images in int32
            raise ValueError(f"batch {B} is too large for one launch (at most {cc.INT32_MAX - self.per_unit})")
        y, result = cc.output(out, (B, g.M, g.ho, g.wo), x, self.out_dtype)
        if y.data_ptr() % self.store_alignment:
            y = torch.empty_like(y)  # vector stores need an aligned buffer (torch allocations always are)
        if y.numel():
            self.kernel(self.grid(B), (g.nt,),
                        (cc.ptr(y), cc.ptr(x), *map(cc.ptr, self.weight_args), cc.ptr(self.bias), cc.i32(B)),
                        shared_mem=g.smem_bytes)
        return cc.finish(y, result)


def layer(weight, bias, H: int, W: int, precision: str, config=None, half_output: bool = False,
          half_input: bool = False):
    """The tensor-core kernel for one input size: the gather, rows or pairs kernel (config['kernel']); with no
    config, the measured winner for this shape (``tuned_config``) or the per-shape default."""
    M, C, K, _ = weight.shape
    if config is None:
        config = tuned_config(M, C, H, W, K, precision)
    kind = (config or {}).get("kernel") or default_kernel(C, K, M, precision)
    return TcLayer(weight, bias, H, W, precision, {**(config or {}), "kernel": kind}, half_output, half_input)


class PoolLayer:
    """tc_pool.cu for one input size: conv + bias + activation + 2x2 max pool on FP16 tensor cores, the pooled
    map written (float32, or FP16 for ``half_output``); loops over units of ``geom.ib`` images. Outputs of a block
    that met a non-finite input are recomputed in exact fp32 inside the kernel."""

    def __init__(self, weight, bias, H: int, W: int, act: int, config: Optional[dict], half_output: bool):
        M, C, K, _ = weight.shape
        self.device = weight.device
        info = cc.device_info(self.device)
        self.geom = plan_pool(M, C, H, W, K, act, config, info.smem_per_block_optin, half_output)
        self.out_dtype = torch.float16 if half_output else torch.float32
        self.weight = weight.float().contiguous().clone()   # the exact redo's
        self.packed = pack_rows(weight, self.geom)
        self.bias = bias
        self.kernel = cc.kernel(self.geom.spec(), "conv_tc_pool", self.device)
        self.grid_cap = info.sm_count * max(1, self.kernel.blocks_per_sm(self.geom.nt, self.geom.smem_bytes))

    def grid(self, B: int) -> tuple[int, int]:
        """(blocks over units, blocks sharing a unit's tiles): where there are fewer units than resident blocks
        (small batches), each unit's warp tiles are split over up to grid_cap / units blocks, at least one tile a
        warp (each such block stages the unit's images itself)."""
        g = self.geom
        units = cc.cdiv(B, g.ib)
        if units >= self.grid_cap:
            return self.grid_cap, 1
        return units, max(1, min(cc.cdiv(self.grid_cap, units), g.tiles // (g.nt // 32)))

    def __call__(self, x: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
        g = self.geom
        B = x.shape[0]
        if B > cc.INT32_MAX - g.ib:
            raise ValueError(f"batch {B} is too large for one launch (at most {cc.INT32_MAX - g.ib})")
        y, result = cc.output(out, (B, g.M, g.hp, g.wp), x, self.out_dtype)
        if y.numel():
            self.kernel(self.grid(B), (g.nt,), (cc.ptr(y), cc.ptr(x), cc.ptr(self.packed), cc.ptr(self.weight),
                                                cc.ptr(self.bias), cc.i32(B)), shared_mem=g.smem_bytes)
        return cc.finish(y, result)


class UnfusedPool:
    """A fused layer the pool kernel does not serve (TF32, another pool, K > 9): the unfused tensor-core conv,
    then torch's max pool and the network's activation (act(max) == max(act): all are monotone)."""

    def __init__(self, weight, bias, H: int, W: int, precision: str, activation: Optional[str], pool: int,
                 half_output: bool):
        self.conv = layer(weight, bias, H, W, precision)
        self.act, self.pool = ACTIVATIONS.get(activation), pool
        self.out_dtype = torch.float16 if half_output else torch.float32

    def __call__(self, x: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
        y = self.conv(x, None).float()
        if min(y.shape[2:]) < self.pool:   # no whole window: an empty map, as the fused kernels' floor
            y = y[:, :, :y.shape[2] // self.pool, :y.shape[3] // self.pool]
        else:
            y = torch.nn.functional.max_pool2d(y, self.pool)
        y = self.act(y) if self.act is not None else y
        if out is None:
            return y.to(self.out_dtype)
        buffer, result = cc.output(out, tuple(y.shape), x, self.out_dtype)
        buffer.copy_(y)
        return cc.finish(buffer, result)


def prepare_fused(weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str], pool: int,
                  precision: str = "fp16", config=None, input_hw=None, out_dtype: torch.dtype = torch.float32):
    """conv + bias + activation + max pool: the pool kernel (tc_pool.cu) where it serves the layer (FP16, 2x2
    pool, K <= 9, a tile that fits shared memory; ``config`` is its launch shape), else the unfused kernel and
    torch's pool. ``out_dtype``:
    float16 writes the pooled map in FP16 (for a consumer that reads FP16; callers bound the values)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    weight, bias = cc.check_weight(weight, bias)
    act, pool = cc.fusion_codes(activation, pool)
    half = cc.is_half("out_dtype", out_dtype)
    M, C, K, _ = weight.shape

    def make(h: int, w: int):
        if pool_serves(C, h, w, K, pool, precision):
            try:
                return PoolLayer(weight, bias, h, w, act, config, half)
            except TileTooLarge:
                if config is not None:   # a launch shape asked for by name fails as asked
                    raise
        # Many channels or wide rows: even one image a unit outgrows shared memory (C 14 of 65x92 needs 409 KB).
        return UnfusedPool(weight, bias, h, w, precision, activation, pool, half)
    return cc.per_input_size(weight, make, input_hw)


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, precision: str = "tf32", config=None,
            input_hw=None, out_dtype: torch.dtype = torch.float32, in_dtype: torch.dtype = torch.float32):
    """``out_dtype=torch.float16``: the gather kernel writes its output in FP16 (half the bytes, for a consumer
    that reads FP16; values past 65504 become +-Inf, so the caller bounds them); ``out`` is then a float16 buffer.
    The rows and pairs kernels write float32 whatever is asked: the returned tensor's dtype says which.
    ``in_dtype=torch.float16``: the layer also takes an FP16 x, which the gather kernel reads as it is (FP16
    precision only); float32 inputs still work (a second kernel, compiled at the first such call)."""
    if precision not in GATHER_PRECISIONS:
        raise ValueError(f"precision must be one of {GATHER_PRECISIONS}, got {precision!r}")
    half, half_in = cc.is_half("out_dtype", out_dtype), cc.is_half("in_dtype", in_dtype)
    if half_in and precision != "fp16":
        raise ValueError(f"in_dtype=torch.float16 needs precision fp16 (TF32 reads fp32), got {precision}")
    if half and precision == "tf32x3":
        raise ValueError("out_dtype=torch.float16 would round away 3xTF32's accuracy; 3xTF32 writes float32")
    weight, bias = cc.check_weight(weight, bias)
    dtypes = (torch.float32, torch.float16) if half_in else (torch.float32,)
    return cc.per_input_size(weight, lambda h, w: layer(weight, bias, h, w, precision, config, half, half_in),
                             input_hw, dtypes)
