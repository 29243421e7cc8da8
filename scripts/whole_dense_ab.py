"""Issue #21: the exact GPU engine with its dense layers choosing among two sets of forms (GpuDense.VARIANTS,
--before and --after), same process, interleaved; CUDA graph replays, CUDA events, median of 20 per round, 3
rounds, per batch size. Usage: python3 scripts/whole_dense_ab.py [--batch 10 100] [--before linear]
[--after linear,transposed] [--out FILE.json]"""
import argparse
import json
import statistics

import torch

from convforge.engine import Engine
from convforge.gpu_dense import GpuDense
from convforge.models import PRESETS, load_preset

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def replay_ms(graphed, x, repeat=20):
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graphed(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--batch", type=int, nargs="+", default=[10000])
    parser.add_argument("--before", default="linear")
    parser.add_argument("--after", default="linear,transposed")
    args = parser.parse_args()
    sets = {"before": tuple(args.before.split(",")), "after": tuple(args.after.split(","))}
    rows = []
    for preset, batch in [(p, b) for p in PRESETS if p != "fa17-low" for b in args.batch]:
        network = load_preset(preset)
        size = network.architecture.input_size
        x = torch.randint(0, 256, (batch, 1, size, size), device="cuda").float()
        graphs = {}
        for label, variants in sets.items():
            GpuDense.VARIANTS = variants
            engine = Engine(network, device="cuda")
            graphs[label] = (engine, engine.graphed(batch))
        GpuDense.VARIANTS = sets["after"]
        logits = {k: g(x).clone() for k, (_, g) in graphs.items()}
        times = {k: [] for k in graphs}
        for _ in range(3):
            for k, (_, g) in graphs.items():
                times[k].append(replay_ms(g, x))
        choice = [s.gpu_dense.graph_choice.get(batch) for s in graphs["after"][0].steps if s.gpu_dense]
        row = {"preset": preset, "batch": batch, "before_ms": min(times["before"]),
               "after_ms": min(times["after"]), "rounds": times, "dense_choice": choice,
               "same_predictions": bool(torch.equal(logits["before"].argmax(1), logits["after"].argmax(1))),
               "max_logit_diff": (logits["before"] - logits["after"]).abs().max().item()}
        rows.append(row)
        print(f"{preset:9s} {batch:5d} before {row['before_ms']:.4f} ms  after {row['after_ms']:.4f} ms  "
              f"x{row['before_ms'] / row['after_ms']:.3f}  dense {choice}  same argmax {row['same_predictions']} "
              f"max |dlogit| {row['max_logit_diff']:.2e}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, handle,
                      indent=1)


if __name__ == "__main__":
    main()
