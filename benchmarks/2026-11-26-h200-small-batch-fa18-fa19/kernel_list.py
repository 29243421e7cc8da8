"""Issue #21: where fa18's and fa19's small-batch forward goes. Per preset and batch, the engine's CUDA-graph
replay with cuda-auto's table as in main (TABLE_MAIN) and with the swept one (TABLE_NEW), both timed as bench
--whole's 'call' mode (CUDA events around the host call, inputs rotated past L2, 5 interleaved rounds x 30,
median), and every kernel of one replay: launches per replay, GPU microseconds per replay (profiler, mean of 20).
Usage: python3 kernel_list.py TABLE_MAIN TABLE_NEW OUT.json [preset ...]"""
import json
import statistics
import sys
from pathlib import Path

import torch

from convforge import tuning
from convforge.conv.torch_conv import exact_fp32
from convforge.engine import Engine
from convforge.harness.timing import rotated_inputs, time_calls
from convforge.models import load_preset

texts = {"main": Path(sys.argv[1]).read_text(), "new": Path(sys.argv[2]).read_text()}
out = Path(sys.argv[3])
models = sys.argv[4:] or ["fa18", "fa19"]
_read = tuning._read


def use(table):
    tuning._read = lambda impl: texts[table] if impl == "cuda-auto" else _read(impl)
    tuning.clear_cache()


def kernel_list(fn, x, n=20):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn(x)
        torch.cuda.synchronize()
    found = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            found.setdefault(e.name[:90], []).append(e.device_time)
    return sorted(((round(sum(v) / n, 2), len(v) / n, k) for k, v in found.items()), reverse=True)


exact_fp32()
print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
rows = []
for name in models:
    network = load_preset(name)
    arch = network.architecture
    for batch in (10, 100):
        x = torch.randint(0, 256, (batch, arch.in_channels, arch.input_size, arch.input_size),
                          device="cuda").to(torch.float32)
        runs, engines = {}, {}
        for table in texts:
            use(table)
            engines[table] = Engine(network, impl="auto", device="cuda")
            runs[table] = engines[table].graphed(batch)
        use("new")
        inputs = rotated_inputs(x)
        times = {t: [] for t in runs}
        with torch.inference_mode():
            for _ in range(5):
                for t, fn in runs.items():
                    times[t] += time_calls(fn, inputs, "cuda", repeat=30, timing="call").tolist()
            same = bool(torch.equal(runs["main"](x).clone(), runs["new"](x).clone()))
        for t, fn in runs.items():
            ks = kernel_list(fn, x)
            ms = 1e3 * statistics.median(times[t])
            row = dict(model=name, batch=batch, table=t, gpu=torch.cuda.get_device_name(), replay_ms=ms,
                       kernel_us_sum=sum(k[0] for k in ks), launches=sum(k[1] for k in ks), kernels=ks,
                       same_logits_main_new=same)
            rows.append(row)
            print(f"{name} B={batch} table {t}: replay {ms:.4f} ms, {row['launches']:.0f} kernels/copies per replay, "
                  f"their GPU time {row['kernel_us_sum']:.1f} us (logits main == new: {same})", flush=True)
            for us, count, k in ks:
                print(f"    {us:7.2f} us  x{count:g}  {k}", flush=True)
        out.write_text(json.dumps(rows, indent=1))
        del runs, engines
