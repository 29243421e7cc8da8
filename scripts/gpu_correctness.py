"""Every exact GPU implementation on every preset at 10000 images must give the reference's correctness.

Run on a GPU machine: python3 scripts/gpu_correctness.py [--images N] [--out FILE]
The reference figures are the shipped weights' metadata (float64-reference-equal on the CPU).
"""

import argparse
import json
import sys

import torch

from convforge import conv, data
from convforge.engine import Engine
from convforge.errors import UserError
from convforge.models import PRESETS, load_preset


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=10000)
    parser.add_argument("--impl", nargs="*", help="default: every available cuda implementation")
    parser.add_argument("--out")
    args = parser.parse_args()
    impls = [conv.get(n) for n in args.impl] if args.impl else [
        i for i in conv.IMPLEMENTATIONS if "cuda" in i.devices and i.unavailable_reason("cuda") is None]
    rows, failures = [], 0
    for name in PRESETS:
        network = load_preset(name)
        subset = data.load("test", network.architecture.input_size, args.images)
        expected = Engine(network, impl="torch", device="cuda").run(subset.images, subset.labels)
        for impl in impls:
            try:
                result = Engine(network, impl=impl.name, device="cuda").run(subset.images, subset.labels)
                again = Engine(network, impl=impl.name, device="cuda").run(subset.images, subset.labels)
            except (UserError, RuntimeError, ValueError) as exc:  # report and go on to the next kernel
                rows.append({"model": name, "impl": impl.name, "error": str(exc).splitlines()[0]})
                failures += 1
                print(f"{name:10s} {impl.name:20s} ERROR {rows[-1]['error']}", flush=True)
                continue
            ok = result.correctness == expected.correctness if impl.exact else \
                abs(result.correctness - expected.correctness) <= 0.001
            failures += not ok
            rows.append({"model": name, "impl": impl.name, "precision": impl.precision,
                         "correctness": result.correctness, "torch": expected.correctness, "ok": ok,
                         "op_time_s": [l.op_time_s for l in again.layers],
                         "fused": [l.fused for l in again.layers]})
            print(f"{name:10s} {impl.name:20s} {impl.precision:5s} {result.correctness:.4f} "
                  f"(torch {expected.correctness:.4f}) {'ok' if ok else 'MISMATCH'} "
                  f"op {[round(l.op_time_s * 1e3, 3) for l in again.layers]} ms", flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, handle, indent=1)
    print(f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
