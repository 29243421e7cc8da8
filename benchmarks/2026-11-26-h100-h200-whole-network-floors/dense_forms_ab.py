"""A/B of the GPU engine's dense layer forms (issue #21): Engine(auto) choosing among all of GpuDense's forms
against the same engine held to the two of 2026-11-25 (linear, transposed), both replayed from CUDA graphs in one
process, 7 interleaved rounds of 50 calls each (timing 'call', as bench --whole), median per round; the logits of
both checked against each other (same argmax, max difference) and the choices printed."""
import statistics

import torch

from convforge.engine import Engine, GpuDense
from convforge.models import PRESETS, load_preset

torch.backends.cuda.matmul.allow_tf32 = False
OLD = ("linear", "transposed")


def hold_to_old_forms(engine: Engine, x: torch.Tensor) -> None:
    """Make each dense layer's choice for this batch among the old forms only, before the graph is captured."""
    rows = x.shape[0]
    for step in engine.steps:
        dense = step.gpu_dense
        if dense is not None:
            width = dense.weight.shape[1]
            probe = torch.rand(rows, width, device="cuda")
            dense.choice[rows] = min(OLD, key=lambda v: dense._seconds(v, probe))


def per_call_ms(graph, x, calls=50):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        graph(x)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


for name in [p for p in PRESETS if p != "fa17-low"]:
    network = load_preset(name)
    arch = network.architecture
    for batch in (10, 100, 1000, 10000):
        x = torch.randint(0, 256, (batch, arch.in_channels, arch.input_size, arch.input_size),
                          device="cuda").float()
        new, old = (Engine(network, impl="auto", device="cuda") for _ in range(2))
        hold_to_old_forms(old, x)
        g_new, g_old = new.graphed(batch), old.graphed(batch)
        a, b = g_new(x).clone(), g_old(x).clone()
        same = bool((a.argmax(1) == b.argmax(1)).all())
        rounds = [(per_call_ms(g_old, x), per_call_ms(g_new, x)) for _ in range(7)]
        o, n = statistics.median(r[0] for r in rounds), statistics.median(r[1] for r in rounds)
        ratio = statistics.median(r[1] / r[0] for r in rounds)
        chosen = [s.gpu_dense.choice.get(batch) for s in new.steps if s.gpu_dense is not None]
        held = [s.gpu_dense.choice.get(batch) for s in old.steps if s.gpu_dense is not None]
        print(f"{name:9s} {batch:6d} old {o:.4f} ms  new {n:.4f} ms  new/old {ratio:.3f}  same argmax {same}  "
              f"max |diff| {float((a - b).abs().max()):.1e}  forms new {chosen} old {held}", flush=True)
        del g_new, g_old, new, old
