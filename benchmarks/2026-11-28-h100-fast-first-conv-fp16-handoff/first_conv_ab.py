"""The fast path's FP16 hand-off from the fused first conv to the tensor-core second conv (engine.HALF_CONV_HANDOFF)
on and off, with the exact path, three engines per preset in one process (the previous A/B's script,
benchmarks/2026-11-27-h100-fast-fp16-handoff/handoff_ab.py, with the new switch): the whole forward from a CUDA
graph at 100 and 10000 images, interleaved rounds (order reversed every round), each round the median of `repeat`
calls (host launch work included, as `bench --whole`), rotating inputs > L2; logits against float64; then the 10000
test images through Engine.run for each engine (accuracy, predictions agreement). Usage: PYTHONPATH=. python3 first_conv_ab.py
OUT.json [rounds] [presets...]"""
import json
import statistics
import sys

import numpy as np
import torch

from convforge import data, engine
from convforge.engine import Engine
from convforge.harness.check import relative_error
from convforge.harness.timing import rotated_inputs, time_calls
from convforge.models import forward_with, load_preset


def build(network, precision, conv_handoff=True):
    saved = engine.HALF_CONV_HANDOFF
    engine.HALF_CONV_HANDOFF = conv_handoff
    try:
        return Engine(network, device="cuda", precision=precision)
    finally:
        engine.HALF_CONV_HANDOFF = saved


def engines_for(network):
    return {"exact": build(network, "exact"), "fast conv fp16 hand-off": build(network, "fast"),
            "fast main": build(network, "fast", conv_handoff=False)}


def first_conv_dtype(e, size, batch):
    """The dtype the engine's first conv writes at ``batch`` images (float16 with the hand-off)."""
    with torch.inference_mode():
        return str(e.steps[0].conv_fn(torch.rand(batch, 1, size, size, device="cuda") * 255).dtype)


def main():
    out, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 7
    presets = sys.argv[3:] or ["sp18", "sp19", "fa18", "fa19"]
    rows = []
    for name in presets:
        network = load_preset(name)
        arch = network.architecture
        engines = engines_for(network)
        for label, e in engines.items():
            dtypes = [first_conv_dtype(e, arch.input_size, batch) for batch in (100, 10000)]
            print(f"{name:9s} {label:24s} first conv writes at 100 and 10000 images: {dtypes}", flush=True)
        params64 = {k: v.to("cuda", torch.float64) for k, v in network.params.items()}
        for batch in (100, 10000):
            g = torch.Generator(device="cuda").manual_seed(batch)
            x = torch.randint(0, 256, (batch, 1, arch.input_size, arch.input_size), generator=g,
                              device="cuda").float()
            with torch.inference_mode():
                reference = forward_with(arch, params64, x.double()).cpu().numpy()
            inputs = rotated_inputs(x)
            graphs, errors, agree = {}, {}, {}
            with torch.inference_mode():
                for label, e in engines.items():
                    graphs[label] = e.graphed(batch)
                    logits = graphs[label](x).clone()
                    errors[label] = relative_error(logits, reference)
                    agree[label] = float((logits.argmax(1).cpu().numpy() == reference.argmax(1)).mean())
            per_round = {label: [] for label in engines}
            order = list(engines)
            for r in range(rounds):
                for label in (order if r % 2 == 0 else order[::-1]):
                    with torch.inference_mode():
                        t = time_calls(graphs[label], inputs, "cuda", repeat=30 if batch > 1000 else 200,
                                       timing="call")
                    per_round[label].append(float(np.median(t)) * 1e3)
            for label, e in engines.items():
                forms = [(s.prefix, s.gpu_dense.graph_choice.get(batch)) for s in e.steps if s.gpu_dense is not None]
                convs = [(s.result.impl, s.result.fused) for s in e.steps if getattr(s, "result", None)]
                print(f"{name:9s} {batch:6d} {label:20s} convs {convs} dense forms in the graph: {forms}",
                      flush=True)
            for label in engines:
                ms = statistics.median(per_round[label])
                ratio = [a / b for a, b in zip(per_round["exact"], per_round[label])]
                gain = [a / b for a, b in zip(per_round["fast main"], per_round[label])]
                row = dict(model=name, batch=batch, candidate=label, ms=ms, ms_rounds=per_round[label],
                           exact_over_this=statistics.median(ratio), exact_over_this_range=[min(ratio), max(ratio)],
                           main_over_this=statistics.median(gain), main_over_this_range=[min(gain), max(gain)],
                           relative_error=errors[label], argmax_agree_float64=agree[label])
                rows.append(row)
                print(f"{name:9s} {batch:6d} {label:24s} {ms:8.4f} ms  exact/this {row['exact_over_this']:5.2f} "
                      f"({min(ratio):.2f}-{max(ratio):.2f})  main/this {row['main_over_this']:5.3f} "
                      f"({min(gain):.3f}-{max(gain):.3f})  err {errors[label]:.1e}  agree {agree[label]:.4f}",
                      flush=True)
            del graphs
        subset = data.load("test", arch.input_size, 10000)
        preds = {}
        for label, e in engines.items():
            result = e.run(subset.images, subset.labels)
            preds[label] = result.predictions
            rows.append(dict(model=name, batch=10000, candidate=label, test_accuracy=result.correctness))
            print(f"{name:9s} test images: {label:20s} accuracy {result.correctness:.4f}", flush=True)
        for label in engines:
            print(f"{name:9s} predictions equal to exact's: {label:20s} "
                  f"{float((preds[label] == preds['exact']).mean()):.4f}", flush=True)
        del engines
        torch.cuda.empty_cache()
    with open(out, "w") as handle:
        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                       rows=rows), handle, indent=1)


if __name__ == "__main__":
    main()
