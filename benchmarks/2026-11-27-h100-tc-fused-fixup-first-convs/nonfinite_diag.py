"""Why the rows kernel's fix-up leaves Toeplitz NaNs on a GPU: a bare probe kernel, then the rows kernel launched by
hand (the prepared closure's own buffers): its flag, its output before and after _rows_fixup, and the probe's PTX.
Usage: PYTHONPATH=. python3 nonfinite_diag.py OUTDIR"""
import sys

import torch
import triton
import triton.language as tl

from convforge.conv import triton_tc_fused as t


@triton.jit
def _probe(x_ptr, y_ptr, N: tl.constexpr):
    v = tl.load(x_ptr + tl.arange(0, N))
    bits = v.to(tl.int32, bitcast=True) & 0x7F800000
    tl.store(y_ptr + tl.arange(0, N), bits)
    tl.store(y_ptr + N, tl.max(bits, 0))


v = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")] + [0.5] * 12, device="cuda")
y = torch.zeros(17, dtype=torch.int32, device="cuda")
_probe[(1,)](v, y, N=16)
print("bare probe:", y.tolist())

g = torch.Generator().manual_seed(9)
x = (torch.rand((1, 3, 13, 13), generator=g) * 2 - 1).cuda()
w = (torch.randn((5, 3, 3, 3), generator=g) * 0.3).cuda()
b = torch.randn(5, generator=g).cuda()
x[0, 1, 4, 6] = float("nan")
fn = t.prepare(w, b)
out = fn(x)
cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__)))
print("closure:", sorted(cells))
flags = cells["probe_buffers"]
print("flags after a call:", {k: v.tolist() for k, v in flags.items()})
constants, fixup = next(iter(cells["launches"].values()))
print("constants:", constants)
ys = torch.full_like(out, -7.0)
flag = torch.full((1,), 5.0, device="cuda")
k = t._rows_kernel[(1,)](x, cells["packed"], cells["packed_bias"], ys, flag, 1, **constants)
torch.cuda.synchronize()
print("rows kernel alone: flag", flag.tolist(), "NaN outputs", int(torch.isnan(ys).sum()), "of", ys.numel())
t._rows_fixup[(1,)](x, cells["exact"], cells["packed_bias"], ys, flag.view(torch.int32), 1, **fixup)
torch.cuda.synchronize()
print("after the fix-up: NaN outputs", int(torch.isnan(ys).sum()))
flag.fill_(float("nan"))
t._rows_fixup[(1,)](x, cells["exact"], cells["packed_bias"], ys, flag.view(torch.int32), 1, **fixup)
torch.cuda.synchronize()
print("after a forced fix-up: NaN outputs", int(torch.isnan(ys).sum()), "positions",
      torch.isnan(ys).nonzero().tolist()[:12])
ptx = k.asm["ptx"]
open(sys.argv[1] + "/rows_kernel.ptx", "w").write(ptx)
print("ptx lines with 2139095040:", len([l for l in ptx.splitlines() if "2139095040" in l]))
