"""main's cpu_dense (v2, fc8b8b8), kept for the A/B: the CPU engine's dense layers: y = act(x @ W.T + b) as one blocked matrix product, Numba + an LLVM tile.

Technique (the register-blocked GEMM of the BLIS/Goto papers, written for this project): W.T is packed once,
at prepare time, into panels of NR = 16 outputs, wp[panel][k][16] (the outputs padded to a multiple of 16 with
zero weights). The product is cut into KC-long slices of the reduction; for each slice and group of PR panels,
tiles of MR images x PR * 16 outputs are summed in registers (``dense_tile``: MR * PR accumulators of 16 lanes,
PR 16-float loads of the panels and MR broadcast inputs per k, MR * PR fused multiply-adds). Per ISA (TILES):
AVX2 MR = 6, PR = 1 (12 + 2 + 1 ymm registers); AVX-512 MR = 12, PR = 2 (24 + 2 + 1 of the 32 zmm: with the
AVX2 tile's 6 accumulators the 4-cycle FMAs of 2 ports could not be kept busy). The panels' slice (KC x PR * 16
floats, 16-32 KiB) stays in L1 while every MR-image tile of the thread's MC images uses it; the images' slice
(MC x KC) stays in L2. Leftover panels take tiles of one panel, leftover images tiles of one image. The tile starts at the bias on the first slice, at the partial sum
otherwise, and the last slice's store applies the activation (the same vector formulas as cpu-parallel's fused
pool), so the bias add and activation cost no pass over memory. Output rows are 16-padded too: (B, Np), and the
next layer reads its first N columns (``ld`` below). Threads: runs of MC images go to cpu-parallel's pool of
torch.get_num_threads() threads, each running the nogil kernel.
The sum is fp32 with fused multiply-adds in k order (contract only, no reassociation).
"""

from __future__ import annotations

import threading
from typing import Optional

import numpy as np
import torch

from convforge.conv.cpu_loops import vector_lanes

NR = 16         # outputs per panel: one 16-lane vector
TILES = {16: (12, 2), 8: (6, 1)}   # vector lanes (cpu_loops.vector_lanes) -> (MR images, PR panels) per tile
MR, PR = TILES[vector_lanes()]
KC = 256        # reduction slice: PR panels' slice is KC * PR * NR * 4 = 16 or 32 KiB (L1)
MC = 192        # images per work item: their slice, MC * KC * 4 = 192 KiB, in L2
DENSE_VERSION = 2


def dense_tile(rows: int, act: int, panels: int = 1):
    """The Numba intrinsic ``tile(x, x0, ldx, w, w0, wstep, kc, bias, n0, c, c0, ldc, first, last)`` for MR =
    ``rows`` images and PR = ``panels`` panels: c[c0 + r * ldc + pp * 16 + j] = (first ? bias[n0 + pp * 16 + j]
    : c[...]) + sum over k < kc of x[x0 + r * ldx + k] * w[w0 + pp * wstep + k * 16 + j] for r < rows,
    pp < panels, j < 16, then activation ``act`` when ``last``."""
    key = (rows, act, panels)
    if key not in _TILES:
        from llvmlite import ir
        from numba import types
        from numba.core import cgutils
        from numba.extending import intrinsic
        from convforge.conv.cpu_parallel import vector_activation

        @intrinsic
        def tile(typingctx, x, x0, ldx, w, w0, wstep, kc, bias, n0, c, c0, ldc, first, last):
            sig = types.void(x, x0, ldx, w, w0, wstep, kc, bias, n0, c, c0, ldc, first, last)

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

                xd, wd, bd, cd = data(0), data(3), data(7), data(9)
                x0v, ldxv, w0v, wstepv, kcv, n0v, c0v, ldcv = (as64(i) for i in (1, 2, 4, 5, 6, 8, 10, 11))
                is_first = builder.icmp_signed("!=", as64(12), const(0))
                is_last = builder.icmp_signed("!=", as64(13), const(0))
                rows_x = [builder.add(x0v, builder.mul(ldxv, const(r))) for r in range(rows)]
                rows_c = [[builder.add(c0v, builder.add(builder.mul(ldcv, const(r)), const(pp * NR)))
                           for pp in range(panels)] for r in range(rows)]
                panel_w = [builder.add(w0v, builder.mul(wstepv, const(pp))) for pp in range(panels)]
                starts = [vload(bd, builder.add(n0v, const(pp * NR))) for pp in range(panels)]
                accs = [[cgutils.alloca_once(builder, vec) for _ in range(panels)] for _ in range(rows)]
                for r in range(rows):
                    for pp in range(panels):
                        builder.store(builder.select(is_first, starts[pp], vload(cd, rows_c[r][pp])), accs[r][pp])

                def step(k):
                    # The PR panel vectors, then one broadcast input at a time into PR FMAs (accumulators
                    # + PR + 1 live registers).
                    wvs = [vload(wd, builder.add(panel_w[pp], builder.mul(k, const(NR)))) for pp in range(panels)]
                    for r in range(rows):
                        xs = builder.load(builder.gep(xd, [builder.add(rows_x[r], k)], inbounds=True), align=4)
                        one = builder.insert_element(undef, xs, ir.Constant(i32, 0))
                        xb = builder.shuffle_vector(one, undef, splat_mask)
                        for pp in range(panels):
                            acc = accs[r][pp]
                            builder.store(builder.call(fma, [xb, wvs[pp], builder.load(acc)]), acc)

                unroll = 4
                with cgutils.for_range(builder, builder.sdiv(kcv, const(unroll))) as loop:
                    base = builder.mul(loop.index, const(unroll))
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


def kernel_source(act: int, rows: int = 0, panels: int = 0) -> str:
    """The Numba kernel for activation ``act`` with tiles of ``rows`` images x ``panels`` panels (default
    MR, PR)."""
    R, P = rows or MR, panels or PR
    return f'''"""Generated by convforge.cpu_dense: MR={R}, PR={P}, NR={NR}, KC={KC}, act={act} (v{DENSE_VERSION})."""
from dense_v2 import dense_tile

tile = dense_tile({R}, {act}, {P})
tile_p1 = dense_tile({R}, {act}, 1)
tile1 = dense_tile(1, {act}, 1)


def dense(x, ldx, K, wp, bias, c, ldc, panels, r0, r1):
    """c[r, :panels * 16] = act(x[r, :K] @ W.T + b) for r0 <= r < r1 (x and c flat, row strides ldx, ldc)."""
    wstep = K * {NR}                    # floats from one panel to the next
    for k0 in range(0, K, {KC}):
        kc = min({KC}, K - k0)
        first = 1 if k0 == 0 else 0
        last = 1 if k0 + kc >= K else 0
        p = 0
        while p < panels:
            w0 = (p * K + k0) * {NR}
            r = r0
            if p + {P} <= panels:       # {P} panels at a time, then one at a time for the rest
                while r + {R} <= r1:
                    tile(x, r * ldx + k0, ldx, wp, w0, wstep, kc, bias, p * {NR}, c, r * ldc + p * {NR}, ldc, first, last)
                    r += {R}
                for q in range(p, p + {P}):
                    for rr in range(r, r1):
                        tile1(x, rr * ldx + k0, ldx, wp, (q * K + k0) * {NR}, wstep, kc, bias, q * {NR}, c,
                              rr * ldc + q * {NR}, ldc, first, last)
                p += {P}
            else:
                while r + {R} <= r1:
                    tile_p1(x, r * ldx + k0, ldx, wp, w0, wstep, kc, bias, p * {NR}, c, r * ldc + p * {NR}, ldc, first, last)
                    r += {R}
                while r < r1:
                    tile1(x, r * ldx + k0, ldx, wp, w0, wstep, kc, bias, p * {NR}, c, r * ldc + p * {NR}, ldc, first, last)
                    r += 1
                p += 1
'''


_KERNELS: dict = {}
_LOCK = threading.Lock()


def get_kernel(act: int, rows: int = 0, panels: int = 0):
    from convforge.conv.cpu_loops import jit_generated
    rows, panels = rows or MR, panels or PR
    with _LOCK:
        key = (act, rows, panels)
        if key not in _KERNELS:
            _KERNELS[key] = jit_generated(f"cpu_dense_a{act}_mr{rows}_pr{panels}", kernel_source(act, rows, panels),
                                          "dense", nogil=True, fastmath={"contract"})
        return _KERNELS[key]


def padded(n: int) -> int:
    """Columns of a dense layer's output buffer: ``n`` rounded up to whole panels."""
    return -(-n // NR) * NR


class DenseLayer:
    """A dense layer (weight (N, K), optional bias (N,)) with activation ``activation`` fused, packed once.

    ``__call__(x, ld, out)``: x a float32 NumPy array whose rows hold the K inputs in their first K columns
    (row stride ``ld`` floats), out a C-contiguous (B, padded(N)) float32 array, written completely."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str],
                 tile: Optional[tuple[int, int]] = None):
        from convforge.conv import ACTIVATION_CODES
        if activation not in ACTIVATION_CODES:
            raise ValueError(f"unknown activation {activation!r}")
        n, k = weight.shape
        self.n, self.k, self.np = n, k, padded(n)
        self.panels = self.np // NR
        w = np.zeros((self.np, k), np.float32)
        w[:n] = weight.detach().to(torch.float32).numpy()
        # wp[p, k, j] = W[p * 16 + j, k]
        self.wp = np.ascontiguousarray(w.reshape(self.panels, NR, k).transpose(0, 2, 1)).reshape(-1)
        self.bias = np.zeros(self.np, np.float32)
        if bias is not None:
            self.bias[:n] = bias.detach().to(torch.float32).numpy()
        self.rows, panels = tile or (MR, PR)   # tile: (MR, PR) other than this ISA's (A/B runs, tests)
        self.kernel = get_kernel(ACTIVATION_CODES[activation], self.rows, panels)
        # Compile now (a one-row call of the same types).
        self.kernel(np.zeros(k, np.float32), k, k, self.wp, self.bias, np.empty(self.np, np.float32), self.np,
                    self.panels, 0, 1)

    def __call__(self, x: np.ndarray, ld: int, out: np.ndarray) -> np.ndarray:
        rows = out.shape[0]
        if out.shape != (rows, self.np) or not out.flags.c_contiguous or out.dtype != np.float32:
            raise ValueError(f"out must be a contiguous float32 ({rows}, {self.np}) array")
        if rows == 0:
            return out
        xf, cf = x.reshape(-1), out.reshape(-1)
        if xf.size < (rows - 1) * ld + self.k:
            raise ValueError("x holds fewer rows than out")
        threads = max(1, torch.get_num_threads())
        pieces = max(1, min(-(-rows // self.rows), max(threads, -(-rows // MC))))
        edges = [rows * i // pieces // self.rows * self.rows for i in range(pieces)] + [rows]
        items = [(a, b) for a, b in zip(edges, edges[1:]) if b > a]
        if len(items) == 1 or threads == 1:
            for a, b in items:
                self.kernel(xf, ld, self.k, self.wp, self.bias, cf, self.np, self.panels, a, b)
        else:
            from convforge.conv.cpu_parallel import _pool
            pool = _pool(threads)
            for future in [pool.submit(self.kernel, xf, ld, self.k, self.wp, self.bias, cf, self.np, self.panels,
                                       a, b) for a, b in items]:
                future.result()
        return out
