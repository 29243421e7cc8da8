"""The whole-network benchmark's cost model (the GPU timing needs a GPU), the CPU whole-network path (fused
conv, GEMM dense layers, the arena) and its CPU benchmark."""

import numpy as np
import pytest
import torch

from convforge.harness.whole import network_cost
from convforge.models import PRESETS, load_preset


def test_network_cost_counts_every_layer_and_the_bytes_a_fused_pass_moves():
    net = load_preset("fa17-high")     # 28x28 -> conv 50 5x5 -> tanh -> pool -> FC 500 -> tanh -> FC 10
    cost = network_cost(net, 100)
    conv = 2 * 100 * 50 * 24 * 24 * 1 * 25
    dense = 2 * 100 * (50 * 12 * 12 * 500 + 500 * 10)
    assert cost.flops == conv + dense and cost.dense_flops == dense
    weights = 50 * 25 + 50 * 12 * 12 * 500 + 500 + 500 * 10 + 10     # conv (no bias), fc1 and fc2 with bias
    assert sum(v.numel() for v in net.params.values()) == weights
    assert cost.bytes_moved == 4 * (100 * 28 * 28 + weights + 100 * 10)


def test_two_conv_network_cost():
    net = load_preset("sp19")          # 48 -> conv 6 5x5 -> pool -> conv 16 5x5 -> FC 140 -> FC 10
    cost = network_cost(net, 1)
    conv = 2 * (6 * 44 * 44 * 25) + 2 * (16 * 18 * 18 * 6 * 25)
    dense = 2 * (16 * 18 * 18 * 140 + 140 * 10)
    assert cost.flops == conv + dense


def test_exact_floor_counts_every_layer_at_the_best_exact_rate():
    """The exact path's dense layers (GpuDense's tc3 forms) and its plain convs (cuda-auto's cuda-tc-3xtf32 entries)
    may run on 3xTF32 tensor cores: the floor counts all FLOPs at the larger of the fp32 rate and a third of the
    TF32 rate."""
    from convforge.harness.probes import Ceilings
    from convforge.harness.whole import NetworkCost, exact_floor_s
    cost = NetworkCost(flops=3_000_000_000, bytes_moved=1000, dense_flops=1_000_000_000)
    fp32_only = Ceilings(copy_gbps=1000.0, matmul_gflops=50_000.0)
    assert exact_floor_s(fp32_only, cost) == pytest.approx(3e9 / 50e12)
    assert exact_floor_s(fp32_only, cost) == pytest.approx(fp32_only.floor_s(cost.flops, cost.bytes_moved))
    tensor = Ceilings(copy_gbps=1000.0, matmul_gflops=50_000.0, tf32_gflops=450_000.0)   # 3xTF32: 150 TFLOP/s
    assert exact_floor_s(tensor, cost) == pytest.approx(3e9 / 150e12)
    slow_tc = Ceilings(copy_gbps=1000.0, matmul_gflops=50_000.0, tf32_gflops=60_000.0)   # 20 < 50: fp32 wins
    assert exact_floor_s(slow_tc, cost) == pytest.approx(3e9 / 50e12)
    assert exact_floor_s(tensor, NetworkCost(10, 10**9)) == pytest.approx(1e9 / 1000e9)   # bytes-bound


def test_cli_refuses_gpu_only_options_on_the_cpu_with_one_line(cli):
    code, out, err = cli("infer", "--model", "sp19", "--images", "10", "--device", "cpu", "--precision", "fast")
    assert code == 2 and out == "" and err.strip().count("\n") == 0 and "needs --device cuda" in err


def test_infer_reports_images_per_second_and_precision(cli, data_dir):
    import json
    code, out, _ = cli("infer", "--model", "sp19", "--images", "20", "--device", "cpu", "--impl", "torch",
                       "--json", "--data-dir", data_dir)
    record = json.loads(out)
    assert code == 0 and record["precision"] == "exact"
    assert record["images_per_s"] == record["images"] / record["total_time_s"] > 0


# ----------------------------------------------------------------------- the CPU whole-network path

def _reference(network, images):
    from convforge.models import forward_with
    params = {k: v.double() for k, v in network.params.items()}
    return forward_with(network.architecture, params, torch.from_numpy(images).double().unsqueeze(1)).numpy()


def _images(network, count, seed):
    size = network.architecture.input_size
    return np.random.default_rng(seed).integers(0, 256, (count, size, size), dtype=np.uint8)


@pytest.mark.parametrize("impl", ["cpu-parallel", "cpu-winograd"])
@pytest.mark.parametrize("name", [p for p in PRESETS if p != "fa17-low"])
def test_cpu_whole_network_matches_float64_on_every_preset(name, impl):
    """Fused conv + act + pool, the GEMM dense layers, the arena: logits within 1e-5 of float64; a batch of 37
    in chunks of 16 (a partial 16-image group and a partial last chunk). cpu-winograd: the unpooled second
    convs (sp18, sp19, fa18, fa19) take its kernel, the pooled ones cpu-parallel's."""
    from convforge.engine import Engine
    from convforge.harness.check import relative_error
    network = load_preset(name)
    engine = Engine(network, impl=impl, device="cpu", chunk=16)
    assert engine.cpu_whole
    images = _images(network, 37, seed=len(name))
    reference = _reference(network, images)
    with torch.inference_mode():
        logits = engine.forward(torch.from_numpy(images).float().unsqueeze(1))
    assert relative_error(logits, reference) <= 1e-5
    result = engine.run(images, reference.argmax(1))
    assert result.correctness == 1.0
    fused = [layer.fused for layer in result.layers]
    assert fused[0] in ("tanh+maxpool2", "relu+maxpool2")
    assert all(layer.op_time_s > 0 for layer in result.layers)
    winograd = impl == "cpu-winograd" and name in ("sp18", "sp19", "fa18", "fa19")
    assert [layer.impl for layer in result.layers][1:] == (["cpu-winograd"] if winograd else
                                                           ["cpu-parallel"] * (len(result.layers) - 1))


@pytest.mark.parametrize("impl", ["cpu-parallel", "cpu-winograd"])
@pytest.mark.parametrize("name", ["fa20", "fa18", "sp19", "fa17-high"])
def test_cpu_arena_buffers_are_reused_without_stale_data(cpu_tiles, name, impl):
    """Two different batches in a row, a smaller one after a larger one, a partial last chunk: each matches
    its own reference, and the arena keeps its buffers (allocated once, for the largest chunk). fa20: two
    fused convs (pool 2 and 4); fa18 and sp19: an unfused second conv into the dense layer; fa17-high: the
    7200 -> 500 dense layer (32 panels: groups of PR and a narrower leftover group). With the AVX-512
    and the AVX2 register tiles (cpu_tiles), whatever this CPU has."""
    from convforge.engine import Engine
    from convforge.harness.check import relative_error
    network = load_preset(name)
    engine = Engine(network, impl=impl, device="cpu", chunk=32)
    first, second = _images(network, 50, seed=1), _images(network, 41, seed=2)
    pointers = None
    with torch.inference_mode():
        for images in (first, second, first[:7], second, first[:33]):
            logits = engine.forward(torch.from_numpy(images).float().unsqueeze(1))
            assert relative_error(logits, _reference(network, images)) <= 1e-5
            now = {key: buffer.data_ptr() for key, buffer in engine._arena.items()}
            assert pointers is None or now == pointers
            pointers = now
    result = engine.run(second, _reference(network, second).argmax(1))
    assert result.correctness == 1.0


def test_cpu_whole_is_the_default_on_the_cpu():
    from convforge import conv
    from convforge.engine import Engine
    engine = Engine(load_preset("sp19"), impl="auto", device="cpu")
    assert conv.resolve("auto", "cpu").name == "cpu-winograd" and engine.cpu_whole
    unfused = Engine(load_preset("sp19"), impl="auto", device="cpu", fuse=False)
    images = _images(unfused.network, 20, seed=3)
    assert unfused.run(images, _reference(unfused.network, images).argmax(1)).correctness == 1.0


def test_bench_whole_cpu_without_the_onnx_extras(cli, tmp_path, monkeypatch):
    """ORT and OpenVINO missing: their columns say how to install them; convforge and torch still run."""
    import json
    from convforge.harness import probes, whole
    monkeypatch.setattr(whole, "extra_missing",
                        lambda module: f"not installed: {whole.ONNX_HINT}" if module in ("onnxruntime", "openvino")
                        else None)
    monkeypatch.setattr(whole, "export_onnx", lambda network, path: None)
    monkeypatch.setattr(probes, "DEFAULT_BUDGET_S", 0.1)
    out = tmp_path / "rows.json"
    code, stdout, _ = cli("bench", "--whole", "--device", "cpu", "--model", "sp19", "--images", "20",
                          "--repeat", "1", "--out", out)
    assert code == 0
    rows = {row["candidate"]: row for row in json.loads(out.read_text())}
    assert rows["onnxruntime"]["note"] == rows["openvino"]["note"] == "not installed: pip install 'convforge[onnx]'"
    assert rows["onnxruntime"]["ms"] is None and "not installed" in stdout
    ours = rows["convforge (cpu-winograd)"]
    assert rows["convforge (cpu-parallel)"]["relative_error"] <= 1e-5      # the direct kernels' row, same run
    assert ours["ms"] > 0 and ours["relative_error"] <= 1e-5 and ours["threads"] == torch.get_num_threads()
    assert rows["torch eager"]["predictions_agree"] == 1.0 and ours["fma_gflops"] > 0
    assert ours["fma_gflops_during"] > 0 and ours["pct_of_peak_during"] > 0   # the probe between rounds


def test_the_cpu_floor_takes_the_best_peak_of_the_run(monkeypatch, tmp_path):
    """A probe between rounds faster than the bench's first measurement raises the ceiling (and the store),
    and every row's % of floor is recomputed at the run's best peak."""
    from convforge.harness import probes, whole
    monkeypatch.setenv("CONVFORGE_CACHE", str(tmp_path))
    start = probes.Ceilings(copy_gbps=10.0, matmul_gflops=50.0, fma_gflops=100.0)
    assert whole.raised_ceilings(start, [80.0, 90.0]) is start
    raised = whole.raised_ceilings(start, [80.0, 150.0])
    assert raised.fma_gflops == 150.0 and raised.copy_gbps == 10.0
    rows = [dict(ms=10.0, flops=10 ** 9, bytes_moved=0, fma_gflops=100.0, floor_ms=10.0, pct_floor=100.0),
            dict(ms=None, note="not installed")]
    assert whole.refloor(rows, raised) == 1
    assert abs(rows[0]["floor_ms"] - 1e3 / 150) < 1e-9 and abs(rows[0]["pct_floor"] - 100 / 1.5) < 1e-9


def test_cpu_candidates_are_timed_round_by_round(monkeypatch):
    """Each round times every candidate once, the order reversed every other round, then probes the peak."""
    from convforge.harness import probes, whole
    calls = []
    monkeypatch.setattr(probes, "fma_peak_gflops", lambda threads, budget: calls.append("peak") or 100.0)
    forwards = {name: (lambda x, name=name: calls.append(name)) for name in ("a", "b", "c")}
    times, loads, peaks = whole.interleaved_times(forwards, torch.zeros(1), 3, threads=1)
    assert calls == ["a", "b", "c", "peak", "c", "b", "a", "peak", "a", "b", "c", "peak"]
    assert all(len(t) == 3 and min(t) >= 0 for t in times.values()) and peaks == [100.0] * 3


def test_onnx_export_runs_in_onnxruntime_and_openvino(tmp_path):
    """With the extras installed: the exported graph gives torch's logits in both runtimes."""
    pytest.importorskip("onnx")
    from convforge.harness import whole
    network = load_preset("sp19")
    path = str(tmp_path / "sp19.onnx")
    whole.export_onnx(network, path)
    runs = whole.cpu_candidates(network, path, threads=1)
    images = _images(network, 5, seed=4)
    x = torch.from_numpy(images).float().unsqueeze(1)
    reference = _reference(network, images)
    checked = 0
    for name in ("onnxruntime", "openvino"):
        if isinstance(runs[name], str):
            continue
        logits = np.asarray(runs[name]()(x))
        assert np.abs(logits - reference).max() / np.abs(reference).max() < 1e-5
        checked += 1
    if not checked:
        pytest.skip("neither onnxruntime nor openvino is installed")
