"""Issue #21: every preset's dense layers at 1-100 rows in each of GpuDense's forms, GPU time (CUDA events after
a spin, engine.median_seconds' way), weights rotated over copies that together exceed twice the L2 cache
(as in the network, where the convolutions run between two calls of a layer). Checked against float64 first.
Usage: PYTHONPATH=. python3 benchmarks/2026-11-26-h100-dense-gemv-small-batch/dense_forms.py > dense_forms.txt"""
import statistics

import torch

from convforge.engine import LEAD_CYCLES, median_seconds
from convforge.gpu_dense import GpuDense
from convforge.models import PRESETS, load_preset

torch.backends.cuda.matmul.allow_tf32 = False
L2 = torch.cuda.get_device_properties(0).L2_cache_size


def layers():
    seen = {}
    for preset in PRESETS:
        params = load_preset(preset).params
        for name, w in params.items():
            if name.endswith(".weight") and w.dim() == 2 and tuple(w.shape) not in seen:
                seen[tuple(w.shape)] = (preset, name, w.float(), params.get(name[:-len("weight")] + "bias"))
    return seen.values()


def main():
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}, L2 {L2 / 2**20:.0f} MiB, spin {LEAD_CYCLES}")
    print(f"{'layer':24s} {'rows':>5s} " + " ".join(f"{v:>13s}" for v in GpuDense.VARIANTS) + "   best  GB/s(best)")
    for preset, name, w, b in layers():
        w, b = w.cuda(), b.float().cuda()
        copies = max(2, int(2 * L2 // w.numel() // 4) + 1)
        denses = [GpuDense(w + 0.0 if i == 0 else w * (1 + 1e-3 * i), b, median_seconds) for i in range(copies)]
        for rows in (1, 10, 16, 32, 100):
            x = torch.rand(rows, w.shape[1], device="cuda") * 2
            ref = torch.nn.functional.linear(x.double(), w.double(), b.double())
            cells, best = [], None
            for variant in GpuDense.VARIANTS:
                if not denses[0].serves(variant, rows):
                    cells.append(f"{'-':>13s}")
                    continue
                err = ((denses[0].run(variant, x).double() - ref).norm() / ref.norm()).item()
                assert err <= 1e-5, (name, rows, variant, err)
                for d in denses:
                    d.run(variant, x)
                state = {"i": 0}

                def call():
                    denses[state["i"] % copies].run(variant, x)
                    state["i"] += 1
                ms = statistics.median(median_seconds(call, "cuda", copies) for _ in range(7)) * 1e3
                cells.append(f"{ms * 1e3:10.1f} us")
                if best is None or ms < best[1]:
                    best = (variant, ms)
            gbps = (w.numel() + x.numel() + rows * w.shape[0]) * 4 / (best[1] * 1e-3) / 1e9
            print(f"{preset + ' ' + name:24s} {rows:5d} " + " ".join(cells) + f"   {best[0]:12s} {gbps:7.0f}",
                  flush=True)


if __name__ == "__main__":
    main()
