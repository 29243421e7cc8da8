"""The presets' dense layers at 10 and 100 images (issue #21's small batches): cuBLAS through four layouts, each
checked against float64, timed as one CUDA graph replay of 20 calls (launch work amortised: the kernels' own time),
median of 15 replays. F.linear (x W^T + b), addmm with W^T stored, the output-major product (b + W x^T, read back
transposed) and split-K by hand (S partial products in one bmm, then a sum)."""
import statistics

import torch
import torch.nn.functional as F

from convforge.models import Dense, PRESETS, load_preset

torch.backends.cuda.matmul.allow_tf32 = False


def graph_us(fn, calls=20, replays=15):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(); fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(); graph.replay(); end.record(); end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


for name in [p for p in PRESETS if p != "fa17-low"]:
    network = load_preset(name)
    for layer, prefix, shape_in, shape_out in network.architecture.walk():
        if not isinstance(layer, Dense):
            continue
        w = network.params[f"{prefix}.weight"].cuda(); b = network.params[f"{prefix}.bias"].cuda()
        wt = w.t().contiguous(); bcol = b[:, None].contiguous()
        n, k = w.shape
        for rows in (10, 100):
            x = torch.rand(rows, k, device="cuda") * 2 - 1
            ref = F.linear(x.double(), w.double(), b.double())
            variants = {"linear": lambda: F.linear(x, w, b), "addmm W^T": lambda: torch.addmm(b, x, wt),
                        "output-major": lambda: torch.addmm(bcol, w, x.t()).t()}
            for splits in (4, 8, 16):
                if k % splits == 0:
                    xs, ws = x.view(rows, splits, k // splits).transpose(0, 1), wt.view(splits, k // splits, n)
                    variants[f"split-K {splits}"] = lambda xs=xs, ws=ws: torch.bmm(xs, ws).sum(0) + b
            line = []
            for label, fn in variants.items():
                err = ((fn().double() - ref).norm() / ref.norm()).item()
                assert err <= 1e-5, (name, prefix, rows, label, err)
                line.append(f"{label} {graph_us(fn):.1f}")
            print(f"{name:9s} {prefix:8s} {rows:4d} x {k:5d} -> {n:3d}: " + ", ".join(line) + " us", flush=True)
