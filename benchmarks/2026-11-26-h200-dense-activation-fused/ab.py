"""Issue #21, small batches: the exact GPU engine with the dense layers' activation fused into gemv's sum kernel
and gemv's fixed row groups (gemv4, gemv8) measured beside the other forms ("after") against the engine without
them ("before": gpu_dense.FUSE_ACTIVATION off, GpuDense.VARIANTS of main 3490eeb), same process, CUDA-graph
replays interleaved round by round (CUDA events, median of 20 per round, 5 rounds), per preset and batch; logits
of both against float64 (argmax) and against each other.
Usage: PYTHONPATH=. python3 benchmarks/2026-11-26-h200-dense-activation-fused/ab.py [--batch 10 100] [--out F]"""
import argparse
import json
import os
import statistics
import sys

import torch

from convforge import gpu_dense
from convforge.engine import Engine
from convforge.gpu_dense import GpuDense
from convforge.models import PRESETS, forward_with, load_preset

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
BEFORE = ("linear", "transposed", "output-major", "split-k", "gemv")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from whole_dense_ab import replay_ms  # noqa: E402  (CUDA events around one replay, median of 20)



def build(network, batch, after):
    variants, fuse = GpuDense.VARIANTS, gpu_dense.FUSE_ACTIVATION
    GpuDense.VARIANTS = variants if after else BEFORE
    gpu_dense.FUSE_ACTIVATION = after
    try:
        engine = Engine(network, device="cuda")
        return engine, engine.graphed(batch)
    finally:
        GpuDense.VARIANTS, gpu_dense.FUSE_ACTIVATION = variants, fuse


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--batch", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows = []
    print(torch.cuda.get_device_name(), torch.__version__, torch.version.cuda)
    for preset, batch in [(p, b) for p in PRESETS if p != "fa17-low" for b in args.batch]:
        network = load_preset(preset)
        size = network.architecture.input_size
        x = torch.randint(0, 256, (batch, 1, size, size), device="cuda").float()
        graphs = {"before": build(network, batch, False), "after": build(network, batch, True)}
        logits = {k: g(x).clone() for k, (_, g) in graphs.items()}
        params64 = {k: v.detach().double().cpu() for k, v in network.params.items()}
        with torch.no_grad():
            ref = forward_with(network.architecture, params64, x.double().cpu())
        times = {k: [] for k in graphs}
        for r in range(args.rounds):
            for k in (("before", "after") if r % 2 == 0 else ("after", "before")):
                times[k].append(replay_ms(graphs[k][1], x))
        ratios = [b / a for b, a in zip(times["before"], times["after"])]
        choice = [(s.gpu_dense.choice.get(batch), s.gpu_dense.activation) for s in graphs["after"][0].steps
                  if s.gpu_dense]
        rel = ((logits["after"].double().cpu() - ref).norm() / ref.norm()).item()
        row = {"preset": preset, "batch": batch, "before_ms": statistics.median(times["before"]),
               "after_ms": statistics.median(times["after"]), "speedup_per_round_median": statistics.median(ratios),
               "rounds": times, "dense_choice_after": choice,
               "argmax_agrees_float64": bool(torch.equal(logits["after"].cpu().argmax(1), ref.argmax(1))),
               "rel_error_after_vs_float64": rel,
               "max_logit_diff": (logits["before"] - logits["after"]).abs().max().item()}
        rows.append(row)
        print(f"{preset:9s} {batch:5d} before {row['before_ms']:.4f} ms  after {row['after_ms']:.4f} ms  "
              f"x{row['speedup_per_round_median']:.3f}  dense {choice}  argmax ok {row['argmax_agrees_float64']} "
              f"rel err {rel:.1e}", flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
                       "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
