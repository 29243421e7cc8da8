"""Issue #21: the exact path's dense layers on the GPU, one cuBLAS call each: does another operand layout or
cuBLASLt run the presets' fully connected layers (B = 10000, fp32, TF32 off) closer to the fp32 matmul rate
than F.linear? CUDA events, median of 30 after warm-up; every variant checked against float64 first.
Usage: python3 scripts/dense_layout_probe.py [--out FILE.json]"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from convforge.models import Dense, load_preset

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def median_ms(fn, repeat=30):
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def variants(x, w, b):
    wt = w.t().contiguous()
    return {
        "F.linear (x W^T + b)": lambda: F.linear(x, w, b),
        "addmm x Wt (W^T stored)": lambda: torch.addmm(b, x, wt),
        "addmm W x^T, transposed out": lambda: torch.addmm(b[:, None], w, x.t()).t(),
        "mm then bias (no epilogue)": lambda: torch.mm(x, wt).add_(b),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--batch", type=int, default=10000)
    args = parser.parse_args()
    records = []
    a = torch.randn(8192, 8192, device="cuda")
    rate = 2 * 8192**3 / median_ms(lambda: a @ a, 10) / 1e9
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}: fp32 matmul 8192^3 {rate:.1f} TFLOP/s")
    seen = set()
    for preset in ("fa17-high", "sp18", "sp19", "fa18", "fa19", "fa20"):
        network = load_preset(preset)
        for layer, prefix, _, _ in network.architecture.walk():
            if not isinstance(layer, Dense):
                continue
            name = prefix
            w = network.params[f"{prefix}.weight"].float().cuda()
            b = network.params[f"{prefix}.bias"].float().cuda()
            shape = (args.batch, w.shape[1], w.shape[0])
            if shape in seen:
                continue
            seen.add(shape)
            x = torch.rand(args.batch, w.shape[1], device="cuda")
            ref = F.linear(x.double(), w.double(), b.double())
            flop = 2 * args.batch * w.shape[0] * w.shape[1]
            for library in ("cublas", "cublaslt"):
                torch.backends.cuda.preferred_blas_library(library)
                for label, fn in variants(x, w, b).items():
                    error = ((fn().double() - ref).norm() / ref.norm()).item()
                    ms = median_ms(fn)
                    record = {"preset": preset, "layer": name, "B_K_N": shape, "blas": library, "variant": label,
                              "ms": ms, "tflops": flop / ms / 1e9, "pct_fp32_rate": 100 * flop / ms / 1e9 / rate,
                              "rel_error": error}
                    records.append(record)
                    print(f"{preset:9s} {str(shape):20s} {library:8s} {label:30s} {ms:8.4f} ms "
                          f"{record['tflops']:6.1f} TFLOP/s {record['pct_fp32_rate']:5.1f} % err {error:.1e}")
            torch.backends.cuda.preferred_blas_library("cublas")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "fp32_rate_tflops": rate,
                       "records": records}, handle, indent=1)


if __name__ == "__main__":
    main()
