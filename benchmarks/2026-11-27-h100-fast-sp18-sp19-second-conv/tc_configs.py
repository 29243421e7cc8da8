"""cuda-tc-fp16 on sp18 L2 and sp19 L2 (6 -> 16 maps, 5x5) at 10000 images, every kernel and launch shape that
serves them: the gather kernel with an FP16 output (what the fast path runs; no tuned entry exists for these
FP16 layers, so it runs DEFAULT_CONFIG) and with fp32, the rows kernel (fp32 output only); with XH=1 (call 6), the
gather kernel's FP16 image pairs (xh=1) and the fp32 image over the same launch shapes. Inputs in tanh's range,
rotated past L2; CUDA events, GPU time, median of 30 after warm-up; outputs against float64.
Usage: [XH=1] PYTHONPATH=. python3 tc_configs.py OUT.json"""
import itertools
import json
import os
import sys

import numpy as np
import torch

from convforge.conv import cuda_tc
from convforge.harness.check import relative_error
from convforge.harness.timing import rotated_inputs, time_calls
from convforge.models import load_preset

LAYERS = {"sp18 L2": ("sp18", 30), "sp19 L2": ("sp19", 22)}
XH = os.environ.get("XH") == "1"


def main():
    results = []
    for label, (preset, size) in LAYERS.items():
        w = load_preset(preset).params["conv2.weight"].cuda().contiguous()
        g = torch.Generator(device="cuda").manual_seed(size)
        x = torch.rand((10000, w.shape[1], size, size), generator=g, device="cuda") * 2 - 1
        ref = torch.nn.functional.conv2d(x[:256].double(), w.double()).cpu().numpy()
        inputs = rotated_inputs(x)
        candidates = []
        if XH:   # call 6: the FP16 image pairs (xh=1) against the fp32 image, both with FP16 outputs
            for rm, nt, cs, xh in itertools.product((1, 2, 4), (64, 128, 256), (0, 1), (1, 0)):
                candidates.append(({"kernel": "gather", "rm": rm, "nt": nt, "cs": cs, "xh": xh}, True))
        else:    # call 5
            for rm, nt, cs in itertools.product((1, 2, 4), (128, 256, 512), (0, 1)):
                for half in (True, False) if (rm, nt, cs) == (2, 256, 0) else (True,):
                    candidates.append(({"kernel": "gather", "rm": rm, "nt": nt, "cs": cs}, half))
            candidates += [(dict(c), False) for c in cuda_tc.ROWS_LAUNCH_CONFIGS]
        for config, half in candidates:
            tag = f"{config} {'fp16-out' if half else 'fp32-out'}"
            try:
                fn = cuda_tc.prepare(w, None, precision="fp16", config=config,
                                     out_dtype=torch.float16 if half else torch.float32)
                out = fn(x[:256])
            except Exception as exc:   # noqa: BLE001 - a shape the kernel refuses: recorded, skipped
                print(f"{label}  {tag}: {type(exc).__name__}: {str(exc)[:100]}", flush=True)
                continue
            err = relative_error(out.float(), ref)
            ms = float(np.median(time_calls(fn, inputs, "cuda", repeat=30))) * 1e3
            results.append(dict(layer=label, config=config, out=str(out.dtype), ms=ms, relative_error=err))
            print(f"{label}  {tag:70s} {ms:7.4f} ms  err {err:.1e}", flush=True)
    with open(sys.argv[1], "w") as handle:
        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, rows=results), handle, indent=1)


if __name__ == "__main__":
    main()
