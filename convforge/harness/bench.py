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
timed, and not timed if wrong.

Each row also records what it ran under: the transparent-huge-page settings, whether torch's CPU
allocator advises huge pages (THP_MEM_ALLOC_ENABLE, probed), and over its timed calls the minor page faults
per call, the 1-minute load average, the CPU time other processes used and the hypervisor stole, and on a
GPU the SM clock (min / median / max), peak power, temperature and NVML's clock-event reasons. On a
CPU at large batches a fresh output's first-touch page faults can cost as much as the convolution, for
torch and for every implementation here alike (they all allocate their outputs through torch); ``--hugepages``
switches torch's allocator to huge pages for the whole run, the baseline included.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

try:
    import resource  # Unix: page faults and CPU time of this process
except ImportError:  # pragma: no cover
    resource = None

from convforge import conv
from convforge.console import print_table
from convforge.conv import ConvImpl
from convforge.engine import Stopwatch, resolve_device
from convforge.errors import UserError
from convforge.harness import (DEFAULT_BATCHES, DEFAULT_BUDGET_S, DEFAULT_WARMUP, MAX_REPEATS, MIN_REPEATS, THP_ENV,
                               TIMINGS)
from convforge.harness.check import describe_exception, progress_bar, random_case
from convforge.harness.gpu_clocks import FIELDS as GPU_CLOCK_FIELDS, GpuSampler, device_uuid
from convforge.harness.verify import Case, LayerSpec, model_layers, select_impls, verify_impl
from convforge.models import ACTIVATIONS, DEFAULT_PRESET, ConvShape, get_preset

COPY_BYTES = {"cuda": 1 << 30, "cpu": 256 << 20}  # the bandwidth ceiling's copy
MATMUL_SIZES = {"cuda": (8192,), "cpu": (1024, 1536, 2048)}  # the arithmetic ceiling: N x N x N products, the best
FMA_CHAINS, FMA_DEPTH, FMA_LANES = 12, 8, 16     # the CPU FMA-peak probe: independent 16-lane chains
FMA_CALL_S = 0.05                                 # seconds per FMA-probe call
THP_SYSFS = Path("/sys/kernel/mm/transparent_hugepage")
RESTARTED_ENV = "CONVFORGE_BENCH_RESTARTED"       # set in a bench that re-executed itself (no second restart)
THP_PROBE_BYTES = 64 << 20                        # above torch's 2 MiB huge-page threshold and glibc's largest
                                                  # mmap threshold: a fresh mapping of its own (never touched)
MAX_ROTATION_COPIES = 4096                        # input copies a GPU case cycles through, at most
CHECK_BATCH = 2                                   # batch of the correctness check before timing
BASELINE = "torch"
FUSED_BASELINE = "torch conv+act+pool"

ROW_KEYS = ("kind", "model", "layer", "B", "M", "C", "H", "W", "K", "impl", "precision", "device",
            "median_ms", "p20_ms", "p80_ms", "repeats", "flops", "bytes", "gflops", "gbps", "floor_ms",
            "roofline_pct", "baseline", "baseline_ms", "speedup", "copy_gbps", "matmul_gflops",
            "machine", "cpu", "threads", "gpu", "torch", "cuda", "cudnn", "numba", "triton", "cupy", "python",
            "date", "gpu_uuid", "timing", "fma_gflops", "minflt_per_call", "loadavg_1m", "other_cpu_pct",
            "steal_pct", "thp_enabled", "thp_defrag", "torch_thp_alloc", *GPU_CLOCK_FIELDS)


# ----------------------------------------------------------------------------------------- timing

@dataclass(frozen=True)
class Counters:
    """Process and machine counters at one moment (see ``read_counters``)."""
    wall_s: float
    minflt: int                  # this process's minor page faults so far, all threads
    own_cpu_s: float             # this process's user + system CPU time so far, all threads
    busy_s: Optional[float]      # every CPU's user + nice + system + irq + softirq time (/proc/stat; None off Linux)
    steal_s: Optional[float]     # time the hypervisor ran something else on our virtual CPUs


def _proc_stat() -> tuple[Optional[float], Optional[float]]:
    """(busy, steal) seconds summed over all CPUs since boot, from /proc/stat (None, None where absent)."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            fields = handle.readline().split()
    except OSError:
        return None, None
    if not fields or fields[0] != "cpu" or len(fields) < 8:
        return None, None
    ticks = [int(v) for v in fields[1:]] + [0] * 8
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks[:8]
    return (user + nice + system + irq + softirq) / hz, steal / hz


def read_counters() -> Counters:
    busy, steal = _proc_stat()
    if resource is None:  # pragma: no cover
        return Counters(time.perf_counter(), 0, time.process_time(), busy, steal)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return Counters(time.perf_counter(), usage.ru_minflt, usage.ru_utime + usage.ru_stime, busy, steal)


def load_fields(before: Counters, after: Counters, calls: int) -> dict:
    """The row fields of a row's timed calls: minor page faults per call, the 1-minute load average at
    the end (it counts the bench's own busy threads too), and the share of all CPUs' time (cores x wall)
    that other processes used and that the hypervisor stole."""
    capacity = max(after.wall_s - before.wall_s, 1e-9) * (os.cpu_count() or 1)
    other = steal = None
    if before.busy_s is not None and after.busy_s is not None:
        # /proc/stat counts in clock ticks (10 ms): over a short row this share is coarse.
        other = max(0.0, 100 * ((after.busy_s - before.busy_s) - (after.own_cpu_s - before.own_cpu_s)) / capacity)
        steal = max(0.0, 100 * (after.steal_s - before.steal_s) / capacity)
    try:
        loadavg = os.getloadavg()[0]
    except OSError:
        loadavg = None
    return {"minflt_per_call": (after.minflt - before.minflt) / max(calls, 1), "loadavg_1m": loadavg,
            "other_cpu_pct": other, "steal_pct": steal}


# the spin ahead of a GPU-timed call: about 0.5 ms at 2 GHz, longer than the host's launch work for any
# implementation here, so the timed kernels are queued before the start event fires
LEAD_CYCLES = 1_000_000


def lead_cycles(device: str, timing: str) -> int:
    """Spin cycles to queue ahead of each timed call (0: time as the engine does)."""
    if timing not in TIMINGS:
        raise ValueError(f"timing must be one of {TIMINGS}, got {timing!r}")
    return LEAD_CYCLES if device == "cuda" and timing == "gpu" and hasattr(torch.cuda, "_sleep") else 0


def time_calls(fn: Callable[[torch.Tensor], object], inputs: Sequence[torch.Tensor], device: str,
               warmup: int = DEFAULT_WARMUP, repeat: Optional[int] = None,
               budget_s: float = DEFAULT_BUDGET_S, load: Optional[dict] = None, timing: str = "gpu") -> np.ndarray:
    """Seconds of each timed call ``fn(inputs[i % len(inputs)])``, after up to ``warmup`` untimed calls.

    Warm-up stops early once it has taken ``budget_s`` (a call that long is past compiling and cold
    caches). Timed calls: exactly ``repeat`` when given, else at least MIN_REPEATS and then until
    ``budget_s`` of wall time or MAX_REPEATS. ``load``, when given, receives ``load_fields`` of the
    timed calls (the counters are read outside the timed regions) and, on a GPU, the SM clock, power,
    temperature and clock-event reasons sampled during them (``gpu_clocks``). ``timing``: see the module
    docstring (``gpu``: GPU time only; ``call``: the host's launch work included).
    """
    lead = lead_cycles(device, timing)
    call = 0
    started = time.perf_counter()
    for _ in range(warmup):
        with Stopwatch(device):
            fn(inputs[call % len(inputs)])
        call += 1
        if time.perf_counter() - started >= budget_s:
            break
    times = []
    before = read_counters() if load is not None else None
    sample_gpu = load is not None and device == "cuda"
    with GpuSampler(torch.cuda.current_device() if sample_gpu else None) as sampler:
        started = time.perf_counter()
        while True:
            with Stopwatch(device, lead) as watch:
                fn(inputs[call % len(inputs)])
            call += 1
            times.append(watch.seconds)
            if repeat is not None:
                if len(times) >= repeat:
                    break
            elif len(times) >= MAX_REPEATS or (len(times) >= MIN_REPEATS and time.perf_counter() - started >= budget_s):
                break
    if load is not None:
        load.update(load_fields(before, read_counters(), len(times)))
        if sample_gpu:
            load.update(sampler.fields())
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
    """This machine's measured copy bandwidth (bytes read + written) and fp32 matrix-product rate; on a CPU
    also the fp32 FMA peak of a register-resident loop (recorded only: the floor uses the matmul rate)."""
    copy_gbps: float
    matmul_gflops: float
    fma_gflops: Optional[float] = None

    def floor_s(self, flops: int, bytes_moved: int) -> float:
        return max(bytes_moved / (self.copy_gbps * 1e9), flops / (self.matmul_gflops * 1e9))

    def layer_floor_s(self, shape: ConvShape, pool: Optional[int] = None) -> float:
        """The roofline floor of one conv layer; with ``pool`` (a fused call) only the pooled output is written."""
        out_h, out_w = shape.out_hw
        out_elements = None if not pool else shape.B * shape.M * (out_h // pool) * (out_w // pool)
        return self.floor_s(shape.flops, shape.bytes_moved(out_elements))


def measure_ceilings(device: str, budget_s: float = DEFAULT_BUDGET_S) -> Ceilings:
    """Copy COPY_BYTES[device] device to device and multiply N x N fp32 matrices (TF32 off) for each N of
    MATMUL_SIZES[device], on torch's threads; on a CPU also time ``fma_peak_gflops``.

    Each ceiling is the fastest of its repeated runs (and of the matrix sizes), not the median: it bounds
    what the machine can do, and a run slowed by other work on the machine must not lower it.
    """
    from convforge.conv.torch_conv import exact_fp32
    exact_fp32()
    source = torch.ones(COPY_BYTES[device] // 4, device=device)
    target = torch.empty_like(source)
    copy_s = float(np.min(time_calls(lambda src: target.copy_(src), [source], device, budget_s=budget_s)))
    del source, target
    matmul_gflops = 0.0
    for n in MATMUL_SIZES[device]:
        a, b = torch.rand(n, n, device=device), torch.rand(n, n, device=device)
        product = torch.empty(n, n, device=device)
        seconds = float(np.min(time_calls(lambda left: torch.mm(left, b, out=product), [a], device,
                                          budget_s=budget_s / len(MATMUL_SIZES[device]))))
        matmul_gflops = max(matmul_gflops, 2 * n ** 3 / seconds / 1e9)
    fma = fma_peak_gflops(torch.get_num_threads(), budget_s / 2) if device == "cpu" else None
    return Ceilings(copy_gbps=2 * COPY_BYTES[device] / copy_s / 1e9, matmul_gflops=matmul_gflops, fma_gflops=fma)


def fma_source() -> str:
    """A Numba kernel of FMA_CHAINS independent chains s = s * a + b, FMA_DEPTH deep per pass, each chain
    FMA_LANES floats wide (the lane loop becomes one AVX-512 register), so the loop is bound by FMA
    throughput alone: enough independent chains to cover the FMA latency, loads and stores once per
    FMA_DEPTH multiply-adds."""
    lanes = FMA_LANES
    loads = "; ".join(f"s{i} = acc[{lanes * i} + lane]" for i in range(FMA_CHAINS))
    chain = "; ".join(f"s{i} = s{i} * a + b" for i in range(FMA_CHAINS))
    body = "\n".join(" " * 12 + chain for _ in range(FMA_DEPTH))
    stores = "; ".join(f"acc[{lanes * i} + lane] = s{i}" for i in range(FMA_CHAINS))
    return f'''"""Generated by convforge.harness.bench: the FMA-peak probe ({FMA_CHAINS} chains, {FMA_DEPTH} deep)."""


def chains(acc, n, a, b):
    for _ in range(n):
        for lane in range({lanes}):
            {loads}
{body}
            {stores}
'''


def fma_peak_gflops(threads: int, budget_s: float = DEFAULT_BUDGET_S / 2) -> Optional[float]:
    """fp32 GFLOP/s of ``fma_source``'s kernel run on ``threads`` threads at once (Numba, GIL released),
    the best of repeated runs of about FMA_CALL_S each (at least MIN_REPEATS, then until ``budget_s``).
    None when Numba is not installed or cannot compile it (the figure is recorded, nothing depends on it)."""
    try:
        from convforge.conv.cpu_loops import jit_generated
        kernel = jit_generated("fma_peak", fma_source(), "chains", nogil=True, fastmath={"contract"})
        accs = [np.zeros(FMA_CHAINS * FMA_LANES, np.float32) for _ in range(max(1, threads))]
        a, b = np.float32(0.999), np.float32(1e-3)  # the chains converge to 1: no overflow, no denormals
        kernel(accs[0], 1, a, b)                    # compile (or load from the disk cache)
    except Exception:  # ImportError without Numba; a compile error must not stop the bench
        return None
    flops_per_pass = 2 * FMA_CHAINS * FMA_LANES * FMA_DEPTH

    def run(passes: int) -> float:
        workers = [threading.Thread(target=kernel, args=(acc, passes, a, b)) for acc in accs]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return time.perf_counter() - started

    passes = 1000
    while (seconds := run(passes)) < FMA_CALL_S / 4:   # calibrate a pass count for about FMA_CALL_S
        passes *= 4
    passes = max(1, int(passes * FMA_CALL_S / seconds))
    best, runs, started = 0.0, 0, time.perf_counter()
    while runs < MIN_REPEATS or time.perf_counter() - started < budget_s:
        best = max(best, flops_per_pass * passes * len(accs) / run(passes) / 1e9)
        runs += 1
    return best


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


def thp_setting(name: str) -> Optional[str]:
    """The selected value of /sys/kernel/mm/transparent_hugepage/NAME ('madvise' from 'always [madvise] never')."""
    try:
        text = (THP_SYSFS / name).read_text(encoding="ascii")
    except OSError:  # not Linux, or no THP in this kernel
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else text.strip() or None


def torch_thp_alloc() -> Optional[bool]:
    """Whether torch's CPU allocator gives large tensors huge pages in this process.

    torch (c10/core/impl/alloc_cpu.cpp) reads THP_MEM_ALLOC_ENABLE once, into a static, at its first CPU
    allocation; when it was 1, every later allocation of 2 MiB or more is page-aligned and advised with
    madvise(MADV_HUGEPAGE). The probe allocates THP_PROBE_BYTES (untouched, so no memory is used) and checks
    both: a page-aligned address (torch's plain alignment is 64 bytes; glibc puts a mapped chunk's data 64
    bytes into its first page) and the advice, the 'hg' flag, on its mapping in /proc/self/smaps. The size
    gives the probe a fresh mapping: a smaller one may reuse heap memory that NumPy (which advises huge pages
    for its own arrays of 4 MiB or more) has flagged. None where there is no smaps.
    (Whether the kernel then backs it with huge pages is thp_setting('enabled').)
    """
    probe = torch.empty(THP_PROBE_BYTES // 4, dtype=torch.float32)
    address = probe.data_ptr()
    if address % (os.sysconf("SC_PAGESIZE") if hasattr(os, "sysconf") else 4096):
        return False
    try:
        with open("/proc/self/smaps", encoding="ascii", errors="replace") as handle:
            inside = False
            for line in handle:
                head = line.split(" ", 1)[0]
                if "-" in head and not head.endswith(":"):     # a mapping's first line: start-end perms ...
                    start, _, end = head.partition("-")
                    try:
                        inside = int(start, 16) <= address < int(end, 16)
                    except ValueError:
                        inside = False
                elif inside and head == "VmFlags:":
                    return "hg" in line.split()[1:]
    except OSError:
        return None
    return None


def _restart_with_environment(changes: dict) -> None:
    """Re-execute this command (same interpreter, same arguments) with ``changes`` in its environment.

    Returns (doing nothing) when this process is not `convforge bench` started from a command line, e.g.
    ``cli.main([...])`` called in-process, or when it is already the restarted one."""
    original = list(getattr(sys, "orig_argv", ()))
    arguments = sys.argv[1:]
    if (os.environ.get(RESTARTED_ENV) or not original or arguments[:1] != ["bench"]
            or len(original) < len(arguments) + 1 or original[len(original) - len(arguments):] != arguments):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *original[1:]], {**os.environ, **changes, RESTARTED_ENV: "1"})


def use_hugepages() -> None:
    """Make torch's CPU allocator give huge pages to every large tensor of this run (THP_MEM_ALLOC_ENABLE=1).

    Setting the variable is enough while torch has not yet allocated (it reads it at its first
    allocation); otherwise the bench re-executes itself with the variable set. In-process callers that
    cannot be restarted get a UserError saying how to set it.
    """
    previous = os.environ.get(THP_ENV)
    os.environ[THP_ENV] = "1"
    if torch_thp_alloc():
        return
    if previous is None:
        del os.environ[THP_ENV]
    else:
        os.environ[THP_ENV] = previous
    _restart_with_environment({THP_ENV: "1"})
    raise UserError(f"--hugepages: torch's allocator had already read {THP_ENV} (at its first allocation) in this "
                    f"process and did not take it; start the process with {THP_ENV}=1 in its environment"
                    + (" (/proc/self/smaps shows no MADV_HUGEPAGE advice)" if os.environ.get(RESTARTED_ENV) else ""))


def environment(device: str) -> dict:
    """Where and with what the rows were measured: the machine, library versions (None when absent), date,
    the transparent-huge-page settings and whether torch's allocator asks for huge pages."""
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
        # which physical GPU (machines are lent per session, and the host name does not tell them apart)
        "gpu_uuid": device_uuid(torch.cuda.current_device()) if on_gpu else None,
        "thp_enabled": thp_setting("enabled"),
        "thp_defrag": thp_setting("defrag"),
        "torch_thp_alloc": torch_thp_alloc(),
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
    floor_s = ceilings.layer_floor_s(shape, pool)
    row = {"kind": kind, "model": case.model, "layer": case.spec.label,
           "B": shape.B, "M": shape.M, "C": shape.C, "H": shape.H, "W": shape.W, "K": shape.K,
           "impl": impl, "precision": precision, "device": device,
           "median_ms": median_s * 1e3, "p20_ms": float(np.percentile(times, 20)) * 1e3,
           "p80_ms": float(np.percentile(times, 80)) * 1e3, "repeats": len(times),
           "flops": shape.flops, "bytes": bytes_moved, "gflops": shape.flops / median_s / 1e9,
           "gbps": bytes_moved / median_s / 1e9, "floor_ms": floor_s * 1e3, "roofline_pct": 100 * floor_s / median_s,
           "baseline": baseline, "baseline_ms": baseline_ms, "speedup": baseline_ms / (median_s * 1e3),
           "copy_gbps": ceilings.copy_gbps, "matmul_gflops": ceilings.matmul_gflops,
           "fma_gflops": ceilings.fma_gflops, **env, **(load or {})}
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
    fma = f", FMA peak {ceilings.fma_gflops:.1f} GFLOP/s" if ceilings.fma_gflops else ""
    pages = "" if device == "cuda" else (f"; THP {first['thp_enabled']}, torch huge-page allocator "
                                         f"{'on' if first['torch_thp_alloc'] else 'off'}")
    title = (f"bench on {device} ({where}): copy {ceilings.copy_gbps:.1f} GB/s, "
             f"fp32 matmul {ceilings.matmul_gflops:.1f} GFLOP/s{fma}{pages}; times in ms")
    columns = ("layer", "kind", "B", "impl", "median", "p20-p80", "GFLOP/s", "GB/s", "floor", "% floor", "speedup")
    table = [(r["layer"], r["kind"], r["B"], r["impl"], f"{r['median_ms']:.4g}",
              f"{r['p20_ms']:.4g}-{r['p80_ms']:.4g}", f"{r['gflops']:.1f}", f"{r['gbps']:.1f}",
              f"{r['floor_ms']:.4g}", f"{r['roofline_pct']:.1f}", f"{r['speedup']:.2f}") for r in rows]
    print_table(title, columns, table, justify_right=columns[2:3] + columns[4:])


# ------------------------------------------------------------------------------------------- command

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
        path.write_text(rows_as_csv(rows) if path.suffix.lower() == ".csv" else rows_as_json(rows) + "\n",
                        encoding="utf-8")
    if args.report:
        from convforge.harness.report import write_report
        write_report(rows, Path(args.report))
    for failure in outcome.failures:
        print(f"bench: {failure}", file=sys.stderr)
    return 1 if outcome.failures else 0
