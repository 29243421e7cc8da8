"""Does where the buffers land in GPU memory move a kernel's time? (dev tool;
see benchmarks/2026-11-21-h200-clocks-placement-tc-epilogue/)

    python3 scripts/placement_spread.py [--layers "sp19 L1,fa17 L1"] [--trials 12] [--impls cuda-direct,torch]

The same kernel has measured up to 15 % apart between bench processes at the same 1980 MHz SM clock, while
two rows of one process (cuda-direct and cuda-auto, the same kernel) agree within 2 %. Here, in one
process, each trial frees the caching allocator's memory, allocates a pad of random size (0-2 GiB) and
then the layer's input and a preallocated output, and times each implementation as the bench does (CUDA
events, median of --repeat calls). It also times a plain device-to-device copy of the output's size into
that same output. If the per-trial medians spread as much as the processes did, placement is the cause.
"""

import argparse

import numpy as np
import torch

from convforge import conv
from convforge.harness.timing import time_calls
from convforge.harness.check import random_case
from convforge.harness.sweep import preset_layers
from convforge.harness.gpu_clocks import GpuSampler


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", default="sp19 L1,fa17 L1")
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--impls", default="cuda-direct,torch")
    p.add_argument("--batch", type=int, default=10000)
    args = p.parse_args()
    wanted = args.layers.split(",")
    rng = np.random.default_rng(0)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    for spec in preset_layers():
        label, (M, C, H, W, K) = spec.label, (spec.shape.M, spec.shape.C, spec.shape.H, spec.shape.W, spec.shape.K)
        if label not in wanted:
            continue
        B = args.batch
        x_host, w_host, _ = random_case((B, C, H, W), (M, C, K, K), seed=0)
        print(f"{label}: B={B} C={C} H={H} W={W} M={M} K={K}")
        per_impl = {name: [] for name in args.impls.split(",")}
        per_impl["copy"] = []
        for trial in range(args.trials):
            torch.cuda.empty_cache()
            pad_mib = int(rng.integers(0, 2048))
            pad = torch.empty(pad_mib << 18, device="cuda")   # float32: 4 B each, so MiB * 2^18 elements
            x = x_host.to("cuda")
            w = w_host.to("cuda")
            out = conv.get("torch").prepare(w, None)(x)
            src = torch.empty_like(out).normal_()
            line = [f"  trial {trial:2d} pad {pad_mib:4d} MiB x@{x.data_ptr() % (1 << 30):#011x}"]
            for name in per_impl:
                if name == "copy":
                    fn = lambda t, o=out, s=src: o.copy_(s)
                else:
                    fn = conv.get(name).prepare(w, None)
                with GpuSampler(0) as sampler:
                    ms = float(np.median(time_calls(fn, [x], "cuda", warmup=3, repeat=args.repeat))) * 1e3
                per_impl[name].append(ms)
                line.append(f"{name} {ms:.3f} ms ({sampler.fields()['sm_clock_mhz_median']} MHz)")
            print("  ".join(line), flush=True)
            del pad, x, w, out, src
        for name, values in per_impl.items():
            v = np.array(values)
            print(f"  {name:12s} min {v.min():.3f} median {np.median(v):.3f} max {v.max():.3f} ms, "
                  f"max/min {v.max() / v.min():.3f}")


if __name__ == "__main__":
    main()
