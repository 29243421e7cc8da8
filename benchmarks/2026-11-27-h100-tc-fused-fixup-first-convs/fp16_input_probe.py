"""What an FP16 hand-off from fa20's first conv to its second would buy: triton-tc-fused's rows kernel on fa20 L2
(relu + pool 4, B = 10000) with its input in float32 (as now) and in float16 (the loads give fp16, the convert is a
no-op), the kernels launched by hand past the prepared function's float32 check; plus the fix-up launch alone. GPU
time, CUDA events, median of 50 after warm-up, inputs rotated past 2 x L2; outputs compared.
Usage: PYTHONPATH=. python3 fp16_input_probe.py"""
import numpy as np
import torch

from convforge.conv import triton_tc_fused as t
from convforge.harness.timing import rotated_inputs, time_calls
from convforge.models import load_preset

net = load_preset("fa20")
w = net.params["conv2.weight"].cuda()
b = net.params["conv2.bias"].cuda() if "conv2.bias" in net.params else None   # fa20's convs have no bias
g = torch.Generator(device="cuda").manual_seed(3)
x = torch.relu(torch.randn((10000, 4, 40, 40), generator=g, device="cuda") * 40)
fn = t.prepare_fused(w, b, "relu", 4)
out = fn(x)
cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__)))
constants, fixup = next(iter(cells["launches"].values()))
programs = next(iter(cells["probe_buffers"]))[1]
probes = torch.empty(programs, device="cuda")
y = torch.empty_like(out)


def rows(xs):
    t._rows_kernel[(programs,)](xs, cells["packed"], cells["packed_bias"], y, probes, 10000, **constants)


def fix(xs):
    t._rows_fixup[(programs,)](xs, cells["exact"], cells["packed_bias"], y, probes.view(torch.int32), 10000, **fixup)


rows(x)
base = y.clone()
rows(x.half())
print("fp16-input output vs fp32-input output, relative:", float((y - base).norm() / base.norm()))
for label, fn_, xin in (("rows, fp32 input", rows, x), ("rows, fp16 input", rows, x.half()),
                        ("fix-up alone (no block flagged)", fix, x), ("prepared call (rows + fix-up)", fn, x)):
    times = time_calls(fn_, rotated_inputs(xin), "cuda", warmup=5, repeat=50)
    print(f"{label:34s} {np.median(times) * 1e3:.4f} ms", flush=True)
