"""Issue #21: the first dense layer of fa18 (17496 -> 160) and fa19 (20184 -> 160) at 10 and 100 rows, every form
GpuDense chooses from (gpu_dense.py), GPU time (CUDA events, inputs rotated past L2, median of 100 after 10),
beside its floors (weights read once at the measured copy rate; FLOPs at the fp32 matmul rate) and the form the
engine picks (GpuDense's own 5-call measurement). Usage: python3 dense_probe.py"""
import statistics

import torch

from convforge.conv.torch_conv import exact_fp32
from convforge.gpu_dense import GpuDense
from convforge.harness.timing import rotated_inputs, time_calls

exact_fp32()
print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)


def measure(fn, device, calls):
    return statistics.median(time_calls(lambda _x: fn(), [None], device, repeat=calls).tolist())


for name, depth in (("fa18", 24 * 27 * 27), ("fa19", 24 * 29 * 29)):
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(160, depth, device="cuda", generator=g) / depth ** 0.5
    b = torch.randn(160, device="cuda", generator=g)
    dense = GpuDense(w, b, measure)
    for rows in (10, 100):
        x = torch.randn(rows, depth, device="cuda", generator=g)
        ref = (x.double() @ w.double().t() + b.double())
        inputs = rotated_inputs(x)
        picked = None
        with torch.inference_mode():
            dense(x)
            picked = dense.choice[rows]
            line = []
            for v in dense.variants:
                if not dense.serves(v, rows):
                    continue
                err = float(((dense.run(v, x).double() - ref).abs().max() / ref.abs().max()))
                us = 1e6 * statistics.median(time_calls(lambda xi: dense.run(v, xi), inputs, "cuda", warmup=10,
                                                        repeat=100).tolist())
                line.append(f"{v} {us:.1f} us (err {err:.0e})")
        wbytes, flops = 4 * 160 * depth, 2 * rows * 160 * depth
        print(f"{name} fc1 {depth}->160, {rows} rows: " + ", ".join(line) + f"; engine picks {picked}; floors: "
              f"weights {wbytes / 4.3e12 * 1e6:.1f} us at 4.3 TB/s, FLOPs {flops / 51e12 * 1e6:.1f} us at "
              "51 TFLOP/s", flush=True)
