"""sp18 L2 and sp19 L2 (6 channels -> 16 maps, 5x5, no activation, no pool) as the fast path runs them at 10000
images: cuda-tc-fp16 with an FP16 output (main's fast path: its tuned kernel for the shape) against triton-tc-fused's
rows kernel with FP16 and fp32 outputs, its default launch shape and the other rows shapes of its SWEEP (plus 4
output columns per row block). Inputs in tanh's range (the first conv's pooled tanh output), rotated past L2; CUDA
events, GPU time, median of 30 calls after warm-up; every output against float64 (relative error).
Usage: PYTHONPATH=. python3 layer_ab.py OUT.json"""
import dataclasses
import json
import sys

import numpy as np
import torch

from convforge import conv
from convforge.conv import triton_tc_fused as tcf
from convforge.harness.check import relative_error
from convforge.harness.timing import rotated_inputs, time_calls
from convforge.models import load_preset

LAYERS = {"sp18 L2": ("sp18", "conv2", 30), "sp19 L2": ("sp19", "conv2", 22)}
BATCH = 10000


def main():
    rows_configs = [c for c in tcf.SWEEP if c.rows]
    rows_configs += [dataclasses.replace(tcf.DEFAULT_ROWS, rows=4), dataclasses.replace(tcf.DEFAULT_ROWS, rows=4,
                                                                                         block_m=256)]
    results = []
    for label, (preset, prefix, size) in LAYERS.items():
        params = load_preset(preset).params
        w = params[f"{prefix}.weight"].cuda().contiguous()
        b = params.get(f"{prefix}.bias")
        b = None if b is None else b.cuda()
        g = torch.Generator(device="cuda").manual_seed(size)
        x = torch.rand((BATCH, w.shape[1], size, size), generator=g, device="cuda") * 2 - 1
        ref = torch.nn.functional.conv2d(x[:256].double(), w.double(), None if b is None else b.double()).cpu().numpy()
        inputs = rotated_inputs(x)
        candidates = {"cuda-tc-fp16 fp16-out (main)": conv.get("cuda-tc-fp16").prepare(
            w, b, input_hw=(size, size), out_dtype=torch.float16)}
        for cfg in [tcf.DEFAULT_ROWS] + [c for c in rows_configs if c != tcf.DEFAULT_ROWS]:
            tag = f"rows{cfg.rows} {cfg.block_m}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}"
            candidates[f"tc-fused {tag} fp16-out"] = tcf.prepare(w, b, config=cfg, out_dtype=torch.float16)
            if cfg == tcf.DEFAULT_ROWS:
                candidates[f"tc-fused {tag} fp32-out"] = tcf.prepare(w, b, config=cfg)
        for name, fn in candidates.items():
            out = fn(x[:256])
            err = relative_error(out.float(), ref)
            t = time_calls(fn, inputs, "cuda", repeat=30)
            ms = float(np.median(t)) * 1e3
            results.append(dict(layer=label, candidate=name, ms=ms, relative_error=err, out_dtype=str(out.dtype)))
            print(f"{label}  {name:44s} {ms:7.4f} ms  err {err:.1e}  {out.dtype}", flush=True)
    with open(sys.argv[1], "w") as handle:
        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                       triton=__import__("triton").__version__, rows=results), handle, indent=1)


if __name__ == "__main__":
    main()
