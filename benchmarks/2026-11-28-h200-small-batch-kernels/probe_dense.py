"""The exact dense head (first dense layer + its activation + the second layer) at 10 and 100 rows: every form the
engine has, and tensor-core forms it does not have yet (blocks of up to 128 rows, so that the weights are read once
at 100 rows; other output widths, steps and stages), GPU time, median of 50 calls after a warm-up; each form's
logits checked against float64.

    python3 probe_dense.py OUT.json
"""
import json
import sys

import numpy as np
import torch

from convforge import gpu_dense
from convforge.engine import median_seconds
from convforge.gpu_dense import DenseHead, GpuDense, TcForm
from convforge.harness.timing import time_calls
from convforge.models import load_preset

NEW = {
    "tc3-b128": TcForm(32, 32, 256, 8, max_bm=128),
    "tc3-wide-b128": TcForm(64, 64, 512, 4, max_bm=128),
    "tc3-deep-b128": TcForm(32, 64, 256, 8, max_bm=128),
    "tc3-n16-b128": TcForm(16, 64, 256, 8, max_bm=128),
    "tc3-k128-b128": TcForm(32, 128, 512, 8, max_bm=128),
    "tc3-deep-b128-s4": TcForm(32, 64, 256, 8, max_bm=128, stages=4),
    "tc3-deep-b128-ps16": TcForm(32, 64, 256, 16, max_bm=128),
    "tc3-deep-b128-ms512": TcForm(32, 64, 512, 8, max_bm=128),
    "tc3-deep-ms512": TcForm(32, 64, 512, 8),
}
gpu_dense.TC.update(NEW)
gpu_dense.TC_ALL.update(NEW)
GpuDense.VARIANTS = GpuDense.VARIANTS + tuple(NEW)

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
    for rows in (10, 100):
        x = torch.rand((rows, w1.shape[1]), device="cuda") * 3
        act = {"tanh": torch.tanh, "relu": torch.relu, None: lambda v: v}[activation]
        ref = (act(x.double() @ w1.double().T + b1.double()) @ w2.double().T + b2.double())
        for form in head.forms(rows, first):
            try:
                with torch.inference_mode():
                    y = head.run(form, x)
                    err = float((y.double() - ref).norm() / ref.norm())
                    t = time_calls(lambda _: head.run(form, x), [x], "cuda", warmup=5, repeat=50, timing="gpu")
            except Exception as exc:  # a form that does not fit this layer
                print(f"{name} {rows} {form}: {type(exc).__name__} {exc}"[:200], flush=True)
                continue
            us = float(np.median(t)) * 1e6
            rows_out.append(dict(model=name, rows=rows, form=form, us=us, error=err,
                                 shape=[int(x.shape[1]), int(w1.shape[0]), int(w2.shape[0])]))
            print(f"{name:9s} {rows:4d} {form:26s} {us:7.2f} us  err {err:.1e}", flush=True)
json.dump(rows_out, open(sys.argv[1], "w"), indent=1)
