"""The CPU engine's dense layers: y = act(x @ W.T + b) as one blocked matrix product, Numba + an LLVM tile.

Technique (the register-blocked GEMM of the BLIS/Goto papers, written for this project). Both operands are
read from packed, contiguous panels, so the tile's loads are two sequential streams:
- W.T is packed once, at prepare time, into groups of PR panels of NR = 16 outputs, wp[group][k][PR * 16]
  (the outputs padded to a multiple of 16 with zero weights; the panels left over form one narrower group).
- The images are packed per call, block by block: for each block of NC images and each KC-long slice of the
  reduction, the block's inputs go to a per-work-item scratch panel of stripes of S images, xp[stripe][k][S]
  (S = 16 when whole tiles fit it, packed by 16 x 16 transposes in registers, cpu_parallel.transposed_store;
  else S = MR, packed by a scalar loop; a last partial stripe padded with zero rows). Version 2 (main until
  2026-11-25) read the rows in place, MR rows K floats apart: on the AVX-512 Xeon fa17's 7200 -> 500 layer ran
  at 231 GFLOP/s there and 275 here (2 threads, B = 2048, benchmarks/2026-11-25-cpu-fa17-dense-panel).
For each block and slice, each tile of MR images (its stripe's KC x S packed inputs, 16 KiB, stay in L1) runs
over every group of panels (the slice of W, KC x Np floats, stays in L2) with ``dense_tile``: MR * PR
accumulators of 16 lanes, per k PR 16-float loads of W and MR broadcast inputs into MR * PR fused multiply-adds,
and every 4 k a software prefetch into L2 of its share of the next slice of W. Per ISA (TILES): AVX2 MR = 6,
PR = 1 (12 + 1 + 1 ymm registers; S = 6); AVX-512 MR = 8, PR = 3 (24 + 3 + 1 of the 32 zmm; two tiles per
16-image stripe; 11 loads per 24 FMAs, where 12 x 2 needs 14).
The tile starts at the bias on the first slice, at the partial sum otherwise, and the last slice's store
applies the activation (the same vector formulas as cpu-parallel's fused pool), so the bias add and
activation cost no pass over memory. A last tile of fewer than MR images accumulates in a scratch tile whose
valid rows are copied out after the last slice. Output rows are 16-padded too: (B, Np), and the next layer
reads its first N columns (``ld`` below). Threads: the images are cut into a multiple of
torch.get_num_threads() work items of at most about NC images (whole stripes), run on cpu-parallel's pool of
threads, each running the nogil kernel with its own scratch (allocated once per layer, reused across calls).
Bottleneck (fa17's layer, one thread): packing 11 % of the time, W's slices read from L3 6 %, the tile itself
78 % of the FMA peak with every operand in cache. A layer with a single group of panels (fa20's 32 outputs)
pays the pack for nothing: 0.23 ms more per 2048 images than version 2.
The sum is fp32 with fused multiply-adds in k order (contract only, no reassociation).
"""

from __future__ import annotations

import threading
from typing import Optional

import numpy as np
import torch

from convforge.conv.cpu_loops import vector_lanes

NR = 16         # outputs per panel: one 16-lane vector
TILES = {16: (8, 3), 8: (6, 1)}    # vector lanes (cpu_loops.vector_lanes) -> (MR images, PR panels) per tile
STRIPE = 16     # images per packed stripe when whole tiles fit (AVX-512's 8 x 3 tile: two per stripe)
MR, PR = TILES[vector_lanes()]
# Per ISA: (KC, NC). KC: the reduction slice (a tile's packed inputs, KC * S * 4 = 16 KiB, in L1; W's slice,
# KC * Np * 4, in L2). NC: images per block (their packed slice, NC * KC * 4 = 192 KiB, in L2 with W's slice).
# On the AVX-512 Xeon NC = 384 measured the same as 192 on fa17's 7200 -> 500 layer and 2 % slower on fa18's
# (per-round ratios of 25 interleaved rounds, benchmarks/2026-11-25-cpu-fa17-dense-panel/ab_blocking_nc.txt).
BLOCKING = {16: (256, 192), 8: (256, 192)}
KC, NC = BLOCKING[vector_lanes()]
DENSE_VERSION = 6
# (Version 5 could also prefetch into L2 each tile call's share of the next stripe's inputs in the lane layout:
# 0.97-1.07x in the engine, within this VM's noise, benchmarks/2026-11-26-cpu-whole-fa17-sp18-sp19; removed.)
# A layer with less work per call than this (rows x K x padded N multiply-adds: the 140 -> 10 and 500 -> 10
# output layers) runs as one work item on the calling thread: handing 12 items to the pool cost more than
# their arithmetic (0.60 against 0.21 ms for 2048 images of 140 -> 10)
SMALL_WORK = 1 << 25
UNROLL = 4      # k steps per iteration of the tile's loop (one W prefetch each)


def dense_tile(rows: int, act: int, panels: int = 1, stride: int = 0, unroll: int = 4):
    """The Numba intrinsic ``tile(xp, x0, w, w0, wk, kc, bias, n0, c, c0, ldc, first, last, pf, pfn)`` for MR = ``rows``
    images and PR = ``panels`` panels: c[c0 + r * ldc + pp * 16 + j] = (first ? bias[n0 + pp * 16 + j] :
    c[...]) + sum over k < kc of xp[x0 + k * S + r] * w[w0 + k * wk + pp * 16 + j] for r < rows,
    pp < panels, j < 16, then activation ``act`` when ``last``; S = ``stride`` (default ``rows``), the images
    of one packed stripe. Every ``unroll`` k it also prefetches into L2 one of the ``pfn`` cache lines of w from
    w[pf] on (the next slice of W, which the hardware prefetchers left to be read from L3 at first use)."""
    stride = stride or rows
    key = (rows, act, panels, stride, unroll)
    if key not in _TILES:
        from llvmlite import ir
        from numba import types
        from numba.core import cgutils
        from numba.extending import intrinsic
        from convforge.conv.cpu_parallel import vector_activation

        @intrinsic
        def tile(typingctx, xp, x0, w, w0, wk, kc, bias, n0, c, c0, ldc, first, last, pf, pfn):
            sig = types.void(xp, x0, w, w0, wk, kc, bias, n0, c, c0, ldc, first, last, pf, pfn)

            def codegen(context, builder, signature, args):
                i64, i32 = ir.IntType(64), ir.IntType(32)
                vec = ir.VectorType(ir.FloatType(), NR)
                vptr = vec.as_pointer()
                undef = ir.Constant(vec, ir.Undefined)
                splat_mask = ir.Constant(ir.VectorType(i32, NR), [0] * NR)
                fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * 3),
                                                     "llvm.fma.v16f32")

                def data(i):
                    return context.make_array(signature.args[i])(context, builder, args[i]).data

                def as64(i):
                    return context.cast(builder, args[i], signature.args[i], types.int64)

                def const(n):
                    return ir.Constant(i64, n)

                def vload(base, offset):
                    return builder.load(builder.bitcast(builder.gep(base, [offset], inbounds=True), vptr), align=4)

                xd, wd, bd, cd = data(0), data(2), data(6), data(8)
                x0v, w0v, wkv, kcv, n0v, c0v, ldcv = (as64(i) for i in (1, 3, 4, 5, 7, 9, 10))
                is_first = builder.icmp_signed("!=", as64(11), const(0))
                is_last = builder.icmp_signed("!=", as64(12), const(0))
                pfv, pfnv = as64(13), as64(14)
                i8p = ir.IntType(8).as_pointer()
                prefetch = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
                    ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0")
                rows_c = [[builder.add(c0v, builder.add(builder.mul(ldcv, const(r)), const(pp * NR)))
                           for pp in range(panels)] for r in range(rows)]
                starts = [vload(bd, builder.add(n0v, const(pp * NR))) for pp in range(panels)]
                accs = [[cgutils.alloca_once(builder, vec) for _ in range(panels)] for _ in range(rows)]
                for r in range(rows):
                    for pp in range(panels):
                        builder.store(builder.select(is_first, starts[pp], vload(cd, rows_c[r][pp])), accs[r][pp])

                def step(k):
                    # The PR panel vectors, then one broadcast input at a time into PR FMAs (accumulators
                    # + PR + 1 live registers); both streams contiguous.
                    wbase = builder.add(w0v, builder.mul(k, wkv))
                    xbase = builder.add(x0v, builder.mul(k, const(stride)))
                    wvs = [vload(wd, builder.add(wbase, const(pp * NR))) for pp in range(panels)]
                    for r in range(rows):
                        xs = builder.load(builder.gep(xd, [builder.add(xbase, const(r))], inbounds=True), align=4)
                        one = builder.insert_element(undef, xs, ir.Constant(i32, 0))
                        xb = builder.shuffle_vector(one, undef, splat_mask)
                        for pp in range(panels):
                            acc = accs[r][pp]
                            builder.store(builder.call(fma, [xb, wvs[pp], builder.load(acc)]), acc)

                with cgutils.for_range(builder, builder.sdiv(kcv, const(unroll))) as loop:
                    base = builder.mul(loop.index, const(unroll))
                    line = builder.select(builder.icmp_signed("<", loop.index, pfnv), loop.index, const(0))
                    target = builder.gep(wd, [builder.add(pfv, builder.mul(line, const(16)))], inbounds=True)
                    builder.call(prefetch, [builder.bitcast(target, i8p), ir.Constant(i32, 0), ir.Constant(i32, 2),
                                            ir.Constant(i32, 1)])
                    for u in range(unroll):
                        step(builder.add(base, const(u)))
                with cgutils.for_range(builder, builder.srem(kcv, const(unroll))) as loop:
                    step(builder.add(builder.mul(builder.sdiv(kcv, const(unroll)), const(unroll)), loop.index))
                for r in range(rows):
                    for pp in range(panels):
                        value = builder.load(accs[r][pp])
                        value = builder.select(is_last, vector_activation(builder, value, act), value)
                        ptr = builder.gep(cd, [rows_c[r][pp]], inbounds=True)
                        builder.store(value, builder.bitcast(ptr, vptr), align=4)
                return context.get_dummy_value()

            return sig, codegen

        _TILES[key] = tile
    return _TILES[key]


_TILES: dict = {}


def lanes_supported(rows: int = 0) -> bool:
    """Whether tiles of ``rows`` images (default MR) can read cpu-parallel's lane layout in place."""
    return stripe_of(rows or MR) == STRIPE


def stripe_of(rows: int) -> int:
    """Images per packed stripe for tiles of ``rows`` images: 16 (packed by 16 x 16 register transposes) when
    whole tiles fit it, else one tile."""
    return STRIPE if STRIPE % rows == 0 else rows


def kernel_source(act: int, rows: int = 0, panels: int = 0, kc: int = 0, nc: int = 0, lanes: bool = False) -> str:
    """The Numba kernel for activation ``act`` with tiles of ``rows`` images x ``panels`` panels, slices of
    ``kc`` and blocks of ``nc`` images (default MR, PR, KC, NC). ``lanes``: x is in cpu-parallel's lane
    layout, x[g][k][16] (image g * 16 + lane), which is the packed stripe already: no pack, the tiles read x
    in place (16-image stripes only)."""
    R, P, KC, NC = rows or MR, panels or PR, kc or globals()["KC"], nc or globals()["NC"]
    S = stripe_of(R)
    assert S == 16 or not lanes, "the lane layout is 16-image stripes"
    rest = "\n".join(f"tile_r{q} = dense_tile({R}, {act}, {q}, {S}, {UNROLL})" for q in range(1, P))
    calls = "\n".join(f"""                    {'if' if q == 1 else 'elif'} rem == {q}:
                        pf, pfn = prefetch_share(groups * gw * K + k0n * {q * NR}, kcn * {q}, u, nt)
                        tile_r{q}(src, x0, wp, groups * gw * K + k0 * {q * NR}, {q * NR}, kc, bias, groups * gw, cc,
                                  c0 + groups * gw, ldc, first, last, pf, pfn)""" for q in range(1, P))
    if S == 16:
        fast_pack = f"""if row + 16 <= b1:             # 16 x 16 blocks transposed in registers
                    start = row * ldx + k0
                    for k in range(0, kc - 15, 16):
                        transpose16(x, start + k, ldx, xp, base + k * 16, 16)
                    for k in range(kc // 16 * 16, kc):
                        for r in range(16):
                            xp[base + k * 16 + r] = x[start + r * ldx + k]
                    continue
                """
    else:
        fast_pack = ""
    if lanes:       # stripe t of the block is lane group (b0 + t * 16) / 16 (blocks start at whole stripes)
        pack = "            src = x"
        stripe_start = f"((b0 // {S} + t) * K + k0) * {S}"
    else:
        pack = f"""            # Pack the block's slice: xp[t * kc * {S} + k * {S} + r] = x[b0 + t * {S} + r, k0 + k], zero rows
            # past b1.
            src = xp
            for t in range(stripes):
                base = t * kc * {S}
                row = b0 + t * {S}
                {fast_pack}for r in range({S}):
                    if row + r < b1:
                        start = (row + r) * ldx + k0
                        for k in range(kc):
                            xp[base + k * {S} + r] = x[start + k]
                    else:
                        for k in range(kc):
                            xp[base + k * {S} + r] = 0.0"""
        stripe_start = f"t * kc * {S}"
    return f'''"""Generated by convforge.cpu_dense: MR={R}, PR={P}, S={S}, NR={NR}, KC={KC}, NC={NC}, act={act}, lanes={lanes} (v{DENSE_VERSION})."""
from numba import njit

from convforge.conv.cpu_parallel import transposed_store
from convforge.cpu_dense import dense_tile

transpose16 = transposed_store()
tile = dense_tile({R}, {act}, {P}, {S}, {UNROLL})
{rest}


@njit(inline="always")
def prefetch_share(start, lines, u, nt):
    """Tile u of nt's share of the ``lines`` cache lines of W from wp[start] on: (first float, lines)."""
    chunk = (lines + nt - 1) // nt
    if u * chunk >= lines:
        return start, 1
    return start + u * chunk * 16, min(chunk, lines - u * chunk)


def dense(x, ldx, K, wp, bias, c, ldc, panels, r0, r1, xp, cs):
    """c[r, :panels * 16] = act(x[r, :K] @ W.T + b) for r0 <= r < r1 (x and c flat, row strides ldx, ldc);
    xp: scratch of at least {NC} * {KC} floats (rounded up to whole stripes of {S}), cs: {R} * ldc floats."""
    gw = {P} * {NR}                     # outputs of a group of {P} panels
    groups = panels // {P}              # full groups; then one group of the panels % {P} left
    rem = panels - groups * {P}
    for b0 in range(r0, r1, {NC}):
        b1 = min(b0 + {NC}, r1)
        stripes = (b1 - b0 + {S - 1}) // {S}
        for k0 in range(0, K, {KC}):
            kc = min({KC}, K - k0)
            first = 1 if k0 == 0 else 0
            last = 1 if k0 + kc >= K else 0
            k0n = 0 if last else k0 + kc     # the next slice of W (the next block's first after the last),
            kcn = min({KC}, K - k0n)         # prefetched into L2 a share per tile call
            nt = stripes * {S // R}
{pack}
            for t in range(stripes):
                for i in range({S // R}):
                    row = b0 + t * {S} + i * {R}
                    if row >= b1:
                        break
                    x0 = {stripe_start} + i * {R}
                    u = t * {S // R} + i
                    if row + {R} <= b1:
                        cc = c
                        c0 = row * ldc
                    else:                   # a partial tile: into the scratch tile
                        cc = cs
                        c0 = 0
                    for g in range(groups):
                        pf, pfn = prefetch_share((g * K + k0n) * gw, kcn * {P}, u, nt)
                        tile(src, x0, wp, (g * K + k0) * gw, gw, kc, bias, g * gw, cc, c0 + g * gw, ldc, first, last,
                             pf, pfn)
{calls if P > 1 else ""}
                    if last and row + {R} > b1:
                        for r in range(b1 - row):
                            for j in range(panels * {NR}):
                                c[(row + r) * ldc + j] = cs[r * ldc + j]
'''


_KERNELS: dict = {}
_LOCK = threading.Lock()


def get_kernel(act: int, rows: int = 0, panels: int = 0, kc: int = 0, nc: int = 0, lanes: bool = False):
    from convforge.conv.cpu_loops import jit_generated
    rows, panels, kc, nc = rows or MR, panels or PR, kc or KC, nc or NC
    with _LOCK:
        key = (act, rows, panels, kc, nc, bool(lanes), UNROLL)
        if key not in _KERNELS:
            name = f"cpu_dense_a{act}_mr{rows}_pr{panels}_kc{kc}_nc{nc}" + ("_lanes" if lanes else "") + f"_u{UNROLL}"
            _KERNELS[key] = jit_generated(name, kernel_source(act, rows, panels, kc, nc, bool(lanes)), "dense",
                                          nogil=True, fastmath={"contract"})
        return _KERNELS[key]


def padded(n: int) -> int:
    """Columns of a dense layer's output buffer: ``n`` rounded up to whole panels."""
    return -(-n // NR) * NR


def aligned_zeros(n: int) -> np.ndarray:
    """n float32 zeros starting at a multiple of 64 bytes. NumPy's large arrays start 16 bytes past a page
    (glibc's mmap'd blocks), so a packed W there had every 16-float vector load span two cache lines: fa17's
    7200 -> 500 layer ran 0.898x (per-round median) of that time with W aligned
    (benchmarks/2026-11-27-cpu-dense-tile/ab_dense_tiles_1.txt)."""
    raw = np.zeros(n + 16, np.float32)
    start = (-raw.ctypes.data % 64) // 4
    return raw[start:start + n]


def pack_weight(w: np.ndarray, panels: int, group: int) -> np.ndarray:
    """W (panels * 16, K) as the kernel reads it: groups of ``group`` panels, wp[g][k][group * 16], then the
    leftover panels as one narrower group, wp[k][leftover * 16]; flat, at a multiple of 64 bytes."""
    k = w.shape[1]
    full = panels // group
    parts = [np.ascontiguousarray(w[:full * group * NR].reshape(full, group * NR, k).transpose(0, 2, 1))]
    if panels > full * group:
        parts.append(np.ascontiguousarray(w[full * group * NR:panels * NR].T))
    out = aligned_zeros(sum(p.size for p in parts))
    np.concatenate([p.reshape(-1) for p in parts], out=out)
    return out


class DenseLayer:
    """A dense layer (weight (N, K), optional bias (N,)) with activation ``activation`` fused, packed once.

    ``__call__(x, ld, out)``: x a float32 NumPy array whose rows hold the K inputs in their first K columns
    (row stride ``ld`` floats), out a C-contiguous (B, padded(N)) float32 array, written completely. With
    ``lanes`` (16-image stripes only: lanes_supported), x is in cpu-parallel's lane layout instead,
    (groups, K, 16) for B images (``ld`` unused), and is read in place, without packing."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str],
                 tile: Optional[tuple[int, int]] = None, blocking: Optional[tuple[int, int]] = None,
                 lanes: bool = False):
        from convforge.conv import ACTIVATION_CODES
        if activation not in ACTIVATION_CODES:
            raise ValueError(f"unknown activation {activation!r}")
        n, k = weight.shape
        self.n, self.k, self.np = n, k, padded(n)
        self.panels = self.np // NR
        self.rows, self.group = tile or (MR, PR)   # tile: (MR, PR) other than this ISA's (A/B runs, tests)
        self.kc, self.nc = blocking or (KC, NC)     # blocking: (KC, NC) other than the default (A/B, tests)
        self.lanes = lanes
        self.small_work = SMALL_WORK
        if lanes:
            if stripe_of(self.rows) != STRIPE:
                raise ValueError(f"the lane layout needs 16-image stripes; tiles of {self.rows} images have none")
            self.nc = -(-self.nc // STRIPE) * STRIPE    # blocks start at whole lane groups
        w = np.zeros((self.np, k), np.float32)
        w[:n] = weight.detach().to(torch.float32).numpy()
        self.wp = pack_weight(w, self.panels, self.group)
        self.bias = aligned_zeros(self.np)
        if bias is not None:
            self.bias[:n] = bias.detach().to(torch.float32).numpy()
        self.kernel = get_kernel(ACTIVATION_CODES[activation], self.rows, self.group, self.kc, self.nc, lanes)
        self._scratch: list = []    # per work item: (packed inputs, partial tile), kept across calls
        # Compile now (a one-row call of the same types).
        xp, cs = self.scratch(1)[0]
        self.kernel(np.zeros(k * (STRIPE if lanes else 1), np.float32), k, k, self.wp, self.bias,
                    np.empty(self.np, np.float32), self.np, self.panels, 0, 1, xp, cs)

    def scratch(self, items: int) -> list:
        """Scratch for ``items`` work items, allocated once and reused (no page faults per call)."""
        stripe = stripe_of(self.rows)
        block = 1 if self.lanes else -(-self.nc // stripe) * stripe * self.kc   # no packed inputs with lanes
        while len(self._scratch) < items:
            self._scratch.append((aligned_zeros(block), aligned_zeros(self.rows * self.np)))
        return self._scratch[:items]

    def work_items(self, rows: int, threads: int) -> list[tuple[int, int]]:
        """The images cut into a multiple of ``threads`` runs of whole stripes, each at most about NC images."""
        stripe = stripe_of(self.rows)
        stripes = -(-rows // stripe)
        if rows * self.k * self.np < self.small_work:
            return [(0, rows)]
        pieces = max(1, min(stripes, threads * -(-rows // (threads * self.nc))))
        edges = [min(rows, stripes * i // pieces * stripe) for i in range(pieces)] + [rows]
        return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]

    def __call__(self, x: np.ndarray, ld: int, out: np.ndarray) -> np.ndarray:
        rows = out.shape[0]
        if out.shape != (rows, self.np) or not out.flags.c_contiguous or out.dtype != np.float32:
            raise ValueError(f"out must be a contiguous float32 ({rows}, {self.np}) array")
        if rows == 0:
            return out
        xf, cf = x.reshape(-1), out.reshape(-1)
        if xf.size < (-(-rows // STRIPE) * STRIPE * self.k if self.lanes else (rows - 1) * ld + self.k):
            raise ValueError("x holds fewer rows than out")
        threads = max(1, torch.get_num_threads())
        items = self.work_items(rows, threads)
        scratch = self.scratch(len(items))
        if len(items) == 1 or threads == 1:
            for (a, b), (xp, cs) in zip(items, scratch):
                self.kernel(xf, ld, self.k, self.wp, self.bias, cf, self.np, self.panels, a, b, xp, cs)
        else:
            from convforge.conv.cpu_parallel import _pool
            pool = _pool(threads)
            for future in [pool.submit(self.kernel, xf, ld, self.k, self.wp, self.bias, cf, self.np, self.panels,
                                       a, b, xp, cs) for (a, b), (xp, cs) in zip(items, scratch)]:
                future.result()
        return out
