"""Issue #21: the engine's dense head (gpu_dense.DenseHead, engine.FUSE_HEAD) on and off, same process: per preset,
precision and batch, two engines' CUDA graphs timed in alternating rounds as `bench --whole` times a candidate
(host launch included, `time_calls(timing="call")`, inputs rotated), the launch + input copy yardstick beside.
Records the head's graph choice and whether the two engines' argmax agree.
Usage: python3 head_ab.py OUT.json [BATCH...]"""
import json
import os
import sys

import numpy as np
import torch

from convforge import engine as engine_mod
from convforge.conv.torch_conv import exact_fp32
from convforge.engine import Engine
from convforge.harness.probes import environment
from convforge.harness.timing import rotated_inputs, time_calls
from convforge.harness.whole import LAUNCH_COPY_REPEATS, launch_copy_call
from convforge.models import PRESETS, load_preset

out = sys.argv[1]
batches = [int(b) for b in sys.argv[2:]] or [10, 100, 1000]
exact_fp32()
rows = []
only = os.environ.get("AB_PRESETS", "").split()
for preset in [p for p in PRESETS if p != "fa17-low" and (not only or p in only)]:
    network = load_preset(preset)
    arch = network.architecture
    for batch in batches:
        g = torch.Generator(device="cuda").manual_seed(batch)
        x = torch.randint(0, 256, (batch, 1, arch.input_size, arch.input_size), generator=g, device="cuda").float()
        inputs = rotated_inputs(x)
        yardstick = launch_copy_call(x)

        def ms(call, repeat=200):
            return float(np.median(time_calls(call, inputs, "cuda", repeat=repeat, timing="call"))) * 1e3
        for precision in ("exact", "fast"):
            graphs, heads = {}, {}
            for label, on in (("apart", False), ("head", True)):
                engine_mod.FUSE_HEAD = on
                engine = Engine(network, impl="auto", device="cuda", precision=precision)
                graphs[label] = engine.graphed(batch)
                if os.environ.get("AB_SYNC"):   # where an asynchronous fault comes from
                    torch.cuda.synchronize()
                    print("graphed", preset, batch, precision, label, flush=True)
                heads[label] = [s.head for s in engine.steps if s.head is not None]
            engine_mod.FUSE_HEAD = True
            with torch.inference_mode():
                logits = {k: g(x).clone() for k, g in graphs.items()}
                if os.environ.get("AB_SYNC"):
                    torch.cuda.synchronize()
                    print("replayed", flush=True)
                rounds = {k: [] for k in graphs}
                launch_copy = []
                for _ in range(3):
                    launch_copy.append(ms(yardstick, LAUNCH_COPY_REPEATS))
                    for k, g in graphs.items():
                        rounds[k].append(ms(lambda xi, g=g: g(xi)))
            head = heads["head"][0] if heads["head"] else None
            # the graph's choice for this batch (the input is FP16 where the fast path hands the conv's output over)
            choice = next((c[1][batch] for c in head.choices.values() if batch in c[1]), None) if head else None
            row = dict(preset=preset, batch=batch, precision=precision, launch_copy_ms=min(launch_copy),
                       apart_ms=float(np.median(rounds["apart"])), head_ms=float(np.median(rounds["head"])),
                       rounds=rounds, launch_copy_rounds=launch_copy, head_choice=choice,
                       same_argmax=bool(torch.equal(logits["apart"].argmax(1), logits["head"].argmax(1))),
                       max_logit_diff=(logits["apart"] - logits["head"]).abs().max().item())
            rows.append(row)
            lc = row["launch_copy_ms"]
            print(f"{preset:9s} {batch:5d} {precision:5s} apart {row['apart_ms']:.4f} ms ({row['apart_ms'] / lc:.2f}x) "
                  f"head {row['head_ms']:.4f} ms ({row['head_ms'] / lc:.2f}x)  x{row['apart_ms'] / row['head_ms']:.3f}"
                  f"  choice {choice}  launch+copy {lc * 1e3:.1f} us  same argmax {row['same_argmax']} "
                  f"max |dlogit| {row['max_logit_diff']:.1e}", flush=True)
            del graphs, heads
            torch.cuda.empty_cache()
        with open(out, "w") as f:
            json.dump(dict(environment("cuda"), rows=rows), f, indent=1)
