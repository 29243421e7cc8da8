"""Where 10 and 100 images go (issue #21's small-batch goal): per preset, the engine's CUDA-graph replay (input
already on the GPU, host launch work included, as bench --whole times it) against the goal's yardsticks measured in
the same process: one empty kernel launch, and the input's copy from pinned host memory; then the kernels one
replay runs and their GPU time (torch.profiler)."""
import statistics
import time

import torch

from convforge.engine import Engine
from convforge.models import PRESETS, load_preset


def call_ms(fn, repeat=200):
    """Median per-call ms, each call between CUDA events with the host work included (bench's timing 'call')."""
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[repeat // 10:])


torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
empty = torch.empty(1, device="cuda")
print(f"empty kernel launch (fill_ of one float): {call_ms(lambda: empty.fill_(0)):.4f} ms")
for name in [p for p in PRESETS if p != "fa17-low"]:
    network = load_preset(name)
    arch = network.architecture
    for precision in ("exact", "fast"):
        engine = Engine(network, impl="auto", device="cuda", precision=precision)
        for batch in (10, 100):
            host = (torch.rand(batch, arch.in_channels, arch.input_size, arch.input_size) * 255).pin_memory()
            x = host.cuda()
            dev = torch.empty_like(x)
            copy = call_ms(lambda: dev.copy_(host, non_blocking=True))
            graph = engine.graphed(batch)
            replay = call_ms(lambda: graph(x))
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    graph(x)
                torch.cuda.synchronize()
            kernels = {}
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    kernels.setdefault(e.name[:60], []).append(e.device_time)
            gpu = sum(sum(v) for v in kernels.values()) / 10 / 1e3
            print(f"{name:9s} {precision:5s} B={batch:4d} replay {replay:.4f} ms  input copy {copy:.4f} ms  "
                  f"GPU time {gpu:.4f} ms in {sum(len(v) for v in kernels.values()) // 10} kernels", flush=True)
            for k, v in sorted(kernels.items(), key=lambda kv: -sum(kv[1])):
                print(f"      {sum(v) / len(v) / 1e3:8.4f} ms x{len(v) // 10}  {k}")
