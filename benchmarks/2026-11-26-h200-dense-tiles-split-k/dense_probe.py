"""Issue #21: the GPU engine's dense layers at 17 / 100 / 1000 rows, every form GpuDense measures (cuBLAS's four,
gemv's, and dense_tiles.cu's split-K tiles at several split settings), each checked against float64 with its
scratch poisoned (NaN) and timed alone: harness.timing.time_calls ('gpu': GPU time only, inputs rotated past
twice the L2 cache, 30 calls after warm-up, median). Shapes: every preset's dense layers.
Usage: PYTHONPATH=. python3 dense_probe.py [--rows 17 100 1000] [--out F.json]"""
import argparse
import json
import statistics

import torch

from convforge import gpu_dense
from convforge.engine import median_seconds
from convforge.harness.timing import rotated_inputs, time_calls

torch.backends.cuda.matmul.allow_tf32 = False
SHAPES = {"fa17 fc1": (500, 7200), "sp18 fc1": (140, 10816), "sp19 fc1": (140, 5184), "fa18 fc1": (160, 17496),
          "fa19 fc1": (160, 20184), "fa20 fc1": (32, 1024), "fa17 fc2": (10, 500)}
SETTINGS = [(8, 256), (16, 128), (16, 256), (32, 128)]   # "tiles" at (TILES_PER_SM, min slice) beside the forms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[17, 100, 1000])
    parser.add_argument("--out")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, torch.version.cuda, flush=True)
    gen = torch.Generator(device="cuda").manual_seed(26)
    scratch, rows_out = gpu_dense.scratch, []
    per_sm, tiles = gpu_dense.TILES_PER_SM, dict(gpu_dense.TILES)
    for name, (outputs, depth) in SHAPES.items():
        weight = torch.randn(outputs, depth, device="cuda", generator=gen) / depth ** 0.5
        bias = torch.randn(outputs, device="cuda", generator=gen)
        dense = gpu_dense.GpuDense(weight, bias, median_seconds, "tanh")
        for rows in args.rows:
            x = torch.rand(rows, depth, device="cuda", generator=gen) * 4
            ref = torch.tanh(torch.nn.functional.linear(x.double(), weight.double(), bias.double()))
            inputs = rotated_inputs(x)
            forms = [(v, None) for v in dense.variants if dense.serves(v, rows)]
            if dense.serves("tiles", rows):
                forms += [("tiles", s) for s in SETTINGS]
            times = {}
            for variant, setting in forms:
                if setting:
                    gpu_dense.TILES_PER_SM, gpu_dense.TILES["tiles"] = setting[0], (64, setting[1])
                gpu_dense.scratch = lambda shape, device: torch.full(shape, float("nan"), device=device)
                out = dense.run(variant, x)
                gpu_dense.scratch = scratch
                err = ((out.double() - ref).norm() / ref.norm()).item()
                assert err <= 1e-5 and not out.isnan().any(), (name, rows, variant, setting, err)
                seconds = time_calls(lambda t: dense.run(variant, t), inputs, "cuda", repeat=30)
                label = variant if setting is None else f"tiles {setting[0]}/SM min {setting[1]}"
                slices = (gpu_dense.tiles_slices(rows, outputs, depth, torch.cuda.get_device_properties(0)
                                                  .multi_processor_count, variant)
                          if variant in gpu_dense.TILES else None)
                times[label] = {"us": statistics.median(seconds.tolist()) * 1e6, "rel_error": err, "slices": slices}
                gpu_dense.TILES_PER_SM, gpu_dense.TILES = per_sm, dict(tiles)
            best = min(times, key=lambda k: times[k]["us"])
            rows_out.append({"layer": name, "rows": rows, "outputs": outputs, "depth": depth, "forms": times})
            print(f"{name:9s} {rows:5d} rows  best {best} {times[best]['us']:.1f} us  | "
                  + "  ".join(f"{k} {v['us']:.1f}" for k, v in times.items()), flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
                       "rows": rows_out}, handle, indent=1)


if __name__ == "__main__":
    main()
