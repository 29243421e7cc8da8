"""cpu-winograd: Winograd F(m, K) along each row, 16 images a vector, Numba with LLVM intrinsics, all cores.

Technique: the minimal-filtering algorithm (Winograd; Lavin and Gray's "Fast Algorithms for Convolutional Neural
Networks") in one dimension. For m outputs of a row the K taps of kernel row p become n = m + K - 1 products:
y[map, h, w0 + a] = sum_xi AT[a, xi] * sum_(c, p) U[xi, map, c, p] * V[xi, c, h + p], with V[xi, c, h] = sum_k BT[xi, k]
* x[c, h, w0 + k] (input transform), U = G . w along q (weights, once, in float64) and AT the output transform
(Toom-Cook matrices from the points 0, +-1, +-2, +-1/2, 3, -3). So the layer's C * K * K multiply-adds per
output become C * K * n / m: for K = 7 (m = 3) 21 of 49 (2.3x fewer), for K = 5 (m = 5) 9 of 25. The middle
sum is, for each xi, a convolution of 1 x K taps along h over the transformed input, run by cpu-parallel's
register tile (tile_kernel with rows=1: 16 images a vector, TW outputs x MB maps in registers over the whole
C * K reduction) writing straight into a scratch of products; the transforms are LLVM intrinsics over 16-lane
vectors (Numba vectorises innermost loops only). It reads and writes cpu-parallel's lane layout (x[g, c, h, w,
lane], y[g, m, h, w, lane]), which is how the CPU engine passes maps between layers; the registry entry wraps
it with transposes. Per group of 16 images and column tile the scratch (transformed input and products, under
1 MB on the course layers) stays in L2. 2-D Winograd F(2x2, 7x7) measured 3.1e-6 relative to float64 on fa18's
second layer against 1.9e-6 for this 1-D F(3, 7) and 6e-7 for direct fp32 sums (numpy emulation); the 2-D form
saves more multiply-adds but spends a third of them on transforms of overlapping 8 x 8 tiles.
Range: the transforms scale values by up to ~2^7 and the points' fractions divide them, so a group whose images'
largest |x| is outside 2^-RANGE..2^RANGE, or holds Inf or NaN, is computed again by cpu-parallel's direct
kernel (torch's Inf/NaN positions, and a subnormal's bits: a transform spreads one Inf over a tile's m outputs
as NaN). The input transform tracks both per lane as it reads x, so no extra pass; weights outside the range
take the direct kernel at prepare.
Course step: none; beyond the course (whose steps are direct and unrolled convolutions), the CPU analogue of
cuDNN's WINOGRAD algorithm, and the same register tiles and thread pool as cpu-parallel.
Bottleneck: the FMA units in the products (C * K * n / m per output row and map); the transforms add about
n * n per input and m * n per output element.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from convforge.conv import finish_output, output_buffer
from convforge.conv import cpu_parallel as direct
from convforge.conv.cpu_loops import check_input, jit_generated

LANES = direct.LANES
POINTS = (0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0)   # Toom-Cook points, the infinite one implied
RANGE = 40          # |x| and |w| within 2^-RANGE..2^RANGE take the Winograd path (module header)
MAX_POINTS = len(POINTS) + 1


def outputs_per_tile(kernel: int) -> int:
    """m with n = m + K - 1 = 9 points (at most 6 outputs): K = 7 takes F(3, 7), K = 5 F(5, 5). Measured on
    2 threads at B = 2048, idle machine (benchmarks/2026-11-27-cpu-winograd-second-convs, ab_layers.txt), ms:
    fa18's 7x7 layer direct 194, m = 2 / 3 / 4: 150 / 110 / 100; fa19's 5x5 layer direct 114, m = 2 / 4 / 5:
    105 / 77 / 68. Each point past eight costs accuracy (the ninth is 3, the tenth -3): fa18 1.3e-6 (m = 3) and
    2.3e-6 (m = 4), fa19 1.2e-6 (m = 5) against 3-6e-7 for direct sums; m = 4 on 7x7 (10 points) was left out
    for that."""
    return max(1, min(6, MAX_POINTS - kernel))


def toom_cook(m: int, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(AT (m x n), G (n x r), BT (n x n)) in float64 for F(m, r), correlation form: for any d (n) and g (r),
    AT @ ((G @ g) * (BT @ d)) == [sum_k g[k] * d[i + k] for i < m]."""
    n = m + r - 1
    if m == 1:                   # one output: the direct sum (n = r products), no transform
        return np.ones((1, n)), np.eye(n), np.eye(n)
    points = POINTS[:n - 1]
    AT, G = np.zeros((m, n)), np.zeros((n, r))
    for j, a in enumerate(points):
        f = np.prod([a - b for b in points if b != a])
        AT[:, j] = [a ** i for i in range(m)]
        G[j] = [a ** k / f for k in range(r)]
    AT[m - 1, n - 1] = G[n - 1, r - 1] = 1.0        # the point at infinity
    # BT solves the identity's m * r * n linear equations (unique for distinct points).
    rows, rhs = [], []
    for i in range(m):
        for k in range(r):
            for t in range(n):
                coef = np.zeros((n, n))
                coef[:, t] = AT[i] * G[:, k]
                rows.append(coef.ravel())
                rhs.append(1.0 if t == i + k else 0.0)
    BT = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)[0].reshape(n, n)
    BT = np.where(np.abs(BT - np.round(BT * 64) / 64) < 1e-9, np.round(BT * 64) / 64, BT)   # exact dyadics
    assert np.allclose(np.array(rows) @ BT.ravel(), rhs, atol=1e-9), (m, r)
    return AT, G, BT


def transform_kernel(matrix: np.ndarray, kind: str):
    """The Numba intrinsic for ``out_i = sum_k matrix[i, k] * v_k`` over 16-lane vectors, the matrix baked in
    (zero terms skipped, +-1 as adds). ``kind`` "input": ``(src, s0, sstep, dst, d0, dstep, flags, f0)`` reads
    v_k = src[s0 + k * sstep ...], stores every out_i to dst[d0 + i * dstep ...], and marks per lane in
    flags[f0 ...] any |v| above 2^RANGE or NaN and in flags[f0 + 16 ...] any |v| of at least 2^-RANGE.
    ``kind`` "output": ``(src, s0, sstep, dst, d0, dstep, valid, bias, b0)`` adds bias[b0] and stores out_i for
    i < valid only."""
    key = (kind, matrix.shape, matrix.tobytes())
    if key in _TRANSFORMS:
        return _TRANSFORMS[key]
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic
    rows_out, taps = matrix.shape
    coefficients = [[float(np.float32(c)) for c in row] for row in matrix]

    def transform(typingctx, src, s0, sstep, dst, d0, dstep, *rest):
        sig = types.void(src, s0, sstep, dst, d0, dstep, *rest)

        def codegen(context, builder, signature, args):
            cg = direct.VectorCodegen(context, builder, signature, args, LANES)
            i64, vec, vptr, fma, data, as64 = cg.i64, cg.vec, cg.vptr, cg.fma, cg.data, cg.as64
            fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec]),
                                                  f"llvm.fabs.v{LANES}f32")

            def splat(value):
                return ir.Constant(vec, [value] * LANES)

            def at(base, offset):
                return builder.bitcast(builder.gep(base, [offset], inbounds=True), vptr)

            src_data, dst_data = data(0), data(3)
            s0v, sstepv, d0v, dstepv = as64(1), as64(2), as64(4), as64(5)
            vs = [builder.load(at(src_data, builder.add(s0v, builder.mul(sstepv, ir.Constant(i64, k)))), align=4)
                  for k in range(taps)]
            outs = []
            for row in coefficients:
                total = None
                for coef, v in zip(row, vs):
                    if coef == 0.0:
                        continue
                    if total is None:
                        total = v if coef == 1.0 else builder.fneg(v) if coef == -1.0 else builder.fmul(v, splat(coef))
                    elif coef == 1.0:
                        total = builder.fadd(total, v)
                    elif coef == -1.0:
                        total = builder.fsub(total, v)
                    else:
                        total = builder.call(fma, [v, splat(coef), total])
                outs.append(total if total is not None else splat(0.0))
            if kind == "input":
                flags = data(6)
                f0 = as64(7)
                bad_ptr, big_ptr = at(flags, f0), at(flags, builder.add(f0, ir.Constant(i64, LANES)))
                bad = big = None
                for v in vs:
                    a = builder.call(fabs, [v])
                    over = builder.fcmp_unordered(">", a, splat(2.0 ** RANGE))     # NaN counts as over
                    some = builder.fcmp_ordered(">=", a, splat(2.0 ** -RANGE))
                    bad = over if bad is None else builder.or_(bad, over)
                    big = some if big is None else builder.or_(big, some)
                builder.store(builder.select(bad, splat(1.0), builder.load(bad_ptr, align=4)), bad_ptr, align=4)
                builder.store(builder.select(big, splat(1.0), builder.load(big_ptr, align=4)), big_ptr, align=4)
                for i, out in enumerate(outs):
                    builder.store(out, at(dst_data, builder.add(d0v, builder.mul(dstepv, ir.Constant(i64, i)))),
                                  align=4)
            else:
                valid = as64(6)
                bias_vec = cg.splat(builder.gep(data(7), [as64(8)], inbounds=True))
                for i, out in enumerate(outs):
                    with cgutils.if_likely(builder, builder.icmp_signed("<", ir.Constant(i64, i), valid)):
                        builder.store(builder.fadd(out, bias_vec),
                                      at(dst_data, builder.add(d0v, builder.mul(dstepv, ir.Constant(i64, i)))),
                                      align=4)
            return context.get_dummy_value()

        return sig, codegen

    if kind == "input":
        def input_transform(typingctx, src, s0, sstep, dst, d0, dstep, flags, f0):
            return transform(typingctx, src, s0, sstep, dst, d0, dstep, flags, f0)
        _TRANSFORMS[key] = intrinsic(input_transform)
    else:
        def output_transform(typingctx, src, s0, sstep, dst, d0, dstep, valid, bias, b0):
            return transform(typingctx, src, s0, sstep, dst, d0, dstep, valid, bias, b0)
        _TRANSFORMS[key] = intrinsic(output_transform)
    return _TRANSFORMS[key]


_TRANSFORMS: dict = {}
TRANSFORM_VERSION = 1   # part of the generated source: a change here recompiles the cached kernels


def kernel_source(kernel: int, m: int, block: int, width: int, vector: int) -> str:
    """Python source of the Numba kernel for K = ``kernel``, m outputs a tile, MB = ``block`` maps and TW =
    ``width`` columns in the register tile, ``vector`` lanes a tile call; x and y in the lane layout."""
    K, MB, TW, V, L = kernel, block, width, vector, LANES
    n = m + K - 1
    remainder = "".join(f'''
                    {"if" if r == 1 else "elif"} Ho % {TW} == {r}:
                        for s in range(0, {L}, {V}):
                            tile_r{r}(v, (xi * C * H + Ho - {r}) * {L} + s, 0, H * {L}, C, u, uo, zeros, 0, mx,
                                      ((xi * Mp + m0) * Ho + Ho - {r}) * {L} + s, {L}, Ho * {L}, valid)'''
                        for r in range(1, TW))
    return f'''"""Generated by convforge.conv.cpu_winograd for K={K}, m={m}, MB={MB}, TW={TW}, vector={V} (transforms v{TRANSFORM_VERSION}, range 2^{RANGE}, tile v{direct.TILE_VERSION})."""
import numpy as np

from convforge.conv.cpu_parallel import tile_kernel
from convforge.conv.cpu_winograd import toom_cook, transform_kernel

AT, G, BT = toom_cook({m}, {K})
input_tf = transform_kernel(BT, "input")
output_tf = transform_kernel(AT, "output")
tile = tile_kernel({K}, {MB}, {TW}, {V}, True, 1)
{"".join(f"tile_r{r} = tile_kernel({K}, {MB}, {r}, {V}, True, 1)" + chr(10) for r in range(1, TW))}

def conv(x, u, zeros, bias, y, flags, M, g0, g1):
    """y[g] for the 16-image groups g0 <= g < g1, x and y in the lane layout; flags[g] the range marks."""
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    Ho = H - {K} + 1
    Wo = W - {K} + 1
    T = (Wo + {m - 1}) // {m}                     # column tiles of {m} outputs
    Mp = zeros.shape[0]                           # maps padded to whole blocks of {MB}
    nv = {n} * C * H * {L}                        # v[xi, c, h, lane]: one column tile's transformed input
    nm = {n} * Mp * Ho * {L}                      # mx[xi, map, h, lane]: its products
    buf = np.empty(nv + nm + {n * L} + {2 * L}, np.float32)
    o = (-(buf.ctypes.data >> 2)) & {L - 1}       # 64-byte aligned: whole-cache-line vectors
    v = buf[o:o + nv]
    mx = buf[o + nv:o + nv + nm]
    edge = buf[o + nv + nm:o + nv + nm + {n * L}]  # a row's last tile, zero past W
    xf = x.reshape(-1)
    yf = y.reshape(-1)
    ff = flags.reshape(-1)
    per_xi = C * {K * MB}                         # packed weights of one (xi, map block)
    for g in range(g0, g1):
        for tx in range(T):
            w0 = tx * {m}
            for c in range(C):
                for h in range(H):
                    s = (((g * C + c) * H + h) * W + w0) * {L}
                    if w0 + {n} <= W:
                        input_tf(xf, s, {L}, v, (c * H + h) * {L}, C * H * {L}, ff, g * {2 * L})
                    else:
                        edge[:] = 0.0
                        for e in range((W - w0) * {L}):
                            edge[e] = xf[s + e]
                        input_tf(edge, 0, {L}, v, (c * H + h) * {L}, C * H * {L}, ff, g * {2 * L})
            for xi in range({n}):
                for m0 in range(0, M, {MB}):
                    uo = (xi * Mp + m0) * per_xi // {MB}
                    valid = min({MB}, M - m0)
                    for t in range(Ho // {TW}):
                        for s in range(0, {L}, {V}):
                            tile(v, (xi * C * H + t * {TW}) * {L} + s, 0, H * {L}, C, u, uo, zeros, 0, mx,
                                 ((xi * Mp + m0) * Ho + t * {TW}) * {L} + s, {L}, Ho * {L}, valid){remainder}
            valid = min({m}, Wo - w0)
            for mm in range(M):
                for h in range(Ho):
                    output_tf(mx, (mm * Ho + h) * {L}, Mp * Ho * {L}, yf, (((g * M + mm) * Ho + h) * Wo + w0) * {L},
                              {L}, valid, bias, mm)
'''


_KERNELS: dict = {}


def get_kernel(kernel: int, m: int, block: int, width: int, vector: int):
    key = (kernel, m, block, width, vector)
    with direct._LOCK:
        if key not in _KERNELS:
            source = kernel_source(*key)
            _KERNELS[key] = jit_generated(f"cpu_winograd_k{kernel}_m{m}_mb{block}_tw{width}_v{vector}", source,
                                          "conv", nogil=True, fastmath={"contract"})
        return _KERNELS[key]


def pack_weights(weight: np.ndarray, G: np.ndarray, block: int) -> np.ndarray:
    """U = G . w along q, in float64, packed for the tile: u[((xi * Mp + m0) / MB * C + c) * K + p) * MB + mm]."""
    maps, channels, kernel, _ = weight.shape
    padded = -(-maps // block) * block
    U = np.einsum("xq,mcpq->xmcp", G, weight.astype(np.float64))         # (n, M, C, K)
    full = np.zeros((G.shape[0], padded, channels, kernel))
    full[:, :maps] = U
    blocks = full.reshape(G.shape[0], padded // block, block, channels, kernel).transpose(0, 1, 3, 4, 2)
    return np.ascontiguousarray(blocks, dtype=np.float32).reshape(-1)


def serves(weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> bool:
    """Whether the Winograd kernel takes this layer: square 2x2 to 8x8 kernels (larger ones would need more
    points than POINTS, or m = 1, no saving), finite weights within the range, a finite bias."""
    kernel, kernel_w = weight.shape[2:]
    return kernel == kernel_w and 2 <= kernel <= MAX_POINTS - 2 and in_range(weight) \
        and (bias is None or bool(torch.isfinite(bias).all()))


def in_range(t: torch.Tensor) -> bool:
    largest = float(t.detach().abs().max()) if t.numel() else 0.0
    return bool(torch.isfinite(t).all()) and 2.0 ** -RANGE <= largest <= 2.0 ** RANGE


def prepare_lanes(weight: torch.Tensor, bias: Optional[torch.Tensor], lanes_in: bool = True,
                  lanes_out: bool = True, config=None, raw_input: bool = False):
    """As cpu_parallel.prepare_lanes for x and y both in the lane layout: ``fn(x, out, rows)``. ``config``:
    (m, MB, TW[, vector lanes]) instead of outputs_per_tile's, choose_block's, choose_width's and VECTOR."""
    if not (lanes_in and lanes_out) or raw_input:
        raise ValueError("cpu-winograd reads and writes the lane layout only (lanes_in and lanes_out)")
    maps, channels, kernel, kernel_w = weight.shape
    if kernel != kernel_w:
        raise ValueError(f"square kernels only, got {kernel}x{kernel_w}")
    fallback = direct.prepare_lanes(weight, bias, True, True)
    if not serves(weight, bias):
        return fallback    # the transforms would lose or overflow these weights: the direct kernel serves
    m, block, width, vector = (tuple(config) + (None,) * 4)[:4] if config else (None,) * 4
    m = m or outputs_per_tile(kernel)
    block = block or direct.choose_block(maps, kernel)
    width = width or direct.choose_width(block)
    vector = vector or direct.VECTOR
    _, G, _ = toom_cook(m, kernel)
    u = pack_weights(weight.detach().to(torch.float32).numpy(), G, block)
    padded = -(-maps // block) * block
    zeros = np.zeros(padded, np.float32)
    b = np.zeros(maps, np.float32)
    if bias is not None:
        b[:] = bias.detach().to(torch.float32).numpy()
    fn = get_kernel(kernel, m, block, width, vector)
    probe = np.zeros((1, 2, LANES), np.float32)
    fn(np.zeros(direct.lane_shape(1, (channels, kernel, kernel)), np.float32), u, zeros, b,
       np.empty(direct.lane_shape(1, (maps, 1, 1)), np.float32), probe, maps, 0, 1)   # compile now

    def run_lanes(x: torch.Tensor, out: torch.Tensor, rows: int) -> torch.Tensor:
        groups = -(-rows // LANES)
        if x.dim() != 5 or x.shape[0] < groups or x.shape[1] != channels or x.shape[4] != LANES:
            raise ValueError(f"x must be a lane-layout ({groups}, {channels}, H, W, {LANES}) tensor, got "
                             f"{tuple(x.shape)}")
        height, width_in = x.shape[2], x.shape[3]
        if height < kernel or width_in < kernel:
            raise ValueError(f"a {kernel}x{kernel} kernel does not fit a {height}x{width_in} input")
        want = direct.lane_shape(rows, (maps, height - kernel + 1, width_in - kernel + 1))
        if tuple(out.shape) != want or out.dtype != torch.float32 or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous float32 {want} tensor, got {out.dtype} {tuple(out.shape)}")
        if not rows:
            return out
        xn = x[:groups].contiguous().numpy()
        flags = np.zeros((groups, 2, LANES), np.float32)
        direct._run_items(fn, (xn, u, zeros, b, out.numpy(), flags, maps),
                          [item[:2] for item in direct.work_items(groups, 1, max(1, torch.get_num_threads()))])
        lanes = np.arange(LANES)[None, :] < (rows - np.arange(groups) * LANES)[:, None]   # images, not padding
        redo = np.nonzero(((flags[:, 0] != 0) | (flags[:, 1] == 0)) & lanes)[0]
        if redo.size:
            fallback(x, out, rows, groups=sorted(set(redo.tolist())))
        return out

    return run_lanes


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, config=None):
    """NCHW in and out (the registry's contract): the lane-layout kernel between two transposes."""
    lanes = prepare_lanes(weight, bias, config=config)

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        xn, shape = check_input(x, weight.shape)
        target, result = output_buffer(out, shape, x)
        if shape[0]:
            y = torch.empty(direct.lane_shape(shape[0], shape[1:]))
            lanes(direct.to_lanes(torch.from_numpy(xn)), y, shape[0])
            target.copy_(direct.from_lanes(y, shape[0]))
        return finish_output(target, result)

    return run
