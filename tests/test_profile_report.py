"""``convforge profile`` and ``convforge report``.

profile: the real command on the CPU (operator table, Op Time and Correctness lines, a Chrome trace), and
the GPU tables built from hand-made profiler events, since this code path cannot run without a GPU.
report: the real command on a SYNTHETIC bench file (made-up timings in the bench schema, generated below),
checking every chart is a real PNG, the HTML page embeds them, and bad input ends in one line, exit 2; the
bar charts' panels (one per layer, fastest first) on it, and their size on the recorded H200 bench file.
"""

from __future__ import annotations

import base64
import csv
import functools
import json
import inspect
import re
from pathlib import Path

import pytest

from convforge.harness import profile, report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------ profile

@pytest.fixture(scope="module")
def weights_args(tmp_path_factory) -> list[str]:
    """Nothing when fa17-high's shipped weights load; else random weights (the lead may be retraining them)."""
    from convforge.errors import UserError
    from convforge.models import Network, get_preset, load_preset
    try:
        load_preset("fa17-high")
        return []
    except UserError:
        import torch
        from convforge.train import init_params
        preset = get_preset("fa17-high")
        path = tmp_path_factory.mktemp("weights") / "fa17-high-random.safetensors"
        params = init_params(preset, torch.Generator().manual_seed(408))
        Network(preset.architecture, params, name=preset.name).save(path)
        return ["--weights", str(path)]


def test_profile_prints_course_lines_and_cpu_table(cli, data_dir, weights_args, has_cuda, tmp_path):
    trace = tmp_path / "traces" / "profile.json"
    code, out, err = cli("profile", "--device", "cpu", "--images", 20, "--impl", "torch", "--data-dir", data_dir,
                         "--trace", trace, *weights_args)
    assert code == 0, err
    assert re.search(r"^Op Time: \d+\.\d{6}$", out, re.M), out
    assert re.search(r"^Correctness: [\d.]+ Model: fa17-high$", out, re.M), out
    reason = "--device cpu: showing CPU operators" if has_cuda else "no CUDA GPU: showing CPU operators"
    assert reason in out.splitlines()
    assert re.search(r"Time\(%\)\s+Cum\(%\)\s+Time\s+Calls\s+Avg\s+Min\s+Max\s+Name", out)
    table = out[out.index("CPU operators:"):]
    assert "aten::" in table
    cumulative = [float(v) for v in re.findall(r"%\s+([\d.]+)%", table)]
    assert cumulative == sorted(cumulative) and cumulative[-1] >= 90.0 - 1e-9

    events = json.loads(trace.read_text())["traceEvents"]
    assert len(events) > 10
    assert any(e.get("name") == "conv1 [torch]" for e in events), "the engine's layer annotation is in the trace"
    assert [p.name for p in trace.parent.iterdir()] == ["profile.json"], "no temporary file left behind"


def test_profile_rejects_a_folder_as_trace(cli, tmp_path):
    code, out, err = cli("profile", "--device", "cpu", "--images", 5, "--impl", "torch", "--trace", tmp_path)
    assert code == 2 and out == ""
    assert err.startswith("convforge: error: --trace") and err.count("\n") == 1


def _event(name, device_type, start, end, *, annotation=False, activity_type=None, keep_activity_type=True):
    """A real FunctionEvent as torch's kineto parser builds it, given only the keywords this torch accepts."""
    from torch.autograd.profiler_util import FunctionEvent
    wanted = dict(id=0, name=name, thread=1, start_us=start, end_us=end, use_device="cuda", device_type=device_type,
                  is_user_annotation=annotation, activity_type=activity_type if keep_activity_type else None)
    accepted = inspect.signature(FunctionEvent.__init__).parameters
    return FunctionEvent(**{k: v for k, v in wanted.items() if k in accepted})


@pytest.mark.parametrize("with_activity_type", [True, False], ids=["torch-2.13", "no-activity_type"])
def test_gpu_tables_from_profiler_events(with_activity_type):
    """What torch 2.x reports on a GPU: kernels and memcpys as CUDA events, runtime calls as CPU events."""
    from torch.autograd import DeviceType
    # Without activity_type (as an older torch may give) device_type, is_user_annotation and names must decide.
    event = functools.partial(_event, keep_activity_type=with_activity_type)
    cpu, cuda = DeviceType.CPU, DeviceType.CUDA
    long_kernel = "void implicit_gemm<float, 16, (int)5>(float const*, float const*, float*, int, int)"
    events = [
        event("conv1 [cuda-tiled]", cpu, 0, 900, annotation=True, activity_type="user_annotation"),
        # kineto mirrors the range onto the GPU timeline; without any flag its name still gives it away
        event("conv1 [cuda-tiled]", cuda, 5, 880, annotation=with_activity_type, activity_type="gpu_user_annotation"),
        event("aten::tanh", cpu, 910, 950, activity_type="cpu_op"),
        event("cudaLaunchKernel", cpu, 10, 20, activity_type="cuda_runtime"),
        event("cudaLaunchKernel", cpu, 30, 34, activity_type="cuda_runtime"),
        event("cuLaunchKernel", cpu, 40, 46, activity_type="cuda_driver"),
        event("cudaStreamSynchronize", cpu, 50, 850),
        event("cudnnConvolutionForward", cpu, 60, 70),   # a library call, not a CUDA API call
        event(long_kernel, cuda, 100, 700, activity_type="kernel"),
        event(long_kernel, cuda, 700, 800, activity_type="kernel"),
        event("tanh_kernel", cuda, 800, 830),  # no activity_type (older torch): device_type decides
        event("Memcpy HtoD (Pageable -> Device)", cuda, 0, 50, activity_type="gpu_memcpy"),
        event("Memset (Device)", cuda, 830, 831, activity_type="gpu_memset"),
    ]
    reason, sections = profile.choose_sections(events, "cuda", cuda_available=True)
    assert reason is None
    (gpu_label, gpu_rows), (api_label, api_rows) = sections
    assert (gpu_label, api_label) == ("GPU activities", "API calls")
    assert [r.name for r in gpu_rows] == [long_kernel, "[CUDA memcpy HtoD] (Pageable -> Device)", "tanh_kernel",
                                          "[CUDA memset] (Device)"]
    assert (gpu_rows[0].calls, gpu_rows[0].total_us, min(gpu_rows[0].durations_us)) == (2, 700, 100)
    assert [(r.name, r.calls) for r in api_rows] == [("cudaStreamSynchronize", 1), ("cudaLaunchKernel", 2),
                                                     ("cuLaunchKernel", 1)]
    text = profile.format_profile(sections, cut_percent=90, name_width=60)
    assert " GPU activities:" in text and "      API calls:" in text
    assert "void implicit_gemm<float, 16, (int)5>" in text and "float const*" not in text
    # GPU: 700 of 781 us is 89.6 %, the memcpy row crosses 90 %; API: the sync alone is 800 of 820 us.
    assert re.search(r"GPU activities:\s+89\.63%\s+89\.63%\s+700\.00us\s+2\s+350\.00us\s+100\.00us\s+600\.00us", text)
    assert "2 more, 3.97% of the time" in text and "2 more, 2.44% of the time" in text

    reason, sections = profile.choose_sections([e for e in events if e.device_type == cpu], "cuda", True)
    assert "no GPU activity" in reason and sections[0][0] == "CPU operators"


def test_cut_rows_keeps_the_row_that_crosses_the_cut():
    rows = [profile.ProfileRow(name, [t]) for name, t in (("a", 50), ("b", 30), ("c", 15), ("d", 5))]
    assert [r.name for r in profile.cut_rows(rows, 80)[0]] == ["a", "b"]
    assert [r.name for r in profile.cut_rows(rows, 90)[0]] == ["a", "b", "c"]
    assert len(profile.cut_rows(rows, 100)[0]) == 4
    assert profile.format_duration(1905.2) == "1.9052ms" and profile.format_duration(0.5) == "500.00ns"


# ------------------------------------------------------------------------------------------- report

SYNTHETIC_LAYERS = {"fa17 L1": (50, 1, 28, 28, 5), "fa18 L1": (12, 1, 72, 72, 7), "fa18 L2": (24, 12, 33, 33, 7)}
# (impl, kind, SYNTHETIC sustained GFLOP/s). As bench does: conv rows are timed against "torch", fused rows
# against "torch conv+act+pool", whose own row is impl "torch", kind "fused".
SYNTHETIC_IMPLS = (("torch", "conv", 4000.0), ("cuda-naive", "conv", 700.0), ("cuda-fused-gemm", "conv", 6500.0),
                   ("torch", "fused", 3000.0), ("cuda-fused-layer", "fused", 7500.0))
SYNTHETIC_BASELINES = {"conv": "torch", "fused": "torch conv+act+pool"}
SYNTHETIC_COPY_GBPS, SYNTHETIC_MATMUL_GFLOPS = 2800.0, 25000.0


def synthetic_bench_rows(batches=(100, 1000, 10000)) -> list[dict]:
    """SYNTHETIC bench rows: the real schema and real shapes/flops/bytes, made-up timings. Not measurements."""
    from convforge.models import ConvShape
    rows = []
    for layer, (M, C, H, W, K) in SYNTHETIC_LAYERS.items():
        for B in batches:
            shape = ConvShape(B, M, C, H, W, K)
            flops, moved = shape.flops, shape.bytes_moved()
            floor_ms = max(flops / SYNTHETIC_MATMUL_GFLOPS, moved / SYNTHETIC_COPY_GBPS) / 1e6
            baseline_ms = {kind: flops / (rate * 1e6) + 0.02 for impl, kind, rate in SYNTHETIC_IMPLS if impl == "torch"}
            for impl, kind, rate in SYNTHETIC_IMPLS:
                median = flops / (rate * 1e6) + 0.02
                rows.append({
                    "kind": kind, "model": layer.split()[0], "layer": layer, "B": B, "M": M, "C": C, "H": H, "W": W,
                    "K": K, "impl": impl, "precision": "fp32", "device": "cuda", "median_ms": median,
                    "p20_ms": median * 0.97, "p80_ms": median * 1.05, "repeats": 20, "flops": flops, "bytes": moved,
                    "gflops": flops / (median * 1e6), "gbps": moved / (median * 1e6), "floor_ms": floor_ms,
                    "roofline_pct": 100 * floor_ms / median, "baseline": SYNTHETIC_BASELINES[kind],
                    "baseline_ms": baseline_ms[kind], "speedup": baseline_ms[kind] / median,
                    "copy_gbps": SYNTHETIC_COPY_GBPS, "matmul_gflops": SYNTHETIC_MATMUL_GFLOPS,
                    "machine": "SYNTHETIC test fixture", "cpu": "none", "threads": 1, "gpu": "SYNTHETIC GPU",
                    "torch": "2.11.0", "cuda": "12.10", "cudnn": 91000, "numba": None, "triton": "3.5.0",
                    "cupy": "13.6.0", "python": "3.12.0", "date": "2026-01-01T00:00:00+00:00"})
    return rows


def write_csv(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC), path
    import matplotlib.image
    image = matplotlib.image.imread(str(path))
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300, (path, image.shape)


def test_report_writes_charts_page_and_summary(cli, tmp_path):
    results = write_csv(tmp_path / "bench.csv", synthetic_bench_rows())
    out = tmp_path / "report"
    code, stdout, err = cli("report", results, "--out", out)
    assert code == 0, err
    charts = [out / name for name in report.CHART_FILES.values()]
    for chart in charts:
        _assert_png(chart)
    page = (out / report.PAGE_FILE).read_text()
    embedded = [base64.b64decode(uri) for uri in re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)]
    assert embedded == [chart.read_bytes() for chart in charts], "the page embeds each chart, in order"
    assert "<img" in page and "src='http" not in page and "SYNTHETIC GPU" in page
    assert page.count("<tr>") >= len(synthetic_bench_rows()) + 1

    summary = (out / report.SUMMARY_FILE).read_text().splitlines()
    assert "| layer | B | impl | median ms | speedup | % of roofline |" in summary
    table = [line for line in summary if line.startswith("| fa")]
    assert len(table) == len(SYNTHETIC_LAYERS) * len(SYNTHETIC_IMPLS)
    assert all("| 10000 |" in line for line in table), "the summary holds the largest batch only"
    assert any(line.startswith("| fa17 L1 | 10000 | torch conv+act+pool | ") for line in table), "fused baseline"
    assert any("cuda-fused-layer (fused)" in line and "x |" in line for line in table)
    assert str(out / report.PAGE_FILE) in stdout


def _labels(ax) -> list[str]:
    return [label.get_text() for label in ax.get_yticklabels()]


def test_bar_charts_have_one_panel_per_layer_fastest_first():
    rows = synthetic_bench_rows()
    table = report._Table(rows)
    fig = report.facet_bars_figure(table, lambda r: r["median_ms"], "ms", "op time", table.series, with_spread=True)
    assert [ax.get_title().splitlines()[0] for ax in fig.axes] == list(SYNTHETIC_LAYERS)
    assert fig.axes[0].get_title().splitlines()[1] == "B=10000, M50 C1 28x28 K5"
    assert fig.get_figwidth() <= report.FACET_MAX_WIDTH_IN
    for ax, layer in zip(fig.axes, SYNTHETIC_LAYERS):
        # conv rows ranked by time, then the fused rows (conv + activation + pool) ranked among themselves
        medians = {table.series_name(r): r["median_ms"] for r in rows if r["layer"] == layer and r["B"] == 10000}
        labels = _labels(ax)
        conv_rows = [name for name in labels if not name.endswith((" (fused)", "conv+act+pool"))]
        fused_rows = labels[len(conv_rows):]
        assert conv_rows == sorted(conv_rows, key=medians.get) == ["cuda-fused-gemm", "torch", "cuda-naive"]
        assert fused_rows == ["cuda-fused-layer (fused)", "torch conv+act+pool"]
        assert ax.get_xscale() == "log", "times spanning a decade and more: log axis"
        assert [label.get_fontstyle() for label in ax.get_yticklabels()] == \
            ["normal", "italic", "normal", "normal", "italic"], "the baselines are marked"

    close = [dict(r, median_ms=1.0 + 0.1 * i, p20_ms=None, p80_ms=None) for i, r in enumerate(rows) if r["B"] == 100]
    fig = report.facet_bars_figure(report._Table(close), lambda r: r["median_ms"], "ms", "op time",
                                   report._Table(close).series)
    assert {ax.get_xscale() for ax in fig.axes} == {"linear"}, "times within a factor of 2: linear axis"

    table = report._Table(rows)
    speedups = [s for s in table.series if s not in table.baselines]
    fig = report.facet_bars_figure(table, report._speedup, "x", "speedup", speedups, speedup=True)
    assert _labels(fig.axes[0]) == ["cuda-fused-gemm", "cuda-naive", "cuda-fused-layer (fused)"], \
        "the baselines are not bars of their own speedup chart; fastest (highest speedup) first"


@pytest.mark.slow
def test_bar_charts_of_the_recorded_h200_run_stay_readable():
    """The recorded bench file (14 implementations, 11 layers): the grouped bars were 54 inches wide."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "2026-11-21-h200-all-impls-course-path" / "bench_b10000.json"
    if not path.is_file():
        pytest.skip(f"{path} is not in this checkout")
    import io
    import matplotlib.image
    table = report._Table(report.load_rows([path]))
    assert len(table.layers) == 11 and len(table.series) >= 17
    for chart in (report.chart_op_time, report.chart_speedup):
        png = chart(table)
        assert png.startswith(PNG_MAGIC)
        height, width = matplotlib.image.imread(io.BytesIO(png)).shape[:2]
        assert 1000 <= width <= 110 * report.FACET_MAX_WIDTH_IN, (chart.__name__, width)  # 110 dpi
        assert 800 <= height <= 110 * 14, (chart.__name__, height)
    fig = report.facet_bars_figure(table, lambda r: report._value(r, "median_ms"), "ms", "op time", table.series)
    assert len(fig.axes) == 11 and len(_labels(fig.axes[0])) == len(table.at_largest_batch("fa17 L1"))


def test_load_rows_converts_csv_numbers_but_not_versions(tmp_path):
    rows = synthetic_bench_rows(batches=(100,))
    csv_rows = report.load_rows([write_csv(tmp_path / "bench.csv", rows)])
    assert csv_rows[0]["B"] == 100 and isinstance(csv_rows[0]["B"], int)
    assert csv_rows[0]["median_ms"] == pytest.approx(rows[0]["median_ms"])
    assert csv_rows[0]["cuda"] == "12.10" and csv_rows[0]["numba"] == ""  # versions stay text (None: empty)
    (tmp_path / "bench.json").write_text(json.dumps({"rows": rows}))
    assert report.load_rows([tmp_path / "bench.json"]) == rows


def test_write_report_api_returns_the_files(tmp_path):
    rows = [r for r in synthetic_bench_rows(batches=(64,)) if r["impl"] != "torch"]
    for row in rows:  # no baseline rows and no machine ceilings: those charts still draw or are explained
        row.pop("copy_gbps"), row.pop("matmul_gflops")
    written = report.write_report(rows, tmp_path / "nested" / "out")
    assert [p.name for p in written] == list(report.CHART_FILES.values()) + [report.SUMMARY_FILE, report.PAGE_FILE]
    assert all(p.is_file() for p in written)


@pytest.mark.parametrize("name, content, message", [
    ("missing.csv", None, "does not exist"),
    ("binary.csv", PNG_MAGIC + b"\x00\xff\xfe", "not a bench results file"),
    ("broken.json", "[{\"layer\": ", "not valid JSON"),
    ("empty.json", "[]", "no result rows"),
    ("notes.txt", "hello\nworld\n", "no column layer, impl, B, median_ms"),
    ("partial.json", json.dumps([{"layer": "fa17 L1", "impl": "torch", "B": 10}]), "row 1 lacks median_ms"),
    ("words.json", json.dumps([{"layer": "x", "impl": "y", "B": 10, "median_ms": "fast"}]), "not a number"),
    ("batch.json", json.dumps([{"layer": "x", "impl": "y", "B": 2.5, "median_ms": 1}]), "not a batch size"),
])
def test_report_bad_input_is_one_line(cli, tmp_path, name, content, message):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    code, out, err = cli("report", path, "--out", tmp_path / "out")
    assert code == 2 and out == ""
    assert err.startswith("convforge: error: ") and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()
