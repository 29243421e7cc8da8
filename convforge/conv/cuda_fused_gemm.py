"""cuda-fused-gemm: implicit GEMM, the unroll fused into a register-tiled multiply, every shape compiled in.

Technique: ``cuda/regtile.cu``. A thread owns TM maps x HT rows x WT consecutive columns of accumulators; for
each (channel, kernel row) it loads its input row segments (WT+K-1 values, 16-byte shared loads) into
registers once and reuses them for all K horizontal taps, against TM weights per tap (16-byte broadcast
loads from shared memory), so the inner loop is ~90 % FFMA (ptxas: fa18 L2 at TM=12, WT=4 uses 119
registers, no spills; 336 FFMA in a 367-instruction loop body). Blocks loop over (image, band of rows) units,
staging all channels of the band's input rows in shared memory once; the filter bank is staged once per
block. M, C, H, W, K and the launch shape are ``-D`` constants, so every loop bound and index stride is
known to the compiler.
Course step: milestone 4's last optimisations: unroll fused into the matrix multiply, ``__restrict__``,
loop unrolling with compile-time constants, thread coarsening (many outputs per thread), weights and
input in shared memory.
Bottleneck: FP32 FFMA issue on these layers (every preset layer has more than ~6 FLOPs per byte that must
move), then the output stores on the C=1 first layers; the floor is max(bytes / 4.2 TB/s, FLOPs /
51 TFLOP/s) on an H200.

Small batches: ``ms`` (map splits) spreads the map groups over ``ms`` blocks (grid.y), each staging only its
groups' weights, so 100 images of one band each give 100 * ms blocks instead of 100 on 132 SMs.

Input staging: cp.async copies, double-buffered (the next band streams in while this one is computed;
``pipe`` in the config, see regtile.cu). Launch shapes: ``convforge/tuning/cuda-fused-gemm.json`` holds the
measured best shape of each preset layer and pool (the default for those shapes when no config is given; one
that does not fit this device falls back to the cost model); ``LAUNCH_CONFIGS`` lists the register tiles
worth sweeping; ``candidate_configs(...)`` expands them (threads per block, rows per band) for one layer and
ranks them with a small cost model;
``prepare(weight, bias, config=...)`` takes one (a ``RegTileConfig`` or a dict of its fields, missing
fields filled in). ``input_hw=(H, W)`` compiles in prepare; otherwise the first call compiles (NVRTC, then
CuPy's disk cache).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Optional, Union

import torch

from convforge import tuning
from convforge.conv import cuda_common as cc

SOURCE = "regtile.cu"
SMEM_OPTIN_DEFAULT = 227 * 1024        # H100 / H200 per-block opt-in limit, used when no device is at hand
SMEM_PER_SM_DEFAULT = 228 * 1024
MAX_ACCUMULATORS = 96                  # TM * HT * WT; past this the register file (255 per thread) spills

# Register tiles worth sweeping (threads per block, rows per band, blocks per SM and the kernel-row
# unroll are derived per layer unless given). The bench may pass any of these, or its own, as config=.
LAUNCH_CONFIGS: tuple[dict, ...] = (
    {"tm": 4, "ht": 1, "wt": 4}, {"tm": 4, "ht": 2, "wt": 4}, {"tm": 4, "ht": 1, "wt": 8},
    {"tm": 6, "ht": 1, "wt": 4}, {"tm": 6, "ht": 2, "wt": 4}, {"tm": 6, "ht": 1, "wt": 8},
    {"tm": 8, "ht": 1, "wt": 4}, {"tm": 8, "ht": 2, "wt": 4}, {"tm": 8, "ht": 1, "wt": 8},
    {"tm": 10, "ht": 1, "wt": 4}, {"tm": 10, "ht": 2, "wt": 4},
    {"tm": 12, "ht": 1, "wt": 4}, {"tm": 12, "ht": 2, "wt": 4}, {"tm": 12, "ht": 1, "wt": 8},
    {"tm": 16, "ht": 1, "wt": 4}, {"tm": 16, "ht": 1, "wt": 8}, {"tm": 24, "ht": 1, "wt": 4},
    {"tm": 5, "ht": 1, "wt": 4}, {"tm": 3, "ht": 1, "wt": 4}, {"tm": 2, "ht": 1, "wt": 4},
    {"tm": 1, "ht": 1, "wt": 4}, {"tm": 4, "ht": 1, "wt": 2}, {"tm": 4, "ht": 1, "wt": 1},
    {"tm": 6, "ht": 4, "wt": 4}, {"tm": 4, "ht": 4, "wt": 4}, {"tm": 3, "ht": 4, "wt": 4}, {"tm": 6, "ht": 2, "wt": 8},
    {"tm": 4, "ht": 3, "wt": 4},
)


@dataclass(frozen=True)
class RegTileConfig:
    tm: int = 8        # maps per thread
    ht: int = 1        # output rows per thread
    wt: int = 4        # consecutive output columns per thread
    nt: int = 0        # threads per block (0: derived)
    bh: int = 0        # conv output rows per unit / band (0: derived)
    minb: int = 1      # __launch_bounds__ min blocks per SM (caps registers at 65536 / (nt * minb))
    pu: int = 0        # unroll of the kernel-row loop, 1 or K (0: chosen by the cost model)
    pipe: int = 2      # input staging: 0 load+store, 1 cp.async, 2 cp.async double-buffered (next band prefetched)
    ms: int = 1        # map splits: the map groups spread over ms blocks (grid.y), for small batches

    @staticmethod
    def coerce(config: Union["RegTileConfig", dict, None]) -> Optional["RegTileConfig"]:
        if config is None or isinstance(config, RegTileConfig):
            return config
        known = {f.name for f in fields(RegTileConfig)}
        unknown = set(config) - known
        if unknown:
            raise ValueError(f"unknown launch parameters {sorted(unknown)}; known: {sorted(known)}")
        return RegTileConfig(**config)


@dataclass(frozen=True)
class Geometry:
    """The kernel's derived constants (mirrors the constexprs at the top of regtile.cu)."""
    M: int
    C: int
    H: int
    W: int
    K: int
    pool: int
    cfg: RegTileConfig
    xsmem: bool = True
    wsmem: bool = True

    @property
    def ho(self): return self.H - self.K + 1
    @property
    def wo(self): return self.W - self.K + 1
    @property
    def hp(self): return self.ho // self.pool
    @property
    def wp(self): return self.wo // self.pool
    @property
    def he(self): return self.ho if self.pool == 1 else self.hp * self.pool
    @property
    def we(self): return self.wo if self.pool == 1 else self.wp * self.pool
    @property
    def mg(self): return cc.cdiv(self.M, self.cfg.tm)
    @property
    def gs(self): return cc.cdiv(self.cfg.tm, 4) * 4 if self.cfg.tm >= 4 else self.cfg.tm
    @property
    def mp(self): return self.mg * self.gs
    @property
    def mgs(self): return self.mg // self.cfg.ms      # map groups per block (ms divides mg)
    @property
    def g(self): return cc.cdiv(self.we, self.cfg.wt)
    @property
    def nb(self): return cc.cdiv(self.he, self.cfg.bh)
    @property
    def rt(self): return self.cfg.bh // self.cfg.ht
    @property
    def items(self): return self.mgs * self.rt * self.g
    @property
    def xvec(self): return self.cfg.wt % 4 == 0 and self.xsmem
    @property
    def xwl(self):
        xw = self.cfg.wt + self.K - 1
        return cc.cdiv(xw, 4) * 4 if self.xvec else xw
    @property
    def pitch(self):
        p0 = max(self.W, (self.g - 1) * self.cfg.wt + self.xwl)
        return cc.cdiv(p0, 4) * 4 if self.xvec else p0
    @property
    def xr(self): return self.cfg.bh + self.K - 1
    @property
    def xs_floats(self):
        one = cc.cdiv(self.C * self.xr * self.pitch, 4) * 4 if self.xsmem else 0
        return one * (2 if self.cfg.pipe == 2 else 1)
    @property
    def ws_floats(self): return self.C * self.K * self.K * self.mgs * self.gs if self.wsmem else 0
    @property
    def smem_bytes(self): return 4 * (self.xs_floats + self.ws_floats)
    @property
    def vec_out(self): return self.pool == 1 and self.cfg.wt % 4 == 0 and self.wo % 4 == 0
    @property
    def vec2_out(self): return self.pool == 1 and not self.vec_out and self.cfg.wt % 2 == 0 and self.wo % 2 == 0

    def registers_estimate(self) -> int:
        """Roughly what ptxas reports (within ~10 % at pu=1; unrolling the kernel rows hoists loads)."""
        c = self.cfg
        hoisted = (c.ht * self.xwl + self.gs) * (min(c.pu, self.K) - 1) // 2
        return c.tm * c.ht * c.wt + c.ht * self.xwl + self.gs + 32 + hoisted

    def spec(self, activation: int = 0) -> cc.KernelSpec:
        c = self.cfg
        split = {"CF_MS": c.ms} if c.ms > 1 else {}      # ms 1: the same spec (and cache key) as before
        return cc.KernelSpec.of(SOURCE, CF_M=self.M, CF_C=self.C, CF_H=self.H, CF_W=self.W, CF_K=self.K,
                                CF_TM=c.tm, CF_HT=c.ht, CF_WT=c.wt, CF_NT=c.nt, CF_BH=c.bh, CF_MINB=c.minb,
                                CF_PUNROLL=c.pu, CF_POOL=self.pool, CF_ACT=activation, CF_PIPE=c.pipe,
                                CF_XSMEM=int(self.xsmem), CF_WSMEM=int(self.wsmem), **split)

    def instructions_per_item(self) -> float:
        """A count of the issued instructions of one work item (the cost model behind the default config)."""
        c = self.cfg
        x_loads = c.ht * (self.xwl // 4 if self.xvec else self.xwl)
        w_loads = c.tm // 4 + (c.tm % 4 + 1) // 2 if self.gs % 4 == 0 else c.tm
        body = c.tm * c.ht * c.wt * self.K + x_loads + self.K * w_loads + (6 if c.pu < self.K else 1)
        per_row = c.wt // 4 if self.vec_out else c.wt // 2 if self.vec2_out else c.wt
        epilogue = c.tm * (c.ht * per_row + 4) + 40
        if self.pool > 1:
            epilogue += c.tm * c.ht * c.wt
        return self.C * self.K * body + epilogue

    def efficiency(self, smem_per_sm: int = SMEM_PER_SM_DEFAULT) -> float:
        """Useful FFMAs over issued instructions, scaled down when too few warps are resident."""
        useful = self.M * self.he * self.we * self.C * self.K * self.K
        per_item = self.instructions_per_item()
        rounds = cc.cdiv(self.items, self.cfg.nt)
        idle = rounds * self.cfg.nt - self.items
        staging = (self.C * self.xr * cc.cdiv(self.pitch, 32) * 32 * (2 if self.cfg.pipe else 4) if self.xsmem else 0)
        issued = self.nb * self.cfg.ms * (self.items * per_item + 0.5 * idle * per_item + staging)
        regs = min(255, self.registers_estimate())
        blocks = min(65536 // (regs * self.cfg.nt), smem_per_sm // max(1, self.smem_bytes + 1024), 32)
        warps = blocks * self.cfg.nt // 32
        if warps == 0:
            return 0.0
        hidden = blocks >= 2 or (self.cfg.pipe == 2 and self.xsmem)   # else the staging latency is exposed
        occupancy = min(1.0, warps / 12.0) * (1.0 if hidden else 0.8)
        placement = (1.0 if self.xsmem else 0.5) * (1.0 if self.wsmem else 0.7)
        return useful / issued * occupancy * placement


def _thread_counts(items: int) -> list[int]:
    counts = set()
    for rounds in range(1, 9):
        nt = cc.cdiv(cc.cdiv(items, rounds), 32) * 32
        if 64 <= nt <= 512:
            counts.add(nt)
    if not counts:
        counts.add(max(64, min(512, cc.cdiv(items, 32) * 32)))
    return sorted(counts)


def _complete(M, C, H, W, K, pool, cfg: RegTileConfig, smem_optin: int, smem_per_sm: int) -> list[Geometry]:
    """Every full configuration (bh, nt, pu, memory placement) for a partial one, best first."""
    ho = H - K + 1
    he = ho if pool == 1 else (ho // pool) * pool
    # rows per band: the whole image, or a half, third, quarter of it, or one row tile
    bhs = [cfg.bh] if cfg.bh else sorted({cc.cdiv(he, n * cfg.ht) * cfg.ht for n in (1, 2, 3, 4)} | {cfg.ht},
                                          reverse=True)
    out = []
    for placements in (((True, True), (True, False)), ((False, True), (False, False))):
        for bh in bhs:
            for xsmem, wsmem in placements:
                probe = Geometry(M, C, H, W, K, pool, replace(cfg, bh=bh, nt=cfg.nt or 256), xsmem, wsmem)
                pipe = cfg.pipe
                if probe.smem_bytes > smem_optin and pipe == 2 and xsmem:   # no room for two bands: one
                    pipe = 1
                    probe = Geometry(M, C, H, W, K, pool, replace(probe.cfg, pipe=1), xsmem, wsmem)
                if probe.smem_bytes > smem_optin:
                    continue
                for pu in ([cfg.pu] if cfg.pu else sorted({1, K})):
                    for nt in ([cfg.nt] if cfg.nt else _thread_counts(probe.items)):
                        full = Geometry(M, C, H, W, K, pool, replace(cfg, bh=bh, nt=nt, pu=pu), xsmem, wsmem)
                        if not cfg.nt and min(255, full.registers_estimate()) * cc.cdiv(nt, 128) * 128 > 65536:
                            continue  # ptxas would cap the registers below the tile's needs and spill
                        out.append(Geometry(M, C, H, W, K, pool, replace(cfg, bh=bh, nt=nt, pu=pu, pipe=pipe),
                                            xsmem, wsmem))
                break  # weights in shared memory when they fit
        if out:
            break      # input from global memory only when no band fits in shared memory
    out.sort(key=lambda g: -g.efficiency(smem_per_sm))
    return out


def valid_partial(cfg: RegTileConfig, M: int, pool: int, we: int) -> bool:
    if cfg.tm < 1 or cfg.ht < 1 or cfg.wt < 1 or cfg.tm * cfg.ht * cfg.wt > MAX_ACCUMULATORS:
        return False
    if cfg.ht % pool or cfg.wt % pool or (cfg.bh and cfg.bh % cfg.ht) or (cfg.nt and cfg.nt % 32):
        return False
    if cfg.tm > max(M, 1) and cfg.tm > 4:
        return False
    if cfg.ms < 1 or cc.cdiv(M, cfg.tm) % cfg.ms:
        return False
    return True


def candidate_configs(M: int, C: int, H: int, W: int, K: int, pool: int = 1,
                      smem_optin: int = SMEM_OPTIN_DEFAULT, smem_per_sm: int = SMEM_PER_SM_DEFAULT,
                      partials: Optional[list] = None) -> list[Geometry]:
    """Full configurations for one layer (from ``partials``, default LAUNCH_CONFIGS), best modelled first."""
    wo = W - K + 1
    we = wo if pool == 1 else (wo // pool) * pool
    seeds = [RegTileConfig.coerce(p) for p in (partials if partials is not None else LAUNCH_CONFIGS)]
    if pool > 1:  # a thread tile must hold whole windows
        seeds = [replace(s, ht=math.lcm(s.ht, pool), wt=math.lcm(s.wt, pool)) for s in seeds]
    seen, out = set(), []
    for s in seeds:
        if s in seen or not valid_partial(s, M, pool, we):
            continue
        seen.add(s)
        out.extend(_complete(M, C, H, W, K, pool, s, smem_optin, smem_per_sm))
    if not out and pool * pool <= MAX_ACCUMULATORS:  # large pools: one map, one window per thread
        out.extend(_complete(M, C, H, W, K, pool, RegTileConfig(tm=1, ht=pool, wt=pool), smem_optin, smem_per_sm))
    out.sort(key=lambda g: -g.efficiency(smem_per_sm))
    return out


def plan(M: int, C: int, H: int, W: int, K: int, pool: int = 1, config=None,
         smem_optin: int = SMEM_OPTIN_DEFAULT, smem_per_sm: int = SMEM_PER_SM_DEFAULT) -> Geometry:
    """The geometry to run: ``config`` completed, or the best modelled candidate."""
    if H < K or W < K:
        raise ValueError(f"input {H}x{W} is smaller than the {K}x{K} kernel")
    if pool > 1 and ((H - K + 1) < pool or (W - K + 1) < pool):
        raise ValueError(f"a {pool}x{pool} pool needs at least {pool}x{pool} conv outputs")
    cfg = RegTileConfig.coerce(config)
    if cfg is not None:
        if pool > 1 and (cfg.ht % pool or cfg.wt % pool):
            raise ValueError(f"config {cfg}: ht and wt must be multiples of the pool size {pool}")
        if min(cfg.tm, cfg.ht, cfg.wt) < 1 or cfg.tm * cfg.ht * cfg.wt > MAX_ACCUMULATORS:
            raise ValueError(f"config {cfg}: tm, ht, wt must be >= 1 with at most {MAX_ACCUMULATORS} "
                             "accumulators per thread")
        if (cfg.bh and cfg.bh % cfg.ht) or (cfg.nt and (cfg.nt % 32 or cfg.nt > 1024)):
            raise ValueError(f"config {cfg}: bh must be a multiple of ht, nt a multiple of 32 up to 1024")
        if cfg.ms < 1 or cc.cdiv(M, cfg.tm) % cfg.ms:
            raise ValueError(f"config {cfg}: ms must divide the {cc.cdiv(M, cfg.tm)} map groups of tm={cfg.tm}")
        full = _complete(M, C, H, W, K, pool, cfg, smem_optin, smem_per_sm)
        if not full:
            raise ValueError(f"config {cfg} does not fit this layer's shared memory")
        return full[0]
    tuned = tuning.lookup("cuda-fused-gemm", M=M, C=C, H=H, W=W, K=K, pool=pool)
    if tuned is not None:
        full = _complete(M, C, H, W, K, pool, RegTileConfig(**tuned), smem_optin, smem_per_sm)
        if full:
            return full[0]
    found = candidate_configs(M, C, H, W, K, pool, smem_optin, smem_per_sm)
    if not found:
        raise ValueError(f"no launch configuration for M={M} C={C} H={H} W={W} K={K} pool={pool}")
    return found[0]


def kernel_specs(M: int, C: int, H: int, W: int, K: int, pool: int = 1, activation: int = 0,
                 config=None) -> list[cc.KernelSpec]:
    """What prepare() would compile for this layer (used by the CI compile test)."""
    return [plan(M, C, H, W, K, pool, config).spec(activation)]


def pack_weights(weight: torch.Tensor, geom: Geometry) -> torch.Tensor:
    """(M, C, K, K) -> [c][p][q][group][GS] float32 (maps fastest, zero padded), contiguous."""
    M, C, K, _ = weight.shape
    mg, tm, gs = geom.mg, geom.cfg.tm, geom.gs
    w = weight.permute(1, 2, 3, 0)                                    # (C, K, K, M)
    w = torch.nn.functional.pad(w, (0, mg * tm - M)).reshape(C, K, K, mg, tm)
    w = torch.nn.functional.pad(w, (0, gs - tm))
    return w.contiguous().reshape(-1)


class RegTileLayer:
    """One layer's regtile kernel: geometry, packed weights, compiled kernel, launch."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], H: int, W: int, pool: int = 1,
                 activation: int = 0, config=None):
        self.weight, self.bias = weight, bias
        M, C, K, _ = weight.shape
        self.device = weight.device
        info = cc.device_info(self.device)
        self.geom = plan(M, C, H, W, K, pool, config, info.smem_per_block_optin, info.smem_per_sm)
        self.packed = pack_weights(weight, self.geom)
        self.kernel = cc.kernel(self.geom.spec(activation), "conv_regtile", self.device)
        self.sm_count = info.sm_count
        self.blocks_per_sm = max(1, self.kernel.blocks_per_sm(self.geom.cfg.nt, self.geom.smem_bytes))

    def out_shape(self, batch: int) -> tuple[int, int, int, int]:
        g = self.geom
        return (batch, g.M, g.hp, g.wp) if g.pool > 1 else (batch, g.M, g.ho, g.wo)

    def __call__(self, x: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
        batch = x.shape[0]
        y, result = cc.output(out, self.out_shape(batch), x)
        if (self.geom.vec_out or self.geom.vec2_out) and y.data_ptr() % 16:
            y = torch.empty_like(y)  # 16-byte stores need an aligned buffer (torch allocations always are)
        if batch:
            units = batch * self.geom.nb
            ms = self.geom.cfg.ms
            grid = min(units, max(1, self.sm_count * self.blocks_per_sm // ms))
            self.kernel((grid, ms), (self.geom.cfg.nt,), (cc.ptr(y), cc.ptr(x), cc.ptr(self.packed),
                                                       cc.ptr(self.bias), cc.i32(batch)),
                        shared_mem=self.geom.smem_bytes)
        return cc.finish(y, result)


def describe(geom: Geometry) -> dict:
    """The launch shape as a flat dict (for bench rows and notes)."""
    return {**asdict(geom.cfg), "xsmem": geom.xsmem, "wsmem": geom.wsmem, "smem_bytes": geom.smem_bytes,
            "items": geom.items, "bands": geom.nb}


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, config=None, input_hw=None):
    weight, bias = cc.check_weight(weight, bias)
    return cc.per_input_size(weight, lambda h, w: RegTileLayer(weight, bias, h, w, 1, 0, config), input_hw)
