"""Probe (issue #21, the exact path at 100 images): gpu_dense_tc's 3xTF32 split-K partial-product kernel on the
presets' first dense layers at 100 rows, over launch shapes (BM, BN, BK, warps, stages) and slice counts; GPU time
(harness time_calls, inputs rotated), median; each shape's summed output checked against float64 first. The
current forms (gpu_dense.TC) are marked. Usage: tc_forms_probe.py OUT.json [ROWS]"""
import itertools
import json
import sys

import torch

from convforge import gpu_dense, gpu_dense_tc
from convforge.conv import cuda_common as cc
from convforge.harness.probes import environment
from convforge.harness.timing import rotated_inputs, time_calls

out, rows = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 100
LAYERS = {"fa17 fc1": (7200, 500), "sp18 fc1": (10816, 140), "fa18 fc1": (17496, 160)}
sms = cc.device_info(torch.device("cuda")).sm_count
current = {}
for name, form in gpu_dense.TC.items():
    current[(gpu_dense.tc_rows_per_block(rows, name), form.bn, form.bk, gpu_dense.TC_WARPS, form.stages)] = name
results = []
for label, (depth, outputs) in LAYERS.items():
    g = torch.Generator(device="cuda").manual_seed(depth)
    x = torch.rand(rows, depth, device="cuda", generator=g) * 2 - 1
    w = torch.randn(outputs, depth, device="cuda", generator=g) / depth ** 0.5
    ref = (x.double() @ w.double().T)
    inputs = rotated_inputs(x)
    shapes = list(itertools.product((64, 128), (32, 64), (32, 64), (4, 8), (3, 4)))
    for (bm, bn, bk, warps, stages), slices in itertools.product(shapes, (8, 16, 32, 64)):
        length = -(-depth // slices)
        length = -(-length // bk) * bk
        n = -(-depth // length)
        tiles = -(-rows // bm) * -(-outputs // bn)
        row = dict(layer=label, rows=rows, bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, slices=n,
                   blocks=tiles * n, current=current.get((bm, bn, bk, warps, stages)))
        part = torch.empty(n, rows, outputs, device="cuda")
        try:
            def call(xi):
                gpu_dense_tc.launch_part(xi, w, part, length, (bm, bn, bk), warps, stages, "tf32x3")
            call(x)
            row["rel_err"] = float((part.double().sum(0) - ref).norm() / ref.norm())
            t = time_calls(call, inputs, "cuda", repeat=50)
            row["us"] = float(sorted(t)[len(t) // 2]) * 1e6
        except Exception as e:   # out of resources: recorded
            row["error"] = str(e).splitlines()[0][:120]
        results.append(row)
        print(json.dumps(row), flush=True)
    best = sorted((r for r in results if r["layer"] == label and "us" in r), key=lambda r: r["us"])[:5]
    cur = [r for r in results if r["layer"] == label and r["current"] and "us" in r]
    print(f"== {label} {rows} rows: best " + "; ".join(
        f"{r['bm']}x{r['bn']}x{r['bk']} w{r['warps']} s{r['stages']} {r['slices']} slices {r['us']:.1f} us "
        f"err {r['rel_err']:.1e}" for r in best), flush=True)
    print(f"== {label} current forms: " + "; ".join(
        f"{r['current']} {r['slices']} slices {r['us']:.1f} us" for r in sorted(cur, key=lambda r: r['us'])[:6]),
        flush=True)
with open(out, "w") as f:
    json.dump(dict(environment("cuda"), sms=sms, rows=results), f, indent=1)
