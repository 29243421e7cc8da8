"""The exact dense head (first dense layer + its activation + the second layer) of every preset at 10, 32, 64 and 100
rows in each of its forms (DenseHead.forms: apart, then every split-K form of the first layer + dense_head_sum),
the mma3 form among them: GPU time (harness.timing.time_calls, median of 50 after a warm-up), logits checked
against float64, and each form's slices.

    python3 probe_mma3.py OUT.json
"""
import json
import sys

import numpy as np
import torch

from convforge import gpu_dense
from convforge.engine import median_seconds
from convforge.gpu_dense import DenseHead, GpuDense
from convforge.harness.timing import time_calls
from convforge.models import load_preset

sm_count = torch.cuda.get_device_properties(0).multi_processor_count
rows_out = []
for name in ("fa17-high", "sp18", "sp19", "fa18", "fa19", "fa20"):
    net = load_preset(name)
    dense = [k for k in net.params if k.endswith("weight") and net.params[k].dim() == 2]
    w1, w2 = (net.params[k].cuda().contiguous() for k in dense[:2])
    b1, b2 = (net.params[k.replace("weight", "bias")].cuda().contiguous() for k in dense[:2])
    layers = net.architecture.layers
    after = layers[[type(layer).__name__ for layer in layers].index("Dense") + 1]
    activation = after.kind if type(after).__name__ == "Activation" else None
    first = GpuDense(w1, b1, median_seconds, activation)
    second = GpuDense(w2, b2, median_seconds, None)
    head = DenseHead(first, second)
    for rows in (10, 32, 64, 100):
        x = torch.rand((rows, w1.shape[1]), device="cuda") * 3
        act = {"tanh": torch.tanh, "relu": torch.relu, None: lambda v: v}[activation]
        ref = (act(x.double() @ w1.double().T + b1.double()) @ w2.double().T + b2.double())
        for form in head.forms(rows, first):
            variant = form.removesuffix("+head")
            slices = (gpu_dense.mma3_slices(rows, w1.shape[0], w1.shape[1], sm_count)[0]
                      if variant == "mma3" else
                      gpu_dense.tc_slices(rows, w1.shape[0], w1.shape[1], sm_count, variant)[0]
                      if variant in gpu_dense.TC_ALL else None)
            with torch.inference_mode():
                y = head.run(form, x)
                err = float((y.double() - ref).norm() / ref.norm())
                t = time_calls(lambda _: head.run(form, x), [x], "cuda", warmup=5, repeat=50, timing="gpu")
            us = float(np.median(t)) * 1e6
            rows_out.append(dict(model=name, rows=rows, form=form, us=us, error=err, slices=slices,
                                 shape=[int(x.shape[1]), int(w1.shape[0]), int(w2.shape[0])]))
            print(f"{name:9s} {rows:5d} {form:18s} {us:8.2f} us  err {err:.1e}  slices {slices}", flush=True)
json.dump(rows_out, open(sys.argv[1], "w"), indent=1)
