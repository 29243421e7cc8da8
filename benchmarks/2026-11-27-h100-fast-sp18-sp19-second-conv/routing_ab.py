"""The fast path's unfused second conv of sp18 and sp19 (6 -> 16 maps, 5x5, FP16 hand-off to fc1) on triton-tc-fused's
rows kernel (this branch's Engine._layer_impl) against cuda-tc-fp16 (main's routing, restored here by patching the
method), with the exact path: three engines per preset in one process. The whole forward at 100 and 10000 images,
eager (Engine.forward, no per-layer syncs) and from a CUDA graph, interleaved rounds (order reversed every round),
each round the median of `repeat` calls with host launch work included (as `bench --whole`), rotating inputs > L2;
logits against float64; then the 10000 test images through Engine.run (accuracy, predictions against exact's).
Usage: PYTHONPATH=. CONVFORGE_DATA=.data python3 routing_ab.py OUT.json [rounds] [presets...]"""
import json
import statistics
import sys

import numpy as np
import torch

from convforge import conv, data, engine
from convforge.engine import Engine
from convforge.harness.check import relative_error
from convforge.harness.timing import rotated_inputs, time_calls
from convforge.models import forward_with, load_preset


def main_layer_impl(self, channels, maps, fusion):
    """main's routing (d27b919): unfused many-channel layers on FAST_CONV whatever their maps."""
    if self.precision != "fast" or channels == 1 or (fusion is not None and maps > engine.FAST_FUSED_MAX_MAPS):
        return self.impl
    fast = conv.get(engine.FAST_CONV if fusion is None else engine.FAST_FUSED_CONV)
    return fast if fast.unavailable_reason(self.device) is None else self.impl


def engines_for(network):
    built = {"exact": Engine(network, device="cuda", precision="exact"),
             "fast rows (branch)": Engine(network, device="cuda", precision="fast")}
    branch = Engine._layer_impl
    Engine._layer_impl = main_layer_impl
    try:
        built["fast tc-fp16 (main)"] = Engine(network, device="cuda", precision="fast")
    finally:
        Engine._layer_impl = branch
    return built


def main():
    out, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 7
    presets = sys.argv[3:] or ["sp18", "sp19"]
    rows = []
    for name in presets:
        network = load_preset(name)
        arch = network.architecture
        engines = engines_for(network)
        for label, e in engines.items():
            print(f"{name:6s} {label:22s} convs {[(s.result.impl, s.result.fused) for s in e.steps if s.result]}",
                  flush=True)
        params64 = {k: v.to("cuda", torch.float64) for k, v in network.params.items()}
        for batch in (100, 10000):
            g = torch.Generator(device="cuda").manual_seed(batch)
            x = torch.randint(0, 256, (batch, 1, arch.input_size, arch.input_size), generator=g,
                              device="cuda").float()
            with torch.inference_mode():
                reference = forward_with(arch, params64, x.double()).cpu().numpy()
            inputs = rotated_inputs(x)
            forwards, errors = {}, {}
            with torch.inference_mode():
                for label, e in engines.items():
                    graph = e.graphed(batch)
                    forwards[f"{label} graph"] = graph
                    forwards[f"{label} eager"] = lambda t, e=e: e.forward(t, timed=False)
                    errors[label] = relative_error(graph(x).clone(), reference)
            per_round = {label: [] for label in forwards}
            order = list(forwards)
            for r in range(rounds):
                for label in (order if r % 2 == 0 else order[::-1]):
                    with torch.inference_mode():
                        t = time_calls(forwards[label], inputs, "cuda", repeat=30 if batch > 1000 else 200,
                                       timing="call")
                    per_round[label].append(float(np.median(t)) * 1e3)
            for label in forwards:
                base = label.replace(" graph", "").replace(" eager", "")
                exact = per_round["exact eager"] if label.endswith("eager") else per_round["exact graph"]
                ratio = [a / b for a, b in zip(exact, per_round[label])]
                row = dict(model=name, batch=batch, candidate=label, ms=statistics.median(per_round[label]),
                           ms_rounds=per_round[label], exact_over_this=statistics.median(ratio),
                           exact_over_this_range=[min(ratio), max(ratio)], relative_error=errors[base])
                rows.append(row)
                print(f"{name:6s} {batch:6d} {label:30s} {row['ms']:8.4f} ms  exact/this (same form) "
                      f"{row['exact_over_this']:5.2f} ({min(ratio):.2f}-{max(ratio):.2f})  err {errors[base]:.1e}",
                      flush=True)
            del forwards
        subset = data.load("test", arch.input_size, 10000)
        preds = {}
        for label, e in engines.items():
            result = e.run(subset.images, subset.labels)
            preds[label] = result.predictions
            print(f"{name:6s} test images: {label:22s} accuracy {result.correctness:.4f}", flush=True)
            rows.append(dict(model=name, batch=10000, candidate=label, test_accuracy=result.correctness,
                             predictions_equal_exact=float((preds[label] == preds["exact"]).mean())))
            print(f"{name:6s} predictions equal to exact's: {label:22s} {rows[-1]['predictions_equal_exact']:.4f}",
                  flush=True)
        del engines
        torch.cuda.empty_cache()
    with open(out, "w") as handle:
        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                       triton=__import__("triton").__version__, rows=rows), handle, indent=1)


if __name__ == "__main__":
    main()
