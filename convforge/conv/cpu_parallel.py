"""cpu-parallel: direct convolution on 16 images at once, one AVX-512 lane per image, Numba, all cores.

Technique: images are taken 16 at a time (one float32 lane of a 512-bit register each) and repacked so
the 16 images' copies of a pixel are adjacent: xp[c, row, col * 16 + lane]. Every output row is then a
perfectly vectorisable sum with no edge cases (any W, any K, 100 % of the lanes in use): for an output
row h, a block of MB maps, each input row (c, h + p) and each output column, K aligned 16-lane loads of
x feed MB x K fused multiply-adds into MB accumulators, with the MB x K weights of (c, p) held in
registers as broadcasts. The kernel is generated per (K, MB) so both are compile-time constants: the q
and map loops are unrolled and the 16-lane loop becomes one zmm operation. MB is at most 25 / K (3 for
7x7, 5 for 5x5), chosen to pad M as little as possible, so the accumulators, K x loads and MB*K weights
fit the 32 vector registers. The accumulators of one output row (Wo x MB x 16 floats) stay in L1 while
its C*K input rows are summed; a band of such rows (up to ACC_BYTES, the whole Ho x Wo plane on every
course layer) is kept and then written back as one run of each (image, map) plane, which is contiguous in
y: 16-float chunks of the flattened plane, so only a plane's last chunk overlaps its neighbour (with
per-row chunks, rows of 18 to 34 floats wrote up to 44 % of their chunks twice) and cache lines fill in
order. The input is repacked the same way, each channel plane flattened. Into and out of the lane layout
is a transpose both ways, done 16 x 16 in registers by a small LLVM intrinsic (transposed_store), twice
as fast as the gathers Numba makes of the scalar loops. Threads: work items (runs of 16-image groups, or
map blocks of a group when the batch is small) go to a pool of torch.get_num_threads() Python threads
running the nogil kernel, rather than a Numba prange: the kernel compiles about 3x faster without the
parfor pass, items are handed out as threads free up (the load balances when other work shares the
cores), and the harness's --threads applies as it does to torch. The sum is fp32, contracted to fused
multiply-adds (``fastmath={'contract'}`` only: rounding once per multiply-add instead of twice; no
reassociation, no approximate functions), within about 5e-7 of the float64 reference on the course
layers.
Course step: the CPU side of the optimisation milestones: loop reordering for SIMD, register tiling,
compile-time kernel sizes and multi-threading, the CPU analogue of the GPU's per-thread output tiles.
Bottleneck: the FMA units for the many-channel layers (the inner loop runs at ~95 % of the 2 x 512-bit
FMA peak on data in L1/L2, the whole layer at 65-85 % with the repacking); for the one-channel first
layers, writing the output (only K*K multiply-adds per output element). At B = 10000 a fresh output's
first-touch page faults cost about as much as the convolution itself on this machine: the output is a
plain torch.empty like torch's own, so both pay them (THP_MEM_ALLOC_ENABLE=1 makes them cheap for both).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import numpy as np
import torch

from convforge.conv import finish_output, output_buffer
from convforge.conv.cpu_loops import check_input, jit_generated

LANES = 16          # float32 lanes of an AVX-512 register = images per group
REGISTER_BUDGET = 25  # MB * K weights kept in registers, about
ACC_BYTES = 256 << 10  # accumulators of one band of output rows (the whole plane on the course layers), in L2


def choose_block(maps: int, kernel: int) -> int:
    """Maps per register block: at most REGISTER_BUDGET // K, the fewest padded maps, then the largest."""
    cap = max(1, min(16, maps, REGISTER_BUDGET // kernel))
    return min(range(1, cap + 1), key=lambda mb: (-(-maps // mb) * mb, -mb))


def transposed_store():
    """The Numba intrinsic ``store_transposed16(src, s0, s_step, dst, d0, d_step)`` (Numba imported here).

    It does dst[d0 + l * d_step + c] = src[s0 + c * s_step + l] for 0 <= l, c < 16: 16 vector loads of
    16 floats, a 16 x 16 transpose in registers (4 rounds of 16 two-register shuffles, each swapping the
    off-diagonal halves of 2^k blocks) and 16 vector stores. Numba has no vector types, and the
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

                def pointers(array_arg, start_arg, step_arg):
                    data = context.make_array(signature.args[array_arg])(context, builder, args[array_arg]).data
                    start = context.cast(builder, args[start_arg], signature.args[start_arg], types.int64)
                    step = context.cast(builder, args[step_arg], signature.args[step_arg], types.int64)
                    offsets = [builder.add(start, builder.mul(step, ir.Constant(i64, n))) for n in range(LANES)]
                    return [builder.bitcast(builder.gep(data, [offset], inbounds=True), vec.as_pointer())
                            for offset in offsets]

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
TRANSPOSE_VERSION = 1  # part of the generated source, so a change here recompiles the cached kernels


def kernel_source(kernel: int, block: int) -> str:
    """Python source of the Numba kernel for K = ``kernel`` and MB = ``block`` (both baked in)."""
    K, MB, L, ACC_FLOATS = kernel, block, LANES, ACC_BYTES // 4
    weights = "; ".join(f"w{m}_{q} = w[m0 + {m}, c, p, {q}]" for m in range(MB) for q in range(K))
    loads_x = "; ".join(f"x{q} = xr[j + {L * q}]" for q in range(K))
    loads_a = "; ".join(f"s{m} = ar[i + {L * m}]" for m in range(MB))
    sums = "\n".join(" " * 36 + f"s{m} = s{m} + " + " + ".join(f"x{q} * w{m}_{q}" for q in range(K))
                     for m in range(MB))
    stores = "; ".join(f"ar[i + {L * m}] = s{m}" for m in range(MB))
    return f'''"""Generated by convforge.conv.cpu_parallel for K={K}, MB={MB} (transpose v{TRANSPOSE_VERSION})."""
import numpy as np

from convforge.conv.cpu_parallel import transposed_store

store_transposed16 = transposed_store()


def conv(x, w, bias, y, M, g0, g1, mb0, mb1):
    """y[b, m] for the 16-image groups g0 <= g < g1 and map blocks mb0 <= mb < mb1 ({MB} maps each)."""
    B, C, H, W = x.shape
    Ho = H - {K} + 1
    Wo = W - {K} + 1
    plane = max(Ho, 0) * max(Wo, 0)               # floats of one (image, map) output plane
    nx = C * H * W * {L}
    nr = max(Wo, 1) * {MB * L}                    # accumulators of one output row block
    band = max(1, min(Ho, max(-(-{L} // max(Wo, 1)), {ACC_FLOATS} // nr)))  # output rows per band
    na = band * nr
    buf = np.empty(nx + na + {L}, np.float32)
    o = (-(buf.ctypes.data >> 2)) & {L - 1}       # 64-byte aligned: whole-cache-line vector loads
    xp = buf[o:o + nx].reshape((C, H, W * {L}))   # xp[c, r, col * 16 + lane] = x[b0 + lane, c, r, col]
    acc = buf[o + nx:o + nx + na]                 # acc[((h - h0) * Wo + col) * MB + mm) * 16 + lane]: a band
    xf = x.reshape(-1)
    yf = y.reshape(-1)
    image = C * H * W                             # floats from one image to the next, in x and in y
    out_image = M * plane
    last_in = max(H * W - {L}, 0)                 # 16-float chunks of a plane; the last one ends at the
    for g in range(g0, g1):                       # plane's end, overlapping its neighbour (same values)
        b0 = g * {L}
        nb = min({L}, B - b0)
        if nb == {L} and H * W >= {L}:
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
        for mb in range(mb0, mb1):
            m0 = mb * {MB}
            for h0 in range(0, Ho, band):
                h1 = min(h0 + band, Ho)
                for h in range(h0, h1):
                    ar = acc[(h - h0) * nr:(h - h0 + 1) * nr]
                    for jj in range(Wo):
                        for mm in range({MB}):
                            bv = bias[m0 + mm]
                            for lane in range({L}):
                                ar[(jj * {MB} + mm) * {L} + lane] = bv
                    for c in range(C):
                        for p in range({K}):
                            xr = xp[c, h + p]
                            {weights}
                            for jj in range(Wo):
                                for lane in range({L}):
                                    j = jj * {L} + lane
                                    i = jj * {MB * L} + lane
                                    {loads_x}
                                    {loads_a}
{sums}
                                    {stores}
                # Back to y's layout, the band's rows as one run of each (image, map) plane; nothing else
                # sits in the (c, p) loops: any further loop there makes LLVM spill the weight broadcasts.
                run = (h1 - h0) * Wo
                for mm in range(min({MB}, M - m0)):
                    first = (b0 * M + m0 + mm) * plane + h0 * Wo
                    if nb == {L} and run >= {L}:
                        for v in range((run + {L - 1}) // {L}):
                            c0 = min(v * {L}, run - {L})
                            store_transposed16(acc, (c0 * {MB} + mm) * {L}, {MB * L}, yf, first + c0, out_image)
                    else:
                        for lane in range(nb):
                            dst = first + lane * out_image
                            for i in range(run):
                                yf[dst + i] = acc[(i * {MB} + mm) * {L} + lane]
'''


_KERNELS: dict = {}
_LOCK = threading.Lock()


def get_kernel(kernel: int, block: int):
    """The compiled kernel for (K, MB), compiled (or loaded from the disk cache) once per process."""
    with _LOCK:
        key = (kernel, block)
        if key not in _KERNELS:
            _KERNELS[key] = jit_generated(f"cpu_parallel_k{kernel}_mb{block}", kernel_source(kernel, block),
                                          "conv", nogil=True, fastmath={"contract"})
        return _KERNELS[key]


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


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
    maps, channels, kernel, kernel_w = weight.shape
    if kernel != kernel_w:
        raise ValueError(f"square kernels only, got {kernel}x{kernel_w}")
    block = choose_block(maps, kernel)
    padded = -(-maps // block) * block  # maps rounded up to whole blocks: zero weights, never written out
    w = np.zeros((padded, channels, kernel, kernel), np.float32)
    w[:maps] = weight.detach().to(torch.float32).numpy()
    b = np.zeros(padded, np.float32)
    if bias is not None:
        b[:maps] = bias.detach().to(torch.float32).numpy()
    fn = get_kernel(kernel, block)
    blocks = padded // block
    # Compile now (a one-image call of the same types), so the first timed call runs compiled code.
    fn(np.zeros((1, channels, kernel, kernel), np.float32), w, b, np.empty((1, maps, 1, 1), np.float32),
       maps, 0, 1, 0, blocks)

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        xn, shape = check_input(x, weight.shape)
        target, result = output_buffer(out, shape, x)
        if shape[0] == 0:
            return finish_output(target, result)
        y = target.numpy()
        groups = -(-shape[0] // LANES)
        items = work_items(groups, blocks, max(1, torch.get_num_threads()))
        if len(items) == 1:
            fn(xn, w, b, y, maps, *items[0])
        elif items:
            for future in [_pool(torch.get_num_threads()).submit(fn, xn, w, b, y, maps, *item) for item in items]:
                future.result()
        return finish_output(target, result)

    return run
