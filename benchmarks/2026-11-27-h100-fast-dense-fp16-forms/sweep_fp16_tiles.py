"""gpu_dense_tc's kernel on FP16 operands (the fast path's fc1 after the FP16 hand-off) across launch shapes, at
10000 rows: BM x BN x BK, warps, pipeline stages and reduction slices; each shape's partial products plus the
ordered sum (gemv's sum kernel, as GpuDense runs them), GPU time, CUDA events, median of 30 after warm-up, inputs
rotated past L2; output against float64. cuBLAS (F.linear on FP16, fp32 sums) for reference.
Usage: PYTHONPATH=. python3 sweep_fp16_tiles.py OUT.json [presets...]"""
import itertools
import json
import sys

import numpy as np
import torch

from convforge import gpu_dense, gpu_dense_tc
from convforge.engine import median_seconds
from convforge.gpu_dense import GpuDense
from convforge.harness.timing import rotated_inputs, time_calls
from convforge.models import load_preset

ROWS = 10000


def main():
    out_rows = []
    for preset in sys.argv[2:] or ("sp18", "sp19"):
        params = load_preset(preset).params
        weight, bias = params["fc1.weight"].cuda().half().contiguous(), params["fc1.bias"].cuda()
        outputs, depth = weight.shape
        dense = GpuDense(weight, bias, median_seconds)
        g = torch.Generator(device="cuda").manual_seed(7)
        x = ((torch.rand((ROWS, depth), generator=g, device="cuda") * 2 - 1) * 4).half()
        ref = torch.nn.functional.linear(x.double(), weight.double(), bias.double())
        inputs = rotated_inputs(x)
        t = time_calls(lambda t: torch.nn.functional.linear(t, weight), inputs, "cuda", repeat=30)
        print(f"{preset} fc1 {tuple(weight.shape)} cuBLAS F.linear fp16: {np.median(t) * 1e3:.4f} ms", flush=True)
        out_rows.append(dict(layer=f"{preset} fc1", form="cuBLAS F.linear", gpu_ms=float(np.median(t)) * 1e3))
        for bm, bn, bk, warps, stages, slices in itertools.product((64, 128), (64, 128, 256), (64, 128), (4, 8),
                                                                     (3, 4), (1, 2, 4)):
            if bm * bn > 128 * 128 and warps == 4:
                continue
            length = -(-(-(-depth // slices)) // bk) * bk
            n_slices = -(-depth // length)

            def run(t, bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, length=length, n_slices=n_slices):
                part = torch.empty((n_slices, ROWS, outputs), device="cuda")
                gpu_dense_tc.launch_part(t, weight, part, length, (bm, bn, bk), warps, stages, "tf32")
                return dense._sum(gpu_dense.kernel_specs()[0], part, ROWS, outputs, n_slices)
            tag = f"{bm}x{bn}x{bk} w{warps} s{stages} k{n_slices}"
            try:
                got = run(x)
            except Exception as exc:   # noqa: BLE001 - shared memory or registers out of range: skip the shape
                print(f"{preset} {tag}: {type(exc).__name__}", flush=True)
                continue
            err = ((got.double() - ref).norm() / ref.norm()).item()
            t = time_calls(run, inputs, "cuda", repeat=30)
            ms = float(np.median(t)) * 1e3
            out_rows.append(dict(layer=f"{preset} fc1", form=tag, gpu_ms=ms, relative_error=err))
            print(f"{preset} {tag:26s} {ms:8.4f} ms  err {err:.1e}", flush=True)
    with open(sys.argv[1], "w") as handle:
        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                       triton=__import__("triton").__version__, rows=out_rows), handle, indent=1)


if __name__ == "__main__":
    main()
