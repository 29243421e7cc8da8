"""Issue #21's small-batch goals at 10 and 100 images, interleaved in one process: per preset and batch, 7 rounds,
each timing (median of 100 calls between CUDA events, host work included, as bench --whole's 'call' timing) one
empty kernel launch, the input's copy from pinned host memory, torch eager (cuDNN, TF32 off), and the engine's
exact forward eagerly and replayed from a CUDA graph with main's dense forms and with this branch's (tc3).
Prints the median over rounds; yardstick = 2 x (launch + copy).
Usage: PYTHONPATH=. python3 .../goals.py OUT.json"""
import json
import statistics
import sys

import torch

from convforge.engine import Engine
from convforge.gpu_dense import TC, GpuDense
from convforge.models import PRESETS, load_preset

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
ALL = GpuDense.VARIANTS
SETS = {"main": tuple(v for v in ALL if v not in TC), "tc3": ALL}


def call_ms(fn, repeat=100):
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[repeat // 10:])


def main():
    rows = []
    empty = torch.empty(1, device="cuda")
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for name in [p for p in PRESETS if p != "fa17-low"]:
        network = load_preset(name)
        arch = network.architecture
        for batch in (10, 100):
            host = (torch.rand(batch, arch.in_channels, arch.input_size, arch.input_size) * 255).pin_memory()
            x = host.cuda()
            dev = torch.empty_like(x)
            calls = {"empty launch": lambda: empty.fill_(0), "input copy": lambda: dev.copy_(host, non_blocking=True)}
            theirs = Engine(network, impl="torch", device="cuda")
            calls["torch eager"] = lambda: theirs.forward(x, timed=False)
            logits, choice = {}, {}
            for label, variants in SETS.items():
                GpuDense.VARIANTS = variants
                ours = Engine(network, impl="auto", device="cuda")
                graph = ours.graphed(batch)
                ours.forward(x, timed=False)
                calls[f"convforge eager {label}"] = lambda ours=ours: ours.forward(x, timed=False)
                calls[f"convforge graph {label}"] = lambda graph=graph: graph(x)
                logits[label] = graph(x).clone()
                choice[label] = [s.gpu_dense.choice.get(batch) for s in ours.steps if s.gpu_dense]
            GpuDense.VARIANTS = ALL
            with torch.inference_mode():
                rounds = {k: [] for k in calls}
                for _ in range(7):
                    for k, fn in calls.items():
                        rounds[k].append(call_ms(fn))
            ms = {k: statistics.median(v) for k, v in rounds.items()}
            yard = 2 * (ms["empty launch"] + ms["input copy"])
            row = dict(model=name, batch=batch, ms=ms, rounds=rounds, yardstick_ms=yard, dense_choice=choice,
                       same_argmax=bool(torch.equal(logits["main"].argmax(1), logits["tc3"].argmax(1))),
                       max_logit_diff=(logits["main"] - logits["tc3"]).abs().max().item())
            rows.append(row)
            print(f"{name:9s} {batch:4d} yardstick {yard:.4f} (launch {ms['empty launch']:.4f}, copy "
                  f"{ms['input copy']:.4f})  torch eager {ms['torch eager']:.4f}", flush=True)
            for label in SETS:
                g = ms[f"convforge graph {label}"]
                print(f"      {label:4s} graph {g:.4f} ms = {100 * (g / yard - 1):+6.1f} % vs yardstick, "
                      f"x{ms['torch eager'] / g:.2f} eager;  convforge eager {ms[f'convforge eager {label}']:.4f} ms"
                      f"  dense {choice[label]}", flush=True)
            print(f"      same argmax {row['same_argmax']}  max |dlogit| {row['max_logit_diff']:.2e}", flush=True)
    with open(sys.argv[1], "w") as handle:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
