"""Where the fft entry's GPU time goes (issue #24): torch.profiler's CUDA kernel table per shape.

    python3 scripts/fft_profile.py B,M,C,H,W,K [...]    # prints the top kernels of 5 calls per shape
"""

from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from convforge.conv import fft_conv
from convforge.harness.check import random_case


def main(shapes: list[str]) -> None:
    for text in shapes:
        B, M, C, H, W, K = map(int, text.split(","))
        x, w, _ = random_case((B, C, H, W), (M, C, K, K), 0, device="cuda")
        fn = fft_conv.prepare(w)
        with torch.inference_mode():
            for _ in range(3):
                fn(x)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                for _ in range(5):
                    fn(x)
                torch.cuda.synchronize()
        print(f"== {text}: plan {fft_conv.plan(M, C, H, W, K)}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))


if __name__ == "__main__":
    main(sys.argv[1:])
