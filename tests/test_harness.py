"""The harness: verify must reject known-wrong implementations and pass the right ones; bench's rows and CLI."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from convforge import conv
from convforge.conv import ConvImpl
from convforge.harness import bench, check, probes, timing, verify
from convforge.harness.check import check_call, random_case, reference_layer
from convforge.errors import UserError
from convforge.models import ACTIVATIONS, PRESETS, ConvShape


# ----------------------------------------------------------------------------- test implementations

@dataclass(frozen=True)
class FakeImpl(ConvImpl):
    """A ConvImpl whose prepare functions live in this file rather than in a module of convforge.conv."""
    build: Optional[Callable] = None
    build_fused: Optional[Callable] = None

    def unavailable_reason(self, device: str) -> Optional[str]:
        return None

    def prepare(self, weight, bias=None):
        return self.build(weight, bias)

    def prepare_fused(self, weight, bias, activation, pool):
        return self.build_fused(weight, bias, activation, pool)


def fake(name: str, build: Callable, build_fused: Optional[Callable] = None) -> FakeImpl:
    return FakeImpl(name, "not-a-module", ("cpu",), "fp32", "test double", fuses=build_fused is not None,
                    build=build, build_fused=build_fused)


def _into(out, y):
    """Return y the way the registry asks: copied into out when out is given."""
    if out is None:
        return y
    out.copy_(y)
    return out


def right(weight, bias):
    return lambda x, out=None: _into(out, F.conv2d(x, weight, bias))


def last_row_unwritten(weight, bias):
    def run(x, out=None):
        y = F.conv2d(x, weight, bias)
        target = torch.empty_like(y) if out is None else out
        target[:, :, :-1] = y[:, :, :-1]
        return target
    return run


def window_off_by_one(weight, bias):
    """Reads x[h + p + 1] (clamped at the last row) instead of x[h + p]."""
    def run(x, out=None):
        shifted = torch.cat([x[:, :, 1:], x[:, :, -1:]], dim=2)
        return _into(out, F.conv2d(shifted, weight, bias))
    return run


def window_short(weight, bias):
    """Sums only K-1 of the K taps along each row."""
    return lambda x, out=None: _into(out, F.conv2d(x[..., :-1], weight[..., :-1], bias))


def transposed_weights(weight, bias):
    """Uses k[m, c, q, p]: right on symmetric kernels only."""
    flipped = weight.transpose(2, 3).contiguous()
    return lambda x, out=None: _into(out, F.conv2d(x, flipped, bias))


def ignores_out(weight, bias):
    """Right values, but in a freshly allocated tensor rather than the out buffer it was given."""
    return lambda x, out=None: F.conv2d(x, weight, bias)


def writes_input(weight, bias):
    """Right values, but scales its input in place to save a buffer."""
    def run(x, out=None):
        x.div_(255.0)
        return _into(out, F.conv2d(x, weight * 255.0, bias))
    return run


def fused_right(weight, bias, activation, pool):
    def run(x, out=None):
        y = F.conv2d(x, weight, bias)
        y = ACTIVATIONS[activation](y) if activation else y
        return _into(out, F.max_pool2d(y, pool))
    return run


def fused_avg_pool(weight, bias, activation, pool):
    def run(x, out=None):
        y = F.conv2d(x, weight, bias)
        y = ACTIVATIONS[activation](y) if activation else y
        return _into(out, F.avg_pool2d(y, pool))
    return run


WRONG = {
    "last-row-unwritten": (last_row_unwritten, "relative error inf"),
    "window-off-by-one": (window_off_by_one, "relative error"),
    "window-short": (window_short, "relative error"),
    "transposed-weights": (transposed_weights, "relative error"),
    "ignores-out": (ignores_out, "instead of the out buffer"),
    "writes-input": (writes_input, "modified its input"),
}


@pytest.fixture(scope="module")
def cases():
    """Preset layers, edge shapes and a few random shapes: the data and references are made once."""
    return verify.default_cases(seed=1, random_cases=4)


# ------------------------------------------------------------------------------------------ verify

@pytest.mark.parametrize("name", sorted(WRONG))
def test_verify_rejects_wrong_implementations(name, cases):
    build, symptom = WRONG[name]
    result = verify.verify_impl(fake(name, build), "cpu", cases)
    assert result.status == "FAIL" and not result.passed
    assert any(symptom in failure for failure in result.failures), result.failures[:2]


def test_transposed_weights_pass_only_on_symmetric_kernels():
    """Why the weights must be random: a symmetric kernel hides the transposition."""
    x, w, _ = random_case((2, 3, 12, 12), (4, 3, 5, 5), seed=3)
    symmetric = (w + w.transpose(2, 3)) / 2
    ref = reference_layer(x, symmetric)
    assert check_call(transposed_weights(symmetric, None), x, ref, 1e-5).problem is None
    assert check_call(transposed_weights(w, None), x, reference_layer(x, w), 1e-5).problem is not None


@pytest.mark.parametrize("name", ["reference", "torch"])
def test_reference_and_torch_pass(name, cases):
    result = verify.verify_impl(conv.get(name), "cpu", cases)
    assert result.status == "pass", result.failures[:2]
    assert result.cases == sum(1 for case in cases if not case.fusion)
    assert 0 < result.max_error < 1e-5


def test_fused_path_accepts_right_and_rejects_wrong(cases):
    good = verify.verify_impl(fake("fused", right, fused_right), "cpu", cases)
    assert good.status == "pass", good.failures[:2]
    assert good.cases == len(cases)  # fused cases count for a fusing implementation
    fused_cases = [case for case in cases if case.fusion]
    bad = verify.verify_impl(fake("fused-avg", right, fused_avg_pool), "cpu", fused_cases)
    assert bad.status == "FAIL" and len(bad.failures) == len(fused_cases)


def test_fused_reference_matches_torch_in_float64():
    x, w, b = random_case((2, 3, 15, 13), (4, 3, 4, 4), seed=5, bias=True, unit_output=True)
    for activation in ("tanh", "relu", "sigmoid", None):
        for pool in (2, 4):
            y = F.conv2d(x.double(), w.double(), b.double())
            y = ACTIVATIONS[activation](y) if activation else y
            want = F.max_pool2d(y, pool).numpy()
            np.testing.assert_allclose(reference_layer(x, w, b, activation, pool), want, rtol=1e-12, atol=1e-12)


def test_cases_cover_presets_and_random_shapes_within_ranges():
    cases = verify.default_cases(seed=7, random_cases=20)
    assert cases == verify.default_cases(seed=7, random_cases=20)  # seeded
    labels = {case.label for case in cases}
    for preset in PRESETS.values():
        for spec in verify.model_layers(preset.architecture):
            assert spec.label in labels
    randoms = [case for case in cases if case.label.startswith("random")]
    assert len({case.label for case in randoms}) == 20
    assert any(case.bias for case in randoms) and any(not case.bias for case in randoms)
    assert {case.fusion[0] for case in randoms if case.fusion} == {"tanh", "relu", "sigmoid", None}
    for case in randoms:
        s = case.shape
        assert 1 <= s.B <= 32 and 1 <= s.C <= 16 and 1 <= s.M <= 64 and 1 <= s.K <= 7
        assert s.K <= s.H <= 100 and s.K <= s.W <= 100
        assert s.flops // 2 <= verify.MAX_MULTIPLY_ADDS["cpu"]
    x1, w1, _, _ = randoms[0].data
    x2, w2, _, _ = randoms[2].data
    assert x1.abs().min() >= 0 and x1.abs().sum() > 0 and w1.abs().sum() > 0
    assert not torch.equal(x1.flatten()[:10], x2.flatten()[:10])  # data re-drawn per case


def test_model_layers_know_what_a_fusing_kernel_absorbs():
    fa20 = verify.model_layers(PRESETS["fa20"].architecture)
    assert [(s.label, s.fusion) for s in fa20] == [("fa20 L1", ("relu", 2)), ("fa20 L2", ("relu", 4))]
    sp18 = verify.model_layers(PRESETS["sp18"].architecture)
    assert [s.fusion for s in sp18] == [("tanh", 2), None]
    assert sp18[1].shape == ConvShape(1, 16, 6, 30, 30, 5)


def test_cli_verify_torch_passes(cli):
    code, out, _ = cli("verify", "--device", "cpu", "--impl", "torch")
    assert code == 0
    assert "torch" in out and "pass" in out and "max rel. error" in out


def test_cli_verify_json_and_skipped(cli):
    code, out, _ = cli("verify", "--device", "cpu", "--impl", "torch", "cuda-naive", "--cases", "2", "--json")
    assert code == 0
    results = {r["impl"]: r for r in json.loads(out)}
    assert results["torch"]["status"] == "pass" and results["torch"]["cases"] > 0
    assert results["cuda-naive"]["status"] == "skipped" and results["cuda-naive"]["reason"]


def test_cli_verify_exits_1_on_a_wrong_implementation(cli, monkeypatch):
    monkeypatch.setitem(conv._BY_NAME, "transposed-weights", fake("transposed-weights", transposed_weights))
    code, out, _ = cli("verify", "--device", "cpu", "--impl", "transposed-weights", "--cases", "1")
    assert code == 1
    assert "FAIL" in out


def test_cli_verify_unknown_impl_is_a_user_error(cli):
    code, _, err = cli("verify", "--impl", "no-such-impl")
    assert code == 2 and "unknown implementation" in err and len(err.strip().splitlines()) == 1

def test_verify_reports_a_module_that_fails_to_load(monkeypatch):
    def unloadable(self, device):
        raise ImportError("No module named 'nonexistent'")

    monkeypatch.setattr(FakeImpl, "unavailable_reason", unloadable)
    (result,) = verify.verify_all([fake("broken", right)], "cpu", [], show_progress=False)
    assert result.status == "FAIL" and "ImportError" in result.failures[0]
    assert result.as_dict()["max_error"] is None  # plain JSON, no Infinity


# ------------------------------------------------------------------------------------------- bench

FAKE_CEILINGS = probes.Ceilings(copy_gbps=10.0, matmul_gflops=100.0)


def test_the_floor_takes_the_best_measured_rates():
    """A kernel that mostly reads can beat the copy rate, a direct convolution the SGEMM rate: the floor
    uses the best bandwidth and the best arithmetic rate measured, and skips a rate not measured."""
    ceilings = probes.Ceilings(copy_gbps=10.0, matmul_gflops=100.0, fma_gflops=300.0, read_gbps=20.0, write_gbps=5.0)
    assert ceilings.floor_s(flops=0, bytes_moved=40e9) == pytest.approx(2.0)
    assert ceilings.floor_s(flops=600e9, bytes_moved=0) == pytest.approx(2.0)
    assert FAKE_CEILINGS.floor_s(flops=100e9, bytes_moved=5e9) == pytest.approx(1.0)
    assert "read 20.0" in ceilings.describe() and "FMA peak 300.0" in ceilings.describe()


def test_reduced_precision_floors_use_the_tensor_core_rates():
    """A TF32 or FP16 kernel is held to the tensor-core rate it may use, 3xTF32 to a third of TF32's, a mixed
    network to the fastest; exact kernels keep the fp32 rates; a rate not measured (CPU) is left out."""
    gpu = probes.Ceilings(copy_gbps=10.0, matmul_gflops=100.0, fma_gflops=300.0, tf32_gflops=1200.0,
                          fp16_gflops=2400.0)
    flops = 2400e9
    assert gpu.floor_s(flops, 0) == pytest.approx(8.0)
    assert gpu.floor_s(flops, 0, "fp64") == pytest.approx(8.0)
    assert gpu.floor_s(flops, 0, "tf32") == pytest.approx(2.0)
    assert gpu.floor_s(flops, 0, "tf32x3") == pytest.approx(6.0)
    assert gpu.floor_s(flops, 0, "fp16") == gpu.floor_s(flops, 0, "bf16") == pytest.approx(1.0)
    assert gpu.floor_s(flops, 0, "mixed") == pytest.approx(1.0)
    assert gpu.floor_s(flops, 50e9, "mixed") == pytest.approx(5.0)   # bytes still bound it
    assert FAKE_CEILINGS.floor_s(flops, 0, "fp16") == FAKE_CEILINGS.floor_s(flops, 0)
    assert "TF32 tensor cores 1200.0" in gpu.describe() and "tensor" not in FAKE_CEILINGS.describe()


def test_time_calls_counts_warmup_and_repeats():
    calls = []
    times = timing.time_calls(calls.append, [torch.zeros(1)], "cpu", warmup=2, repeat=5)
    assert len(times) == 5 and len(calls) == 7
    calls.clear()
    times = timing.time_calls(calls.append, [torch.zeros(1)], "cpu", warmup=0, budget_s=1e-9)
    assert len(times) == timing.MIN_REPEATS


def test_rotation_covers_twice_the_l2_cache():
    l2 = 50 << 20
    fa17_b10 = 4 * 10 * 28 * 28
    copies = timing.rotation_copies(fa17_b10, l2)
    assert copies * fa17_b10 > 2 * l2 and (copies - 1) * fa17_b10 <= 2 * l2 + fa17_b10
    assert timing.rotation_copies(400 << 20, l2) == 2
    assert timing.rotation_copies(16, l2) == timing.MAX_ROTATION_COPIES
    assert len(timing.rotated_inputs(torch.zeros(2, 1, 4, 4))) == 1  # CPU inputs are not rotated


def test_run_bench_rows_baselines_and_fused_floor():
    impls = [conv.get("torch"), fake("fused", right, fused_right), fake("transposed-weights", transposed_weights)]
    cases = bench.bench_cases(["fa17-high"], [], [3, 2])
    outcome = bench.run_bench(cases, impls, "cpu", FAKE_CEILINGS, warmup=1, repeat=3, show_progress=False)
    rows = {(r["kind"], r["impl"]): r for r in outcome.rows if r["B"] == 3}
    assert len(outcome.rows) == 8
    assert set(rows) == {("conv", "torch"), ("conv", "fused"), ("fused", "torch"), ("fused", "fused")}
    assert all(tuple(r) == bench.ROW_KEYS for r in outcome.rows)
    base = rows[("conv", "torch")]
    assert base["speedup"] == 1.0 and base["baseline"] == "torch" and base["layer"] == "fa17 L1"
    assert base["B"] == 3 and base["repeats"] == 3 and base["device"] == "cpu" and base["gpu"] is None
    assert base["timing"] == "call"   # a CPU call is timed whole; only GPU kernels can be timed apart from the host
    shape = ConvShape(3, 50, 1, 28, 28, 5)
    assert base["bytes"] == shape.bytes_moved() and base["flops"] == shape.flops
    assert base["floor_ms"] == pytest.approx(max(shape.bytes_moved() / 10e9, shape.flops / 100e9) * 1e3)
    assert base["roofline_pct"] == pytest.approx(100 * base["floor_ms"] / base["median_ms"])
    fused = rows[("fused", "fused")]
    assert fused["baseline"] == bench.FUSED_BASELINE
    assert fused["baseline_ms"] == rows[("fused", "torch")]["median_ms"]
    assert fused["bytes"] == shape.bytes_moved(out_elements=3 * 50 * 12 * 12)
    assert fused["speedup"] == pytest.approx(fused["baseline_ms"] / fused["median_ms"])
    assert len(outcome.failures) == 1  # checked once per layer, not once per batch size
    assert "transposed-weights is wrong, so not timed: fa17 L1" in outcome.failures[0]


def test_cli_bench_json(cli):
    code, out, _ = cli("bench", "--shape", "2,4,1,12,12,3", "--impl", "torch", "--device", "cpu",
                       "--repeat", "3", "--warmup", "1", "--json")
    assert code == 0
    (row,) = json.loads(out)
    assert (row["model"], row["impl"], row["speedup"]) == ("custom", "torch", 1.0)
    assert row["layer"] == "custom M4 C1 12x12 K3"
    assert (row["B"], row["M"], row["C"], row["H"], row["W"], row["K"]) == (2, 4, 1, 12, 12, 3)
    assert row["copy_gbps"] > 0 and row["matmul_gflops"] > 0 and row["roofline_pct"] > 0
    assert row["torch"] == torch.__version__ and row["date"]


def test_cli_bench_csv_table_and_out_file(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "measure_ceilings", lambda device: FAKE_CEILINGS)
    args = ("bench", "--model", "sp19", "--images", "2", "--impl", "torch", "--device", "cpu", "--repeat", "3")
    code, out, _ = cli(*args, "--csv", "--out", tmp_path / "rows.json")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split(",") == list(bench.ROW_KEYS) and len(lines) == 3  # header + sp19 L1, L2
    saved = json.loads((tmp_path / "rows.json").read_text())
    assert [r["layer"] for r in saved] == ["sp19 L1", "sp19 L2"]
    code, out, _ = cli(*args)
    assert code == 0 and "sp19 L2" in out and "% floor" in out


@pytest.mark.parametrize("args, message", [
    (("--shape", "1,2,3"), "B,M,C,H,W,K"),
    (("--shape", "1,2,1,4,4,5"), "at least K"),
    (("--images", "0"), "at least 1"),
    (("--impl", "no-such-impl"), "unknown implementation"),
    (("--model", "no-such-model"), "unknown model"),
    (("--out", "rows.txt"), ".json or .csv"),
    (("--warmup", "-1"), "--warmup"),
])
def test_cli_bench_bad_input_is_a_user_error(cli, args, message):
    code, out, err = cli("bench", "--device", "cpu", *args)
    assert code == 2 and message in err and not out
    assert len(err.strip().splitlines()) == 1


def test_cli_bench_report_hands_rows_to_the_report_module(cli, tmp_path, monkeypatch):
    from convforge.harness import report
    handed = []
    monkeypatch.setattr(bench, "measure_ceilings", lambda device: FAKE_CEILINGS)
    monkeypatch.setattr(report, "write_report", lambda rows, out_dir: handed.append((rows, out_dir)))
    code, _, _ = cli("bench", "--shape", "1,2,1,6,6,3", "--impl", "torch", "--device", "cpu", "--repeat", "3",
                     "--report", tmp_path)
    assert code == 0
    (rows, out_dir), = handed
    assert out_dir == tmp_path and [r["impl"] for r in rows] == ["torch"]


def test_cli_bench_report_without_the_report_module_is_a_user_error(cli, tmp_path, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "convforge.harness.report", None)  # as if it were not part of the build
    code, out, err = cli("bench", "--device", "cpu", "--report", tmp_path)
    assert code == 2 and "convforge.harness.report" in err and not out



# ------------------------------------------------------------------- bench: allocation and load fields

LOAD_KEYS = ("minflt_per_call", "loadavg_1m", "other_cpu_pct", "steal_pct")


def test_time_calls_reports_page_faults_and_load_of_the_timed_calls():
    touched = []
    load: dict = {}
    # Each timed call touches a fresh 4 MiB tensor: about 1024 minor faults (fewer with huge pages).
    times = timing.time_calls(lambda x: touched.append(torch.ones(1 << 20).sum()), [torch.zeros(1)], "cpu",
                             warmup=1, repeat=4, load=load)
    assert len(times) == 4 and set(load) == set(LOAD_KEYS)
    assert load["minflt_per_call"] >= 0 and load["loadavg_1m"] is not None and load["loadavg_1m"] >= 0
    assert load["other_cpu_pct"] is None or load["other_cpu_pct"] >= 0
    assert load["steal_pct"] is None or load["steal_pct"] >= 0


def test_load_fields_arithmetic():
    before = timing.Counters(wall_s=10.0, minflt=100, own_cpu_s=1.0, busy_s=50.0, steal_s=2.0)
    after = timing.Counters(wall_s=12.0, minflt=700, own_cpu_s=4.0, busy_s=54.0, steal_s=2.5)
    fields = timing.load_fields(before, after, calls=3)
    cores = os.cpu_count()
    assert fields["minflt_per_call"] == 200
    assert fields["other_cpu_pct"] == pytest.approx(100 * (4.0 - 3.0) / (2.0 * cores))
    assert fields["steal_pct"] == pytest.approx(100 * 0.5 / (2.0 * cores))
    unknown = timing.Counters(wall_s=12.0, minflt=700, own_cpu_s=4.0, busy_s=None, steal_s=None)
    assert timing.load_fields(before, unknown, calls=3)["other_cpu_pct"] is None


def test_rows_record_the_allocation_environment_and_load():
    cases = bench.bench_cases([], [ConvShape(2, 4, 1, 12, 12, 3)], [])
    ceilings = probes.Ceilings(copy_gbps=10.0, matmul_gflops=100.0, fma_gflops=300.0)
    (row,) = bench.run_bench(cases, [conv.get("torch")], "cpu", ceilings, warmup=0, repeat=3,
                             show_progress=False).rows
    assert tuple(row) == bench.ROW_KEYS and row["fma_gflops"] == 300.0
    assert all(row[key] is None or row[key] >= 0 for key in LOAD_KEYS) and row["minflt_per_call"] is not None
    assert row["thp_enabled"] == probes.thp_setting("enabled") and row["thp_defrag"] == probes.thp_setting("defrag")
    assert row["torch_thp_alloc"] == probes.torch_thp_alloc()


def test_thp_setting_reads_the_selected_value(tmp_path, monkeypatch):
    (tmp_path / "enabled").write_text("always [madvise] never\n")
    (tmp_path / "defrag").write_text("always defer defer+madvise [madvise] never\n")
    monkeypatch.setattr(probes, "THP_SYSFS", tmp_path)
    assert probes.thp_setting("enabled") == "madvise" and probes.thp_setting("defrag") == "madvise"
    assert probes.thp_setting("no-such-file") is None


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc/self/smaps")
def test_torch_thp_alloc_follows_the_environment_torch_started_with():
    """torch reads THP_MEM_ALLOC_ENABLE once, at its first allocation: the probe sees what it read."""
    code = ("import os, torch; torch.empty(1); os.environ['THP_MEM_ALLOC_ENABLE'] = '1'\n"
            "from convforge.harness import probes; print(probes.torch_thp_alloc())")
    for value, expected in ((None, "False"), ("1", "True")):
        env = {k: v for k, v in os.environ.items() if k != bench.THP_ENV}
        if value is not None:
            env[bench.THP_ENV] = value
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.split()[-1] == expected


def test_hugepages_in_process_after_torch_allocated_is_a_user_error(cli, monkeypatch):
    monkeypatch.delenv(bench.THP_ENV, raising=False)
    monkeypatch.setattr(probes, "torch_thp_alloc", lambda: False)  # as in a process whose torch already allocated
    code, out, err = cli("bench", "--shape", "1,2,1,6,6,3", "--impl", "torch", "--device", "cpu", "--hugepages")
    assert code == 2 and not out and "THP_MEM_ALLOC_ENABLE=1" in err
    assert bench.THP_ENV not in os.environ  # left as it was


def test_hugepages_accepted_when_torch_takes_it(cli, monkeypatch):
    monkeypatch.setattr(probes, "torch_thp_alloc", lambda: True)
    monkeypatch.setattr(bench, "measure_ceilings", lambda device: FAKE_CEILINGS)
    code, out, _ = cli("bench", "--shape", "1,2,1,6,6,3", "--impl", "torch", "--device", "cpu", "--repeat", "3",
                       "--hugepages", "--json")
    assert code == 0 and json.loads(out)[0]["torch_thp_alloc"] is True


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc/self/smaps")
def test_hugepages_restarts_a_command_whose_torch_already_allocated(tmp_path):
    """A `convforge bench` whose torch has allocated re-executes itself with THP_MEM_ALLOC_ENABLE=1."""
    script = tmp_path / "bench_after_allocating.py"
    script.write_text("import os, sys, torch\n"
                      "torch.empty(1)  # torch's allocator reads THP_MEM_ALLOC_ENABLE now (unset)\n"
                      "from convforge.harness import probes\n"
                      "probes.use_hugepages()\n"
                      "print(probes.torch_thp_alloc(), os.environ.get(probes.RESTARTED_ENV))\n")
    env = {k: v for k, v in os.environ.items() if k not in (bench.THP_ENV, probes.RESTARTED_ENV)}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(bench.__file__).parents[2]), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, str(script), "bench", "--hugepages"], env=env, capture_output=True,
                         text=True, check=True)
    assert out.stdout.split() == ["True", "1"]


def test_fma_probe_source_compiles_and_measures():
    pytest.importorskip("numba")
    assert probes.fma_peak_gflops(1, budget_s=0.01) > 0
    from convforge.conv.cpu_loops import vector_lanes
    assert f"fma_chains_intrinsic({probes.FMA_CHAINS}, {probes.FMA_DEPTH}, {vector_lanes()})" in probes.fma_source()
    assert "fma_chains_intrinsic(12, 8, 8)" in probes.fma_source(8)


# ------------------------------------------------------------------------ GPU clock sampling

def test_clock_event_reasons_decode_and_idle_is_left_out():
    from convforge.harness import gpu_clocks
    assert gpu_clocks.decode_reasons(0x1) == ""   # GpuIdle alone: the gaps between timed calls
    assert gpu_clocks.decode_reasons(0x1 | 0x4 | 0x40) == "sw_power_cap,hw_thermal_slowdown"


class _FakeNvml:
    """Stands in for the NVML handle: a clock that drops under a power cap half-way."""

    def __init__(self):
        self.calls = 0

    def sample(self):
        self.calls += 1
        capped = self.calls > 3
        return (1500 if capped else 1980, 700.0 if capped else 450.0, 60 + self.calls, 0x4 if capped else 0x1)


def test_gpu_sampler_summarises_its_samples(monkeypatch):
    from convforge.harness import gpu_clocks
    monkeypatch.setattr(gpu_clocks, "_nvml_for", lambda index: _FakeNvml())
    monkeypatch.setattr(gpu_clocks, "SAMPLE_INTERVAL_S", 0.001)
    with gpu_clocks.GpuSampler(0) as sampler:
        import time
        time.sleep(0.05)
    fields = sampler.fields()
    n = len(sampler.samples)
    assert n >= 5 and set(fields) == set(gpu_clocks.FIELDS)
    assert fields["sm_clock_mhz_min"] == 1500 and fields["sm_clock_mhz_max"] == 1980
    assert fields["power_w_max"] == 700.0 and fields["temp_c_max"] == 60 + n
    assert fields["clock_event_reasons"] == "sw_power_cap"


def test_gpu_sampler_survives_a_missing_library_and_failing_reads(monkeypatch):
    from convforge.harness import gpu_clocks

    def no_library(*args, **kwargs):
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")
    monkeypatch.setattr(gpu_clocks.ctypes, "CDLL", no_library)
    monkeypatch.setattr(gpu_clocks, "_nvml_cache", {})
    assert gpu_clocks._nvml_for(0) is None   # no driver: no telemetry, and no error

    class Failing(_FakeNvml):
        def sample(self):
            self.calls += 1
            if self.calls % 2:
                raise OSError("NVML call failed")
            return super().sample()
    monkeypatch.setattr(gpu_clocks, "_nvml_for", lambda index: Failing())
    monkeypatch.setattr(gpu_clocks, "SAMPLE_INTERVAL_S", 0.001)
    with gpu_clocks.GpuSampler(0) as sampler:   # the odd reads fail: they are missing samples, not errors
        import time
        time.sleep(0.02)
    assert sampler.samples and sampler.fields()["sm_clock_mhz_max"] in (1500, 1980)


def test_gpu_sampler_without_a_device_gives_empty_fields():
    from convforge.harness import gpu_clocks
    with gpu_clocks.GpuSampler(None) as sampler:
        pass
    assert sampler.fields() == dict.fromkeys(gpu_clocks.FIELDS)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (NVML comes with its driver)")
def test_gpu_bench_rows_carry_the_sampled_clock():
    load: dict = {}
    x = torch.randn(256, 1024, 1024, device="cuda")
    timing.time_calls(lambda t: t.mul_(1.0), [x], "cuda", repeat=20, load=load)
    assert 100 <= load["sm_clock_mhz_min"] <= load["sm_clock_mhz_median"] <= load["sm_clock_mhz_max"] < 5000
    assert load["power_w_max"] > 0 and load["temp_c_max"] > 0


def test_environment_names_the_gpu_only_on_a_gpu():
    """Bench rows say which physical GPU they ran on (its UUID) on CUDA, and carry no GPU fields on a CPU run."""
    from convforge.harness import bench
    env = probes.environment("cpu")
    assert env["gpu"] is None and env["gpu_uuid"] is None
    assert set(env) <= set(bench.ROW_KEYS)
    if torch.cuda.is_available():
        assert probes.environment("cuda")["gpu_uuid"].startswith("GPU-")


def test_gpu_timing_choice():
    """'gpu' timing queues a spin ahead of the start event only on CUDA; 'call' never does; others are refused."""
    assert timing.lead_cycles("cpu", "gpu") == 0 and timing.lead_cycles("cuda", "call") == 0
    assert timing.lead_cycles("cuda", "gpu") == (timing.LEAD_CYCLES if hasattr(torch.cuda, "_sleep") else 0)
    with pytest.raises(ValueError, match="timing must be one of"):
        timing.lead_cycles("cuda", "wall")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_timing_leaves_out_the_host_launch_work():
    """A call that spends 0.2 ms on the host before a short kernel (less than the ~0.5 ms spin): 'call' timing
    counts the 0.2 ms, 'gpu' does not."""
    x = torch.ones(1 << 20, device="cuda")

    def slow_host(t):
        time.sleep(0.0002)
        return t.mul_(1.0)

    call = np.median(timing.time_calls(slow_host, [x], "cuda", warmup=2, repeat=9, timing="call"))
    gpu = np.median(timing.time_calls(slow_host, [x], "cuda", warmup=2, repeat=9, timing="gpu"))
    assert call >= 0.0002 and gpu < 0.0001


def test_named_shape_sets():
    """bench --shapes: gpu-mode's benchmark shapes and the many-channel set issue #24 asks for (at least 30 shapes,
    16-512 channels, K 1-11, images 16-1024 px, batch 1-64), each at its own batch, labelled by its set."""
    cases = bench.bench_cases([], [], [], ["gpumode", "wide"])
    gpumode = [c for c in cases if c.model == "gpumode"]
    assert [(c.batch, c.shape.M, c.shape.C, c.shape.H, c.shape.K) for c in gpumode] == \
        [(4, 64, 64, 128, 8), (4, 64, 64, 128, 16), (2, 128, 128, 256, 16), (1, 128, 128, 256, 32)]
    wide = [c.shape for c in cases if c.model == "wide"]
    assert len(wide) >= 30 and len(set(wide)) == len(wide)
    assert min(min(s.C, s.M) for s in wide) == 16 and max(max(s.C, s.M) for s in wide) == 512
    assert {s.K for s in wide} >= {1, 3, 5, 7, 9, 11} and min(s.H for s in wide) == 16 and max(s.H for s in wide) == 1024
    assert min(s.B for s in wide) == 1 and max(s.B for s in wide) == 64
    assert all(c.shape.B == c.batch and not c.spec.bias and c.spec.label.startswith(c.model) for c in cases)
    assert len({c.spec.label for c in cases}) == len(cases)
    with pytest.raises(UserError):
        bench.shape_set("narrow")


def test_bench_draws_each_layers_check_data_once():
    """The check before timing draws a layer's data and float64 reference once for every implementation."""
    made = []
    real = verify.Case.data.func

    def counting(self):
        made.append(self.shape)
        return real(self)

    cases = bench.bench_cases([], [ConvShape(2, 4, 1, 12, 12, 3), ConvShape(2, 3, 2, 9, 9, 2)], [])
    ceilings = probes.Ceilings(copy_gbps=10.0, matmul_gflops=100.0, fma_gflops=300.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(verify.Case, "data", functools.cached_property(counting))
        verify.Case.data.__set_name__(verify.Case, "data")
        rows = bench.run_bench(cases, [conv.get("torch"), conv.get("cpu-gemm"), conv.get("reference")], "cpu",
                               ceilings, warmup=0, repeat=3, show_progress=False).rows
    assert len(rows) == 6 and len(made) == 2


def test_ceilings_are_the_best_this_machine_has_measured(tmp_path, monkeypatch, capsys):
    """A run on a loaded machine measures lower rates; the floor keeps the best of this run and the earlier
    runs on the same machine, so no kernel can land above it. A damaged store is rebuilt with one warning."""
    monkeypatch.setenv("CONVFORGE_CACHE", str(tmp_path))
    quiet = probes.Ceilings(copy_gbps=20.0, matmul_gflops=100.0, fma_gflops=400.0, read_gbps=30.0)
    loaded = probes.Ceilings(copy_gbps=25.0, matmul_gflops=60.0, fma_gflops=200.0, write_gbps=9.0)
    assert probes.best_ceilings("cpu", quiet) == quiet
    best = probes.best_ceilings("cpu", loaded)
    assert (best.copy_gbps, best.matmul_gflops, best.fma_gflops, best.read_gbps, best.write_gbps) == \
        (25.0, 100.0, 400.0, 30.0, 9.0)
    assert best.floor_s(flops=400e9, bytes_moved=0) == pytest.approx(1.0)   # the quiet run's FMA peak
    (tmp_path / probes.CEILINGS_FILE).write_text("{not json")
    assert probes.best_ceilings("cpu", loaded) == loaded
    assert capsys.readouterr().err.count("damaged") == 1
    assert probes.best_ceilings("cpu", quiet).fma_gflops == 400.0
    monkeypatch.setattr(probes, "boot_id", lambda: "another-vm")   # same CPU model name, a slower machine
    assert probes.best_ceilings("cpu", loaded) == loaded            # not the other machine's rates


def test_large_outputs_compare_a_part_and_require_the_rest_written(monkeypatch):
    """Above CHECKED_OUTPUTS the float64 reference covers image 0's leading maps only (bench's 1024-px layers);
    a wrong value there, or a NaN left anywhere else, still fails the check."""
    monkeypatch.setattr(check, "CHECKED_OUTPUTS", 2 * 10 * 10)       # image 0, maps 0-1 of (3, 5, 10, 10)
    case = verify.Case("part", ConvShape(3, 5, 2, 12, 12, 3), seed=4, bias=True)
    assert case.output_shape == (3, 5, 10, 10) and case.data[3].shape == (1, 2, 10, 10)

    def unwritten_last_map(weight, bias):
        def run(x, out=None):
            y = F.conv2d(x, weight, bias)
            target = torch.full_like(y, float("nan")) if out is None else out
            target[:, :-1] = y[:, :-1]
            return target
        return run

    def wrong_first_map(weight, bias):
        return lambda x, out=None: _into(out, F.conv2d(x, weight, bias) + (torch.arange(5) == 0).view(1, 5, 1, 1))

    assert verify.verify_impl(fake("right", right), "cpu", [case]).status == "pass"
    for build, symptom in ((unwritten_last_map, "left NaN or Inf outside"), (wrong_first_map, "relative error")):
        result = verify.verify_impl(fake(build.__name__, build), "cpu", [case])
        assert result.status == "FAIL" and symptom in result.failures[0], result.failures
    fused = verify.Case("part", ConvShape(3, 5, 2, 12, 12, 3), seed=4, fusion=("relu", 2))
    assert fused.output_shape == (3, 5, 5, 5) and fused.data[3].shape == (1, 5, 5, 5)
    assert verify.verify_impl(fake("fused", right, fused_right), "cpu", [fused]).status == "pass"


def test_random_case_draws_on_the_device_asked():
    """bench draws its timed inputs where they are used; on the CPU the values are the seeded ones as before."""
    x, w, b = random_case((2, 3, 5, 5), (4, 3, 3, 3), seed=7, bias=True, device="cpu")
    g = torch.Generator().manual_seed(7)
    assert torch.equal(x, torch.rand(2, 3, 5, 5, generator=g) * 255.0 - 64.0)
    assert x.device.type == w.device.type == b.device.type == "cpu"
