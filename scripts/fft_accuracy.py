"""The fft entry's accuracy study (issue #24): relative error against float64 on the gpumode and wide shapes.

    python3 scripts/fft_accuracy.py --device cpu OUT.json            # gpumode + WIDE_SAMPLE, batch 1
    python3 scripts/fft_accuracy.py --device cuda --all OUT.json     # every gpumode and wide shape

Per shape, at batch 1 on the full image (the tiling the layer really gets): x uniform -64..191, weights
N(0, 0.05), a bias N(0, 1), fresh per shape from its own seed. The fft entry computes the whole output into a
NaN-poisoned buffer (every element must be finite); a window of it is compared with the float64 reference
(``reference_layer`` of the matching input crop): the first WINDOW_MAPS maps, WINDOW x WINDOW outputs placed
across the first tile seam when the image is tiled (where overlap-save could go wrong), the whole reduction
C*K*K per output. torch's fp32 convolution (oneDNN / cuDNN, TF32 off) of the same crop is measured beside
it, for scale. The JSON is rewritten after every shape.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from convforge.conv import fft_conv, torch_conv
from convforge.harness.bench import SHAPE_SETS
from convforge.harness.check import poisoned, random_case, reference_layer, relative_error

WINDOW = 48
WINDOW_MAPS = 16
# wide shapes of the CPU study (indices into SHAPE_SETS["wide"]): K 1 to 11, 16 to 1024 px, up to 512 channels
WIDE_SAMPLE = (1, 6, 18, 22, 26, 27, 31, 33)


def study(shape, device: str, seed: int) -> dict:
    _, M, C, H, W, K = shape
    x, w, b = random_case((1, C, H, W), (M, C, K, K), seed, bias=True, device=device)
    p = fft_conv.plan(M, C, H, W, K)
    out_h, out_w = H - K + 1, W - K + 1
    rows, cols = min(WINDOW, out_h), min(WINDOW, out_w)
    r0 = max(0, min(out_h - rows, p.sh - rows // 2)) if p.nh > 1 else 0
    c0 = max(0, min(out_w - cols, p.sw - cols // 2)) if p.nw > 1 else 0
    maps = min(M, WINDOW_MAPS)
    with torch.inference_mode():
        start = time.perf_counter()
        fn = fft_conv.prepare(w, b)
        y = fn(x, out=poisoned((1, M, out_h, out_w), device))
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        written = bool(torch.isfinite(y).all())
        crop = x[:, :, r0:r0 + rows + K - 1, c0:c0 + cols + K - 1]
        ref = reference_layer(crop, w[:maps], b[:maps])
        torch_conv.exact_fp32()
        fp32 = F.conv2d(crop, w[:maps], b[:maps])
        error = relative_error(y[:, :maps, r0:r0 + rows, c0:c0 + cols], ref) if written else float("inf")
    return {"shape": list(shape), "tile": [p.th, p.tw], "tiles": p.nh * p.nw, "window": [r0, c0, rows, cols, maps],
            "fft_error": error, "torch_fp32_error": relative_error(fp32, ref), "written": written,
            "seconds_prepare_and_call": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--all", action="store_true", help="every wide shape, not WIDE_SAMPLE")
    args = parser.parse_args()
    wide = SHAPE_SETS["wide"] if args.all else [SHAPE_SETS["wide"][i] for i in WIDE_SAMPLE]
    rows = []
    for name, shapes in (("gpumode", SHAPE_SETS["gpumode"]), ("wide", wide)):
        for i, shape in enumerate(shapes):
            row = {"set": name, **study(shape, args.device, seed=1000 + 100 * len(rows) + i)}
            rows.append(row)
            print(f"{name} {','.join(map(str, shape))}: tile {row['tile'][0]}x{row['tile'][1]} x{row['tiles']} "
                  f"fft {row['fft_error']:.2e} torch fp32 {row['torch_fp32_error']:.2e} "
                  f"({row['seconds_prepare_and_call']:.2f} s)", flush=True)
            with open(args.out, "w", encoding="utf-8") as handle:
                json.dump(rows, handle, indent=1)
            if args.device == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
