"""Whole-network benchmark: a preset's forward pass per batch, convforge against PyTorch in the same run.

``convforge bench --whole [--model ...] [--images 10 100 1000 10000] [--out FILE]``. Rows per (preset,
batch): the engine's forward (``auto``'s kernels, untimed per layer) as it runs eagerly and
replayed from a CUDA graph; PyTorch eager (cuDNN, TF32 off), the same captured in a CUDA graph, and
``torch.compile(mode="max-autotune")`` (at the batches ``compile_batches`` names: each compile takes minutes).
Every candidate's logits are checked against a float64 forward pass on the same input before it is timed.

The network's floor: FLOPs of every layer at the best measured fp32 rate (SGEMM or FMA peak), or the bytes
that must move (the float32 input read once, the weights, the logits written) at the best measured bandwidth
(copy, read or write), whichever is longer. Intermediate maps are not counted: a fused network need not write them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from convforge.engine import Engine
from convforge.models import Conv, Dense, Network, forward_with, load_preset

BATCHES = (10, 100, 1000, 10000)


@dataclass(frozen=True)
class NetworkCost:
    flops: int
    bytes_moved: int


def network_cost(network: Network, batch: int) -> NetworkCost:
    """FLOPs (2 per multiply-add, convolutions and dense layers) and the bytes a fused pass must move."""
    arch = network.architecture
    flops = 0
    for layer, _, shape_in, shape_out in arch.walk():
        if isinstance(layer, Conv):
            flops += 2 * batch * shape_out[0] * shape_out[1] * shape_out[2] * shape_in[0] * layer.kernel ** 2
        elif isinstance(layer, Dense):
            flops += 2 * batch * shape_in[0] * shape_out[0]
    inputs = batch * arch.in_channels * arch.input_size ** 2
    weights = sum(int(np.prod(shape)) for shape in arch.param_shapes().values())
    logits = batch * list(arch.walk())[-1][3][0]
    return NetworkCost(flops, 4 * (inputs + weights + logits))


def candidates(network: Network, batch: int, compile_batches: Sequence[int]) -> dict[str, Callable[[], Callable]]:
    """name -> a maker of forward(x) -> logits, for one batch size on the GPU. Each is made (its graph
    captured, its compile done) just before it is checked and timed, as a user would run one of them."""
    ours = Engine(network, impl="auto", device="cuda")
    theirs = Engine(network, impl="torch", device="cuda")
    fast = Engine(network, impl="auto", device="cuda", precision="fast")
    runs = {f"convforge ({ours.impl.name})": lambda: lambda x: ours.forward(x, timed=False),
            "convforge, CUDA graph": lambda: ours.graphed(batch),
            "convforge fast": lambda: lambda x: fast.forward(x, timed=False),
            "convforge fast, CUDA graph": lambda: fast.graphed(batch),
            "torch eager": lambda: lambda x: theirs.forward(x, timed=False),
            "torch eager, CUDA graph": lambda: theirs.graphed(batch)}
    if batch in compile_batches:
        params = {k: v.to("cuda") for k, v in network.params.items()}
        runs["torch.compile max-autotune"] = lambda: torch.compile(
            lambda x: forward_with(network.architecture, params, x), mode="max-autotune", dynamic=False)
    return runs


def bench_network(name: str, batches: Sequence[int], ceilings, compile_batches: Sequence[int],
                  repeat: int) -> list[dict]:  # pragma: no cover - needs a GPU
    from convforge.harness.probes import environment
    from convforge.harness.timing import rotated_inputs, time_calls
    from convforge.harness.check import relative_error
    network = load_preset(name)
    arch = network.architecture
    params64 = {k: v.to("cuda", torch.float64) for k, v in network.params.items()}
    rows = []
    for batch in batches:
        g = torch.Generator(device="cuda").manual_seed(batch)
        x = torch.randint(0, 256, (batch, arch.in_channels, arch.input_size, arch.input_size), generator=g,
                          device="cuda").to(torch.float32)
        with torch.inference_mode():
            reference = forward_with(arch, params64, x.double()).cpu().numpy()
        cost = network_cost(network, batch)
        floor_ms = ceilings.floor_s(cost.flops, cost.bytes_moved) * 1e3
        inputs = rotated_inputs(x)
        runs = candidates(network, batch, compile_batches)
        for label, make in runs.items():
            forward = make()
            with torch.inference_mode():
                logits = forward(x).clone()           # first call: compiles, autotunes, captures
                error = relative_error(logits, reference)
                agree = float((logits.argmax(1).cpu().numpy() == reference.argmax(1)).mean())
                # Host launch work included: for 10-1000 images it is most of what a user waits for.
                times = time_calls(lambda xi: forward(xi), inputs, "cuda", repeat=repeat, timing="call")
            ms = float(np.median(times)) * 1e3
            rows.append(dict(model=name, batch=batch, candidate=label, ms=ms, floor_ms=floor_ms,
                             pct_floor=100 * floor_ms / ms, images_per_s=batch / ms * 1e3,
                             gflops=cost.flops / ms / 1e6, relative_error=error, predictions_agree=agree,
                             repeats=len(times)))
            print(f"{name:9s} {batch:6d} {label:30s} {ms:9.4f} ms  floor {floor_ms:8.4f}  "
                  f"{100 * floor_ms / ms:5.1f}%  err {error:.1e}", flush=True)
        # Only once the graphs are gone: empty_cache frees the cuBLAS workspaces their GEMMs were captured with.
        del runs
        torch.cuda.empty_cache()
    env = environment("cuda")
    return [dict(row, **env, timing="call", copy_gbps=ceilings.copy_gbps, matmul_gflops=ceilings.matmul_gflops,
                 read_gbps=ceilings.read_gbps, write_gbps=ceilings.write_gbps, fma_gflops=ceilings.fma_gflops)
            for row in rows]


def accuracy_rows(name: str, images: int) -> list[dict]:  # pragma: no cover - needs a GPU
    """Correctness of the exact and the fast path on the first ``images`` test images."""
    from convforge import data
    network = load_preset(name)
    subset = data.load("test", network.architecture.input_size, images)
    rows = []
    for precision in ("exact", "fast"):
        result = Engine(network, impl="auto", device="cuda", precision=precision).run(subset.images, subset.labels)
        rows.append(dict(model=name, precision=precision, images=images, correctness=result.correctness,
                         layers=[layer.impl + (f" +{layer.fused}" if layer.fused else "") for layer in result.layers]))
        print(f"{name:9s} {precision:5s} correctness {result.correctness:.4f}  {rows[-1]['layers']}", flush=True)
    return rows


def main(args) -> int:  # pragma: no cover - needs a GPU
    """``convforge bench --whole``: ``args`` is bench's namespace (model, images as the batches, repeat, out)."""
    from pathlib import Path
    from convforge.conv.torch_conv import exact_fp32
    from convforge.engine import resolve_device
    from convforge.errors import UserError
    from convforge.files import write_atomically
    from convforge.harness.probes import measure_ceilings
    from convforge.models import PRESETS, get_preset
    if resolve_device(args.device) != "cuda":
        raise UserError("bench --whole times GPU forward passes: it needs --device cuda (or auto with a GPU)")
    models = args.model or [p for p in PRESETS if p != "fa17-low"]
    for name in models:
        get_preset(name)                      # an unknown name fails here, before any work
    out = Path(args.out) if args.out else None
    if out is not None and not out.parent.is_dir():
        raise UserError(f"the folder of --out {args.out} does not exist; create {out.parent} first")
    batches = sorted(set(args.images))
    exact_fp32()
    ceilings = measure_ceilings("cuda")
    print(f"ceilings: {ceilings.describe()}")
    rows = []
    for name in models:
        rows += accuracy_rows(name, 10000)
        rows += bench_network(name, batches, ceilings, batches[-1:], args.repeat or 20)
        if out is not None:   # after each preset, so a run cut short keeps what it measured
            write_atomically(out, lambda tmp: Path(tmp).write_text(json.dumps(rows, indent=1)))
    return 0
