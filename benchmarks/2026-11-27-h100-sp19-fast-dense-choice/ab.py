"""issue #21, sp19's fast fc1: the eager choice timed over calls back to back (gpu_dense.EAGER_QUEUE = 4), the
one-slice tensor-core epilogue (FUSE_TC_EPILOGUE) and the fast dense layer absorbing its tanh (FUSE_ACTIVATION
on the fast path), against the rule and forms before ("before": EAGER_QUEUE = 1, no epilogue, and for the fast
path no absorbed tanh, which is main's code), both built in one process.

Parts (argv[2], comma-separated):
- layer: sp19's fast fc1 (FP16 5184 -> 140, real weights, random FP16 input in [-1, 1]) at 10-10000 rows: per form
  GPU time (a spin queued ahead), one call alone from an idle GPU with its launch work (the rule before), a call's
  share of 4 back to back (the rule now), and the host's launch work (perf_counter around the call, GPU busy
  behind a spin); median of 30 each. Then the eager choice made 8 times afresh under each rule.
- whole: exact, fast before, fast now, at 10000 images; eager (Engine.forward) and CUDA graph; interleaved
  rounds (order reversed every round), each the median of 30 calls with host launch work included, inputs
  rotated past L2 (harness.timing, timing="call", as bench --whole); logits against float64.
- shapes (call 2): see shapes_part.
- small: the eager forward at 10 and 100 images (launch-bound), exact and fast, before and now: 5 interleaved
  rounds of the median of 50 calls between CUDA events; the forms each chose.
Usage: PYTHONPATH=. python3 ab.py OUT.json layer,whole,small [presets for whole...]"""
import contextlib
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

from convforge import gpu_dense
from convforge.conv.torch_conv import exact_fp32
from convforge.engine import Engine, median_seconds
from convforge.harness.check import relative_error
from convforge.harness.timing import rotated_inputs, time_calls
from convforge.models import forward_with, load_preset

RESULT = {"gpu": None, "layer": [], "shapes": [], "whole": [], "small": []}


@contextlib.contextmanager
def before(precision="fast"):
    """main's rule and forms for the GpuDense layers made inside."""
    saved = gpu_dense.EAGER_QUEUE, gpu_dense.FUSE_TC_EPILOGUE, gpu_dense.FUSE_ACTIVATION
    gpu_dense.EAGER_QUEUE, gpu_dense.FUSE_TC_EPILOGUE = 1, False
    if precision == "fast":
        gpu_dense.FUSE_ACTIVATION = False
    try:
        yield
    finally:
        gpu_dense.EAGER_QUEUE, gpu_dense.FUSE_TC_EPILOGUE, gpu_dense.FUSE_ACTIVATION = saved


def engines(network, precisions=("exact", "fast")):
    built = {}
    for p in precisions:
        with before(p):
            built[f"{p} before"] = Engine(network, device="cuda", precision=p)
        built[f"{p} now"] = Engine(network, device="cuda", precision=p)
    return built


def host_seconds(fn, calls=30):
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return float(np.median(times))


def layer_part():
    network = load_preset("sp19")
    w = network.params["fc1.weight"].to("cuda").half().contiguous()
    b = network.params["fc1.bias"].to("cuda")
    for rows in (10, 100, 1000, 10000):
        g = torch.Generator(device="cuda").manual_seed(rows)
        x = (torch.rand(rows, w.shape[1], device="cuda", generator=g) * 2 - 1).half()
        with before():
            old = gpu_dense.GpuDense(w, b, median_seconds)          # main's: tanh a step of its own
        new = gpu_dense.GpuDense(w, b, median_seconds, "tanh")
        forms = [v for v in new.variants if new.serves(v, rows)]
        for v in forms:
            for label, d, fn in (("before (+ tanh_)", old, lambda v=v: old.run(v, x).tanh_()),
                                 ("now", new, lambda v=v: new.run(v, x))):
                fn()
                four = lambda fn=fn: [fn() for _ in range(4)]
                row = dict(rows=rows, form=v, code=label,
                           gpu_us=median_seconds(fn, "cuda", 30, True) * 1e6,
                           alone_us=median_seconds(fn, "cuda", 30, False) * 1e6,
                           queued4_us=median_seconds(four, "cuda", 30, False) / 4 * 1e6,
                           host_us=host_seconds(fn) * 1e6)
                RESULT["layer"].append(row)
                print(f"layer rows {rows:5d} {v:11s} {label:16s} gpu {row['gpu_us']:7.1f}  alone {row['alone_us']:7.1f}"
                      f"  queued/4 {row['queued4_us']:7.1f}  host {row['host_us']:6.1f} us", flush=True)
        for label, d in (("before", old), ("now", new)):
            picks = []
            for _ in range(8):
                d.choice.clear()
                d(x)
                picks.append(d.choice[rows])
            RESULT["layer"].append(dict(rows=rows, code=label, eager_picks=picks))
            print(f"layer rows {rows:5d} eager picks, {label}: {picks}", flush=True)


def shapes_part(name="sp19"):
    """Call 2: gpu_dense_tc's kernel over one slice with the epilogue (bias + tanh), on sp19's fast fc1 at 10000
    rows, across launch shapes (4 warps, as GpuDense launches): GPU time, median of 30, inputs rotated past L2.
    The fastest becomes the form "tc-probe" (TC_HALF) for the whole part's "fast probe" engine."""
    import itertools
    from convforge import gpu_dense_tc
    from convforge.gpu_dense import TC_ALL, TC_HALF, TcForm
    network = load_preset(name)
    w = network.params["fc1.weight"].to("cuda").half().contiguous()
    b = network.params["fc1.bias"].to("cuda")
    rows, depth, outputs = 10000, w.shape[1], w.shape[0]
    g = torch.Generator(device="cuda").manual_seed(5)
    x = (torch.rand(rows, depth, device="cuda", generator=g) * 2 - 1).half()
    ref = torch.tanh(torch.nn.functional.linear(x.double(), w.double(), b.double()))
    inputs = rotated_inputs(x)
    best = None
    for bm, bn, bk, stages in itertools.product((128, 64), (64, 32), (64, 32, 128), (4, 3, 5)):
        length = -(-depth // bk) * bk
        y = torch.empty(rows, outputs, device="cuda")
        try:
            fn = lambda t: gpu_dense_tc.launch_part(t, w, y, length, (bm, bn, bk), 4, stages, "tf32", b, 1)
            fn(x)
            err = ((y.double() - ref).norm() / ref.norm()).item()
            us = float(np.median(time_calls(fn, inputs, "cuda", repeat=30))) * 1e6
        except Exception as exc:  # noqa: BLE001 - out of shared memory and the like: reported, the rest go on
            print(f"shape {bm}x{bn}x{bk} s{stages}: {type(exc).__name__}", flush=True)
            continue
        RESULT["shapes"].append(dict(bm=bm, bn=bn, bk=bk, warps=4, stages=stages, gpu_us=us, relative_error=err))
        print(f"shape {bm}x{bn}x{bk} w4 s{stages}: {us:6.1f} us  err {err:.1e}", flush=True)
        if best is None or us < best[0]:
            best = (us, bm, bn, bk, stages)
    _, bm, bn, bk, stages = best
    TC_HALF["tc-probe"] = TC_ALL["tc-probe"] = TcForm(bn, bk, 512, 2, max_bm=bm, stages=stages)
    print(f"tc-probe = {TC_ALL['tc-probe']}", flush=True)


def whole_part(presets, rounds=7):
    from convforge.gpu_dense import TC_ALL
    for name in presets:
        network = load_preset(name)
        arch = network.architecture
        if "tc-probe" in TC_ALL:   # call 2: the engines and a fast one with the probed form as well
            built = engines(network)
            built["fast probe"] = Engine(network, device="cuda", precision="fast")
            for step in built["fast probe"].steps:
                if step.gpu_dense is not None and step.gpu_dense.half:
                    step.gpu_dense.VARIANTS = (*gpu_dense.GpuDense.VARIANTS, "tc-probe")
        else:
            built = engines(network)
        params64 = {k: v.to("cuda", torch.float64) for k, v in network.params.items()}
        batch = 10000
        g = torch.Generator(device="cuda").manual_seed(batch)
        x = torch.randint(0, 256, (batch, 1, arch.input_size, arch.input_size), generator=g, device="cuda").float()
        with torch.inference_mode():
            reference = forward_with(arch, params64, x.double()).cpu().numpy()
        inputs = rotated_inputs(x)
        forwards, errors = {}, {}
        with torch.inference_mode():
            for label, e in built.items():
                errors[label] = relative_error(e.forward(x, timed=False), reference)   # eager choices made here
                forwards[f"{label} eager"] = lambda t, e=e: e.forward(t, timed=False)
                forwards[f"{label} graph"] = e.graphed(batch)
        per = {k: [] for k in forwards}
        order = list(forwards)
        for r in range(rounds):
            for k in (order if r % 2 == 0 else order[::-1]):
                with torch.inference_mode():
                    t = time_calls(forwards[k], inputs, "cuda", repeat=30, timing="call")
                per[k].append(float(np.median(t)) * 1e3)
        for label, e in built.items():
            dense = [s for s in e.steps if s.gpu_dense is not None]
            print(f"{name:6s} {label:12s} dense eager {[(s.prefix, s.gpu_dense.choice.get(batch)) for s in dense]} "
                  f"graph {[(s.prefix, s.gpu_dense.graph_choice.get(batch)) for s in dense]}  err {errors[label]:.1e}",
                  flush=True)
        for k in forwards:
            mode = k.rsplit(" ", 1)[1]
            row = dict(model=name, batch=batch, candidate=k, ms=statistics.median(per[k]), ms_rounds=per[k])
            if k.startswith("fast"):
                ratio = [a / b for a, b in zip(per[f"exact now {mode}"], per[k])]
                row.update(exact_now_same_mode_over_this=statistics.median(ratio), range=[min(ratio), max(ratio)])
            RESULT["whole"].append(row)
        best = {lab: min(statistics.median(per[f"{lab} eager"]), statistics.median(per[f"{lab} graph"]))
                for lab in built}
        for k in forwards:
            extra = ""
            if k.startswith("fast"):
                row = next(r for r in RESULT["whole"] if r["model"] == name and r["candidate"] == k)
                extra = (f"  exact now ({k.rsplit(' ', 1)[1]}) / this {row['exact_now_same_mode_over_this']:.3f} "
                         f"({row['range'][0]:.3f}-{row['range'][1]:.3f})")
            print(f"{name:6s} {k:18s} {statistics.median(per[k]):8.4f} ms{extra}", flush=True)
        for lab in [k for k in built if k.startswith("fast")]:
            print(f"{name:6s} best of eager/graph: exact now {best['exact now']:.4f} exact before "
                  f"{best['exact before']:.4f} {lab} {best[lab]:.4f} -> exact now / {lab} "
                  f"{best['exact now'] / best[lab]:.3f}", flush=True)
        RESULT["whole"].append(dict(model=name, best_of_eager_graph_ms=best))
        del forwards, built
        torch.cuda.empty_cache()


def call_ms(fn, x, calls=50):
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def small_part(rounds=5):
    for name in ("fa17-high", "sp18", "sp19", "fa18", "fa19", "fa20"):
        network = load_preset(name)
        arch = network.architecture
        built = engines(network)
        for batch in (10, 100):
            g = torch.Generator(device="cuda").manual_seed(batch)
            x = torch.randint(0, 256, (batch, 1, arch.input_size, arch.input_size), generator=g, device="cuda").float()
            with torch.inference_mode():
                logits = {k: e.forward(x, timed=False).clone() for k, e in built.items()}
                per = {k: [] for k in built}
                for r in range(rounds):
                    for k in (list(built) if r % 2 == 0 else list(built)[::-1]):
                        per[k].append(call_ms(lambda xi, e=built[k]: e.forward(xi, timed=False), x))
            choices = {k: [s.gpu_dense.choice.get(batch) for s in e.steps if s.gpu_dense is not None]
                       for k, e in built.items()}
            for p in ("exact", "fast"):
                ratio = [a / b for a, b in zip(per[f"{p} now"], per[f"{p} before"])]
                row = dict(model=name, batch=batch, precision=p, before_ms=statistics.median(per[f"{p} before"]),
                           now_ms=statistics.median(per[f"{p} now"]), now_over_before=statistics.median(ratio),
                           range=[min(ratio), max(ratio)], choices_before=choices[f"{p} before"],
                           choices_now=choices[f"{p} now"],
                           max_abs_diff=float((logits[f"{p} now"] - logits[f"{p} before"]).abs().max()))
                RESULT["small"].append(row)
                print(f"small {name:9s} B={batch:3d} {p:5s} before {row['before_ms']:.4f} now {row['now_ms']:.4f} ms "
                      f"now/before {row['now_over_before']:.3f} ({min(ratio):.3f}-{max(ratio):.3f}) choices "
                      f"{row['choices_before']} -> {row['choices_now']} max|diff| {row['max_abs_diff']:.1e}",
                      flush=True)
        del built
        torch.cuda.empty_cache()


ROUNDS = 7


def main():
    global ROUNDS
    out, parts = sys.argv[1], sys.argv[2].split(",")
    presets = sys.argv[3:] or ["sp19"]
    ROUNDS = int(os.environ.get("ROUNDS", ROUNDS))
    exact_fp32()
    RESULT.update(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                  triton=__import__("triton").__version__)
    for part in parts:
        {"layer": layer_part, "shapes": shapes_part, "whole": lambda: whole_part(presets, ROUNDS),
         "small": small_part}[part]()
        with open(out, "w") as handle:
            json.dump(RESULT, handle, indent=1)


if __name__ == "__main__":
    main()
