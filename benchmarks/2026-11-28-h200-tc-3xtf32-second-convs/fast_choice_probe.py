"""sp18's fast graph at 100 images took 0.0685 ms in call 4 against 0.0443 in the last record: does the engine's
per-batch choice of the dense head's form vary between fresh engines? Four fresh fast engines (and one exact), each
graphed at 100 images and timed as bench --whole times it; their choices printed.
Usage: python3 fast_choice_probe.py [preset] [batch]"""
import sys

import numpy as np
import torch

from convforge.conv.torch_conv import exact_fp32
from convforge.engine import Engine
from convforge.harness import whole
from convforge.harness.timing import rotated_inputs, time_calls
from convforge.models import load_preset

name, batch = (sys.argv[1] if len(sys.argv) > 1 else "sp18"), int(sys.argv[2]) if len(sys.argv) > 2 else 100
exact_fp32()
network = load_preset(name)
arch = network.architecture
x = torch.randint(0, 256, (batch, arch.in_channels, arch.input_size, arch.input_size), device="cuda").float()
inputs = rotated_inputs(x)


def ms(fn, repeat=200):
    return float(np.median(time_calls(fn, inputs, "cuda", repeat=repeat, timing="call"))) * 1e3


print(f"{name} at {batch} images; yardstick {ms(whole.launch_copy_call(x), 500):.4f} ms", flush=True)
for trial, precision in enumerate(["fast"] * 4 + ["exact"]):
    engine = Engine(network, impl="auto", device="cuda", precision=precision)
    with torch.inference_mode():
        graph = engine.graphed(batch)
        graph(x)
        t = ms(lambda xi: graph(xi))
    choices = []
    for step in engine.steps:
        if step.head is not None:
            choices.append(("head", {str(k): v for k, v in step.head.choices.items()}))
        for label, dense in (("dense", step.gpu_dense), ("half_dense", step.half_dense)):
            if dense is not None:
                choices.append((label, dense.graph_choice))
        if step.per_batch is not None:
            choices.append(("conv", step.per_batch.graph_choice))
    print(f"trial {trial} {precision}: graph {t:.4f} ms  {choices}", flush=True)
