"""Host time per call (no synchronisation) of a few implementations on sp19 L1 at B = 1, and a cProfile of cuda-direct's call (dev tool)."""
import cProfile, pstats, time, io
import torch
from convforge import conv
x = torch.rand(1, 1, 48, 48, device="cuda") * 255
w = torch.randn(6, 1, 5, 5, device="cuda") * 0.05
b = torch.randn(6, device="cuda")
for name in ("torch", "cuda-direct", "cuda-fused-gemm", "cuda-auto", "triton-direct"):
    fn = conv.get(name).prepare(w, b)
    for _ in range(50): fn(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(2000): fn(x)
    host = (time.perf_counter() - t) / 2000 * 1e6
    torch.cuda.synchronize()
    print(f"{name:16s} host {host:6.1f} us per call")
fn = conv.get("cuda-direct").prepare(w, b)
fn(x)
pr = cProfile.Profile(); pr.enable()
for _ in range(2000): fn(x)
pr.disable(); torch.cuda.synchronize()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18); print(s.getvalue()[:5000])
