"""The whole-network benchmark's cost model (the timing itself needs a GPU)."""

from convforge.harness.whole import network_cost
from convforge.models import load_preset


def test_network_cost_counts_every_layer_and_the_bytes_a_fused_pass_moves():
    net = load_preset("fa17-high")     # 28x28 -> conv 50 5x5 -> tanh -> pool -> FC 500 -> tanh -> FC 10
    cost = network_cost(net, 100)
    conv = 2 * 100 * 50 * 24 * 24 * 1 * 25
    dense = 2 * 100 * (50 * 12 * 12 * 500 + 500 * 10)
    assert cost.flops == conv + dense
    weights = 50 * 25 + 50 * 12 * 12 * 500 + 500 + 500 * 10 + 10     # conv (no bias), fc1 and fc2 with bias
    assert sum(v.numel() for v in net.params.values()) == weights
    assert cost.bytes_moved == 4 * (100 * 28 * 28 + weights + 100 * 10)


def test_two_conv_network_cost():
    net = load_preset("sp19")          # 48 -> conv 6 5x5 -> pool -> conv 16 5x5 -> FC 140 -> FC 10
    cost = network_cost(net, 1)
    conv = 2 * (6 * 44 * 44 * 25) + 2 * (16 * 18 * 18 * 6 * 25)
    dense = 2 * (16 * 18 * 18 * 140 + 140 * 10)
    assert cost.flops == conv + dense


def test_cli_refuses_gpu_only_options_on_the_cpu_with_one_line(cli):
    code, out, err = cli("infer", "--model", "sp19", "--images", "10", "--device", "cpu", "--precision", "fast")
    assert code == 2 and out == "" and err.strip().count("\n") == 0 and "needs --device cuda" in err
    code, out, err = cli("bench", "--whole", "--device", "cpu")
    assert code == 2 and out == "" and "needs --device cuda" in err


def test_infer_reports_images_per_second_and_precision(cli, data_dir):
    import json
    code, out, _ = cli("infer", "--model", "sp19", "--images", "20", "--device", "cpu", "--impl", "torch",
                       "--json", "--data-dir", data_dir)
    record = json.loads(out)
    assert code == 0 and record["precision"] == "exact"
    assert record["images_per_s"] == record["images"] / record["total_time_s"] > 0
