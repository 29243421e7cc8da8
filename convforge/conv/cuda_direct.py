"""cuda-direct: direct convolution with the filter bank as constant-bank operands of FFMA, output tiles in registers.

Technique: ``cuda/direct.cu``. A thread owns pool rows x R consecutive output columns x a group of maps;
for each input row it loads the R+K-1 values it needs (through L1, 16- or 8-byte loads where aligned) and
does every tap that row feeds. Channel, tap and map are compile-time indices, so each weight is a fixed
constant-bank address that ptxas feeds to the FFMAs through uniform registers (ULDC on the uniform
datapath, one per two weights per warp): no per-thread weight loads, no shared memory, no barriers. The filter bank
and bias go into the module's ``__constant__`` bank once, in prepare; each prepared layer has its own
module instance (as cuda-constmem), and banks over 64 KB run as pieces of maps, one launch each. With a
pool (``prepare_fused``) the tile covers whole windows and only the activated window maxima are stored.
Course step: milestone 4's "weights in constant memory" taken to its end: with all indices compile-time
constants (``-D`` shapes, full unrolling) and thread coarsening (register tiles of columns x maps), the
constant bank feeds the FMA units without per-thread loads; shared-memory tiling is dropped because Hopper's L1 already
serves the input reuse.
Bottleneck: on the one-channel first layers, FP32 FFMA issue and the output stores (fa17 L1: 86 % of the
SASS is FFMA, the rest mostly ULDC); on multi-channel layers the unrolled code grows with C*K*K*tile, so they are left to
cuda-fused-gemm (``CF_UNROLL_C=0`` keeps them correct, with the weights then loaded by LDC).

Launch shapes: ``convforge/tuning/cuda-direct.json`` holds the measured fastest (mg, r, nt) per preset layer and
pool, with each one's median, GPU and run (``convforge sweep --impl cuda-direct --variants --write-tuning``);
other shapes use the modelled ``default_config``. ``candidate_configs`` lists what the
sweep times. Further knobs, each off by default and timed only as sweep variants: ``rows`` (several stored
rows per thread, so each constant-bank weight and each input row feed more FFMAs), ``chunk`` (one-channel
layers: several row tiles per thread in sequence down its strip, each input row loaded once; it wins on
the pooled fa17 and sp18 first layers, and loses on every plain layer, where a warp's stores then land in
several row runs instead of one), ``minb``, ``uc``, ``cs``.
FP16 output (``out_dtype=torch.float16``, CF_OUT_HALF): the stored values rounded to FP16 (nearest even), half
the bytes written, for a consumer that reads FP16 (the fast path's tensor-core second conv after a tanh or
sigmoid first conv, whose outputs lie in [-1, 1]: ``convforge.engine.HALF_CONV_HANDOFF``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from typing import Optional, Union

import torch

from convforge import tuning
from convforge.conv import cuda_common as cc

SOURCE = "direct.cu"
CONST_FLOATS = cc.CONST_BANK_FLOATS
MAX_ACCUMULATORS = 128        # rows * pool * r * mg; past this the 255-register budget spills
UNROLLED_FFMA_LIMIT = 6000    # per thread; past this the channel loop is not unrolled (code size)
unavailable_reason = cc.unavailable_reason


@dataclass(frozen=True)
class DirectConfig:
    mg: int            # maps per thread (one map group)
    r: int             # output columns per thread, a multiple of the pool
    nt: int = 256      # threads per block
    cs: int = 0        # 1: evict-first (streaming) output stores
    minb: int = 0      # > 0: __launch_bounds__ minimum blocks per SM (trades registers for occupancy)
    uc: int = -1       # channel loop: 1 unrolled, 0 rolled, -1 unrolled while the code stays under UNROLLED_FFMA_LIMIT
    rows: int = 1      # stored rows per thread (each weight and input row then serves rows x more FFMAs)
    chunk: int = 1     # one channel: row tiles per thread, one after another (each input row loaded once)

    @staticmethod
    def coerce(config: Union["DirectConfig", dict, None]) -> Optional["DirectConfig"]:
        if config is None or isinstance(config, DirectConfig):
            return config
        return DirectConfig(**config)


def _stored(H: int, W: int, K: int, pool: int) -> tuple[int, int]:
    return (H - K + 1) // pool, (W - K + 1) // pool


def check_config(M: int, C: int, H: int, W: int, K: int, pool: int, cfg: DirectConfig) -> None:
    if cfg.r < 1 or cfg.r % pool:
        raise ValueError(f"r={cfg.r} must be a positive multiple of the pool ({pool})")
    if not 1 <= cfg.mg <= M:
        raise ValueError(f"mg={cfg.mg} must be within 1..{M}")
    hp = _stored(H, W, K, pool)[0]
    if cfg.rows < 1 or hp % cfg.rows:
        raise ValueError(f"rows={cfg.rows} must divide the {hp} stored rows")
    if cfg.chunk < 1 or (cfg.chunk > 1 and (C != 1 or (hp // cfg.rows) % cfg.chunk)):
        raise ValueError(f"chunk={cfg.chunk} needs one input channel (C={C}) and must divide the "
                         f"{hp // cfg.rows} row tiles")
    if _accumulators(pool, cfg) > MAX_ACCUMULATORS:
        raise ValueError(f"rows*pool*r*mg = {_accumulators(pool, cfg)} accumulators exceed {MAX_ACCUMULATORS}")
    if cfg.nt % 32 or not 32 <= cfg.nt <= 1024:
        raise ValueError(f"nt={cfg.nt} must be a multiple of 32 in 32..1024")
    if cfg.cs not in (0, 1):
        raise ValueError(f"cs={cfg.cs} must be 0 or 1")
    if cfg.minb < 0 or cfg.minb * cfg.nt > 2048:
        raise ValueError(f"minb={cfg.minb} blocks of {cfg.nt} threads do not fit an SM (at most 2048 threads)")
    if cfg.uc not in (-1, 0, 1):
        raise ValueError(f"uc={cfg.uc} must be -1 (by code size), 0 or 1")


def _accumulators(pool: int, cfg: DirectConfig) -> int:
    """Registers of one thread's output tile: (rows * pool) conv rows x r columns x mg maps."""
    return cfg.rows * pool * cfg.r * cfg.mg


def _balanced(M: int, mg: int) -> int:
    """The same number of groups with the maps spread evenly (50 maps in groups of 16 -> 4 groups of 13)."""
    return cc.cdiv(M, cc.cdiv(M, mg))


def default_config(M: int, C: int, H: int, W: int, K: int, pool: int = 1) -> DirectConfig:
    """The measured launch shape of this layer (convforge/tuning/cuda-direct.json), else the modelled default:
    the widest strip (up to 4 stored columns) that divides the stored row, then as many maps per thread as
    keep about 64 accumulators."""
    tuned = tuning.lookup("cuda-direct", M=M, C=C, H=H, W=W, K=K, pool=pool)
    if tuned is not None:
        return DirectConfig(**tuned)
    _, wp = _stored(H, W, K, pool)
    rp = next(n for n in (4, 2, 1) if wp % n == 0 or n == 1)
    r = rp * pool
    mg = _balanced(M, max(1, min(M, 64 // (pool * r))))
    return DirectConfig(mg, r)


def candidate_configs(M: int, C: int, H: int, W: int, K: int, pool: int = 1) -> list[DirectConfig]:
    """Launch shapes worth timing: strips of 1-8 stored columns (3 and 6 only where they divide the stored
    row) x map groups of M/1 .. M/8 x 128 or 256 threads, within the accumulator budget."""
    out = []
    wp = _stored(H, W, K, pool)[1]
    for rp in (1, 2, 3, 4, 6, 8):
        if rp in (3, 6) and wp % rp:
            continue
        r = rp * pool
        for parts in (1, 2, 3, 4, 6, 8):
            mg = _balanced(M, cc.cdiv(M, parts))
            if pool * r * mg > MAX_ACCUMULATORS or pool * r * mg < 4:
                continue
            for nt in (128, 256):
                cfg = DirectConfig(mg, r, nt)
                if cfg not in out:
                    out.append(cfg)
    return out


def pieces(M: int, C: int, K: int) -> list[tuple[int, int]]:
    """(m0, maps) launches whose weights and biases fit the constant bank."""
    per = CONST_FLOATS // (C * K * K + 1)
    if per == 0:
        raise ValueError(f"one {C}x{K}x{K} filter does not fit the 64 KB constant bank")
    return [(m0, min(per, M - m0)) for m0 in range(0, M, per)]


def _alignment(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest vector width in floats (4, 2, 1) that both pointers are aligned to."""
    both = a.data_ptr() | b.data_ptr()
    return 4 if both % 16 == 0 else 2 if both % 8 == 0 else 1


def spec(C: int, H: int, W: int, K: int, pool: int, activation: int, cfg: DirectConfig, maps: int,
         instance: int = 0, vec: int = 4, half_output: bool = False) -> cc.KernelSpec:
    """The kernel of one piece of ``maps`` maps; ``vec`` is the widest access the pointers allow (in floats:
    an FP16 output's stores are then half as wide, and as aligned); ``half_output``: y in FP16."""
    mg = min(cfg.mg, maps)
    unroll = C * K * K * _accumulators(pool, replace(cfg, mg=mg)) <= UNROLLED_FFMA_LIMIT if cfg.uc < 0 else bool(cfg.uc)
    return cc.KernelSpec.of(SOURCE, CF_C=C, CF_H=H, CF_W=W, CF_K=K, CF_MP=maps, CF_MG=mg, CF_R=cfg.r,
                            CF_NT=cfg.nt, CF_VEC=vec, CF_UNROLL_C=int(unroll), CF_STREAM_STORES=cfg.cs,
                            **({"CF_MINB": cfg.minb} if cfg.minb else {}),
                            **({"CF_RT": cfg.rows * pool} if cfg.rows > 1 else {}),
                            **({"CF_CHUNK": cfg.chunk} if cfg.chunk > 1 else {}), CF_POOL=pool, CF_ACT=activation,
                            CF_INSTANCE=instance, **({"CF_OUT_HALF": 1} if half_output else {}))


def plan(M: int, C: int, H: int, W: int, K: int, pool: int = 1, config=None) -> DirectConfig:
    """The launch shape one layer runs with: the given config, else the tuned or modelled default."""
    cfg = DirectConfig.coerce(config) or default_config(M, C, H, W, K, pool)
    cfg = replace(cfg, mg=min(cfg.mg, max(maps for _, maps in pieces(M, C, K))))
    check_config(M, C, H, W, K, pool, cfg)
    return cfg


def kernel_specs(M: int, C: int, H: int, W: int, K: int, pool: int = 1, activation: int = 0,
                 config=None, **_) -> list[cc.KernelSpec]:
    """The kernels one layer compiles (instances 0, 1, ... one per piece), for the compile tests."""
    cfg = plan(M, C, H, W, K, pool, config)
    return [spec(C, H, W, K, pool, activation, cfg, maps, i) for i, (_, maps) in enumerate(pieces(M, C, K))]


class DirectLayer:
    """One layer at one input size: a constant bank per piece, kernels compiled per pointer alignment."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], H: int, W: int, pool: int = 1,
                 activation: int = 0, config=None, half_output: bool = False):
        M, C, K, _ = weight.shape
        self.half_output = half_output
        self.out_dtype = torch.float16 if half_output else torch.float32
        if H < K or W < K:
            raise ValueError(f"input {H}x{W} is smaller than the {K}x{K} kernel")
        self.M, self.C, self.H, self.W, self.K, self.pool, self.activation = M, C, H, W, K, pool, activation
        self.cfg = plan(M, C, H, W, K, pool, config)
        self.pieces = pieces(M, C, K)
        self.hp, self.wp = _stored(H, W, K, pool)
        self.nx = cc.cdiv(self.wp, self.cfg.r // pool)
        self.device = weight.device
        self.banks = []   # per piece: weights [c][p][q][map] then biases, copied into each module's bank
        for m0, maps in self.pieces:
            tail = bias[m0:m0 + maps] if bias is not None else torch.zeros(maps, device=self.device)
            self.banks.append(torch.cat([weight[m0:m0 + maps].permute(1, 2, 3, 0).reshape(-1), tail]).contiguous())
        # per piece: map groups (grid y) and the constant kernel arguments M, m0
        self.launch_args = [(cc.cdiv(maps, min(self.cfg.mg, maps)), cc.i32(M), cc.i32(m0)) for m0, maps in self.pieces]
        acquired = [cc.acquire_instance() for _ in self.pieces]
        self.instances = [i for i, _ in acquired]
        self.reused = any(reused for _, reused in acquired)
        self.kernels: dict = {}
        weakref.finalize(self, cc.release_instances, list(self.instances))

    def kernel(self, piece: int, vec: int) -> cc.Kernel:
        """The piece's kernel for this alignment; its module's bank is filled when first compiled."""
        key = (piece, vec)
        if key not in self.kernels:
            s = spec(self.C, self.H, self.W, self.K, self.pool, self.activation, self.cfg,
                     self.pieces[piece][1], self.instances[piece], vec, self.half_output)
            kernel = cc.kernel(s, "conv_direct", self.device)
            if self.reused:
                cc.synchronize(self.device)  # a freed layer's kernels may still read a bank being reused
            bank = self.banks[piece]
            cc.copy_async(cc.global_ptr(s, "cf_bank", self.device), bank.data_ptr(), 4 * bank.numel(), self.device)
            cc.synchronize(self.device)      # written before any stream launches from it
            self.kernels[key] = kernel
        return self.kernels[key]

    def out_shape(self, batch: int) -> tuple[int, int, int, int]:
        return batch, self.M, self.hp, self.wp

    def __call__(self, x: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
        batch = x.shape[0]
        y, result = cc.output(out, self.out_shape(batch), x, self.out_dtype)
        if y.numel() == 0:
            return cc.finish(y, result)
        items_per_image = (self.hp // self.cfg.rows // self.cfg.chunk) * self.nx   # row chunks x column strips
        per_launch = max(1, cc.INT32_MAX // items_per_image)   # the kernel's item index is an int
        nt = self.cfg.nt
        for b0 in range(0, batch, per_launch):
            xs, ys = (x, y) if batch <= per_launch else (x[b0:b0 + per_launch], y[b0:b0 + per_launch])
            nb = xs.shape[0]
            vec = _alignment(xs, ys)
            blocks = cc.cdiv(nb * items_per_image, nt)
            for piece, (groups, m_arg, m0_arg) in enumerate(self.launch_args):
                self.kernel(piece, vec)((blocks, groups, 1), (nt, 1, 1),
                                        (cc.ptr(ys), cc.ptr(xs), cc.i32(nb), m_arg, m0_arg))
        return cc.finish(y, result)


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, config=None, input_hw=None,
            out_dtype: torch.dtype = torch.float32):
    """``out_dtype=torch.float16``: y in FP16 (values past 65504 become +-Inf: the caller bounds them)."""
    weight, bias = cc.check_weight(weight, bias)
    half = cc.is_half("out_dtype", out_dtype)
    return cc.per_input_size(weight, lambda h, w: DirectLayer(weight, bias, h, w, 1, 0, config, half), input_hw)


def prepare_fused(weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str], pool: int,
                  config=None, input_hw=None, out_dtype: torch.dtype = torch.float32):
    weight, bias = cc.check_weight(weight, bias)
    act, pool = cc.fusion_codes(activation, pool)
    half = cc.is_half("out_dtype", out_dtype)
    return cc.per_input_size(weight, lambda h, w: DirectLayer(weight, bias, h, w, pool, act, config, half), input_hw)
