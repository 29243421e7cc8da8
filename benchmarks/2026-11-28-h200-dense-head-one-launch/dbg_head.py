"""Debug: two engines' CUDA graphs of one preset (FUSE_HEAD per engine from argv), each replayed after both were
captured, with a synchronise after each replay. Usage: dbg_head.py PRESET BATCH ON1 ON2 (0/1)."""
import sys

import torch

from convforge import engine as E
from convforge.conv.torch_conv import exact_fp32
from convforge.models import load_preset

exact_fp32()
if len(sys.argv) > 5:   # force the head's form (as its choice)
    from convforge import gpu_dense
    gpu_dense.DenseHead.forms = lambda self, rows, layer: [sys.argv[5]]
preset, batch, flags = sys.argv[1], int(sys.argv[2]), [a == "1" for a in sys.argv[3:5]]
net = load_preset(preset)
S = net.architecture.input_size
x = torch.randint(0, 256, (batch, 1, S, S), device="cuda").float()
import os
if os.environ.get("DBG_ROTATE"):   # as head_ab.py: rotated inputs and the yardstick's buffers made first
    from convforge.harness.timing import rotated_inputs
    from convforge.harness.whole import launch_copy_call
    inputs, yardstick = rotated_inputs(x), launch_copy_call(x)
graphs = []
for on in flags:
    E.FUSE_HEAD = on
    eng = E.Engine(net, impl="auto", device="cuda")
    graphs.append((on, eng, eng.graphed(batch)))
    torch.cuda.synchronize()
    print("captured", on, [s.head.choices if s.head else None for s in eng.steps if s.head], flush=True)
for on, eng, g in (graphs if os.environ.get("DBG_FORWARD") else reversed(graphs)):
    with torch.inference_mode():
        g(x)
    torch.cuda.synchronize()
    print("replayed", on, flush=True)
