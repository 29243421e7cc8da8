"""Whole-network benchmark: a preset's forward pass per batch, convforge against PyTorch in the same run.

``convforge bench --whole [--model ...] [--images 10 100 1000 10000] [--out FILE]``. Rows per (preset,
batch): the engine's forward (``auto``'s kernels, untimed per layer) as it runs eagerly and
replayed from a CUDA graph; PyTorch eager (cuDNN, TF32 off), the same captured in a CUDA graph, and
``torch.compile(mode="max-autotune")`` (at the batches ``compile_batches`` names: each compile takes minutes).
Every candidate's logits are checked against a float64 forward pass on the same input before it is timed.
Each batch also times the small-batch goal's yardstick (``LAUNCH_COPY``): the batch's float32 images copied from
pinned host memory to the GPU plus one kernel that does nothing, timed as the candidates are (host launch work
included), before and after them, the smaller kept; every row at that batch carries its time as a multiple of it
(``x_launch_copy``).

The network's floor: FLOPs of every layer at the best measured fp32 rate (SGEMM or FMA peak), or the bytes
that must move (the float32 input read once, the weights, the logits written) at the best measured bandwidth
(copy, read or write), whichever is longer. Intermediate maps are not counted: a fused network need not write them.
The fast path's floor takes the fastest tensor-core rate measured (FP16 or TF32) instead of the fp32 rate.
The exact path's dense layers (GpuDense's tc3 forms) and plain convs (cuda-auto's cuda-tc-3xtf32 entries) may run
on the tensor cores with split TF32 (fp32-accurate): every layer's FLOPs count at the best exact rate, the larger
of the fp32 rate and the 3xTF32 ceiling (``exact_floor_s``), so that the floor stays a floor. (Before cuda-tc-3xtf32
the convs counted at the fp32 rate: records before benchmarks/2026-11-28-h200-tc-3xtf32-second-convs give a higher
% of that floor.)
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from convforge.engine import Engine
from convforge.models import Conv, Dense, Network, forward_with, load_preset

BATCHES = (10, 100, 1000, 10000)
LAUNCH_COPY = "one empty kernel + input copy"
LAUNCH_COPY_REPEATS = 500


@dataclass(frozen=True)
class NetworkCost:
    flops: int
    bytes_moved: int
    dense_flops: int = 0   # the dense layers' share of ``flops``


def exact_floor_s(ceilings, cost: NetworkCost) -> float:
    """The exact path's floor: the bytes at the best bandwidth, or every layer's FLOPs at the best rate an
    fp32-accurate result may use (``compute_gflops_for("tf32x3")``: the larger of the fp32 rate and the 3xTF32
    ceiling), whichever is longer."""
    return ceilings.floor_s(cost.flops, cost.bytes_moved, "tf32x3")


def network_cost(network: Network, batch: int) -> NetworkCost:
    """FLOPs (2 per multiply-add, convolutions and dense layers) and the bytes a fused pass must move."""
    arch = network.architecture
    flops = dense_flops = 0
    for layer, _, shape_in, shape_out in arch.walk():
        if isinstance(layer, Conv):
            flops += 2 * batch * shape_out[0] * shape_out[1] * shape_out[2] * shape_in[0] * layer.kernel ** 2
        elif isinstance(layer, Dense):
            dense_flops += 2 * batch * shape_in[0] * shape_out[0]
    flops += dense_flops
    inputs = batch * arch.in_channels * arch.input_size ** 2
    weights = sum(int(np.prod(shape)) for shape in arch.param_shapes().values())
    logits = batch * list(arch.walk())[-1][3][0]
    return NetworkCost(flops, 4 * (inputs + weights + logits), dense_flops)


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


def launch_copy_call(x: torch.Tensor) -> Callable[[torch.Tensor], None]:
    """The yardstick for 10-100 images: ``x``'s bytes copied host (pinned) -> GPU, then one empty kernel
    (``torch.cuda._sleep(0)`` spins zero cycles: the cheapest launch torch makes). What a forward pass would cost
    if the network were free."""
    host = x.cpu().pin_memory()
    staged = torch.empty_like(x)

    def call(_):
        staged.copy_(host, non_blocking=True)
        torch.cuda._sleep(0)
    return call


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
        floor_ms = exact_floor_s(ceilings, cost) * 1e3
        # The fast path's layers run on FP16 and TF32 tensor cores: its floor takes the fastest rate it may use.
        fast_floor_ms = ceilings.floor_s(cost.flops, cost.bytes_moved, "mixed") * 1e3
        inputs = rotated_inputs(x)
        yardstick = launch_copy_call(x)

        def yardstick_ms() -> float:   # many repeats: it is a few microseconds
            return float(np.median(time_calls(yardstick, inputs, "cuda", repeat=max(repeat, LAUNCH_COPY_REPEATS),
                                              timing="call"))) * 1e3
        before = yardstick_ms()
        first_row = len(rows)
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
            floor = fast_floor_ms if label.startswith("convforge fast") else floor_ms
            rows.append(dict(model=name, batch=batch, candidate=label, ms=ms, floor_ms=floor,
                             floor_precision="mixed" if floor is fast_floor_ms else "tf32x3",
                             pct_floor=100 * floor / ms, images_per_s=batch / ms * 1e3,
                             gflops=cost.flops / ms / 1e6, relative_error=error, predictions_agree=agree,
                             repeats=len(times)))
            print(f"{name:9s} {batch:6d} {label:30s} {ms:9.4f} ms  floor {floor:8.4f}  "
                  f"{100 * floor / ms:5.1f}%  err {error:.1e}", flush=True)
        # Timed before and after the candidates, the smaller kept: the first batch of a run measured 18-27 us at
        # 10 images on an H200 (the GPU not yet at speed), and a high yardstick would flatter every ratio.
        reference_ms = min(before, yardstick_ms())
        rows.insert(first_row, dict(model=name, batch=batch, candidate=LAUNCH_COPY, ms=reference_ms,
                                    x_launch_copy=1.0, input_bytes=x.numel() * x.element_size()))
        print(f"{name:9s} {batch:6d} {LAUNCH_COPY:30s} {reference_ms:9.4f} ms  (before {before:.4f})", flush=True)
        for row in rows[first_row + 1:]:
            row["x_launch_copy"] = row["ms"] / reference_ms
            print(f"{name:9s} {batch:6d} {row['candidate']:30s} {row['x_launch_copy']:5.1f}x launch+copy", flush=True)
        # Only once the graphs are gone: empty_cache frees the cuBLAS workspaces their GEMMs were captured with.
        del runs
        torch.cuda.empty_cache()
    env = environment("cuda")
    return [dict(row, **env, timing="call", copy_gbps=ceilings.copy_gbps, matmul_gflops=ceilings.matmul_gflops,
                 read_gbps=ceilings.read_gbps, write_gbps=ceilings.write_gbps, fma_gflops=ceilings.fma_gflops,
                 tf32_gflops=ceilings.tf32_gflops, fp16_gflops=ceilings.fp16_gflops)
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


# ------------------------------------------------------------------------------------------------- CPU

ONNX_HINT = "pip install 'convforge[onnx]'"
CPU_BATCHES = (10000,)
CPU_REPEAT = 3
PEAK_PROBE_S = 0.2     # the FMA peak probe after each round of bench_network_cpu (drift, not the ceiling)


def extra_missing(module: str) -> Optional[str]:
    """None when ``module`` imports, else the note its column shows."""
    import importlib.util
    return None if importlib.util.find_spec(module) is not None else f"not installed: {ONNX_HINT}"


def export_onnx(network: Network, path: str) -> None:
    """The network with the same weights as an ONNX graph (TorchScript exporter, dynamic batch)."""
    arch, params = network.architecture, dict(network.params)

    class Forward(torch.nn.Module):
        def forward(self, x):
            return forward_with(arch, params, x)

    import warnings
    sample = torch.zeros((2, arch.in_channels, arch.input_size, arch.input_size))
    with warnings.catch_warnings():   # "legacy TorchScript-based exporter": chosen (dynamo=False), not news
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(Forward(), (sample,), path, dynamo=False, input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17)


def cpu_candidates(network: Network, onnx_path: Optional[str], threads: int) -> dict[str, object]:
    """name -> a maker of forward(x: float32 (B, 1, S, S) tensor) -> logits (NumPy or torch), or the reason
    the candidate cannot run here (a string)."""
    ours = Engine(network, impl="auto", device="cpu")
    arch, params = network.architecture, dict(network.params)
    runs: dict[str, object] = {f"convforge ({ours.impl.name})": lambda: lambda x: ours.forward(x, timed=False)}
    if ours.impl.name != "cpu-parallel":    # the direct kernels alone, for the A/B in the same run
        direct = Engine(network, impl="cpu-parallel", device="cpu")
        runs["convforge (cpu-parallel)"] = lambda: lambda x: direct.forward(x, timed=False)
    runs["torch eager"] = lambda: lambda x: forward_with(arch, params, x)
    reason = extra_missing("onnxruntime") or (None if onnx_path else "the ONNX export failed")
    if reason:
        runs["onnxruntime"] = reason
    else:
        def make_ort():
            import onnxruntime as ort
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
            return lambda x: session.run(None, {"x": x.numpy()})[0]
        runs["onnxruntime"] = make_ort
    reason = extra_missing("openvino") or (None if onnx_path else "the ONNX export failed")
    if reason:
        runs["openvino"] = reason
    else:
        def make_openvino():
            import openvino as ov
            core = ov.Core()
            compiled = core.compile_model(core.read_model(onnx_path), "CPU", {
                "INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"})
            request = compiled.create_infer_request()
            return lambda x: request.infer([x.numpy()])[compiled.output(0)]
        runs["openvino"] = make_openvino
    return runs


def cpu_versions() -> dict:
    from convforge.harness.probes import _package_versions
    return _package_versions(("onnxruntime", "openvino", "onnx", "numba", "numpy"))


def interleaved_times(forwards: dict, x: torch.Tensor, repeat: int, threads: int
                      ) -> tuple[dict, dict, list]:
    """``repeat`` rounds, each timing one call of every candidate in turn (the order reversed every other
    round) and then the FMA peak: a VM whose speed drifts between runs (this project's 2-core VM measured its
    peak at 153 and 288 GFLOP/s minutes apart) slows all candidates of a round alike, so the ratios hold.
    Returns ({label: [seconds]}, {label: [loadavg before each call]}, [FMA GFLOP/s per round])."""
    import os
    from convforge.harness.probes import fma_peak_gflops
    labels = list(forwards)
    times: dict = {label: [] for label in labels}
    loads: dict = {label: [] for label in labels}
    peaks = []
    with torch.inference_mode():
        for round_ in range(repeat):
            for label in (labels if round_ % 2 == 0 else labels[::-1]):
                if hasattr(os, "getloadavg"):
                    loads[label].append(os.getloadavg()[0])
                t0 = time.perf_counter()
                forwards[label](x)
                times[label].append(time.perf_counter() - t0)
            peak = fma_peak_gflops(threads, PEAK_PROBE_S)
            if peak:
                peaks.append(peak)
    return times, loads, peaks


def raised_ceilings(ceilings, peaks: Sequence[float]):
    """``ceilings`` with its FMA peak raised to the best probe of a run when that is higher (and the machine's
    ceiling store raised with it): a floor must hold at the best rate seen, and the VM that ran the bench's
    first probe slowly may run faster minutes later (153 and 288 GFLOP/s on 2026-11-26)."""
    import dataclasses
    from convforge.harness.probes import best_ceilings
    best = max(peaks, default=None)
    if best is None or (ceilings.fma_gflops and best <= ceilings.fma_gflops):
        return ceilings
    return best_ceilings("cpu", dataclasses.replace(ceilings, fma_gflops=best))


def bench_network_cpu(name: str, batches: Sequence[int], ceilings, repeat: int, data_dir=None) -> list[dict]:
    """Rows per (batch, candidate) of the whole forward pass on the CPU, on the test images when they are
    installed (accuracy from the timed logits) else on random pixels (accuracy None). The floor is taken after
    the timing, at the best FMA peak of ``ceilings`` and of the probes between rounds (``raised_ceilings``);
    each row records the peak it used (``fma_gflops``)."""
    import os
    import tempfile
    from convforge import data
    from convforge.harness.check import relative_error
    network = load_preset(name)
    arch = network.architecture
    params64 = {k: v.to(torch.float64) for k, v in network.params.items()}
    threads = torch.get_num_threads()
    rows = []
    with tempfile.TemporaryDirectory(prefix="convforge-onnx-") as folder:
        onnx_path: Optional[str] = os.path.join(folder, f"{name}.onnx")
        try:
            export_onnx(network, onnx_path)
        except Exception as exc:  # noqa: BLE001 - reported in the rows, the other columns still run
            print(f"{name}: ONNX export failed: {exc}", flush=True)
            onnx_path = None
        for batch in batches:
            labels = None
            try:
                subset = data.load("test", arch.input_size, min(batch, data.SPLIT_SIZES["test"]), data_dir)
                images, labels = subset.images, subset.labels
                if len(images) < batch:
                    images = np.resize(images, (batch, *images.shape[1:]))
                    labels = np.resize(labels, batch)
            except Exception:  # noqa: BLE001 - no data here: random pixels, no accuracy
                images = np.random.default_rng(batch).integers(0, 256, (batch, arch.input_size, arch.input_size),
                                                               dtype=np.uint8)
            x = torch.from_numpy(images).to(torch.float32).unsqueeze(1).contiguous()
            with torch.inference_mode():   # float64 in slices: torch's float64 conv unrolls its whole input
                reference = np.concatenate([forward_with(arch, params64, x[i:i + 500].double()).numpy()
                                            for i in range(0, batch, 500)])
            cost = network_cost(network, batch)
            base = dict(model=name, batch=batch, threads=threads, flops=cost.flops, bytes_moved=cost.bytes_moved)
            forwards, logits = {}, {}
            for label, make in cpu_candidates(network, onnx_path, threads).items():
                if isinstance(make, str):
                    rows.append(dict(base, candidate=label, ms=None, note=make))
                    print(f"{name:9s} {batch:6d} {label:26s} {make}", flush=True)
                    continue
                forwards[label] = make()
                with torch.inference_mode():   # warm-up: first-call work (compiling, plans)
                    logits[label] = np.asarray(forwards[label](x))
            times, loads, peaks = interleaved_times(forwards, x, repeat, threads)
            ceilings = raised_ceilings(ceilings, peaks)
            floor_ms = ceilings.floor_s(cost.flops, cost.bytes_moved) * 1e3
            base.update(floor_ms=floor_ms, fma_gflops=ceilings.fma_gflops)
            peak_now = float(np.median(peaks)) if peaks else None
            for label in forwards:
                ms = float(np.median(times[label])) * 1e3
                predicted = logits[label].argmax(1)
                row = dict(base, candidate=label, ms=ms, ms_all=[t * 1e3 for t in times[label]],
                           pct_floor=100 * floor_ms / ms, images_per_s=batch / ms * 1e3,
                           gflops=cost.flops / ms / 1e6, fma_gflops_during=peak_now,
                           pct_of_peak_during=100 * cost.flops / 1e6 / ms / peak_now if peak_now else None,
                           relative_error=relative_error(logits[label], reference),
                           predictions_agree=float((predicted == reference.argmax(1)).mean()),
                           accuracy=float((predicted == labels).mean()) if labels is not None else None,
                           loadavg_1min=max(loads[label]) if loads[label] else None)
                rows.append(row)
                print(f"{name:9s} {batch:6d} {label:26s} {ms:9.1f} ms  floor {floor_ms:7.1f}  {row['pct_floor']:5.1f}%  "
                      f"err {row['relative_error']:.1e}  acc {row['accuracy'] if row['accuracy'] is not None else '-'}  "
                      f"load {row['loadavg_1min']}  FMA peak during "
                      f"{f'{peak_now:.0f} GFLOP/s' if peak_now else '-'}", flush=True)
            forwards.clear()
    fastest = {}
    for row in rows:
        if row["candidate"] in ("onnxruntime", "openvino") and row.get("ms"):
            key = row["batch"]
            fastest[key] = min(fastest.get(key, float("inf")), row["ms"])
    for row in rows:
        if row.get("ms") and row["batch"] in fastest:
            row["speedup_vs_best_of_ort_openvino"] = fastest[row["batch"]] / row["ms"]
            # the same per round (the candidates of a round ran back to back): robust to the machine's drift
            others = [r["ms_all"] for r in rows if r["batch"] == row["batch"] and r.get("ms")
                      and r["candidate"] in ("onnxruntime", "openvino")]
            row["speedup_per_round_median"] = float(np.median(
                [min(o[i] for o in others) / t for i, t in enumerate(row["ms_all"])]))
    return rows


def main_cpu(args) -> int:
    """``convforge bench --whole --device cpu``."""
    from pathlib import Path
    from convforge.files import write_atomically
    from convforge.harness.probes import environment, measure_ceilings
    from convforge.models import PRESETS, get_preset
    from convforge.errors import UserError
    models = args.model or [p for p in PRESETS if p != "fa17-low"]
    for name in models:
        get_preset(name)
    out = Path(args.out) if args.out else None
    if out is not None and not out.parent.is_dir():
        raise UserError(f"the folder of --out {args.out} does not exist; create {out.parent} first")
    batches = sorted(set(args.images or CPU_BATCHES))
    ceilings = measure_ceilings("cpu")
    print(f"ceilings ({torch.get_num_threads()} threads): {ceilings.describe()}", flush=True)
    env = dict(environment("cpu"), **cpu_versions(), copy_gbps=ceilings.copy_gbps,
               matmul_gflops=ceilings.matmul_gflops, fma_gflops=ceilings.fma_gflops, read_gbps=ceilings.read_gbps,
               write_gbps=ceilings.write_gbps)
    print("  ".join(f"{k} {env[k]}" for k in ("cpu", "threads", "torch", "onnxruntime", "openvino", "numba")),
          flush=True)
    rows = []
    for name in models:
        # env's fma_gflops is the bench's first probe; a row's own (the peak its floor used) comes last
        rows += [dict(env, **row) for row in bench_network_cpu(name, batches, ceilings, args.repeat or CPU_REPEAT,
                                                                getattr(args, "data_dir", None))]
        ceilings = raised_ceilings(ceilings, [row["fma_gflops"] for row in rows if row.get("fma_gflops")])
        if out is not None:
            write_atomically(out, lambda tmp: Path(tmp).write_text(json.dumps(rows, indent=1)))
    refloored = refloor(rows, ceilings)
    if refloored:
        print(f"FMA peak raised to {ceilings.fma_gflops:.1f} GFLOP/s during the run: % of floor recomputed for "
              f"{refloored} earlier rows (printed above with the peak they ran under)", flush=True)
        if out is not None:
            write_atomically(out, lambda tmp: Path(tmp).write_text(json.dumps(rows, indent=1)))
    return 0


def refloor(rows: list[dict], ceilings) -> int:
    """Every timed row's floor at the final ``ceilings`` (the best FMA peak of the whole run); the count of rows
    whose floor changed."""
    changed = 0
    for row in rows:
        if row.get("ms") and "flops" in row and row.get("fma_gflops") != ceilings.fma_gflops:
            row["floor_ms"] = ceilings.floor_s(row["flops"], row["bytes_moved"]) * 1e3
            row["pct_floor"] = 100 * row["floor_ms"] / row["ms"]
            row["fma_gflops"] = ceilings.fma_gflops
            changed += 1
    return changed


def main(args) -> int:  # pragma: no cover - needs a GPU
    """``convforge bench --whole``: ``args`` is bench's namespace (model, images as the batches, repeat, out)."""
    from pathlib import Path
    from convforge.conv.torch_conv import exact_fp32
    from convforge.engine import resolve_device
    from convforge.errors import UserError
    from convforge.files import write_atomically
    from convforge.harness.probes import measure_ceilings
    from convforge.models import PRESETS, get_preset
    if resolve_device(args.device) == "cpu":
        return main_cpu(args)
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
