"""A/B: the tensor-core kernels before (OLD_KERNELS: main's tc*.cu and mma.cuh) and after the non-finite fix, in one
process, interleaved, on the preset layers that use them (fa17, fa18, fa19; B = 10000, the tuned kernel of each).

Per layer and precision: both versions prepared (the old one compiled from OLD_KERNELS with its 5-argument launch),
outputs compared bit for bit on finite course-scale data, then ROUNDS rounds of [old, new] groups of CALLS
back-to-back calls between two CUDA events (the queue stays full, so host launch work is hidden); median ms per
call of each. Then the new kernel on inputs with one NaN (image 0) and with a NaN in every image: the exact pass's
cost where it runs. Usage: OLD_KERNELS=DIR python3 ab_time.py [--rounds N] [--calls N] [--json FILE]
"""
import argparse, json, os, statistics, sys
from pathlib import Path

import torch

from convforge.conv import cuda_common as cc, cuda_tc

LAYERS = {"fa17 L1": (50, 1, 28, 28, 5), "fa18 L1": (12, 1, 72, 72, 7), "fa18 L2": (24, 12, 33, 33, 7),
          "fa19 L1": (12, 1, 70, 70, 5), "fa19 L2": (24, 12, 33, 33, 5)}


_KEEP = []   # compiled modules stay referenced (and loaded) while their kernels are timed


def build(w, b, precision, H, W, kernel_dir):
    new_dir = cc.KERNEL_DIR
    cc.KERNEL_DIR = Path(kernel_dir) if kernel_dir else new_dir
    cc._modules.clear(); cc._kernels.clear()
    try:
        fn = cuda_tc.prepare(w, b, precision=precision, input_hw=(H, W))
        layer = fn.layer_for(H, W)
        if kernel_dir and layer.packed is not None:     # main's rows and gather kernels: (y, x, packed, bias, B)
            layer.weight_args = (layer.packed,)
        layer.kernel  # compiled in __init__
    finally:
        cc.KERNEL_DIR = new_dir
        _KEEP.extend(cc._modules.values())
        cc._modules.clear(); cc._kernels.clear()
    return fn, layer


def time_group(fn, x, out, calls):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn(x, out=out)
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--json")
    args = ap.parse_args()
    old_dir = os.environ["OLD_KERNELS"]
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "cuda", torch.version.cuda,
          "cupy", cc.cupy().__version__, flush=True)
    rows = []
    g = torch.Generator(device="cuda").manual_seed(22)
    for name, (M, C, H, W, K) in LAYERS.items():
        x = torch.rand(args.images, C, H, W, device="cuda", generator=g) * 255.0
        w = torch.randn(M, C, K, K, device="cuda", generator=g) * (2.0 / (110.0 * (C * K * K) ** 0.5))
        b = torch.randn(M, device="cuda", generator=g)
        for precision in cuda_tc.PRECISIONS:
            old, old_layer = build(w, b, precision, H, W, old_dir)
            new, new_layer = build(w, b, precision, H, W, None)
            y_old, y_new = old(x), new(x)
            identical = bool(torch.equal(y_old, y_new))
            out = torch.empty_like(y_new)
            for fn in (old, new):            # warm-up
                time_group(fn, x, out, 3)
            t_old, t_new = [], []
            for _ in range(args.rounds):
                t_old.append(time_group(old, x, out, args.calls))
                t_new.append(time_group(new, x, out, args.calls))
            x1 = x.clone(); x1[0, 0, H // 2, W // 2] = float("nan")
            xa = x.clone(); xa[:, 0, H // 2, W // 2] = float("nan")
            t_one = statistics.median(time_group(new, x1, out, args.calls) for _ in range(3))
            t_all = statistics.median(time_group(new, xa, out, max(1, args.calls // 10)) for _ in range(3))
            ref_nan = torch.nn.functional.conv2d(xa[:2].double(), w.double(), b.double()).isnan()
            nan_ok = bool(torch.equal(new(xa)[:2].isnan(), ref_nan))
            row = dict(layer=name, shape=[args.images, M, C, H, W, K], precision=precision,
                       kernel=type(new_layer.geom).__name__, config=new_layer.geom.spec().options(),
                       registers=[old_layer.kernel.registers, new_layer.kernel.registers],
                       blocks=[old_layer.grid_cap, new_layer.grid_cap], old_ms=statistics.median(t_old), new_ms=statistics.median(t_new),
                       old_runs=t_old, new_runs=t_new, identical_on_finite=identical,
                       new_one_nan_ms=t_one, new_nan_every_image_ms=t_all, nan_positions_as_torch=nan_ok)
            row["new_over_old"] = row["new_ms"] / row["old_ms"]
            spread = lambda t: (max(t) - min(t)) / statistics.median(t)
            print(f"{name} {precision:4s} {row['kernel']:14s} old {row['old_ms']:.4f} new {row['new_ms']:.4f} ms "
                  f"new/old {row['new_over_old']:.4f} (spread old {spread(t_old):.3f} new {spread(t_new):.3f}) "
                  f"identical {identical} regs {row['registers']} grid {row['blocks']} | one NaN {t_one:.4f} ms, NaN in every image {t_all:.3f} ms, "
                  f"NaN positions as torch {nan_ok}", flush=True)
            rows.append(row)
            del old, new, y_old, y_new, out
        del x, x1, xa
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
