"""convforge sweep: the one tool behind the tuned tables. Its timing needs a GPU for the CUDA and Triton kernels;
here it runs on CPU implementations end to end, and the tuning variants it would time are built on the host."""

import json

import pytest

from convforge import conv
from convforge.harness import sweep


def test_layers_by_label_or_model_prefix():
    labels = [spec.label for spec in sweep.preset_layers()]
    assert len(labels) == len(set(labels)) == 11 and "fa18 L2" in labels   # 6 architectures, 11 conv layers
    assert [s.label for s in sweep.preset_layers(["fa17"])] == ["fa17 L1"]
    assert [s.label for s in sweep.preset_layers(["sp18 L2", "fa20"])] == ["sp18 L2", "fa20 L1", "fa20 L2"]


def test_a_cpu_sweep_checks_times_and_records_rows(cli, tmp_path):
    out = tmp_path / "rows.json"
    code, stdout, err = cli("sweep", "--impl", "torch", "cpu-gemm", "--device", "cpu", "--layers", "fa17 L1",
                            "--batch", "4", "--repeat", "3", "--json", out)
    assert code == 0, err
    rows = json.loads(out.read_text())
    assert [r["impl"] for r in rows] == ["torch", "cpu-gemm"]
    for row in rows:
        assert row["ok"] and row["error"] <= 1e-5 and row["median_ms"] > 0 and 0 < row["floor_ms"] < row["median_ms"]
    assert stdout.strip().endswith("2 passed, 0 failed")


def test_config_overrides_take_integers_and_names():
    from convforge.harness.sweep import parse_overrides
    assert parse_overrides("kernel=gather,rm=1;nt=128;") == [{"kernel": "gather", "rm": 1}, {"nt": 128}]


@pytest.mark.parametrize("argv, message", [
    (("--impl", "torch", "--device", "cpu", "--layers", "nope"), "names no preset layer"),
    (("--impl", "torch", "--device", "cpu", "--configs", "r"), "NAME=VALUE"),
    (("--impl", "torch", "--device", "cpu", "--configs", "rm=1.5"), "VALUE an integer or a name"),
    (("--sass", "--impl", "cuda-direct"), "--sass compiles"),
])
def test_bad_sweep_options_are_one_line(cli, argv, message):
    code, out, err = cli("sweep", *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


TUNABLE = ("cuda-fused-gemm", "cuda-fused-layer", "cuda-direct", "cuda-tc-tf32", "cuda-tc-fp16", "cuda-tc-3xtf32")


@pytest.mark.parametrize("name", TUNABLE)
def test_every_cuda_variant_is_a_kernel_the_module_can_build(name):
    """The candidates and overrides --variants/--configs would time are accepted by the module's own
    kernel_specs (the NVRTC source and options prepare() compiles), on every preset layer."""
    from convforge.conv import cuda_common as cc
    impl = conv.get(name)
    module = impl._module()
    built = 0
    for spec in sweep.preset_layers():
        s = spec.shape
        for fusion in [None] + ([spec.fusion] if impl.fuses and spec.fusion else []):
            pool = fusion[1] if fusion else 1
            if name == "cuda-fused-layer" and not fusion:
                continue
            if name.startswith("cuda-tc-") and fusion and not module.pool_serves(s.C, s.H, s.W, s.K, pool,
                                                                                impl.precision):
                continue   # fused by torch after the unfused kernel (TF32, pool 4): no launch shape of its own
            configs = sweep.candidates(impl, spec, pool, 4) + sweep.overridden(impl, spec, pool, [{"nt": 128}])
            assert configs, (name, spec.label, pool)
            extra = {"precision": impl.precision} if name.startswith("cuda-tc-") else {}
            if fusion:
                extra.update(pool=pool, activation=fusion[0] if name == "cuda-fused-layer" else cc.activation_code(fusion[0]))
            for config in configs:
                try:
                    specs = module.kernel_specs(s.M, s.C, s.H, s.W, s.K, config=config, **extra)
                except ValueError:
                    continue   # a candidate may not fit (the sweep reports and skips it)
                assert specs and all(isinstance(k, cc.KernelSpec) for k in specs)
                built += 1
    assert built >= 10, built
    if name == "cuda-tc-fp16":   # the FP16 image pairs are swept where the width allows them
        sp18_l2 = next(spec for spec in sweep.preset_layers() if spec.label == "sp18 L2")
        assert {"kernel": "gather", "xh": 1, "rm": 4, "nt": 128, "cs": 1} in sweep.candidates(impl, sp18_l2, 1, 4)


@pytest.mark.parametrize("name", ("triton-direct", "triton-fused-layer"))
def test_triton_overrides_change_the_chosen_config(name):
    pytest.importorskip("triton")
    impl = conv.get(name)
    spec = sweep.preset_layers(["fa20 L2"])[0]
    base, changed = sweep.overridden(impl, spec, 4, [{"num_warps": 2}])
    assert changed.num_warps == 2 and changed.positions_per_thread == base.positions_per_thread
