"""Is torch.compile's wrong answer on the GPU (fuzzing: B=M=C=1, 3x3 input, 3x3 kernel, bias, an input view with a
storage offset) about the offset? torch.compile (max-autotune-no-cudagraphs, as the torch-compile entry) against
F.conv2d on contiguous and offset inputs of a few shapes, then the entry itself. Run with the entry copying offset
views first (the fix this probe was to confirm); the one-pixel case failed contiguous too, so that copy was dropped."""
import torch
import torch.nn.functional as F

from convforge.conv import torch_compile
from convforge.conv.torch_conv import exact_fp32

exact_fp32()
torch.manual_seed(0)
for (C, M, H, K) in ((1, 1, 3, 3), (1, 1, 5, 3), (2, 3, 7, 3), (3, 4, 9, 5)):
    w, b = torch.randn(M, C, K, K, device="cuda"), torch.randn(M, device="cuda")
    fn = torch.compile(lambda x, w=w, b=b: F.conv2d(x, w, b), mode="max-autotune-no-cudagraphs", dynamic=False)
    entry = torch_compile.prepare(w, b)
    for view in ("contiguous", "offset"):
        wrong = []
        for trial in range(4):
            n = C * H * H
            storage = torch.randn(n + 1, device="cuda")
            x = (storage[1:] if view == "offset" else storage[:n]).view(1, C, H, H)
            want = F.conv2d(x, w, b)
            wrong.append((float((fn(x) - want).abs().max()), float((entry(x) - want).abs().max())))
        print(f"C={C} M={M} H={H} K={K} {view:10s} torch.compile max|err| {[f'{a:.2g}' for a, _ in wrong]}  "
              f"entry {[f'{e:.2g}' for _, e in wrong]}", flush=True)
