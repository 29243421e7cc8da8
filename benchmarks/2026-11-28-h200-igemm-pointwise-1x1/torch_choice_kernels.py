"""Why auto, having chosen torch, ran 1.195x cuDNN on one shape (call 5: 64 images of 32 px, 32 -> 32 channels,
K 3, padding 1): in a fresh process on empty caches, that shape alone through scripts/auto_vs_cudnn.run_shape
(3 times, the first as in call 5), then the GPU kernels of 5 calls each of the drop-in (ours) and of F.conv2d
(theirs) under torch.profiler: names and mean microseconds. usage: torch_choice_kernels.py OUT.txt"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "scripts")
import auto_vs_cudnn as avc  # noqa: E402
from convforge.nn import Conv2d  # noqa: E402

torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.benchmark = True
lines = []
shape = next(s for s in avc.shapes() if s["source"] == "sweep" and s["op"] == "conv" and s["B"] == 64
             and s["C"] == 32 and s["M"] == 32 and s["H"] == 32 and s["KH"] == 3)
for i in range(3):
    row = avc.run_shape(shape, seed=1000 + i)
    lines.append(f"run {i}: choice {row['choice']} auto {row['auto_ms']:.4f} ms cudnn {row['cudnn_ms']:.4f} ms "
                 f"ratio {row['ratio']:.3f} candidates {row['candidates_ms']}")
x = torch.randn(64, 32, 32, 32, device="cuda")
layer = Conv2d(32, 32, 3, padding=1, bias=False, device="cuda").requires_grad_(False)
w = layer.weight.detach().clone()
with torch.no_grad():
    for name, fn in (("ours (Conv2d, auto)", lambda: layer(x)), ("theirs (F.conv2d)", lambda: torch.nn.functional.conv2d(x, w, None, 1, [1, 1]))):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        lines.append(f"--- {name}")
        for e in prof.key_averages():
            gpu_us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
            if gpu_us:
                lines.append(f"  {e.key[:110]}  calls {e.count}  mean {gpu_us / max(e.count, 1):.1f} us")
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
