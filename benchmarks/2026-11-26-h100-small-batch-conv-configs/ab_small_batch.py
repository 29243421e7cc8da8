"""Issue #21 at 10 and 100 images: the whole exact network replayed from a CUDA graph with cuda-auto's old table
(B = 10000 entries only) and the new one (plus the entries measured at 10 and 100 images), in one process,
interleaved; eager PyTorch (cuDNN, TF32 off) and the goal's yardsticks (one empty kernel launch, the input's
copy from pinned host memory) beside them; the argmax of both tables' logits against float64.
Usage: python3 ab_small_batch.py NEW.json OUT.json [preset ...]   (old: NEW's B = 10000 entries alone)

Each engine is built and its graph captured while ``convforge.tuning`` reads the table under test (cuda-auto
picks its delegates in the graph's uncaptured warm-up passes); the timing is bench --whole's ('call': CUDA
events around the host call, launch work included; inputs rotated past the L2 cache), rounds of each
candidate interleaved, the median over all rounds."""
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

from convforge import tuning
from convforge.conv.torch_conv import exact_fp32
from convforge.engine import Engine
from convforge.harness.timing import rotated_inputs, time_calls
from convforge.models import PRESETS, forward_with, load_preset

new_path, out = Path(sys.argv[1]), Path(sys.argv[2])
models = sys.argv[3:] or [p for p in PRESETS if p != "fa17-low"]
ROUNDS, REPEAT = 5, 30
new_entries = tuning.read_file(new_path, "cuda-auto")
old_entries = [e for e in new_entries if tuning.entry_batch(e) == tuning.DEFAULT_BATCH]
texts = {"old": tuning.dumps("cuda-auto", old_entries), "new": new_path.read_text()}
print(f"old table {len(old_entries)} entries (B = 10000), new {len(new_entries)} "
      f"(batches {sorted({tuning.entry_batch(e) for e in new_entries})})")
_read = tuning._read


def use(table: str) -> None:
    tuning._read = lambda impl: texts[table] if impl == "cuda-auto" else _read(impl)
    tuning.clear_cache()


def call_ms(fn, repeat=200):
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[repeat // 10:])


def kernels(graph, x):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            graph(x)
        torch.cuda.synchronize()
    found = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            found.setdefault(e.name[:40], []).append(e.device_time)
    return sorted(((sum(v) / 10 / 1e3, k) for k, v in found.items()), reverse=True)


exact_fp32()
print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
empty = torch.empty(1, device="cuda")
launch = call_ms(lambda: empty.fill_(0))
print(f"empty kernel launch (fill_ of one float): {launch:.4f} ms", flush=True)
rows = []
for name in models:
    network = load_preset(name)
    arch = network.architecture
    params64 = {k: v.to("cuda", torch.float64) for k, v in network.params.items()}
    theirs = Engine(network, impl="torch", device="cuda")
    for batch in (10, 100):
        g = torch.Generator(device="cuda").manual_seed(batch)
        x = torch.randint(0, 256, (batch, arch.in_channels, arch.input_size, arch.input_size), generator=g,
                          device="cuda").to(torch.float32)
        host = x.cpu().pin_memory()
        dev = torch.empty_like(x)
        copy = call_ms(lambda: dev.copy_(host, non_blocking=True))
        with torch.inference_mode():
            ref = forward_with(arch, params64, x.double()).argmax(1)
        runs, labels, engines = {}, {}, {}
        for table in ("old", "new"):   # the engines stay alive while their graphs do (the graphs use their weights)
            use(table)
            engines[table] = Engine(network, impl="auto", device="cuda")
            runs[table] = engines[table].graphed(batch)
            labels[table] = engines[table].impl.name
        use("new")
        runs["torch eager"] = lambda xi: theirs.forward(xi, timed=False)
        agree = {}
        with torch.inference_mode():
            for label, fn in runs.items():
                agree[label] = int((fn(x).argmax(1) == ref).sum())
        same = bool(torch.equal(runs["old"](x).argmax(1), runs["new"](x).clone().argmax(1)))
        inputs = rotated_inputs(x)
        times = {label: [] for label in runs}
        with torch.inference_mode():
            for _ in range(ROUNDS):
                for label, fn in runs.items():
                    times[label] += time_calls(fn, inputs, "cuda", repeat=REPEAT, timing="call").tolist()
        ms = {label: 1e3 * statistics.median(t) for label, t in times.items()}
        yard = 2 * (launch + copy)
        row = dict(model=name, batch=batch, gpu=torch.cuda.get_device_name(), launch_ms=launch, copy_ms=copy,
                   yardstick_ms=yard, old_ms=ms["old"], new_ms=ms["new"], torch_eager_ms=ms["torch eager"],
                   speedup_new_over_old=ms["old"] / ms["new"], x_eager_old=ms["torch eager"] / ms["old"],
                   x_eager_new=ms["torch eager"] / ms["new"], argmax_agree_f64=agree, same_argmax_old_new=same,
                   impl=labels, goal_yardstick_met=ms["new"] <= yard, goal_3x_met=ms["torch eager"] / ms["new"] >= 3,
                   kernels_old=kernels(runs["old"], x)[:4], kernels_new=kernels(runs["new"], x)[:4])
        rows.append(row)
        print(f"{name:9s} B={batch:4d} old {ms['old']:.4f}  new {ms['new']:.4f} ms ({ms['old'] / ms['new']:.2f}x)  "
              f"torch eager {ms['torch eager']:.4f} ({row['x_eager_old']:.2f}x -> {row['x_eager_new']:.2f}x)  "
              f"2x(launch+copy) {yard:.4f} ({launch:.4f}+{copy:.4f})  argmax vs f64 {agree}/{batch} "
              f"old==new {same}", flush=True)
        for table in ("old", "new"):
            print(f"      {table}: " + "  ".join(f"{k} {t:.4f}" for t, k in row[f"kernels_{table}"]), flush=True)
        out.write_text(json.dumps(rows, indent=1))
        del runs, engines
