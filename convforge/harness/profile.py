"""``convforge profile``: one inference under torch.profiler, summarised the way nvprof did.

The course ran ``nvprof python m3.1.py`` and read two tables off the end of the output. This command runs
the same inference as ``convforge infer`` (the engine annotating each layer, e.g. "conv1 [cuda-tiled]") and
prints, in nvprof's layout:

    GPU activities   kernels, memory copies and memsets executed on the GPU, by total time
    API calls        CUDA runtime and driver calls made by the host (cudaLaunchKernel, cuLaunchKernel, ...)

Each table is sorted by total time and stops at the row where the cumulative share reaches 90 % (``--cut``).
Without a CUDA GPU (or with ``--device cpu``) there is no device activity to show, so the profile shows the
CPU operators by self time instead, and says so in one line. ``--trace FILE`` writes the whole timeline as a
Chrome/Perfetto trace, the counterpart of opening an nvprof file in nvvp.

The tables read only these fields of ``torch.autograd.profiler_util.FunctionEvent`` (``prof.events()``):
``name``, ``device_type`` (``DeviceType.CUDA`` for work that ran on the GPU), ``time_range.start``/``.end``
(microseconds), ``self_cpu_time_total`` and ``is_async`` (CPU table), ``is_user_annotation`` (record_function
ranges, which kineto also copies onto the GPU timeline; a device event named like a host range counts as one
too). ``activity_type`` (kineto's kind: "kernel", "gpu_memcpy", "cuda_runtime", ...; newer torch only) is a
second opinion read with getattr: without it, API calls are told by their names (cuda*, cu*).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

from convforge.errors import UserError
from convforge.harness import DEFAULT_CUT_PERCENT, DEFAULT_NAME_WIDTH, write_atomically


# Host-side CUDA runtime (cudaLaunchKernel) and driver (cuLaunchKernel) calls: "cu" or "cuda" then a capital,
# which leaves out library namespaces such as cudnn* and cublas* (and every aten:: operator).
_API_NAME = re.compile(r"^cu(da)?[A-Z]\w*$")
_API_ACTIVITY_TYPES = {"cuda_runtime", "cuda_driver"}
_ANNOTATION_ACTIVITY_TYPES = {"user_annotation", "gpu_user_annotation"}


# ------------------------------------------------------------------------------------ summarising

@dataclass
class ProfileRow:
    """All calls of one name in one table: durations in microseconds."""
    name: str
    durations_us: list[float] = field(default_factory=list)

    @property
    def calls(self) -> int:
        return len(self.durations_us)

    @property
    def total_us(self) -> float:
        return sum(self.durations_us)

    @property
    def average_us(self) -> float:
        return self.total_us / self.calls if self.calls else 0.0


def _aggregate(named_durations: Iterable[tuple[str, float]]) -> list[ProfileRow]:
    rows: dict[str, ProfileRow] = {}
    for name, duration in named_durations:
        rows.setdefault(name, ProfileRow(name)).durations_us.append(float(duration))
    return sorted(rows.values(), key=lambda row: row.total_us, reverse=True)


def _elapsed_us(event) -> float:
    return float(event.time_range.end - event.time_range.start)


def _is_device_event(event) -> bool:
    from torch.autograd import DeviceType
    return event.device_type == DeviceType.CUDA


def _is_annotation(event, annotation_names: set[str]) -> bool:
    """A record_function range; on a GPU kineto mirrors each one onto the device timeline as well."""
    return (bool(getattr(event, "is_user_annotation", False))
            or getattr(event, "activity_type", None) in _ANNOTATION_ACTIVITY_TYPES
            or event.name in annotation_names)


def _host_annotation_names(events) -> set[str]:
    return {e.name for e in events if not _is_device_event(e) and getattr(e, "is_user_annotation", False)}


def nvprof_name(name: str) -> str:
    """Kineto's 'Memcpy HtoD (Pageable -> Device)' as nvprof wrote it: '[CUDA memcpy HtoD] (Pageable -> Device)'."""
    match = re.match(r"^Memcpy (\w+)\s*(.*)$", name)
    if match:
        return f"[CUDA memcpy {match.group(1)}] {match.group(2)}".rstrip()
    match = re.match(r"^Memset\s*(.*)$", name)
    if match:
        return f"[CUDA memset] {match.group(1)}".rstrip()
    return name


def gpu_activity_rows(events) -> list[ProfileRow]:
    """Kernels, memcpys and memsets that ran on the GPU (device events other than mirrored annotations)."""
    annotations = _host_annotation_names(events)
    return _aggregate((nvprof_name(e.name), _elapsed_us(e)) for e in events
                      if _is_device_event(e) and not _is_annotation(e, annotations))


def api_call_rows(events) -> list[ProfileRow]:
    """CUDA runtime and driver calls, timed on the host from entry to return (as nvprof's 'API calls')."""
    def is_api_call(e) -> bool:
        return not _is_device_event(e) and (getattr(e, "activity_type", None) in _API_ACTIVITY_TYPES
                                            or bool(_API_NAME.match(e.name)))
    return _aggregate((e.name, _elapsed_us(e)) for e in events if is_api_call(e))


def cpu_operator_rows(events) -> list[ProfileRow]:
    """Host operators and annotated layers by self CPU time (time not spent in a nested operator)."""
    return _aggregate((e.name, e.self_cpu_time_total) for e in events
                      if not _is_device_event(e) and not e.is_async)


def cut_rows(rows: Sequence[ProfileRow], cut_percent: float) -> tuple[list[ProfileRow], list[ProfileRow]]:
    """(shown, hidden): rows up to and including the one where the cumulative share reaches cut_percent."""
    total = sum(row.total_us for row in rows)
    if cut_percent >= 100 or total <= 0:
        return list(rows), []
    cumulative = 0.0
    for i, row in enumerate(rows):
        cumulative += row.total_us
        if 100.0 * cumulative / total >= cut_percent:
            return list(rows[:i + 1]), list(rows[i + 1:])
    return list(rows), []


# -------------------------------------------------------------------------------------- printing

def format_duration(us: float) -> str:
    """nvprof's style: five significant digits (trailing zeros kept) in the unit that keeps the number short."""
    if us == 0:
        return "0ns"
    for scale, unit in ((1e6, "s"), (1e3, "ms"), (1.0, "us")):
        if abs(us) >= scale:
            return f"{us / scale:#.5g}{unit}"
    return f"{us * 1e3:#.5g}ns"


def shorten_name(name: str, width: int) -> str:
    """Long C++ kernel names lose their parameter list first, then their tail; width 0 keeps them whole."""
    if width <= 0 or len(name) <= width:
        return name
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                if i > 0:
                    name = name[:i]
                break
    return name if len(name) <= width else name[:width - 3] + "..."


_HEADER = (f"{'Type':>16}  {'Time(%)':>7}  {'Cum(%)':>7}  {'Time':>9}  {'Calls':>7}  {'Avg':>9}  {'Min':>9}  "
           f"{'Max':>9}  Name")


def format_section(label: str, rows: Sequence[ProfileRow], cut_percent: float, name_width: int) -> list[str]:
    total = sum(row.total_us for row in rows)
    if not rows or total <= 0:
        return [f"{label + ':':>16}  (none recorded)"]
    shown, hidden = cut_rows(rows, cut_percent)
    lines = []
    cumulative = 0.0
    for i, row in enumerate(shown):
        cumulative += row.total_us
        lines.append(f"{(label + ':') if i == 0 else '':>16}  {100 * row.total_us / total:>6.2f}%  "
                     f"{100 * cumulative / total:>6.2f}%  {format_duration(row.total_us):>9}  {row.calls:>7}  "
                     f"{format_duration(row.average_us):>9}  {format_duration(min(row.durations_us)):>9}  "
                     f"{format_duration(max(row.durations_us)):>9}  {shorten_name(row.name, name_width)}")
    if hidden:
        rest = sum(row.total_us for row in hidden)
        lines.append(f"{'':>16}  ... {len(hidden)} more, {100 * rest / total:.2f}% of the time "
                     f"(--cut 100 shows every row)")
    return lines


def format_profile(sections: Sequence[tuple[str, Sequence[ProfileRow]]], cut_percent: float = DEFAULT_CUT_PERCENT,
                   name_width: int = DEFAULT_NAME_WIDTH) -> str:
    lines = [_HEADER]
    for label, rows in sections:
        lines += format_section(label, rows, cut_percent, name_width)
    return "\n".join(lines)


def choose_sections(events, device: str, cuda_available: bool) -> tuple[Optional[str], list[tuple[str, list]]]:
    """The tables to print and, when they are the CPU operators, the one-line reason why."""
    if device == "cuda":
        gpu_rows = gpu_activity_rows(events)
        if gpu_rows:
            return None, [("GPU activities", gpu_rows), ("API calls", api_call_rows(events))]
        reason = "the profiler recorded no GPU activity (is CUPTI available to torch?): showing CPU operators"
    elif cuda_available:
        reason = "--device cpu: showing CPU operators"
    else:
        reason = "no CUDA GPU: showing CPU operators"
    return reason, [("CPU operators", cpu_operator_rows(events))]


# ----------------------------------------------------------------------------------------- trace

def _check_trace_path(path: str) -> Path:
    """Fail before the (possibly long) run, not after it."""
    trace = Path(path)
    if trace.is_dir():
        raise UserError(f"--trace {path} is a folder; give a file name such as {trace / 'profile.json'}")
    try:
        trace.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the folder for --trace {path}: {exc.strerror}") from None
    if not os.access(trace.parent, os.W_OK):
        raise UserError(f"cannot write --trace {path}: its folder is not writable")
    return trace


def write_trace(prof, path: Path) -> None:
    """export_chrome_trace into a temporary file beside ``path``, then rename: no half-written trace."""
    suffix = ".json.gz" if path.name.endswith(".gz") else ".json"  # export gzips when the name ends in .gz
    write_atomically(path, prof.export_chrome_trace, suffix)


# ------------------------------------------------------------------------------------------- CLI

def main(args) -> int:
    import torch
    from convforge.inference import load_for_inference, print_course_lines

    if not 0 < args.cut <= 100:
        raise UserError(f"--cut must be a percentage in (0, 100], got {args.cut:g}")
    if args.warmup < 0:
        raise UserError(f"--warmup must be 0 or more, got {args.warmup}")
    trace = _check_trace_path(args.trace) if args.trace else None
    if not torch.autograd.kineto_available():
        raise UserError("this build of torch has no Kineto profiler; install an official torch wheel")

    dataset, engine = load_for_inference(args, annotate=True)
    for _ in range(args.warmup):
        engine.run(dataset.images, dataset.labels)

    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device == "cuda" else [])
    print("New Inference", flush=True)
    with profile(activities=activities) as prof:
        result = engine.run(dataset.images, dataset.labels)
    print_course_lines(result)

    reason, sections = choose_sections(prof.events(), engine.device, torch.cuda.is_available())
    print()
    print(f"Profiling result: {result.model}, {result.impl} on {result.device}, {result.images} images "
          f"(torch.profiler {torch.__version__}; Op Time above includes the profiler's overhead)")
    if reason:
        print(reason)
    print(format_profile(sections, args.cut, args.name_width), flush=True)
    if trace is not None:
        write_trace(prof, trace)
        print(f"trace: {trace} (open it in https://ui.perfetto.dev or chrome://tracing)")
    return 0
