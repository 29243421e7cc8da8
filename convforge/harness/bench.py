"""convforge bench: op time of each implementation against the framework's convolution and the roofline.

For every (conv layer, batch size, implementation): the median of repeated calls after warm-up, timed as
the engine times Op Time (``engine.Stopwatch``: CUDA events on a GPU, perf_counter on a CPU, synchronised
around each call, the function called without ``out`` as the engine calls it). On a GPU the input is
rotated among copies whose total exceeds twice the L2 cache, so small batches are not served from L2.
Repeats adapt: at least MIN_REPEATS, then until the case's time budget is spent (``--repeat`` fixes them).

Baseline: torch ``F.conv2d`` on the same device in the same run (cuDNN with TF32 off, oneDNN on a CPU);
for fusing implementations, where a preset's conv is followed by [activation +] max pool, also the fused
call against torch's eager conv + activation + pool. Roofline floor = max(bytes / copy bandwidth,
FLOPs / matmul rate), both ceilings measured here at start-up (a large device-to-device copy, bytes read
plus written; an fp32 matrix product with TF32 off); the fused floor counts only the pooled output.
Every implementation is checked against the float64 reference on the layer's shape (B = 2) before it is
timed, and not timed if wrong.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import json
import platform
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from convforge import conv
from convforge.console import print_table
from convforge.conv import ConvImpl
from convforge.engine import Stopwatch, resolve_device
from convforge.errors import UserError
from convforge.harness.check import describe_exception, progress_bar, random_case
from convforge.harness.verify import Case, LayerSpec, model_layers, select_impls, verify_impl
from convforge.models import ACTIVATIONS, DEFAULT_PRESET, ConvShape, get_preset

HELP = "time implementations against torch's convolution and this machine's roofline"

DEFAULT_BATCHES = (10, 100, 1000, 10000)
MIN_REPEATS = 3
MAX_REPEATS = 200
DEFAULT_WARMUP = 2
DEFAULT_BUDGET_S = 1.0                           # timed calls per case stop after this, once MIN_REPEATS are in
COPY_BYTES = {"cuda": 1 << 30, "cpu": 256 << 20}  # the bandwidth ceiling's copy
MATMUL_N = {"cuda": 8192, "cpu": 2048}            # the arithmetic ceiling's N x N x N product
MAX_ROTATION_COPIES = 4096                        # input copies a GPU case cycles through, at most
CHECK_BATCH = 2                                   # batch of the correctness check before timing
BASELINE = "torch"
FUSED_BASELINE = "torch conv+act+pool"

ROW_KEYS = ("kind", "model", "layer", "B", "M", "C", "H", "W", "K", "impl", "precision", "device",
            "median_ms", "p20_ms", "p80_ms", "repeats", "flops", "bytes", "gflops", "gbps", "floor_ms",
            "roofline_pct", "baseline", "baseline_ms", "speedup", "copy_gbps", "matmul_gflops",
            "machine", "cpu", "threads", "gpu", "torch", "cuda", "cudnn", "numba", "triton", "cupy", "python",
            "date")


# ----------------------------------------------------------------------------------------- timing

def time_calls(fn: Callable[[torch.Tensor], object], inputs: Sequence[torch.Tensor], device: str,
               warmup: int = DEFAULT_WARMUP, repeat: Optional[int] = None,
               budget_s: float = DEFAULT_BUDGET_S) -> np.ndarray:
    """Seconds of each timed call ``fn(inputs[i % len(inputs)])``, after up to ``warmup`` untimed calls.

    Warm-up stops early once it has taken ``budget_s`` (a call that long is past compiling and cold
    caches). Timed calls: exactly ``repeat`` when given, else at least MIN_REPEATS and then until
    ``budget_s`` of wall time or MAX_REPEATS.
    """
    call = 0
    started = time.perf_counter()
    for _ in range(warmup):
        with Stopwatch(device):
            fn(inputs[call % len(inputs)])
        call += 1
        if time.perf_counter() - started >= budget_s:
            break
    times = []
    started = time.perf_counter()
    while True:
        with Stopwatch(device) as watch:
            fn(inputs[call % len(inputs)])
        call += 1
        times.append(watch.seconds)
        if repeat is not None:
            if len(times) >= repeat:
                break
        elif len(times) >= MAX_REPEATS or (len(times) >= MIN_REPEATS and time.perf_counter() - started >= budget_s):
            break
    return np.array(times)


def rotation_copies(input_bytes: int, l2_bytes: int) -> int:
    """How many copies of an input together exceed twice the L2 cache (at least 2, at most MAX_ROTATION_COPIES)."""
    return min(MAX_ROTATION_COPIES, max(2, 2 * l2_bytes // input_bytes + 1))


def rotated_inputs(x: torch.Tensor) -> list[torch.Tensor]:
    """Copies of ``x`` to cycle through: on a GPU enough that together they exceed twice the L2 cache;
    on a CPU just ``x`` (perf_counter timing of the plain call, as the engine makes it).

    The copies are views of one allocation. Only inputs of a few kilobytes (custom shapes, not the
    presets' layers) reach MAX_ROTATION_COPIES before covering 2 x L2.
    """
    if x.device.type != "cuda":
        return [x]
    copies = rotation_copies(x.numel() * x.element_size(), torch.cuda.get_device_properties(x.device).L2_cache_size)
    return list(x.unsqueeze(0).repeat(copies, *([1] * x.dim())).unbind(0))


@dataclass(frozen=True)
class Ceilings:
    """This machine's measured copy bandwidth (bytes read + written) and fp32 matrix-product rate."""
    copy_gbps: float
    matmul_gflops: float

    def floor_s(self, flops: int, bytes_moved: int) -> float:
        return max(bytes_moved / (self.copy_gbps * 1e9), flops / (self.matmul_gflops * 1e9))


def measure_ceilings(device: str, budget_s: float = DEFAULT_BUDGET_S) -> Ceilings:
    """Copy COPY_BYTES[device] device to device and multiply MATMUL_N[device]-square fp32 matrices, TF32 off.

    Each ceiling is the fastest of its repeated runs, not the median: it bounds what the machine can do,
    and a run slowed by other work on the machine must not lower it.
    """
    from convforge.conv.torch_conv import exact_fp32
    exact_fp32()
    source = torch.ones(COPY_BYTES[device] // 4, device=device)
    target = torch.empty_like(source)
    copy_s = float(np.min(time_calls(lambda src: target.copy_(src), [source], device, budget_s=budget_s)))
    n = MATMUL_N[device]
    a, b = torch.rand(n, n, device=device), torch.rand(n, n, device=device)
    matmul_s = float(np.min(time_calls(lambda left: torch.mm(left, b), [a], device, budget_s=budget_s)))
    return Ceilings(copy_gbps=2 * COPY_BYTES[device] / copy_s / 1e9, matmul_gflops=2 * n ** 3 / matmul_s / 1e9)


# -------------------------------------------------------------------------------------- environment

def _package_versions(modules: Sequence[str]) -> dict[str, Optional[str]]:
    """Installed version of the distribution providing each importable module (None when absent)."""
    from importlib import metadata
    providers = metadata.packages_distributions()
    return {module: metadata.version(providers[module][0]) if module in providers else None for module in modules}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or platform.machine()


def environment(device: str) -> dict:
    """Where and with what the rows were measured: the machine, library versions (None when absent), date."""
    on_gpu = device == "cuda"
    return {
        "machine": f"{platform.node()} ({platform.platform()})",
        "cpu": _cpu_model(),
        "threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if on_gpu else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        **_package_versions(("numba", "triton", "cupy")),
        "python": platform.python_version(),
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
    }


# ------------------------------------------------------------------------------------------ cases

@dataclass(frozen=True)
class BenchCase:
    """One conv layer at one batch size; ``model`` is the preset name or "custom" for a --shape."""
    model: str
    spec: LayerSpec
    batch: int

    @property
    def shape(self) -> ConvShape:
        return self.spec.shape.with_batch(self.batch)


def bench_cases(models: Sequence[str], shapes: Sequence[ConvShape], batches: Sequence[int]) -> list[BenchCase]:
    """Each preset's conv layers at each batch size, then each explicit shape at its own batch size."""
    cases = [BenchCase(name, spec, batch) for name in models
             for spec in model_layers(get_preset(name).architecture) for batch in batches]
    # Each custom shape gets its own label, so that two of them never share a row key in a report.
    cases += [BenchCase("custom", LayerSpec(f"custom M{s.M} C{s.C} {s.H}x{s.W} K{s.K}", s.with_batch(1), False, None),
                        s.B) for s in shapes]
    return cases


def eager_layer(weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str], pool: int):
    """The fused baseline: torch's conv, activation and max pool as the unfused network runs them."""
    def run(x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, weight, bias)
        if activation:
            y = ACTIVATIONS[activation](y)
        return F.max_pool2d(y, pool)
    return run


# ------------------------------------------------------------------------------------------- rows

def make_row(kind: str, case: BenchCase, impl: str, precision: str, device: str, times: np.ndarray,
             baseline: str, baseline_ms: float, ceilings: Ceilings, env: dict) -> dict:
    """One result row (keys ROW_KEYS); a fused row's bytes and floor count only the pooled output."""
    shape = case.shape
    out_elements = None
    if kind == "fused":
        _, pool = case.spec.fusion
        out_h, out_w = shape.out_hw
        out_elements = shape.B * shape.M * (out_h // pool) * (out_w // pool)
    median_s = float(np.median(times))
    bytes_moved = shape.bytes_moved(out_elements)
    floor_s = ceilings.floor_s(shape.flops, bytes_moved)
    row = {"kind": kind, "model": case.model, "layer": case.spec.label,
           "B": shape.B, "M": shape.M, "C": shape.C, "H": shape.H, "W": shape.W, "K": shape.K,
           "impl": impl, "precision": precision, "device": device,
           "median_ms": median_s * 1e3, "p20_ms": float(np.percentile(times, 20)) * 1e3,
           "p80_ms": float(np.percentile(times, 80)) * 1e3, "repeats": len(times),
           "flops": shape.flops, "bytes": bytes_moved, "gflops": shape.flops / median_s / 1e9,
           "gbps": bytes_moved / median_s / 1e9, "floor_ms": floor_s * 1e3, "roofline_pct": 100 * floor_s / median_s,
           "baseline": baseline, "baseline_ms": baseline_ms, "speedup": baseline_ms / (median_s * 1e3),
           "copy_gbps": ceilings.copy_gbps, "matmul_gflops": ceilings.matmul_gflops, **env}
    return {key: row[key] for key in ROW_KEYS}


@dataclass
class BenchOutcome:
    rows: list[dict]
    failures: list[str]   # implementations that failed their check or raised, and were not timed


def run_bench(cases: Sequence[BenchCase], impls: Sequence[ConvImpl], device: str, ceilings: Ceilings,
              warmup: int = DEFAULT_WARMUP, repeat: Optional[int] = None, budget_s: float = DEFAULT_BUDGET_S,
              show_progress: bool = True) -> BenchOutcome:
    """Time the baseline and each implementation on each case; fused calls too where the layer allows."""
    env = environment(device)
    timed = [impl for impl in impls if impl.name != BASELINE]
    fusing = [impl for impl in timed if impl.fuses]
    rows: list[dict] = []
    failures: list[str] = []
    checked: dict[tuple, bool] = {}

    def passes_check(impl: ConvImpl, case: BenchCase, fusion) -> bool:
        """Whether ``impl`` is right on this layer at B = 2 (checked once per layer; a failure is recorded)."""
        key = (impl.name, case.spec, fusion)
        if key not in checked:
            probe = Case(case.spec.label, case.spec.shape.with_batch(CHECK_BATCH), 0, case.spec.bias, fusion)
            result = verify_impl(impl, device, [probe])
            checked[key] = result.passed
            for failure in result.failures:
                failures.append(f"{impl.name}{' (fused)' if fusion else ''} is wrong, so not timed: {failure}")
        return checked[key]

    def measure(kind: str, case: BenchCase, impl_name: str, precision: str, prepare: Callable, inputs,
                baseline: str, baseline_ms: Optional[float]) -> Optional[float]:
        """Prepare, time and record one row; returns its median in ms (None when it raised)."""
        try:
            times = time_calls(prepare(), inputs, device, warmup, repeat, budget_s)
        except Exception as exc:  # e.g. out of memory at B = 10000: report it and go on with the rest
            failures.append(f"{impl_name} on {case.spec.label} B={case.batch} ({kind}) raised "
                            f"{describe_exception(exc)}")
            if device == "cuda":
                torch.cuda.empty_cache()
            return None
        median_ms = float(np.median(times)) * 1e3
        rows.append(make_row(kind, case, impl_name, precision, device, times, baseline,
                             median_ms if baseline_ms is None else baseline_ms, ceilings, env))
        return median_ms

    per_case = [1 + len(timed) + (1 + len(fusing) if case.spec.fusion and fusing else 0) for case in cases]
    with progress_bar(show_progress) as bar, torch.inference_mode():
        task = bar.add_task("bench", total=sum(per_case))
        for case in cases:
            shape = case.shape
            x, weight, bias = random_case((shape.B, shape.C, shape.H, shape.W), (shape.M, shape.C, shape.K, shape.K),
                                          seed=0, bias=case.spec.bias)
            x, weight = x.to(device), weight.to(device)
            bias = None if bias is None else bias.to(device)
            inputs = rotated_inputs(x)
            where = f"{case.spec.label} B={case.batch}"

            bar.update(task, description=f"{where} {BASELINE}")
            baseline_ms = measure("conv", case, BASELINE, "fp32", lambda: conv.get(BASELINE).prepare(weight, bias),
                                  inputs, BASELINE, None)
            bar.advance(task)
            for impl in timed:
                bar.update(task, description=f"{where} {impl.name}")
                if baseline_ms is not None and passes_check(impl, case, None):
                    measure("conv", case, impl.name, impl.precision, lambda: impl.prepare(weight, bias), inputs,
                            BASELINE, baseline_ms)
                bar.advance(task)

            if case.spec.fusion and fusing:
                activation, pool = case.spec.fusion
                bar.update(task, description=f"{where} {FUSED_BASELINE}")
                fused_baseline_ms = measure("fused", case, BASELINE, "fp32",
                                            lambda: eager_layer(weight, bias, activation, pool), inputs,
                                            FUSED_BASELINE, None)
                bar.advance(task)
                for impl in fusing:
                    bar.update(task, description=f"{where} {impl.name} (fused)")
                    if fused_baseline_ms is not None and passes_check(impl, case, case.spec.fusion):
                        measure("fused", case, impl.name, impl.precision,
                                lambda: impl.prepare_fused(weight, bias, activation, pool), inputs,
                                FUSED_BASELINE, fused_baseline_ms)
                    bar.advance(task)
            del x, inputs
    return BenchOutcome(rows, failures)


# ---------------------------------------------------------------------------------------- output

def rows_as_csv(rows: Sequence[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=ROW_KEYS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def rows_as_json(rows: Sequence[dict]) -> str:
    return json.dumps(list(rows), indent=2)


def print_rows_table(rows: Sequence[dict], ceilings: Ceilings, device: str) -> None:
    first = rows[0] if rows else environment(device)
    where = first["gpu"] or f"{first['cpu']}, {first['threads']} threads"
    title = (f"bench on {device} ({where}): copy {ceilings.copy_gbps:.1f} GB/s, "
             f"fp32 matmul {ceilings.matmul_gflops:.1f} GFLOP/s; times in ms")
    columns = ("layer", "kind", "B", "impl", "median", "p20-p80", "GFLOP/s", "GB/s", "floor", "% floor", "speedup")
    table = [(r["layer"], r["kind"], r["B"], r["impl"], f"{r['median_ms']:.4g}",
              f"{r['p20_ms']:.4g}-{r['p80_ms']:.4g}", f"{r['gflops']:.1f}", f"{r['gbps']:.1f}",
              f"{r['floor_ms']:.4g}", f"{r['roofline_pct']:.1f}", f"{r['speedup']:.2f}") for r in rows]
    print_table(title, columns, table, justify_right=columns[2:3] + columns[4:])


# ------------------------------------------------------------------------------------------- CLI

def _shape(text: str) -> ConvShape:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) != 6:
        raise argparse.ArgumentTypeError(f"--shape takes B,M,C,H,W,K (six integers), got '{text}'")
    shape = ConvShape(*values)
    if min(values) < 1 or shape.H < shape.K or shape.W < shape.K:
        raise argparse.ArgumentTypeError(f"--shape {text}: every value must be at least 1 and H, W at least K")
    return shape


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got '{text}'")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", nargs="+", metavar="NAME",
                   help=f"presets whose conv layers to time (default {DEFAULT_PRESET} unless --shape is given)")
    p.add_argument("--shape", nargs="+", type=_shape, default=[], metavar="B,M,C,H,W,K",
                   help="explicit layer shapes, each at its own batch size B")
    p.add_argument("--images", nargs="+", type=_positive, default=list(DEFAULT_BATCHES), metavar="B",
                   help="batch sizes for the presets' layers (default 10 100 1000 10000)")
    p.add_argument("--impl", nargs="+", metavar="NAME",
                   help="implementations to time (default: all available on the device but 'reference')")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--repeat", type=_positive, help="timed calls per case (default: adaptive, at least "
                   f"{MIN_REPEATS}, up to {MAX_REPEATS} or --budget)")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP,
                   help=f"untimed calls before timing, fewer if they take --budget (default {DEFAULT_WARMUP})")
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                   help=f"seconds of timed calls per case once {MIN_REPEATS} are in (default {DEFAULT_BUDGET_S:g})")
    output = p.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the rows as a JSON list instead of the table")
    output.add_argument("--csv", action="store_true", help="print the rows as CSV instead of the table")
    p.add_argument("--out", metavar="FILE", help="also write the rows to FILE (.json or .csv)")
    p.add_argument("--report", metavar="DIR", help="also write a report (charts and tables) into DIR")


def _runnable(names: Optional[Sequence[str]], device: str) -> list[ConvImpl]:
    """The named implementations, or all made for ``device`` but the slow reference; those that can run here."""
    candidates = [impl for impl in select_impls(names, device) if names or impl.name != "reference"]
    runnable = []
    for impl in candidates:
        reason = impl.unavailable_reason(device)
        if reason:
            print(f"bench: skipping {impl.name}: {reason}", file=sys.stderr)
        else:
            runnable.append(impl)
    return runnable


def main(args) -> int:
    if args.warmup < 0 or args.budget <= 0:
        raise UserError("--warmup must be 0 or more and --budget more than 0")
    if args.out and Path(args.out).suffix.lower() not in (".json", ".csv"):
        raise UserError(f"--out {args.out}: the file name must end in .json or .csv")
    if args.report and importlib.util.find_spec("convforge.harness.report") is None:
        raise UserError("--report needs convforge.harness.report, which is not part of this build of convforge")
    device = resolve_device(args.device)
    models = args.model or ([] if args.shape else [DEFAULT_PRESET])
    cases = bench_cases(models, args.shape, args.images)  # unknown model names fail here, before any timing
    impls = _runnable(args.impl, device)

    ceilings = measure_ceilings(device)
    outcome = run_bench(cases, impls, device, ceilings, args.warmup, args.repeat, args.budget,
                        show_progress=True)
    rows = outcome.rows
    if args.json:
        print(rows_as_json(rows))
    elif args.csv:
        print(rows_as_csv(rows), end="")
    else:
        print_rows_table(rows, ceilings, device)
    if args.out:
        path = Path(args.out)
        path.write_text(rows_as_csv(rows) if path.suffix.lower() == ".csv" else rows_as_json(rows) + "\n",
                        encoding="utf-8")
    if args.report:
        from convforge.harness.report import write_report
        write_report(rows, Path(args.report))
    for failure in outcome.failures:
        print(f"bench: {failure}", file=sys.stderr)
    return 1 if outcome.failures else 0
