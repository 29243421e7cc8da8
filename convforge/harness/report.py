"""``convforge report``: bench results in; charts, one self-contained HTML page and a markdown table out.

The course compared its kernels by hand, Op Time line against Op Time line. This turns the rows that
``convforge bench`` writes (CSV or JSON, one row per layer x batch x implementation) into:

    op_time.png        median op time per implementation at each layer's largest batch: one panel per layer,
                       bars sorted fastest first (fused conv+act+pool rows in their own group), log axis where
                       a panel's times span a decade
    roofline.png       achieved GFLOP/s against arithmetic intensity (flops / bytes) under the machine's measured
                       ceilings, the best of each kind: bandwidth (copy, read, write) and fp32 rate (matmul, FMA)
    batch_scaling.png  op time against batch size, one panel per layer, one line per implementation (log-log)
    speedup.png        speedup over the framework baseline at each layer's largest batch, panels as op_time.png
    summary.md         the largest-batch rows as a markdown table (layer, impl, median ms, speedup, % of roofline)
    report.html        all of it in one file, images embedded as data: URIs, plus the table of every row

Series are implementations; fused rows read "impl (fused)" and the baseline's own rows carry the baseline's name
("torch", "torch conv+act+pool"), drawn in grey. Rows from several devices or machines are told apart by a
"[device: model]" suffix. A chart whose fields are absent from every row is left out (and a stale one from an
earlier report in the same folder removed) and the page says why. Python API:
``load_rows(paths)`` reads and checks result files; ``write_report(rows, out_dir)`` writes the files above
and returns their paths (``convforge bench --report DIR`` calls it).
"""

from __future__ import annotations

import base64
import csv
import datetime
import html
import io
import json
import math
from pathlib import Path
from typing import Iterable, Optional, Sequence

from convforge.errors import UserError
from convforge.harness import write_atomically

# Every row must have these; the rest of the bench schema feeds particular charts and may be missing.
REQUIRED_KEYS = ("layer", "impl", "B", "median_ms")
NUMERIC_KEYS = frozenset({
    "B", "M", "C", "H", "W", "K", "median_ms", "p20_ms", "p80_ms", "repeats", "flops", "bytes", "gflops",
    "gbps", "floor_ms", "roofline_pct", "baseline_ms", "speedup", "copy_gbps", "matmul_gflops", "threads", "read_gbps", "write_gbps", "fma_gflops"})
# The bench schema in its order (columns of the HTML table); unknown keys follow these.
SCHEMA_ORDER = (
    "kind", "model", "layer", "B", "M", "C", "H", "W", "K", "impl", "precision", "device", "median_ms", "p20_ms",
    "p80_ms", "repeats", "flops", "bytes", "gflops", "gbps", "floor_ms", "roofline_pct", "baseline", "baseline_ms",
    "speedup", "copy_gbps", "matmul_gflops", "machine", "cpu", "threads", "gpu", "torch", "cuda", "cudnn",
    "numba", "triton", "cupy", "python", "date")
ENVIRONMENT_KEYS = ("machine", "cpu", "threads", "gpu", "torch", "cuda", "cudnn", "numba", "triton", "cupy",
                    "python", "date")

CHART_FILES = {"op_time": "op_time.png", "roofline": "roofline.png", "batch_scaling": "batch_scaling.png",
               "speedup": "speedup.png"}
SUMMARY_FILE = "summary.md"
PAGE_FILE = "report.html"

_MARKERS = "osD^vP*Xph<>"


# ------------------------------------------------------------------------------------------ input

def _to_number(key: str, value, where: str):
    """CSV gives text: '12' -> 12, '0.5' -> 0.5, '' -> None; a word where a number belongs is an error."""
    if value is None or isinstance(value, bool) or isinstance(value, (int, float)):
        return value
    text = str(value).strip()
    if text == "" or text.lower() in ("none", "null"):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise UserError(f"{where}: {key} is {text!r}, not a number") from None


def check_rows(rows: Iterable, source: str) -> list[dict]:
    """Rows with the numeric fields as numbers; a row that is not a dict or lacks a required key is an error."""
    checked = []
    for number, row in enumerate(rows, start=1):
        where = f"{source} row {number}"
        if not isinstance(row, dict):
            raise UserError(f"{where} is {type(row).__name__}, not an object of bench fields")
        missing = [key for key in REQUIRED_KEYS if row.get(key) in (None, "")]
        if missing:
            raise UserError(f"{where} lacks {', '.join(missing)} (every bench row needs {', '.join(REQUIRED_KEYS)})")
        row = {key: (_to_number(key, value, where) if key in NUMERIC_KEYS else value) for key, value in row.items()}
        if not (isinstance(row["B"], (int, float)) and math.isfinite(row["B"]) and row["B"] >= 1
                and row["B"] == int(row["B"])):
            raise UserError(f"{where}: B is {row['B']!r}, not a batch size (a whole number >= 1)")
        checked.append(row)
    return checked


def _read_one(path: Path) -> list[dict]:
    if not path.is_file():
        raise UserError(f"results file {path} does not exist" + (" (it is a folder)" if path.is_dir() else ""))
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: spreadsheets save CSV with a byte-order mark
    except UnicodeDecodeError:
        raise UserError(f"{path} is not a bench results file (not text; expected CSV or JSON)") from None
    if not text.strip():
        raise UserError(f"{path} is empty: no result rows")
    if path.suffix.lower() == ".json" or text.lstrip()[:1] in "[{":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
        if isinstance(data, dict) and isinstance(data.get("rows"), list):
            data = data["rows"]
        if not isinstance(data, list):
            raise UserError(f"{path}: expected a JSON list of bench rows (or an object with a 'rows' list)")
        return check_rows(data, str(path))
    try:
        reader = csv.DictReader(io.StringIO(text))
        raw = list(reader)
    except csv.Error as exc:
        raise UserError(f"{path} is not a valid CSV file ({exc})") from None
    absent = [key for key in REQUIRED_KEYS if key not in (reader.fieldnames or [])]
    if absent:
        raise UserError(f"{path} is not a bench results file: no column {', '.join(absent)} "
                        f"(expected CSV or JSON with {', '.join(REQUIRED_KEYS)}, ...)")
    return check_rows(raw, str(path))


def load_rows(paths: Sequence[str | Path]) -> list[dict]:
    """All rows of the bench CSV/JSON files, numeric fields as numbers, in file order."""
    if not paths:
        raise UserError("no results files given")
    rows: list[dict] = []
    for path in paths:
        found = _read_one(Path(path))
        if not found:
            raise UserError(f"{path} holds no result rows")
        rows += found
    return rows


# ------------------------------------------------------------------------------------- selecting

def _value(row: dict, key: str) -> Optional[float]:
    """A finite positive number (what a log axis can show), else None."""
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _speedup(row: dict) -> Optional[float]:
    value = _value(row, "speedup")
    if value is None and _value(row, "baseline_ms") and _value(row, "median_ms"):
        value = row["baseline_ms"] / row["median_ms"]
    return value


def _gflops(row: dict) -> Optional[float]:
    value = _value(row, "gflops")
    if value is None and _value(row, "flops") and _value(row, "median_ms"):
        value = row["flops"] / (row["median_ms"] * 1e6)
    return value


def _platform(row: dict) -> str:
    device = str(row.get("device") or "?")
    name = row.get("gpu") if device == "cuda" else row.get("cpu")
    return f"{device}: {name}" if name else device


def _baselines_text(rows: Sequence[dict]) -> str:
    """'torch', or per kind when conv and fused rows have different baselines: 'conv: torch; fused: ...'."""
    by_kind: dict[str, list[str]] = {}
    for row in rows:
        if row.get("baseline") and str(row["baseline"]) not in by_kind.setdefault(str(row.get("kind") or "conv"), []):
            by_kind[str(row.get("kind") or "conv")].append(str(row["baseline"]))
    names = {name for names in by_kind.values() for name in names}
    if len(names) <= 1:
        return next(iter(names), "the baseline")
    return "; ".join(f"{kind}: {', '.join(names)}" for kind, names in by_kind.items() if names)


def _is_baseline(row: dict) -> bool:
    """The row that times the baseline itself. Bench names the fused baseline's row impl "torch" with baseline
    "torch conv+act+pool": the baseline's first word, timed as its own baseline_ms."""
    baseline, impl = str(row.get("baseline") or ""), str(row["impl"])
    return bool(baseline) and (impl == baseline or (baseline.split(" ")[0] == impl
                                                    and row.get("baseline_ms") == row.get("median_ms")))


class _Table:
    """The rows organised for charting: layers and series in first-seen order, one row per (layer, B, series)."""

    def __init__(self, rows: Sequence[dict]):
        self.rows = list(rows)
        self.several_platforms = len({_platform(r) for r in rows}) > 1
        self.layers: list[str] = []
        self.series: list[str] = []
        self.cell: dict[tuple[str, int, str], dict] = {}
        for row in rows:
            layer, name = str(row["layer"]), self.series_name(row)
            if layer not in self.layers:
                self.layers.append(layer)
            if name not in self.series:
                self.series.append(name)
            self.cell[(layer, int(row["B"]), name)] = row  # a repeated measurement: the later one wins
        self.largest_batch = {layer: max(b for (l, b, _) in self.cell if l == layer) for layer in self.layers}
        baselines = [s for s in self.series if any(_is_baseline(r) for r in rows if self.series_name(r) == s)]
        self.baselines = frozenset(baselines)
        self.colours = {}
        from matplotlib import colormaps
        # tab10/tab20 without their greys: grey is the baseline's
        palette = [c for c in colormaps["tab10" if len(self.series) <= 10 else "tab20"].colors
                   if not c[0] == c[1] == c[2]]
        others = [s for s in self.series if s not in baselines]
        for i, name in enumerate(others):
            self.colours[name] = palette[i % len(palette)]
        for i, name in enumerate(baselines):  # the framework baseline in grey, whatever its position
            shade = (0.35, 0.65, 0.15, 0.5)[i % 4]
            self.colours[name] = (shade, shade, shade)

    def series_name(self, row: dict) -> str:
        if _is_baseline(row):
            name = str(row["baseline"])  # "torch", "torch conv+act+pool"
        else:
            name = str(row["impl"]) + (" (fused)" if row.get("kind") == "fused" else "")
        return f"{name} [{_platform(row)}]" if self.several_platforms else name

    def at_largest_batch(self, layer: str) -> dict[str, dict]:
        batch = self.largest_batch[layer]
        return {s: self.cell[(layer, batch, s)] for s in self.series if (layer, batch, s) in self.cell}

    def largest_batch_rows(self) -> list[dict]:
        out = []
        for layer in self.layers:
            out += sorted(self.at_largest_batch(layer).values(), key=lambda r: _value(r, "median_ms") or math.inf)
        return out


# ---------------------------------------------------------------------------------------- charts

def _figure(width: float, height: float):
    # Figure without pyplot: no global backend switch, nothing left open, safe inside other programs.
    from matplotlib.figure import Figure
    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _plain_log_ticks(axis, suffix: str = "") -> None:
    """Log-axis labels as 0.1, 1, 10 (and 2x, 0.5x) rather than 10^-1 or 2 x 10^0."""
    from matplotlib.ticker import FuncFormatter
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}{suffix}"))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}{suffix}" if f"{v:.0e}"[0] in "25" else ""))


# Faceted bar charts: one panel per layer, fixed total width, horizontal bars so that ~20 names stay legible.
FACET_COLUMNS = 4           # panels per row, at most
FACET_MAX_WIDTH_IN = 16.0   # the whole figure's width, at most
FACET_PANEL_WIDTH_IN = 4.0
FACET_BAR_IN = 0.16         # height of one bar's row
FACET_PANEL_EXTRA_IN = 1.1  # a panel's two-line title and its axis
LOG_SPAN = 10.0             # a panel's values spanning this factor or more get a log axis


def _kind(row: dict) -> str:
    return str(row.get("kind") or "conv")


def _panel_groups(table: _Table, layer: str, series: Sequence[str], value_of,
                  descending: bool) -> list[tuple[str, list[tuple[str, dict, float]]]]:
    """(kind, [(series, row, value)]) of one layer at its largest batch: the plain conv rows first, then the
    fused ones (they do more work, so they are not ranked together), each group sorted by value (largest
    first when ``descending``: a speedup), so fastest first."""
    groups: dict[str, list[tuple[str, dict, float]]] = {}
    for name, row in table.at_largest_batch(layer).items():
        value = value_of(row) if name in series else None
        if value is not None:
            groups.setdefault(_kind(row), []).append((name, row, value))
    order = sorted(groups, key=lambda kind: (kind != "conv", list(groups).index(kind)))
    return [(kind, sorted(groups[kind], key=lambda item: -item[2] if descending else item[2]))
            for kind in order]


def _panel_title(table: _Table, layer: str) -> str:
    row = next(iter(table.at_largest_batch(layer).values()))
    shape = ""
    if all(isinstance(row.get(k), (int, float)) for k in ("M", "C", "H", "W", "K")):
        shape = f", M{row['M']} C{row['C']} {row['H']}x{row['W']} K{row['K']}"
    return f"{layer}\nB={table.largest_batch[layer]}{shape}"


def facet_bars_figure(table: _Table, value_of, xlabel: str, title: str, series: Sequence[str],
                      with_spread: bool = False, speedup: bool = False):
    """One panel per layer (its largest batch), one horizontal bar per series, fastest at the top; the figure
    (None when no layer has a value). Each panel has its own axis, logarithmic where its values span
    LOG_SPAN or more. ``speedup``: bars grow from 1x, sorted by speedup, labelled '2.5x'; else bars from 0
    labelled with the value, and with ``with_spread`` p20-p80 whiskers."""
    from matplotlib.ticker import NullFormatter
    panels = [(layer, groups) for layer in table.layers
              if (groups := _panel_groups(table, layer, series, value_of, speedup))]
    if not panels:
        return None
    columns = min(FACET_COLUMNS, len(panels))
    rows_of_panels = math.ceil(len(panels) / columns)
    slots = [sum(len(items) for _, items in groups) + 0.8 * (len(groups) - 1) for _, groups in panels]
    heights = [max(slots[r * columns:(r + 1) * columns]) * FACET_BAR_IN + FACET_PANEL_EXTRA_IN
               for r in range(rows_of_panels)]
    fig = _figure(min(FACET_MAX_WIDTH_IN, FACET_PANEL_WIDTH_IN * columns), sum(heights) + 0.6)
    grid = fig.add_gridspec(rows_of_panels, columns, height_ratios=heights)
    for index, (layer, groups) in enumerate(panels):
        ax = fig.add_subplot(grid[index // columns, index % columns])
        positions, names, values, colours, low, high = [], [], [], [], [], []
        y = 0.0
        for number, (_, items) in enumerate(groups):
            if number:
                ax.axhline(y - 0.9, color="grey", linewidth=0.6, linestyle=":")
            for name, row, value in items:
                positions.append(y)
                names.append(name)
                values.append(value)
                colours.append(table.colours[name])
                p20, p80 = (_value(row, "p20_ms"), _value(row, "p80_ms")) if with_spread else (None, None)
                low.append(max(0.0, value - p20) if p20 else 0.0)
                high.append(max(0.0, p80 - value) if p80 else 0.0)
                y += 1
            y += 0.8
        extent = values + ([1.0] if speedup else []) + [v + h for v, h in zip(values, high)]
        smallest, largest = min(extent), max(extent)
        log = largest / smallest >= LOG_SPAN
        if speedup:  # bars from 1x: right for faster than the baseline, left for slower
            ax.barh(positions, [v - 1 for v in values], left=1, color=colours, height=0.8)
            ax.axvline(1.0, color="black", linewidth=0.8)
        else:
            ax.barh(positions, values, color=colours, height=0.8,
                    xerr=[low, high] if with_spread and any(low + high) else None, capsize=1.5,
                    error_kw={"elinewidth": 0.6})
        if log:
            ax.set_xscale("log")
            low_limit, high_limit = smallest / 1.5, largest * 3.0
            ax.set_xlim(low_limit, high_limit)
            _plain_log_ticks(ax.xaxis, "x" if speedup else "")
            if high_limit / low_limit > 300:  # a narrow panel has room for 2x and 5x labels over two decades at most
                ax.xaxis.set_minor_formatter(NullFormatter())
        else:
            ax.set_xlim(0, largest * 1.35)
        for position, value, spread in zip(positions, values, high):
            end = max(value, 1.0) if speedup else value + spread  # a slower-than-baseline bar ends at 1x
            ax.text(end * 1.06 if log else end + 0.02 * largest, position,
                    f"{value:.2f}x" if speedup else f"{value:.0f}" if value >= 100 else f"{value:.3g}",
                    va="center", ha="left", fontsize=6)
        ax.set_yticks(positions, names, fontsize=7)
        for label, name in zip(ax.get_yticklabels(), names):
            if name in table.baselines:  # drawn in grey; in italics too
                label.set_fontstyle("italic")
        ax.set_ylim(positions[-1] + 0.7, -0.7)  # top to bottom: fastest first
        ax.tick_params(axis="x", which="both", labelsize=7)
        ax.set_xlabel(xlabel + (" (log)" if log else ""), fontsize=7)
        ax.set_title(_panel_title(table, layer), fontsize=8)
        ax.grid(axis="x", which="both", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return fig


def _fused_note(table: _Table) -> str:
    return "; fused conv+act+pool rows below the dotted line" if any(_kind(r) != "conv" for r in table.rows) else ""


def chart_op_time(table: _Table) -> Optional[bytes]:
    fig = facet_bars_figure(table, lambda r: _value(r, "median_ms"), "median op time, ms",
                            "Op time at each layer's largest batch, fastest first\n"
                            f"(whiskers: p20-p80{_fused_note(table)}; baseline in grey)",
                            table.series, with_spread=True)
    return None if fig is None else _png(fig)


def chart_speedup(table: _Table) -> Optional[bytes]:
    series = [s for s in table.series if s not in table.baselines]
    fig = facet_bars_figure(table, _speedup, "speedup over the baseline",
                            f"Speedup over the framework baseline at each layer's largest batch, fastest first\n"
                            f"(baseline: {_baselines_text(table.rows)}{_fused_note(table)})",
                            series, speedup=True)
    return None if fig is None else _png(fig)


def chart_batch_scaling(table: _Table) -> Optional[bytes]:
    layers = [layer for layer in table.layers
              if any(_value(r, "median_ms") for (l, _, _), r in table.cell.items() if l == layer)]
    if not layers:
        return None
    columns = min(3, len(layers))
    rows_of_panels = math.ceil(len(layers) / columns)
    fig = _figure(4.2 * columns + 2.5, 3.4 * rows_of_panels)
    axes = fig.subplots(rows_of_panels, columns, squeeze=False)
    drawn = set()
    for ax, layer in zip(axes.flat, layers):
        for name in table.series:
            points = sorted((b, _value(r, "median_ms")) for (l, b, s), r in table.cell.items()
                            if l == layer and s == name and _value(r, "median_ms"))
            if points:
                ax.plot([b for b, _ in points], [t for _, t in points], marker="o", markersize=3,
                        color=table.colours[name], label=name if name not in drawn else None)
                drawn.add(name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain_log_ticks(ax.xaxis)
        _plain_log_ticks(ax.yaxis)
        ax.set_title(layer, fontsize="medium")
        ax.set_xlabel("batch size B")
        ax.set_ylabel("median op time (ms)")
        ax.grid(which="both", alpha=0.3)
    for ax in list(axes.flat)[len(layers):]:
        ax.set_visible(False)
    fig.suptitle("Op time against batch size (log-log)")
    fig.legend(loc="outside right upper", fontsize="small")
    return _png(fig)


def chart_roofline(table: _Table) -> Optional[bytes]:
    points = []  # (intensity, gflops, series, layer)
    for layer in table.layers:
        for name, row in table.at_largest_batch(layer).items():
            flops, moved, rate = _value(row, "flops"), _value(row, "bytes"), _gflops(row)
            if flops and moved and rate:
                points.append((flops / moved, rate, name, layer))
    if not points:
        return None
    fig = _figure(12.0 if table.several_platforms else 9.5, 5.6)
    ax = fig.add_subplot()
    x_low = min(p[0] for p in points) / 3
    x_high = max(p[0] for p in points) * 3
    ceilings: dict[str, tuple[Optional[float], Optional[float]]] = {}
    for row in table.rows:  # each machine's own measured ceilings, first seen
        platform = _platform(row)
        bandwidths = [v for v in (_value(row, k) for k in ("copy_gbps", "read_gbps", "write_gbps")) if v]
        rates = [v for v in (_value(row, k) for k in ("matmul_gflops", "fma_gflops")) if v]
        if platform not in ceilings and (bandwidths or rates):  # the best of each kind, as the floor takes
            ceilings[platform] = (max(bandwidths, default=None), max(rates, default=None))
    for style, (platform, (bandwidth, peak)) in zip(("-", "--", "-.", ":"), ceilings.items()):
        where = f" ({platform})" if len(ceilings) > 1 else ""
        if bandwidth:  # GB/s x flop/byte = GFLOP/s
            ridge = peak / bandwidth if peak else x_high
            xs = [x_low, min(max(ridge, x_low), x_high)]
            ax.plot(xs, [x * bandwidth for x in xs], color="black", linestyle=style, linewidth=1.2,
                    label=f"measured bandwidth {bandwidth:,.0f} GB/s{where}")
        if peak:
            start = max(x_low, peak / bandwidth) if bandwidth else x_low
            ax.plot([start, x_high], [peak, peak], color="dimgrey", linestyle=style, linewidth=1.2,
                    label=f"measured fp32 peak {peak:,.0f} GFLOP/s{where}")
    markers = {layer: _MARKERS[i % len(_MARKERS)] for i, layer in enumerate(table.layers)}
    for intensity, rate, name, layer in points:
        ax.scatter(intensity, rate, color=table.colours[name], marker=markers[layer], s=42, edgecolors="black",
                   linewidths=0.4, zorder=3)
    from matplotlib.lines import Line2D
    handles, labels = ax.get_legend_handles_labels()
    seen_series = [s for s in table.series if any(p[2] == s for p in points)]
    seen_layers = [layer for layer in table.layers if any(p[3] == layer for p in points)]
    handles += [Line2D([], [], color=table.colours[s], marker="o", linestyle="") for s in seen_series]
    labels += seen_series
    handles += [Line2D([], [], color="black", marker=markers[layer], linestyle="", markerfacecolor="none")
                for layer in seen_layers]
    labels += [f"layer {layer}" for layer in seen_layers]
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_ticks(ax.xaxis)
    _plain_log_ticks(ax.yaxis)
    ax.set_xlim(x_low, x_high)
    ax.set_xlabel("arithmetic intensity (flops / bytes)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title("Roofline at each layer's largest batch")
    ax.grid(which="both", alpha=0.3)
    fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    return _png(fig)


CHARTS = {
    "op_time": (chart_op_time, "Op time per layer",
                "no row has a positive median_ms"),
    "roofline": (chart_roofline, "Roofline",
                 "no row has flops, bytes and gflops (or median_ms)"),
    "batch_scaling": (chart_batch_scaling, "Op time against batch size",
                      "no row has a positive median_ms"),
    "speedup": (chart_speedup, "Speedup over the framework baseline",
                "only the baseline has rows (or none has speedup or baseline_ms): no speedup to show"),
}


# ---------------------------------------------------------------------------------------- tables

def _fmt(value) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"  # 25000, not 2.5e+04
    return str(value)


def _milliseconds(value) -> str:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-"
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:#.4g}"  # 2196, 73.20, 1.940, 0.05600


def summary_markdown(table: _Table) -> str:
    rows = table.largest_batch_rows()
    devices = {r.get("device") for r in table.rows}
    shown = (("gpu",) if "cuda" in devices else ()) + (("cpu", "threads") if devices - {"cuda"} else ()) + \
        ("torch", "date")
    environment = _environment(table.rows)
    where = ", ".join(f"{k} {environment[k]}" for k in shown if k in environment)
    lines = [f"Median op time at each layer's largest batch ({where or 'environment not recorded'}). "
             f"Speedup over the baseline ({_baselines_text(table.rows)}). % of roofline: the fastest time the measured "
             "copy-bandwidth and matmul ceilings allow (floor_ms) as a share of the median.", "",
             "| layer | B | impl | median ms | speedup | % of roofline |",
             "|---|---:|---|---:|---:|---:|"]
    for row in rows:
        speedup = _speedup(row)
        roofline = row.get("roofline_pct")
        lines.append(f"| {row['layer']} | {row['B']} | {table.series_name(row)} | {_milliseconds(row.get('median_ms'))} | "
                     f"{f'{speedup:.2f}x' if speedup else '-'} | "
                     f"{f'{roofline:.1f} %' if isinstance(roofline, (int, float)) and math.isfinite(roofline) else '-'} |")
    return "\n".join(lines) + "\n"


def _environment(rows: Sequence[dict]) -> dict[str, str]:
    """Each environment field's distinct values, joined (one value when the rows come from one machine)."""
    out = {}
    for key in ENVIRONMENT_KEYS:
        values = []
        for row in rows:
            value = row.get(key)
            if value not in (None, "") and str(value) not in values:
                values.append(str(value))
        if values:
            out[key] = "; ".join(values)
    return out


def _html_table(rows: Sequence[dict], columns: Sequence[str], caption: str = "") -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "\n".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in columns) + "</tr>"
                     for r in rows)
    caption_html = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return (f"<div class='wide'><table>{caption_html}<thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody>"
            "</table></div>")


_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0 1.5em}
table{border-collapse:collapse;font-size:12px;margin:1em 0}caption{text-align:left;font-weight:bold;margin:.4em 0}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:right;white-space:nowrap}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}.note{color:#666}dl{display:grid;grid-template-columns:max-content auto;
gap:2px 1em}dt{font-weight:bold}.wide{overflow-x:auto}"""


def report_html(table: _Table, images: dict[str, bytes], missing: dict[str, str]) -> str:
    environment = _environment(table.rows)
    keys_seen = []
    for row in table.rows:
        keys_seen += [k for k in row if k not in keys_seen]
    # The environment goes in its own list when it is the same on every row; the table keeps the varying fields.
    constant = {k for k in ENVIRONMENT_KEYS if len({str(r.get(k)) for r in table.rows}) == 1}
    columns = [k for k in SCHEMA_ORDER if k in keys_seen and k not in constant] + \
              [k for k in keys_seen if k not in SCHEMA_ORDER and k not in constant]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>convforge report</title>"
             f"<style>{_STYLE}</style></head><body>",
             "<h1>convforge report</h1>",
             f"<p class='note'>{len(table.rows)} result rows, {len(table.layers)} layers, {len(table.series)} "
             f"implementations; generated {datetime.datetime.now().isoformat(timespec='seconds')}.</p>"]
    if environment:
        parts.append("<dl>" + "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>"
                                      for k, v in environment.items()) + "</dl>")
    for key, (_, title, _) in CHARTS.items():
        parts.append(f"<h2>{html.escape(title)}</h2>")
        if key in images:
            encoded = base64.b64encode(images[key]).decode("ascii")
            parts.append(f"<img alt='{html.escape(title)}' src='data:image/png;base64,{encoded}'>")
        else:
            parts.append(f"<p class='note'>Not drawn: {html.escape(missing[key])}.</p>")
    summary_columns = ("layer", "B", "impl", "kind", "median_ms", "p20_ms", "p80_ms", "gflops", "roofline_pct",
                       "speedup")
    parts.append("<h2>Largest batch per layer</h2>")
    parts.append(_html_table(table.largest_batch_rows(), [c for c in summary_columns if c in keys_seen]))
    parts.append("<h2>Every row</h2>")
    parts.append(_html_table(table.rows, columns))
    parts.append("</body></html>\n")
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------- output

def _write_atomic(path: Path, data: bytes) -> None:
    """A temporary file beside ``path``, renamed over it: a reader never sees half a chart or page."""
    write_atomically(path, lambda tmp: Path(tmp).write_bytes(data))


def write_report(rows: list[dict], out_dir: Path) -> list[Path]:
    """Charts, summary.md and report.html for bench rows, written into out_dir; returns the files written."""
    rows = check_rows(rows, "bench results")
    if not rows:
        raise UserError("no result rows to report")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"report folder {out_dir} is a file; give a folder for --out")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the report folder {out_dir}: {exc.strerror}") from None
    table = _Table(rows)
    images, missing, written = {}, {}, []
    for key, (draw, _, why_not) in CHARTS.items():
        png = draw(table)
        if png is None:
            missing[key] = why_not
            (out_dir / CHART_FILES[key]).unlink(missing_ok=True)  # an older report's chart would mislead
            continue
        images[key] = png
        path = out_dir / CHART_FILES[key]
        _write_atomic(path, png)
        written.append(path)
    for name, text in ((SUMMARY_FILE, summary_markdown(table)), (PAGE_FILE, report_html(table, images, missing))):
        _write_atomic(out_dir / name, text.encode("utf-8"))
        written.append(out_dir / name)
    return written


# ------------------------------------------------------------------------------------------- CLI

def main(args) -> int:
    rows = load_rows(args.results)
    written = write_report(rows, Path(args.out))
    for path in written:
        print(path)
    print(f"{len(rows)} rows -> open {Path(args.out) / PAGE_FILE}")
    return 0
