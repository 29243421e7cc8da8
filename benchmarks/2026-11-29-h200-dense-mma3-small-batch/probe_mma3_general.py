"""(As run in calls 4-6 on the general kernel of mma3_v3_general.patch; NEW held call 4's and call 6's forms in turn,
see README.) The exact dense head (first dense layer + its activation + the second layer) of every preset at 10, 100 and 1000
rows in each of its forms (DenseHead.forms: apart, then every split-K form of the first layer + dense_head_sum),
the mma3 forms among them (and launch shapes the engine does not have, NEW): GPU time (harness.timing.time_calls, median of 50 after a warm-up), logits checked
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

# launch shapes the engine does not have (gpu_dense.Mma3Form: blocks per SM, shortest slice, stages, warps_m,
# warps_n, warps_k, output tiles a warp, row tiles a warp, fresh sums a tile)
F = gpu_dense.Mma3Form
NEW = {"mma3-c3": F(2, 128, 2, 1, 1, 4, 4, (1, 2, 4), 3), "mma3-wide-c3": F(1, 128, 2, 2, 2, 2, 4, (4,), 3),
       "mma3-n64": F(2, 128, 2, 1, 2, 2, 4, (1, 2, 4)), "mma3-n64-c3": F(2, 128, 2, 1, 2, 2, 4, (1, 2, 4), 3),
       "mma3-m2-c3": F(2, 128, 2, 2, 1, 4, 4, (1, 2), 3), "mma3-c3-s3": F(2, 128, 3, 1, 1, 4, 4, (1, 2, 4), 3)}
gpu_dense.MMA3.update(NEW)
GpuDense.VARIANTS = GpuDense.VARIANTS + tuple(NEW)
GpuDense.OWN_KERNELS = GpuDense.OWN_KERNELS + tuple(NEW)
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
    for rows in (10, 100, 1000):
        x = torch.rand((rows, w1.shape[1]), device="cuda") * 3
        act = {"tanh": torch.tanh, "relu": torch.relu, None: lambda v: v}[activation]
        ref = (act(x.double() @ w1.double().T + b1.double()) @ w2.double().T + b2.double())
        for form in head.forms(rows, first):
            variant = form.removesuffix("+head")
            slices = (gpu_dense.mma3_slices(rows, w1.shape[0], w1.shape[1], sm_count, variant)[0]
                      if variant in gpu_dense.MMA3 else
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
