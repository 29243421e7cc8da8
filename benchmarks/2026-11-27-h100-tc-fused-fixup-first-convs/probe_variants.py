"""Which in-kernel probe sees the rows kernel's Toeplitz NaNs on a GPU: copies of _rows_kernel's body (the module's
own helpers) with the probe taken A) on the pooled 3D block (as shipped at the time), B) on the 2D accumulator,
C) the accumulator's exponent bits dumped whole, D) a float sum of acc * 0 stored as is.
Usage: PYTHONPATH=. python3 probe_variants.py"""
import torch
import triton
import triton.language as tl

from convforge.conv import triton_tc_fused as t


@triton.jit
def _exponent_bits(v):
    """As the kernel had it in calls 4-5: v's exponent field, all ones (0x7F800000) for +-Inf and NaN only."""
    return v.to(tl.int32, bitcast=True) & 0x7F800000


@triton.jit
def _variant(x_ptr, w_ptr, b_ptr, y_ptr, flag_ptr, dump_ptr, fsum_ptr, B, C: tl.constexpr, H: tl.constexpr,
             W: tl.constexpr, K: tl.constexpr, M: tl.constexpr, MP: tl.constexpr, UC: tl.constexpr, TW: tl.constexpr,
             P: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, BLOCK_R: tl.constexpr,
             BLOCK_K: tl.constexpr, ROW_MASK: tl.constexpr, MODE: tl.constexpr):
    HP: tl.constexpr = (H - K + 1) // P
    WP: tl.constexpr = (W - K + 1) // P
    NCB: tl.constexpr = (WP * P + UC - 1) // UC
    BG: tl.constexpr = BLOCK_R // P
    UP: tl.constexpr = UC // P
    N: tl.constexpr = UC * MP
    KRED: tl.constexpr = C * K * TW
    FULL: tl.constexpr = KRED // BLOCK_K
    x_base, w0 = t._rows_place(B, H, W, C, HP, NCB, UC, P, BLOCK_R)
    acc = tl.zeros([BLOCK_R, N], dtype=tl.float32)
    for step in range(FULL):
        acc = t._rows_step(x_ptr, w_ptr, x_base, w0, acc, step * BLOCK_K, K, H, W, TW, KRED, N, BLOCK_K, False,
                           ROW_MASK)
    if KRED % BLOCK_K != 0:
        acc = t._rows_step(x_ptr, w_ptr, x_base, w0, acc, FULL * BLOCK_K, K, H, W, TW, KRED, N, BLOCK_K, True,
                           ROW_MASK)
    if MODE == 1:
        e = tl.max(tl.max(_exponent_bits(acc), 1), 0)
        tl.store(flag_ptr + tl.program_id(0), (e == 0x7F800000).to(tl.int8))
    if MODE == 2:
        r = tl.arange(0, BLOCK_R)
        n = tl.arange(0, N)
        tl.store(dump_ptr + r[:, None] * N + n[None, :], _exponent_bits(acc))
    if MODE == 3:
        tl.store(fsum_ptr + tl.program_id(0), tl.sum(tl.sum(acc * 0.0, 1), 0))
    best = t._rows_pool(acc, P, BG, UP, MP)
    if MODE == 0:
        e = tl.max(tl.max(tl.max(_exponent_bits(best), 2), 1), 0)
        tl.store(flag_ptr + tl.program_id(0), (e == 0x7F800000).to(tl.int8))
    t._rows_store(best, b_ptr, y_ptr, B, M, MP, HP, WP, NCB, UP, BG, HAS_BIAS, ACT)


g = torch.Generator().manual_seed(9)
x = (torch.rand((1, 3, 13, 13), generator=g) * 2 - 1).cuda()
w = (torch.randn((5, 3, 3, 3), generator=g) * 0.3).cuda()
b = torch.randn(5, generator=g).cuda()
x[0, 1, 4, 6] = float("nan")
fn = t.prepare(w, b)
out = fn(x)
cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__)))
constants, _ = next(iter(cells["launches"].values()))
n_cols = constants["UC"] * constants["MP"]
for mode in range(4):
    ys = torch.full_like(out, -7.0)
    flag = torch.full((1,), 5, dtype=torch.int8, device="cuda")
    dump = torch.zeros((constants["BLOCK_R"], n_cols), dtype=torch.int32, device="cuda")
    fsum = torch.full((1,), -7.0, device="cuda")
    _variant[(1,)](x, cells["packed"], cells["packed_bias"], ys, flag, dump, fsum, 1, MODE=mode, **constants)
    torch.cuda.synchronize()
    print(f"mode {mode}: flag {flag.tolist()} NaN outputs {int(torch.isnan(ys).sum())} "
          f"dumped non-finite {int((dump == 0x7F800000).sum())} fsum {fsum.tolist()}", flush=True)
