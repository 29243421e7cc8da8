"""The fast path's FP16 dense layers (fc1 of sp18, sp19, fa18, fa19 after the FP16 hand-off) in every form GpuDense
offers them, at 100 and 10000 rows: GPU time ('gpu') and host launch included ('call'), CUDA events, median of 30
calls after warm-up, inputs rotated past L2; each form's output against float64 (relative error, reduced tolerance).
Usage: PYTHONPATH=. python3 dense_forms.py OUT.json"""
import json
import sys

import numpy as np
import torch

from convforge.engine import median_seconds
from convforge.gpu_dense import GpuDense
from convforge.harness.timing import rotated_inputs, time_calls
from convforge.models import load_preset


def main():
    rows_out = []
    for preset in ("sp18", "sp19", "fa18", "fa19"):
        params = load_preset(preset).params
        weight, bias = params["fc1.weight"].cuda(), params["fc1.bias"].cuda()
        dense = GpuDense(weight.half().contiguous(), bias, median_seconds)
        for rows in (100, 10000):
            g = torch.Generator(device="cuda").manual_seed(rows)
            x = ((torch.rand((rows, weight.shape[1]), generator=g, device="cuda") * 2 - 1) * 4).half()
            ref = torch.nn.functional.linear(x.double(), weight.half().double(), bias.double())
            inputs = rotated_inputs(x)
            for variant in dense.variants:
                if not dense.serves(variant, rows):
                    continue
                out = dense.run(variant, x)
                err = ((out.double() - ref).norm() / ref.norm()).item()
                ms = {}
                for timing in ("gpu", "call"):
                    t = time_calls(lambda t, v=variant: dense.run(v, t), inputs, "cuda", repeat=30, timing=timing)
                    ms[timing] = float(np.median(t)) * 1e3
                rows_out.append(dict(layer=f"{preset} fc1", rows=rows, depth=weight.shape[1], form=variant,
                                     gpu_ms=ms["gpu"], call_ms=ms["call"], relative_error=err))
                print(f"{preset} fc1 {tuple(weight.shape)} rows {rows:6d} {variant:12s} gpu {ms['gpu']:8.4f} ms  "
                      f"call {ms['call']:8.4f} ms  err {err:.1e}", flush=True)
    with open(sys.argv[1], "w") as handle:
        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                       triton=__import__("triton").__version__, rows=rows_out), handle, indent=1)


if __name__ == "__main__":
    main()
