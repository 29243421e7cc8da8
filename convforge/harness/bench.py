"""convforge bench: op time of each implementation against the framework's convolution and the roofline.

For every (conv layer, batch size, implementation): the median of repeated calls after warm-up
(``engine.Stopwatch``: CUDA events on a GPU, perf_counter on a CPU, synchronised around each call, the
function called without ``out`` as the engine calls it). ``--timing`` on a GPU: ``gpu`` (default) queues a
spin kernel ahead of the start event so that the events bracket GPU time only; ``call`` times as the
engine's Op Time does, which also counts the host's 10-50 us of launch work between the start event and the
kernel (RESULTS.md's GPU runs 1-9 used ``call``; that host time differed between processes by up to 20 % of a
0.17 ms layer). Every row records its ``timing``. On a GPU the input is
rotated among copies whose total exceeds twice the L2 cache, so small batches are not served from L2.
Repeats adapt: at least MIN_REPEATS, then until the case's time budget is spent (``--repeat`` fixes them).

Baseline: torch ``F.conv2d`` on the same device in the same run (cuDNN with TF32 off, oneDNN on a CPU);
for fusing implementations, where a preset's conv is followed by [activation +] max pool, also the fused
call against torch's eager conv + activation + pool. Roofline floor = max(bytes / copy bandwidth,
FLOPs / matmul rate), both ceilings measured here at start-up (a large device-to-device copy, bytes read
plus written; an fp32 matrix product with TF32 off); the fused floor counts only the pooled output.
Every implementation is checked against the float64 reference on the layer's shape (B = 2) before it is
timed, and not timed if wrong; where that output exceeds ``check.CHECKED_OUTPUTS`` elements, image 0's
leading maps are compared and the rest must be finite. The timed input is drawn on the device.

Each row also records what it ran under: the transparent-huge-page settings, whether torch's CPU
allocator advises huge pages (THP_MEM_ALLOC_ENABLE, probed), and over its timed calls the minor page faults
per call, the 1-minute load average, the CPU time other processes used and the hypervisor stole, and on a
GPU the SM clock (min / median / max), peak power, temperature and NVML's clock-event reasons. On a
CPU at large batches a fresh output's first-touch page faults can cost as much as the convolution, for
torch and for every implementation here alike (they all allocate their outputs through torch); ``--hugepages``
switches torch's allocator to huge pages for the whole run, the baseline included.

Here: the cases, the run, the row table (ROW_KEYS) and the command's body. The timing loop and the /proc
counters are in ``timing``; the ceilings, huge-page probes and the run's environment in ``probes``.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from convforge import conv
from convforge.console import print_table
from convforge.conv import ConvImpl
from convforge.engine import resolve_device
from convforge.errors import UserError
from convforge.harness import DEFAULT_BUDGET_S, DEFAULT_WARMUP, THP_ENV, write_atomically
from convforge.harness.check import describe_exception, progress_bar, random_case
from convforge.harness.gpu_clocks import FIELDS as GPU_CLOCK_FIELDS
from convforge.harness.probes import Ceilings, environment, measure_ceilings, torch_thp_alloc, use_hugepages
from convforge.harness.timing import lead_cycles, rotated_inputs, time_calls
from convforge.harness.verify import Case, LayerSpec, model_layers, select_impls, verify_impl
from convforge.models import ACTIVATIONS, DEFAULT_PRESET, ConvShape, get_preset

CHECK_BATCH = 2                                   # batch of the correctness check before timing
BASELINE = "torch"
FUSED_BASELINE = "torch conv+act+pool"

ROW_KEYS = ("kind", "model", "layer", "B", "M", "C", "H", "W", "K", "impl", "precision", "device",
            "median_ms", "p20_ms", "p80_ms", "repeats", "flops", "bytes", "gflops", "gbps", "floor_ms",
            "roofline_pct", "baseline", "baseline_ms", "speedup", "copy_gbps", "matmul_gflops",
            "machine", "cpu", "threads", "gpu", "torch", "cuda", "cudnn", "numba", "triton", "cupy", "python",
            "date", "gpu_uuid", "timing", "fma_gflops", "minflt_per_call", "loadavg_1m", "other_cpu_pct",
            "steal_pct", "thp_enabled", "thp_defrag", "torch_thp_alloc", *GPU_CLOCK_FIELDS, "read_gbps", "write_gbps",
            "tf32_gflops", "fp16_gflops")


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


# Named shape sets (``--shapes NAME``), each shape (B, M, C, H, W, K) at its own batch size, no bias.
# gpumode: the benchmark shapes of gpu-mode/reference-kernels problems/pmpp_v2/conv2d_py/task.yml (size,
# kernelsize, channels = C = M, batch; the file lists size 256, kernel 16, 128 channels, batch 2 twice, with two
# seeds: once here). wide: many-channel layers, 16-512 channels, K 1-11, images 16-1024 px, batch 1-64 (issue #24),
# including its 16 images of 1024 x 1024 with 16-64 channels in and 128 out.
SHAPE_SETS: dict[str, tuple[tuple[int, int, int, int, int, int], ...]] = {
    "gpumode": ((4, 64, 64, 128, 128, 8), (4, 64, 64, 128, 128, 16), (2, 128, 128, 256, 256, 16),
                (1, 128, 128, 256, 256, 32)),
    "wide": (
        # K = 1
        (64, 64, 64, 56, 56, 1), (32, 256, 128, 28, 28, 1), (16, 128, 16, 1024, 1024, 1), (8, 512, 512, 16, 16, 1),
        (4, 256, 256, 64, 64, 1), (16, 128, 64, 1024, 1024, 1),
        # K = 3
        (64, 64, 64, 56, 56, 3), (32, 128, 128, 28, 28, 3), (16, 256, 256, 16, 16, 3), (8, 512, 512, 16, 16, 3),
        (1, 64, 64, 224, 224, 3), (4, 128, 64, 128, 128, 3), (16, 128, 32, 1024, 1024, 3), (2, 32, 16, 512, 512, 3),
        (64, 16, 16, 64, 64, 3), (64, 128, 128, 32, 32, 3), (64, 256, 256, 16, 16, 3),
        # K = 5
        (32, 64, 32, 64, 64, 5), (8, 128, 128, 64, 64, 5), (1, 256, 256, 32, 32, 5), (4, 192, 96, 128, 128, 5),
        (16, 32, 16, 256, 256, 5), (16, 128, 16, 1024, 1024, 5), (3, 100, 36, 57, 43, 5), (1, 512, 512, 16, 16, 5),
        # K = 7, 9, 11
        (32, 64, 16, 112, 112, 7), (8, 128, 64, 64, 64, 7), (1, 512, 256, 32, 32, 7), (2, 64, 64, 256, 256, 7),
        (4, 128, 128, 64, 64, 9), (16, 32, 32, 128, 128, 9), (1, 64, 512, 128, 128, 9),
        (8, 96, 48, 128, 128, 11), (1, 256, 128, 64, 64, 11), (64, 64, 16, 32, 32, 11),
    ),
}


def shape_set(name: str) -> list[ConvShape]:
    try:
        return [ConvShape(*s) for s in SHAPE_SETS[name]]
    except KeyError:
        raise UserError(f"unknown shape set '{name}'; choose one of: {', '.join(SHAPE_SETS)}") from None


def bench_cases(models: Sequence[str], shapes: Sequence[ConvShape], batches: Sequence[int],
                shape_sets: Sequence[str] = ()) -> list[BenchCase]:
    """Each preset's conv layers at each batch size, then each explicit shape at its own batch size, then each
    named set's shapes (model: the set's name) at theirs."""
    cases = [BenchCase(name, spec, batch) for name in models
             for spec in model_layers(get_preset(name).architecture) for batch in batches]
    # Each custom shape gets its own label, so that two of them never share a row key in a report.
    cases += [BenchCase("custom", LayerSpec(f"custom M{s.M} C{s.C} {s.H}x{s.W} K{s.K}", s.with_batch(1), False, None),
                        s.B) for s in shapes]
    for name in shape_sets:
        cases += [BenchCase(name, LayerSpec(f"{name} B{s.B} M{s.M} C{s.C} {s.H}x{s.W} K{s.K}", s.with_batch(1),
                                            False, None), s.B) for s in shape_set(name)]
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
             baseline: str, baseline_ms: float, ceilings: Ceilings, env: dict, load: Optional[dict] = None) -> dict:
    """One result row (keys ROW_KEYS); a fused row's bytes and floor count only the pooled output.
    ``load``: ``load_fields`` of the timed calls (None fields when not given)."""
    shape = case.shape
    out_elements = None
    pool = case.spec.fusion[1] if kind == "fused" else None
    if pool:
        out_h, out_w = shape.out_hw
        out_elements = shape.B * shape.M * (out_h // pool) * (out_w // pool)
    median_s = float(np.median(times))
    bytes_moved = shape.bytes_moved(out_elements)
    floor_s = ceilings.layer_floor_s(shape, pool, precision)
    row = {"kind": kind, "model": case.model, "layer": case.spec.label,
           "B": shape.B, "M": shape.M, "C": shape.C, "H": shape.H, "W": shape.W, "K": shape.K,
           "impl": impl, "precision": precision, "device": device,
           "median_ms": median_s * 1e3, "p20_ms": float(np.percentile(times, 20)) * 1e3,
           "p80_ms": float(np.percentile(times, 80)) * 1e3, "repeats": len(times),
           "flops": shape.flops, "bytes": bytes_moved, "gflops": shape.flops / median_s / 1e9,
           "gbps": bytes_moved / median_s / 1e9, "floor_ms": floor_s * 1e3, "roofline_pct": 100 * floor_s / median_s,
           "baseline": baseline, "baseline_ms": baseline_ms, "speedup": baseline_ms / (median_s * 1e3),
           "copy_gbps": ceilings.copy_gbps, "matmul_gflops": ceilings.matmul_gflops,
           "fma_gflops": ceilings.fma_gflops, "read_gbps": ceilings.read_gbps, "write_gbps": ceilings.write_gbps,
           "tf32_gflops": ceilings.tf32_gflops, "fp16_gflops": ceilings.fp16_gflops, **env, **(load or {})}
    return {key: row.get(key) for key in ROW_KEYS}


@dataclass
class BenchOutcome:
    rows: list[dict]
    failures: list[str]   # implementations that failed their check or raised, and were not timed


def run_bench(cases: Sequence[BenchCase], impls: Sequence[ConvImpl], device: str, ceilings: Ceilings,
              warmup: int = DEFAULT_WARMUP, repeat: Optional[int] = None, budget_s: float = DEFAULT_BUDGET_S,
              show_progress: bool = True, timing: str = "gpu") -> BenchOutcome:
    """Time the baseline and each implementation on each case; fused calls too where the layer allows."""
    env = dict(environment(device), timing="gpu" if lead_cycles(device, timing) else "call")
    timed = [impl for impl in impls if impl.name != BASELINE]
    fusing = [impl for impl in timed if impl.fuses]
    rows: list[dict] = []
    failures: list[str] = []
    checked: dict[tuple, bool] = {}
    probes: dict = {}   # this layer's check cases by fusion: data and float64 reference drawn once for all impls

    def passes_check(impl: ConvImpl, case: BenchCase, fusion) -> bool:
        """Whether ``impl`` is right on this layer at B = 2 (checked once per layer; a failure is recorded)."""
        key = (impl.name, case.spec, fusion)
        if key not in checked:
            if probes.get("spec") != case.spec:   # a new layer: the previous layer's data and reference go
                probes.clear()
                probes["spec"] = case.spec
            probe = probes.setdefault(fusion, Case(case.spec.label, case.spec.shape.with_batch(CHECK_BATCH), 0,
                                                   case.spec.bias, fusion))
            result = verify_impl(impl, device, [probe])
            checked[key] = result.passed
            for failure in result.failures:
                failures.append(f"{impl.name}{' (fused)' if fusion else ''} is wrong, so not timed: {failure}")
        return checked[key]

    def measure(kind: str, case: BenchCase, impl_name: str, precision: str, prepare: Callable, inputs,
                baseline: str, baseline_ms: Optional[float]) -> Optional[float]:
        """Prepare, time and record one row; returns its median in ms (None when it raised)."""
        load: dict = {}
        try:
            times = time_calls(prepare(), inputs, device, warmup, repeat, budget_s, load=load, timing=timing)
        except Exception as exc:  # e.g. out of memory at B = 10000: report it and go on with the rest
            failures.append(f"{impl_name} on {case.spec.label} B={case.batch} ({kind}) raised "
                            f"{describe_exception(exc)}")
            if device == "cuda":
                torch.cuda.empty_cache()
            return None
        median_ms = float(np.median(times)) * 1e3
        rows.append(make_row(kind, case, impl_name, precision, device, times, baseline,
                             median_ms if baseline_ms is None else baseline_ms, ceilings, env, load))
        return median_ms

    per_case = [1 + len(timed) + (1 + len(fusing) if case.spec.fusion and fusing else 0) for case in cases]
    with progress_bar(show_progress) as bar, torch.inference_mode():
        task = bar.add_task("bench", total=sum(per_case))
        for case in cases:
            shape = case.shape
            # drawn on the device: the timed input of a wide layer is up to 10^9 values
            x, weight, bias = random_case((shape.B, shape.C, shape.H, shape.W), (shape.M, shape.C, shape.K, shape.K),
                                          seed=0, bias=case.spec.bias, device=device)
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
    pages = "" if device == "cuda" else (f"; THP {first['thp_enabled']}, torch huge-page allocator "
                                         f"{'on' if first['torch_thp_alloc'] else 'off'}")
    title = f"bench on {device} ({where}): {ceilings.describe()}{pages}; times in ms"
    columns = ("layer", "kind", "B", "impl", "median", "p20-p80", "GFLOP/s", "GB/s", "floor", "% floor", "speedup")
    table = [(r["layer"], r["kind"], r["B"], r["impl"], f"{r['median_ms']:.4g}",
              f"{r['p20_ms']:.4g}-{r['p80_ms']:.4g}", f"{r['gflops']:.1f}", f"{r['gbps']:.1f}",
              f"{r['floor_ms']:.4g}", f"{r['roofline_pct']:.1f}", f"{r['speedup']:.2f}") for r in rows]
    print_table(title, columns, table, justify_right=columns[2:3] + columns[4:])


# ------------------------------------------------------------------------------------------- command

def _runnable(names: Optional[Sequence[str]], device: str) -> list[ConvImpl]:
    """The named implementations, or all made for ``device`` but the slow reference; those that can run here."""
    candidates = [impl for impl in select_impls(names, device) if names or impl.name != "reference"]
    runnable, reasons = [], []
    for impl in candidates:
        reason = impl.unavailable_reason(device)
        if reason:
            reasons.append(f"{impl.name}: {reason}")
        else:
            runnable.append(impl)
    if names and not runnable:   # nothing the user asked for can run: an error, not a bench of the baseline alone
        raise UserError(f"--impl: none can run on {device} here ({'; '.join(reasons)})")
    for reason in reasons:
        print(f"bench: skipping {reason}", file=sys.stderr)
    return runnable


def main(args) -> int:
    if args.warmup < 0 or args.budget <= 0:
        raise UserError("--warmup must be 0 or more and --budget more than 0")
    if args.out and Path(args.out).suffix.lower() not in (".json", ".csv"):
        raise UserError(f"--out {args.out}: the file name must end in .json or .csv")
    if args.report and importlib.util.find_spec("convforge.harness.report") is None:
        raise UserError("--report needs convforge.harness.report, which is not part of this build of convforge")
    device = resolve_device(args.device)
    shape_sets = getattr(args, "shapes", None) or []
    models = args.model or ([] if args.shape or shape_sets else [DEFAULT_PRESET])
    cases = bench_cases(models, args.shape, args.images, shape_sets)  # unknown model names fail here, before any timing
    if getattr(args, "hugepages", False):
        use_hugepages()  # may re-execute this command with THP_MEM_ALLOC_ENABLE=1, before anything is timed
    elif torch_thp_alloc():
        print(f"bench: {THP_ENV} is on in the environment: torch's allocator gives every large tensor huge "
              "pages in this run (rows: torch_thp_alloc)", file=sys.stderr)
    impls = _runnable(args.impl, device)

    ceilings = measure_ceilings(device)
    outcome = run_bench(cases, impls, device, ceilings, args.warmup, args.repeat, args.budget,
                        show_progress=True, timing=getattr(args, "timing", "gpu"))
    rows = outcome.rows
    if args.json:
        print(rows_as_json(rows))
    elif args.csv:
        print(rows_as_csv(rows), end="")
    else:
        print_rows_table(rows, ceilings, device)
    if args.out:
        path = Path(args.out)
        text = rows_as_csv(rows) if path.suffix.lower() == ".csv" else rows_as_json(rows) + "\n"
        write_atomically(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    if args.report:
        from convforge.harness.report import write_report
        write_report(rows, Path(args.report))
    for failure in outcome.failures:
        print(f"bench: {failure}", file=sys.stderr)
    return 1 if outcome.failures else 0
