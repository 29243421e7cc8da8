"""torch-compile (the torch.compile comparison baseline) against the float64 reference, and its protocol.

Every new input shape is a TorchInductor compile (a C++ compile on a CPU, 1-2 s on a 2-core machine with a
cold cache), so the cases reuse a few shapes: Inductor's graph cache makes a repeated shape cheap.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

from convforge import conv
from convforge.harness.check import check_call, poisoned, random_case, reference_layer, relative_error

IMPL = conv.get("torch-compile")
TOLERANCE = conv.EXACT_TOLERANCE

# (B, M, C, H, W, K), bias: a preset-like layer with bias, and an odd one (W != H, K = 3) without
PLAIN = [pytest.param((2, 6, 3, 12, 10, 5), True, id="B2-M6-C3-12x10-K5-bias"),
         pytest.param((3, 4, 1, 9, 11, 3), False, id="B3-M4-C1-9x11-K3")]
# (B, M, C, H, W, K), bias, activation, pool
FUSED = [pytest.param((2, 6, 3, 12, 10, 5), True, "tanh", 2, id="tanh-pool2-bias"),
         pytest.param((3, 4, 1, 9, 11, 3), False, None, 4, id="no-activation-pool4")]
DEVICES = [pytest.param("cpu"),
           pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                         reason="no CUDA GPU")])]


def _case(shape, bias: bool, seed: int, fused: bool = False):
    B, M, C, H, W, K = shape
    return random_case((B, C, H, W), (M, C, K, K), seed=seed, bias=bias, unit_output=fused)


def _skip_unless_available(device: str) -> None:
    reason = IMPL.unavailable_reason(device)
    if reason:
        pytest.skip(f"torch-compile on {device}: {reason}")


def test_registered_as_an_exact_fusing_comparison_baseline():
    assert IMPL.devices == ("cpu", "cuda") and IMPL.precision == "fp32" and IMPL.exact and IMPL.fuses
    assert "not ours" in IMPL.description and "first call per input shape" in IMPL.description
    header = IMPL.header
    assert header.startswith("torch-compile:") and "comparison baseline, not ours" in header
    assert "max-autotune" in header and "TF32" in header and "Course step:" in header and "Bottleneck:" in header
    assert conv.resolve("auto", "cpu").name != "torch-compile", "a baseline is never what --impl auto picks"


def test_unavailable_without_a_cpp_compiler(monkeypatch):
    # Inductor reads $CXX once, when its config is imported: the search list it then uses is what is patched.
    import torch._inductor.config as inductor_config
    monkeypatch.delenv("TORCH_INDUCTOR_INSTALL_GXX", raising=False)
    with inductor_config.patch({"cpp.cxx": (None, "/nonexistent/c++-for-convforge-tests")}):
        reason = IMPL.unavailable_reason("cpu")
    assert reason and "C++ compiler" in reason and "/nonexistent/c++-for-convforge-tests" in reason
    assert IMPL.unavailable_reason("cpu") != reason, "the real search list is back"


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape, bias", PLAIN)
def test_conv_matches_the_float64_reference(device, shape, bias):
    _skip_unless_available(device)
    x, w, b = _case(shape, bias, seed=11)
    ref = reference_layer(x, w, b)
    with torch.inference_mode():
        fn = IMPL.prepare(w.to(device), None if b is None else b.to(device))
        outcome = check_call(fn, x.to(device), ref, TOLERANCE)  # NaN-poisoned out=, then without out
    assert outcome.problem is None, outcome.problem
    assert outcome.error <= TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape, bias, activation, pool", FUSED)
def test_fused_layer_matches_the_float64_reference(device, shape, bias, activation, pool):
    _skip_unless_available(device)
    x, w, b = _case(shape, bias, seed=12, fused=True)
    ref = reference_layer(x, w, b, activation, pool)
    with torch.inference_mode():
        fn = IMPL.prepare_fused(w.to(device), None if b is None else b.to(device), activation, pool)
        outcome = check_call(fn, x.to(device), ref, TOLERANCE)
    assert outcome.problem is None, outcome.problem
    B, M, _, H, W, K = shape
    assert ref.shape == (B, M, (H - K + 1) // pool, (W - K + 1) // pool)


@pytest.mark.slow
def test_out_protocol_on_cpu():
    _skip_unless_available("cpu")
    x, w, b = _case((2, 6, 3, 12, 10, 5), True, seed=13)
    ref = reference_layer(x, w, b)
    original = x.clone()
    fn = IMPL.prepare(w, b)

    out = poisoned(ref.shape)
    assert fn(x, out=out) is out, "out= must be written and returned, not a new tensor"
    assert not torch.isnan(out).any(), "every element of the NaN-poisoned buffer is written"
    assert relative_error(out, ref) <= TOLERANCE

    strided = poisoned((ref.shape[1], ref.shape[0], *ref.shape[2:])).transpose(0, 1)  # not contiguous
    assert fn(x, out=strided) is strided and relative_error(strided, ref) <= TOLERANCE

    fresh = fn(x)
    assert fresh is not out and fresh.dtype == torch.float32 and tuple(fresh.shape) == ref.shape
    assert torch.equal(fresh, out), "the same call with and without out= gives the same bits"
    assert torch.equal(x, original), "the input is left alone"

    with pytest.raises(ValueError, match="out must be float32"):
        fn(x, out=torch.empty(2, 6, 7, 7))
    with pytest.raises(ValueError, match="out must be float32"):
        fn(x, out=torch.empty(ref.shape, dtype=torch.float64))
    with pytest.raises(ValueError, match="channels"):
        fn(torch.zeros(2, 2, 12, 10))


@pytest.mark.slow
def test_each_prepared_layer_has_its_own_recompile_budget():
    """Dynamo's recompile limit counts per code object: with one shared code object the (limit + 1)-th layer
    shape of a run would raise under fullgraph=True. Here the limit is 1 and three shapes must still compile."""
    _skip_unless_available("cpu")
    import torch._dynamo
    shapes = [((2, 6, 3, 12, 10, 5), True), ((3, 4, 1, 9, 11, 3), False), ((2, 6, 3, 12, 10, 5), False)]
    with torch._dynamo.config.patch(recompile_limit=1):
        for i, (shape, bias) in enumerate(shapes):
            x, w, b = _case(shape, bias, seed=20 + i)
            fn = IMPL.prepare(w, b)
            assert relative_error(fn(x), reference_layer(x, w, b)) <= TOLERANCE, (shape, bias)


@pytest.mark.slow
def test_tf32_is_off_at_every_call():
    _skip_unless_available("cpu")
    x, w, b = _case((3, 4, 1, 9, 11, 3), False, seed=14)
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        fn = IMPL.prepare(w, b)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # someone else's code
        fn(x)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.slow
def test_bench_warm_up_absorbs_the_compilation():
    """torch-compile compiles at the first call of a shape; bench's untimed warm-up calls must take it, so no
    timed call compiles. Counted with Dynamo's graph counter, not with timings (this VM's jitter is ~10 ms)."""
    _skip_unless_available("cpu")
    from torch._dynamo.utils import counters
    from convforge.harness import bench, timing
    x, w, b = _case((2, 6, 3, 12, 10, 5), True, seed=15)
    graphs_per_call = []

    def counted(fn):
        def call(inp):
            before = counters["stats"]["unique_graphs"]
            fn(inp)
            graphs_per_call.append(counters["stats"]["unique_graphs"] - before)
        return call

    repeat = 4
    with torch.inference_mode():
        times = timing.time_calls(counted(IMPL.prepare(w, b)), [x], "cpu", warmup=bench.DEFAULT_WARMUP, repeat=repeat)
    assert len(times) == repeat and len(graphs_per_call) > repeat, graphs_per_call
    assert graphs_per_call[0] == 1, "the first (warm-up) call compiles"
    assert sum(graphs_per_call[-repeat:]) == 0, f"a timed call compiled: {graphs_per_call}"


def test_engine_warm_up_absorbs_the_compilation_on_cpu():
    """The engine warms up per chunk size on a CPU too for an implementation that compiles per shape, so the
    timed pass (Op Time) compiles nothing; our own CPU kernels keep the single pass."""
    _skip_unless_available("cpu")
    from torch._dynamo.utils import counters
    from convforge.engine import Engine
    from convforge.models import load_preset
    network = load_preset("fa17-high")
    images = (np.random.default_rng(3).random((7, 28, 28)) * 255).astype(np.uint8)
    engine = Engine(network, impl="torch-compile", device="cpu", chunk=4)   # chunk sizes 4 and 3
    engine._warm_up(images)
    before = counters["stats"]["unique_graphs"]
    result = engine.run(images)
    assert counters["stats"]["unique_graphs"] == before, "the timed pass compiled"
    assert engine._warm_batches == {3, 4} and engine.prepare_time_s > 0
    assert result.predictions.shape == (7,)
    assert not conv.get("cpu-parallel").compiles_per_shape and conv.get("torch-compile").compiles_per_shape
