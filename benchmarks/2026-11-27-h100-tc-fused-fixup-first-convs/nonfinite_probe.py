"""The rows kernel's non-finite handling on one case (tests/test_triton.py's): NaN/Inf positions of triton-tc-fused
against torch's float64 conv, with the fix-up flags. Usage: PYTHONPATH=. python3 nonfinite_probe.py"""
import torch
import torch.nn.functional as F

from convforge import conv

impl = conv.get("triton-tc-fused")
g = torch.Generator().manual_seed(9)
x = (torch.rand((1, 3, 13, 13), generator=g) * 2 - 1).cuda()
w = (torch.randn((5, 3, 3, 3), generator=g) * 0.3).cuda()
b = torch.randn(5, generator=g).cuda()
for value in (float("nan"), float("inf")):
    x[0, 1, 4, 6] = value
    want = F.conv2d(x.double(), w.double(), b.double())
    got = impl.prepare(w, b)(x).double()
    for test in (torch.isnan, torch.isposinf, torch.isneginf):
        extra = (test(got) & ~test(want)).nonzero().tolist()
        missing = (~test(got) & test(want)).nonzero().tolist()
        print(value, test.__name__, "extra", extra[:6], "missing", missing[:6])
