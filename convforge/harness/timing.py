"""The one timing loop of the harness: ``time_calls`` (bench, sweep and the ceilings use it) over inputs
rotated past the L2 cache, with a spin kernel ahead of each GPU start event (``--timing gpu``), and the
process's /proc counters read around the timed calls (page faults, CPU time of others, steal)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch

try:
    import resource  # Unix: page faults and CPU time of this process
except ImportError:  # pragma: no cover
    resource = None

from convforge.engine import LEAD_CYCLES, Stopwatch, gpu_lead  # noqa: F401 (LEAD_CYCLES: part of this API)
from convforge.harness import DEFAULT_BUDGET_S, DEFAULT_WARMUP, MAX_REPEATS, MIN_REPEATS, TIMINGS
from convforge.harness.gpu_clocks import GpuSampler

MAX_ROTATION_COPIES = 4096                        # input copies a GPU case cycles through, at most


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



def lead_cycles(device: str, timing: str) -> int:
    """Spin cycles to queue ahead of each timed call (0: time as the engine does)."""
    if timing not in TIMINGS:
        raise ValueError(f"timing must be one of {TIMINGS}, got {timing!r}")
    return gpu_lead(device) if timing == "gpu" else 0


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
