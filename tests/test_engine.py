"""The engine: any preset with any implementation, chunked, timed per conv layer."""

import importlib.util

import numpy as np
import pytest
import torch

from convforge import data
from convforge.engine import Engine
from convforge.errors import UserError
from convforge.models import PRESETS, forward_reference, load_preset


@pytest.mark.parametrize("name", list(PRESETS))
def test_reference_and_torch_agree_with_plain_forward(name, data_dir):
    network = load_preset(name)
    subset = data.load("test", network.architecture.input_size, 40, data_dir)
    expected = forward_reference(network, torch.from_numpy(subset.images).float().unsqueeze(1)).argmax(1).numpy()
    for impl in ("reference", "torch"):
        result = Engine(network, impl=impl, device="cpu").run(subset.images, subset.labels)
        assert np.array_equal(result.predictions, expected), impl
        assert len(result.layers) == len(network.architecture.conv_shapes(1))
        assert all(layer.op_time_s > 0 and layer.shape.B == 40 for layer in result.layers)


def test_chunking_does_not_change_results(data_dir):
    network = load_preset("sp19")
    subset = data.load("test", 48, 50, data_dir)
    whole = Engine(network, impl="torch", device="cpu").run(subset.images, subset.labels)
    chunked = Engine(network, impl="torch", device="cpu", chunk=7).run(subset.images, subset.labels)
    assert np.array_equal(whole.predictions, chunked.predictions)
    assert whole.correctness == chunked.correctness


def test_chunk_size_bounds_memory():
    network = load_preset("fa18")
    engine = Engine(network, impl="torch", device="cpu")
    per_image = 4 * network.architecture.max_activation_elements()
    assert engine.chunk * per_image <= 256 << 20 and engine.chunk >= 1


def test_an_allocation_failure_halves_the_chunk_and_keeps_the_answers(data_dir, capsys):
    """A chunk that does not fit (a GPU shared with other work) is retried at half the size, with the same
    predictions and no Op Time counted for the failed attempt; one image per chunk that fails is an error."""
    network = load_preset("sp19")
    subset = data.load("test", 48, 50, data_dir)
    expected = Engine(network, impl="torch", device="cpu").run(subset.images, subset.labels)
    engine = Engine(network, impl="torch", device="cpu", chunk=32)
    conv_fn = engine.steps[0].conv_fn
    failures = []

    def fails_above_8(x, out=None):
        if x.shape[0] > 8:
            failures.append(x.shape[0])
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return conv_fn(x)
    engine.steps[0].conv_fn = fails_above_8
    result = engine.run(subset.images, subset.labels)
    assert np.array_equal(result.predictions, expected.predictions)
    assert failures == [32, 16] and engine.chunk == 8
    assert capsys.readouterr().err.count("out of cpu memory") == 2

    def always_fails(x, out=None):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
    engine.steps[0].conv_fn = always_fails
    with pytest.raises(UserError, match="one image per chunk"):
        engine.run(subset.images[:5], subset.labels[:5])


@pytest.mark.slow
def test_reference_matches_torch_on_1000_images(data_dir):
    network = load_preset("fa17-high")
    subset = data.load("test", 28, 1000, data_dir)
    ref = Engine(network, impl="reference", device="cpu").run(subset.images, subset.labels)
    fw = Engine(network, impl="torch", device="cpu").run(subset.images, subset.labels)
    assert ref.correctness == fw.correctness
    assert (ref.predictions != fw.predictions).sum() <= 1


def test_precision_is_checked_before_any_work():
    from convforge.errors import UserError
    from convforge.models import load_preset
    network = load_preset("fa17-high")
    with pytest.raises(UserError, match="unknown precision 'half'"):
        Engine(network, impl="torch", device="cpu", precision="half")
    with pytest.raises(UserError, match="needs --device cuda"):
        Engine(network, impl="torch", device="cpu", precision="fast")
    with pytest.raises(UserError, match="need --device cuda"):
        Engine(network, impl="torch", device="cpu").graphed(10)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_fast_path_picks_its_kernel_per_layer(monkeypatch):
    """The fast path's choice per conv layer: unfused many-channel layers on cuda-tc-fp16, fused ones with few maps
    on triton-tc-fused (fa20 L2), fused ones with more maps on the exact kernel; fused one-channel layers with a 2x2
    pool on cuda-tc-fp16's pool kernel, other one-channel layers on the exact kernel."""
    from convforge import conv, engine as engine_module
    monkeypatch.setattr(conv.ConvImpl, "unavailable_reason", lambda self, device: None)   # as on a GPU
    engine = Engine.__new__(Engine)
    engine.precision, engine.device, engine.impl = "fast", "cuda", conv.get("cuda-auto")
    assert engine._layer_impl((4, 40, 40), 16, ("relu", 4, 2), 7).name == "triton-tc-fused"
    assert engine._layer_impl((12, 33, 33), 24, ("tanh", 2, 2), 7).name == "cuda-auto"
    assert engine._layer_impl((6, 30, 30), 16, None, 5).name == "cuda-tc-fp16"
    assert engine._layer_impl((1, 64, 64), 6, ("tanh", 2, 2), 5).name == "cuda-tc-fp16"
    assert engine._layer_impl((1, 86, 86), 4, ("relu", 2, 2), 7).name == "cuda-tc-fp16"
    assert engine._layer_impl((1, 64, 64), 6, ("tanh", 3, 2), 5).name == "cuda-auto"     # pool 3: not the pool kernel's
    assert engine._layer_impl((1, 64, 64), 6, ("tanh", 2, 2), 11).name == "cuda-auto"    # K 11: nor this
    assert engine._layer_impl((1, 5, 6), 6, ("tanh", 2, 2), 5).name == "cuda-auto"      # no whole window
    assert engine._layer_impl((1, 64, 64), 6, None, 5).name == "cuda-auto"
    monkeypatch.setattr(engine_module, "FAST_FIRST_POOL", False)
    assert engine._layer_impl((1, 64, 64), 6, ("tanh", 2, 2), 5).name == "cuda-auto"
    engine.precision = "exact"
    assert engine._layer_impl((4, 40, 40), 16, ("relu", 4, 2), 7).name == "cuda-auto"
    assert engine._layer_impl((1, 64, 64), 6, ("tanh", 2, 2), 5).name == "cuda-auto"


def test_fast_path_hands_fp16_to_dense_only_where_the_weights_bound_it():
    """The fast path's FP16 hand-off from a conv to the dense layer after it: on the second conv of the presets
    whose first block ends in tanh (sp18, sp19, fa18, fa19), never after relu (fa20) nor on a conv fed by raw
    pixels; and not where dense weights scaled up would let a value pass FP16's range."""
    from convforge import engine
    from convforge.models import Conv, Dense
    for name in PRESETS:
        network = load_preset(name)
        walk = list(network.architecture.walk())
        convs = [i for i, (layer, *_) in enumerate(walk) if isinstance(layer, Conv)]
        chosen = [i for i in convs if engine._half_handoff(walk, i, network.params)]
        assert chosen == (convs[1:] if name in ("sp18", "sp19", "fa18", "fa19") else []), name
        for i, (layer, *_) in enumerate(walk):   # each dense layer knows its conv
            if isinstance(layer, Dense):
                assert engine._conv_before(walk, i) == (convs[-1] if i == convs[-1] + 2 else -1), (name, i)
    network = load_preset("sp18")
    walk = list(network.architecture.walk())
    params = dict(network.params, **{"fc1.weight": network.params["fc1.weight"] * 8})
    assert not engine._half_handoff(walk, 3, params)


def test_fast_path_hands_fp16_from_a_bounded_first_conv_to_the_tensor_core_conv(monkeypatch):
    """HALF_CONV_HANDOFF: the fused tanh first conv of sp18 and sp19 writes FP16 for the second conv (cuda-tc-fp16
    unfused, on its FP16-pairs launch); not for fa18 and fa19 (fp32-image launches), never after relu (fa20), nor
    where no conv follows (fa17), nor on the exact path or with the switch off."""
    from convforge import conv, engine
    from convforge.models import Conv, fusion_after
    monkeypatch.setattr(conv.ConvImpl, "unavailable_reason", lambda self, device: None)   # as on a GPU
    fast = Engine.__new__(Engine)
    fast.precision, fast.device, fast.impl = "fast", "cuda", conv.get("cuda-auto")
    for name in PRESETS:
        walk = list(load_preset(name).architecture.walk())
        first = next(i for i, (layer, *_) in enumerate(walk) if isinstance(layer, Conv))
        reader = fast._half_conv_reader(walk, first, fusion_after(walk, first), True)
        assert reader == (3 if name in ("sp18", "sp19") else -1), name
    from convforge.conv import cuda_tc
    assert [cuda_tc.stages_half_pairs(*layer) for layer in ((16, 6, 30, 30, 5), (16, 6, 22, 22, 5),
                                                           (24, 12, 33, 33, 7), (24, 12, 33, 33, 5))] == [
        True, True, False, False]   # sp18, sp19 L2 (tuned xh=1); fa18, fa19 L2
    walk = list(load_preset("sp19").architecture.walk())
    monkeypatch.setattr(engine, "HALF_CONV_HANDOFF", False)
    assert fast._half_conv_reader(walk, 0, fusion_after(walk, 0), True) == -1
    monkeypatch.setattr(engine, "HALF_CONV_HANDOFF", True)
    fast.precision = "exact"
    assert fast._half_conv_reader(walk, 0, fusion_after(walk, 0), True) == -1


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", ["fa17-high", "sp18", "sp19", "fa20"])
def test_graphed_and_fast_forward_on_fresh_batches(name):
    """A CUDA-graph replay gives the eager forward's logits for each new input (not the captured one); the
    fast path stays within the reduced-precision tolerance of a float64 forward pass."""
    from convforge import gpu_dense
    from convforge.engine import FAST_CONV, FasterPerBatch
    from convforge.harness.check import relative_error
    from convforge.models import forward_with
    network = load_preset(name)
    size = network.architecture.input_size
    exact = Engine(network, device="cuda")
    fast = Engine(network, device="cuda", precision="fast")
    # sp18 / sp19: the FP16 dense layer after the conv applies the tanh after it (one step, skipping the tanh); the
    # fast path's fp32 dense layers absorb the activations the exact path's do, and have TF32 forms besides
    halves = [s.half_dense.activation for s in fast.steps if s.half_dense is not None]
    assert halves == (["tanh"] if name in ("sp18", "sp19") else []), name
    assert [(s.skip, s.gpu_dense.activation) for s in fast.steps if s.gpu_dense is not None] == \
        [(s.skip, s.gpu_dense.activation) for s in exact.steps if s.gpu_dense is not None]
    assert all("tf32-linear" in s.gpu_dense.variants for s in fast.steps if s.gpu_dense is not None)
    assert not any(set(gpu_dense.TF32_FORMS) & set(s.gpu_dense.variants) for s in exact.steps if s.gpu_dense)
    # FC -> act -> FC 10: one dense step, whose head takes the second layer too (FUSE_HEAD)
    assert [s.head is not None and s.head.has_kernel for s in exact.steps if s.gpu_dense] == [True]
    first_conv = fast.steps[0].conv_fn   # its tensor-core kernel (FasterPerBatch may run the exact one at 4 images)
    first_conv = first_conv.ways[FAST_CONV] if isinstance(first_conv, FasterPerBatch) else first_conv
    with torch.inference_mode():   # sp18 / sp19: the first conv hands FP16 to the second (HALF_CONV_HANDOFF)
        first = first_conv(torch.rand(4, 1, size, size, device="cuda") * 255)
    assert first.dtype == (torch.float16 if name in ("sp18", "sp19") else torch.float32), name
    params64 = {k: v.to("cuda", torch.float64) for k, v in network.params.items()}
    for batch in (10, 100):
        graphed, graphed_fast = exact.graphed(batch), fast.graphed(batch)
        for seed in range(2):
            g = torch.Generator(device="cuda").manual_seed(seed)
            x = torch.randint(0, 256, (batch, 1, size, size), generator=g, device="cuda").float()
            with torch.inference_mode():
                reference = forward_with(network.architecture, params64, x.double()).cpu().numpy()
                assert relative_error(graphed(x).clone(), reference) <= 1e-5
                assert relative_error(exact.forward(x, timed=False), reference) <= 1e-5
                assert relative_error(graphed_fast(x).clone(), reference) <= 1e-2


@pytest.mark.gpu
@needs_cuda
def test_a_graph_outlives_the_engine_reference_it_came_from():
    """``Engine(...).graphed(10)`` keeps no other reference to the engine: the graph holds it, so its weights stay
    where the graph reads them after another engine's capture (whose empty_cache hands freed memory back)."""
    import gc
    from convforge.harness.check import relative_error
    from convforge.models import forward_with
    network = load_preset("fa17-high")
    graphed = Engine(network, device="cuda").graphed(10)
    gc.collect()
    Engine(network, device="cuda").graphed(10)   # a capture: empty_cache, new allocations
    x = torch.randint(0, 256, (10, 1, 28, 28), device="cuda").float()
    params64 = {k: v.to("cuda", torch.float64) for k, v in network.params.items()}
    with torch.inference_mode():
        reference = forward_with(network.architecture, params64, x.double()).cpu().numpy()
        assert relative_error(graphed(x).clone(), reference) <= 1e-5


@pytest.mark.gpu
@needs_cuda
def test_a_gpu_shared_with_other_work_halves_the_chunk(data_dir, capsys):
    """With the GPU nearly full (another tensor holds all but a third of one chunk's peak memory), the run
    halves its chunk until a chunk fits and gives the same predictions as on an idle GPU."""
    network = load_preset("fa18")
    subset = data.load("test", 72, 2000, data_dir)
    expected = Engine(network, device="cuda", chunk=2000).run(subset.images, subset.labels).predictions
    engine = Engine(network, device="cuda", chunk=2000)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    engine.run(subset.images, subset.labels)
    peak = torch.cuda.max_memory_allocated() - before
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    hog = torch.empty(free - peak // 3, dtype=torch.uint8, device="cuda")
    try:
        result = engine.run(subset.images, subset.labels)
    finally:
        del hog
        torch.cuda.empty_cache()
    assert np.array_equal(result.predictions, expected)
    assert engine.chunk < 2000 and "out of cuda memory" in capsys.readouterr().err


def test_gpu_dense_chooses_for_graphs_by_gpu_time_and_for_eager_calls_with_launches():
    """An eager call's form is chosen with its launch work counted, a CUDA graph's (gpu_dense.for_graph) by
    GPU time alone; each choice is kept apart, per batch size, and made once."""
    from convforge import gpu_dense
    # (GPU time, time with the launch): linear fast on the GPU but slow to launch, transposed the other way
    costs, seen, ran = {"linear": (1.0, 5.0), "transposed": (2.0, 3.0)}, [], []

    def measure(call, device, calls, launch_hidden):
        call()
        seen.append(launch_hidden)
        return costs.get(ran[-1], (9.0, 9.0))[0 if launch_hidden else 1]

    gen = torch.Generator().manual_seed(3)
    dense = gpu_dense.GpuDense(torch.randn(8, 64, generator=gen), None, measure)
    run = dense.run
    dense.run = lambda variant, x: (ran.append(variant), run(variant, x))[1]
    x = torch.rand(4, 64, generator=gen)
    dense(x)
    assert dense.choice == {4: "transposed"} and not dense.graph_choice and set(seen) == {False}
    seen.clear()
    with gpu_dense.for_graph():
        dense(x)
    assert dense.graph_choice == {4: "linear"} and dense.choice == {4: "transposed"} and set(seen) == {True}
    seen.clear()
    dense(x)
    with gpu_dense.for_graph():
        dense(x)
    assert not seen and ran[-2:] == ["transposed", "linear"]   # both kept, each used in its mode
    dense.has_tc = True   # as on a GPU with Triton: the tensor-core forms serve rows while rows x K < 2^31
    assert dense.serves("tc3", 2 ** 25 - 1) and not dense.serves("tc3-wide", 2 ** 25)


@pytest.mark.parametrize("queue", [4, 1])
def test_gpu_dense_eager_choice_times_calls_back_to_back(monkeypatch, queue):
    """An eager call's form is timed as one call's share of EAGER_QUEUE calls launched back to back, launch work
    counted: where every form's GPU time exceeds its launch work (sp19's fast fc1 at 10000 rows: cuBLAS with
    little launch work, tc-tall with less GPU time) GPU time decides; where launches dominate (10-100 rows) launch
    work still does. One call timed alone (EAGER_QUEUE = 1, the rule before) counted both in full and took the
    form of less launch + GPU time in both cases. A graph's choice stays GPU time alone, one call at a time."""
    from convforge import gpu_dense
    monkeypatch.setattr(gpu_dense, "EAGER_QUEUE", queue)
    # (launch work, GPU time) of one call, per batch size and form
    costs = {4: {"linear": (5.0, 120.0), "transposed": (40.0, 90.0)},   # GPU-bound
             2: {"linear": (5.0, 8.0), "transposed": (40.0, 3.0)}}      # launch-bound
    ran, queued = [], []

    def measure(call, device, calls, launch_hidden):
        ran.clear()
        call()
        queued.append((len(ran), launch_hidden))
        variant, rows = ran[0]
        host, gpu = costs[rows].get(variant, (100.0, 1000.0))
        n = len(ran)
        if launch_hidden:   # a spin queued ahead: the GPU's work alone
            return n * gpu
        # from an idle GPU: the first launch, then whichever of the launches and the GPU lags
        return host + n * gpu if host <= gpu else n * host + gpu

    gen = torch.Generator().manual_seed(3)
    dense = gpu_dense.GpuDense(torch.randn(8, 64, generator=gen), None, measure)
    run = dense.run
    dense.run = lambda variant, x: (ran.append((variant, x.shape[0])), run(variant, x))[1]
    for rows in (4, 2):
        dense(torch.rand(rows, 64, generator=gen))
    assert set(queued) == {(queue, False)}   # every eager timing: `queue` calls back to back, launches counted
    # back to back: linear (5 + 4 x 120) / 4 = 121.25 against (40 + 4 x 90) / 4 = 100; alone 125 against 130
    assert dense.choice == {4: "transposed" if queue == 4 else "linear", 2: "linear"}
    queued.clear()
    with gpu_dense.for_graph():
        for rows in (4, 2):
            dense(torch.rand(rows, 64, generator=gen))
    assert set(queued) == {(1, True)} and dense.graph_choice == {4: "transposed", 2: "transposed"}


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_tensor_core_dense_epilogue_adds_bias_and_activation_over_one_slice(dtype):
    """gpu_dense_tc.launch_part over one slice writes the layer's output itself, bias and activation added in its
    epilogue (on the CPU under Triton's interpreter, on a GPU compiled): within the tolerance of float64, equal to
    the partial product + dense_gemv_sum's one-slice arithmetic (part + bias, then the activation) to within the
    activations' rounding; with several slices a bias or activation is refused."""
    from convforge import gpu_dense_tc
    from convforge.conv import ACTIVATION_CODES
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(12)
    rows, outputs, depth = 70, 37, 203   # rows and outputs not a multiple of the blocks', depth of the step
    x = (torch.rand(rows, depth, generator=gen) * 2 - 1).to(device, dtype)
    weight = (torch.randn(outputs, depth, generator=gen) / depth ** 0.5).to(device, dtype)
    bias = torch.randn(outputs, generator=gen).to(device)
    precision = "tf32x3" if dtype == torch.float32 else "tf32"
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    part = torch.full((1, rows, outputs), float("nan"), device=device)
    gpu_dense_tc.launch_part(x, weight, part, 256, (64, 32, 32), 4, 3, precision)
    for act in ("tanh", "relu", "sigmoid", None):
        y = torch.full((rows, outputs), float("nan"), device=device)   # poisoned: every element written
        gpu_dense_tc.launch_part(x, weight, y, 256, (64, 32, 32), 4, 3, precision, bias, ACTIVATION_CODES[act])
        ref = torch.nn.functional.linear(x.double(), weight.double(), bias.double())
        summed = part[0] + bias
        if act:
            ref, summed = getattr(torch, act)(ref), getattr(torch, act)(summed)
        assert not y.isnan().any()
        assert ((y.double() - ref).norm() / ref.norm()).item() <= tolerance, act
        assert (y - summed).abs().max().item() <= 1e-6, act
    with pytest.raises(ValueError, match="one slice"):
        gpu_dense_tc.launch_part(x, weight, torch.empty(2, rows, outputs, device=device), 128, (64, 32, 32), 4, 3,
                                 precision, bias)


@pytest.mark.parametrize("bias", [True, False])
def test_gpu_dense_layouts_match_float64(bias):
    """Every form the GPU engine's dense layer chooses between is exact, on a transposed (output-major) input
    too; the choice is made once per batch size (run here on the CPU, where the same code times with a wall
    clock)."""
    from convforge.engine import median_seconds
    from convforge.gpu_dense import GpuDense
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(37, 4096 + 2048, generator=gen)    # K = 6144: split-K in 16 parts of 384
    b = torch.randn(37, generator=gen) if bias else None
    dense = GpuDense(weight, b, median_seconds)
    assert dense.variants == GpuDense.VARIANTS[:4] and dense.splits == 16   # no gemv: no GPU
    for rows in (1, 19, 64):
        x = torch.rand(rows, weight.shape[1], generator=gen) * 3 - 1
        ref = torch.nn.functional.linear(x.double(), weight.double(), b.double() if bias else None)
        for variant in dense.variants:
            for view in (x, x.t().contiguous().t()):
                out = dense.run(variant, view)
                assert out.shape == ref.shape
                assert ((out.double() - ref).norm() / ref.norm()).item() <= 1e-5, variant
        out = dense(x)
        assert dense.choice[rows] in dense.variants
        assert ((out.double() - ref).norm() / ref.norm()).item() <= 1e-5
    assert sorted(dense.choice) == [1, 19, 64] and not dense.graph_choice
    assert GpuDense(weight[:, :203], b, median_seconds).variants == ("linear", "transposed", "output-major")   # 203
    with pytest.raises(ValueError, match="unknown dense variant"):
        dense.run("nonsense", x)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_cuda])])
def test_gpu_dense_fp16_forms_match_float64(device):
    """The fast path's dense layer on FP16 weights (after a conv that wrote FP16): cuBLAS's two layouts and, on a
    GPU with Triton, the tensor-core forms on FP16 operands, all within the reduced tolerance of float64 with an
    fp32 result, bias added in fp32; the fp32-only forms are not offered."""
    from convforge.engine import median_seconds
    from convforge.gpu_dense import TC, TC_HALF, GpuDense
    gen = torch.Generator().manual_seed(9)
    weight = (torch.randn(140, 10816, generator=gen) * 0.01).to(device)
    bias = torch.randn(140, generator=gen).to(device)
    dense = GpuDense(weight.half(), bias, median_seconds)
    expected = ("linear", "transposed") + ((*TC, *TC_HALF) if device == "cuda" and dense.has_tc else ())
    assert dense.variants == expected
    for rows in (3, 100, 1000):
        x = (torch.rand(rows, 10816, generator=gen) * 2 - 1).to(device)
        ref = torch.nn.functional.linear(x.double(), weight.double(), bias.double())
        for variant in dense.variants:
            out = dense.run(variant, x.half())
            assert out.dtype == torch.float32 and out.shape == ref.shape
            assert ((out.double() - ref).norm() / ref.norm()).item() <= 1e-2, (variant, rows)
        chosen = dense(x.half())   # the measured choice, made once for this batch size
        assert dense.choice[rows] in dense.variants and ((chosen.double() - ref).norm() / ref.norm()).item() <= 1e-2


@pytest.mark.gpu
@needs_cuda
def test_gpu_dense_fp16_one_slice_epilogue_at_10000_rows(monkeypatch):
    """sp19's fast fc1 (5184 -> 140, FP16, tanh absorbed) at 10000 rows on tc-tall: one slice, so the kernel
    writes y with the bias and tanh (no sum kernel); within the reduced tolerance of float64, and within 1e-6 of
    the same form through the sum kernel (gpu_dense.FUSE_TC_EPILOGUE off), with poisoned scratch buffers."""
    pytest.importorskip("triton")
    from convforge import gpu_dense
    from convforge.engine import median_seconds
    monkeypatch.setattr(gpu_dense, "scratch", lambda shape, device: torch.full(shape, float("nan"), device=device))
    gen = torch.Generator(device="cuda").manual_seed(19)
    weight = torch.randn(140, 5184, device="cuda", generator=gen) * 0.01
    bias = torch.randn(140, device="cuda", generator=gen)
    dense = gpu_dense.GpuDense(weight.half(), bias, median_seconds, "tanh")
    if "tc-tall" not in dense.variants:
        pytest.skip("no tensor-core forms here")
    x = torch.rand(10000, 5184, device="cuda", generator=gen) * 2 - 1
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    assert gpu_dense.tc_slices(10000, 140, 5184, sm_count, "tc-tall")[0] == 1
    launched = []
    monkeypatch.setattr(dense, "_sum", lambda *args: (launched.append(args), gpu_dense.GpuDense._sum(dense, *args))[1])
    fused = dense.run("tc-tall", x.half())
    assert not launched   # no sum kernel
    ref = torch.tanh(torch.nn.functional.linear(x.half().double(), weight.half().double(), bias.double()))
    assert not fused.isnan().any() and ((fused.double() - ref).norm() / ref.norm()).item() <= 1e-2
    dense.fuse_tc_epilogue = False   # as made with gpu_dense.FUSE_TC_EPILOGUE off
    summed = dense.run("tc-tall", x.half())
    assert len(launched) == 1 and (fused - summed).abs().max().item() <= 1e-6


def test_an_implementation_that_reads_the_host_is_refused_for_cuda_graphs():
    """fft reads max|x| on the host every call (its non-finite check): a graph capture is refused up front."""
    from convforge.conv import IMPLEMENTATIONS, get
    engine = Engine.__new__(Engine)
    engine.device, engine.impl, engine._graphs = "cuda", get("fft"), {}
    assert not get("fft").graph_safe and all(i.graph_safe for i in IMPLEMENTATIONS if i.name != "fft")
    with pytest.raises(UserError, match="CUDA graph"):
        engine.graphed(10)


@pytest.mark.parametrize("bias", [True, False])
def test_gpu_dense_gemv_kernel_matches_float64(monkeypatch, bias):
    """dense_gemv.cu (the GPU dense layer's split-K form for <= 128 rows), run by the host emulation: within 1e-5
    of float64 for every compiled row count and two groups of rows, a last partial K slice, outputs not a
    multiple of a block's 32 and
    a transposed input view; its partial and output buffers are poisoned (NaN) first, so every element that is
    read was written."""
    from convforge import gpu_dense
    from convforge.conv import cuda_emulate
    if cuda_emulate.compiler() is None:
        pytest.skip("no C++ compiler (g++) for the host emulation")
    with cuda_emulate.emulated(sm_count=2):   # here only: the module's GPU tests need the real launcher
        _check_emulated_gemv(monkeypatch, bias)


def _check_emulated_gemv(monkeypatch, bias):
    from convforge import gpu_dense
    from convforge.engine import median_seconds
    monkeypatch.setattr(gpu_dense, "scratch", lambda shape, device: torch.full(shape, float("nan")))
    gen = torch.Generator().manual_seed(11)
    weight = torch.randn(45, 1028, generator=gen)   # K = 2 slices of 512 + 4 columns; 45 outputs: 2 blocks
    b = torch.randn(45, generator=gen) if bias else None
    dense = gpu_dense.GpuDense(weight, b, median_seconds)
    assert {"gemv", "gemv4", "gemv8"} <= set(dense.variants)
    for rows in (1, 4, 7, 16, 19):
        x = torch.rand(rows, 1028, generator=gen) * 4 - 2
        ref = torch.nn.functional.linear(x.double(), weight.double(), b.double() if bias else None)
        for view in (x, x.t().contiguous().t()):
            out = dense.run("gemv", view)
            assert out.shape == ref.shape and not out.isnan().any()
            assert ((out.double() - ref).norm() / ref.norm()).item() <= 1e-5, rows
        for variant in ("gemv4", "gemv8"):   # fixed groups of rows: only where the rows need several
            assert dense.serves(variant, rows) == (rows > gpu_dense.GpuDense.GEMV_GROUPS[variant])
            if dense.serves(variant, rows):
                out = dense.run(variant, x)
                assert ((out.double() - ref).norm() / ref.norm()).item() <= 1e-5, (variant, rows)
    # the activation fused into the sum kernel, NaN kept (an input row of NaN); one group size per activation
    x = torch.rand(9, 1028, generator=gen) * 4 - 2
    x[3] = float("nan")
    keep = torch.arange(9) != 3
    for activation, fn, variant in (("tanh", torch.tanh, "gemv"), ("relu", torch.relu, "gemv4"),
                                    ("sigmoid", torch.sigmoid, "gemv8")):
        fused = gpu_dense.GpuDense(weight, b, median_seconds, activation)
        ref = fn(torch.nn.functional.linear(x.double(), weight.double(), b.double() if bias else None))
        for form in (variant, "linear"):
            out = fused.run(form, x)
            assert out[3].isnan().all() and not out[keep].isnan().any(), (activation, form)
            err = ((out[keep].double() - ref[keep]).norm() / ref[keep].norm()).item()
            assert err <= 1e-5, (activation, form, err)
    with pytest.raises(ValueError, match="unknown activation 'gelu'"):
        gpu_dense.GpuDense(weight, b, median_seconds, "gelu")
    assert not dense.serves("gemv", 129)
    with pytest.raises(ValueError, match="unknown dense variant 'gemv' for 129 rows"):
        dense.run("gemv", torch.rand(129, 1028))
    assert not {"gemv", "tiles"} & set(gpu_dense.GpuDense(weight[:, :1026].contiguous(), b, median_seconds).variants)


@pytest.mark.parametrize("bias", [True, False])
def test_gpu_dense_tiles_kernel_matches_float64(monkeypatch, bias):
    """dense_tiles.cu (the split-K tiled product for 17-2048 rows), run by the host emulation: within 1e-5 of
    float64 on one and two row tiles (the second partial), outputs over two column tiles (the second partial),
    four slices of the reduction with a partial last slab, a transposed input view and a fused activation; the
    partial and output buffers poisoned (NaN) first."""
    from convforge import gpu_dense
    from convforge.conv import cuda_emulate
    from convforge.engine import median_seconds
    if cuda_emulate.compiler() is None:
        pytest.skip("no C++ compiler (g++) for the host emulation")
    monkeypatch.setattr(gpu_dense, "scratch", lambda shape, device: torch.full(shape, float("nan")))
    gen = torch.Generator().manual_seed(17)
    weight = torch.randn(45, 1028, generator=gen)
    b = torch.randn(45, generator=gen) if bias else None
    with cuda_emulate.emulated(sm_count=2):
        assert gpu_dense.tiles_slices(70, 45, 1028, 2) == (4, 272)   # the last slice 212 columns: 13 slabs + 4
        assert gpu_dense.tiles_slices(70, 45, 1028, 2, "tiles-fine") == (8, 144)   # the last: one slab + 4
        dense = gpu_dense.GpuDense(weight, b, median_seconds)
        assert [dense.serves("tiles", rows) for rows in (16, 17, 2048, 2049)] == [False, True, True, False]
        assert gpu_dense.tiles_slices(70, 45, 1028, 2, "tiles-tall") == (4, 272)   # one partial block of 128 rows
        for rows, variant in ((19, "tiles"), (70, "tiles"), (70, "tiles-fine"), (70, "tiles-tall")):
            x = torch.rand(rows, 1028, generator=gen) * 4 - 2
            ref = torch.nn.functional.linear(x.double(), weight.double(), b.double() if bias else None)
            for view in (x, x.t().contiguous().t()):
                out = dense.run(variant, view)
                assert out.shape == ref.shape and not out.isnan().any()
                assert ((out.double() - ref).norm() / ref.norm()).item() <= 1e-5, (rows, variant)
        relu = gpu_dense.GpuDense(weight, b, median_seconds, "relu")
        out = relu.run("tiles", x)
        assert ((out.double() - torch.relu(ref)).norm() / torch.relu(ref).norm()).item() <= 1e-5


def test_gpu_dense_mma3_kernel_matches_float64(monkeypatch):
    """dense_mma3.cu (split TF32 on mma.sync, split-K, the batch's rows in one block), run by the host emulation:
    within 1e-5 of float64 for 3, 19 and 64 rows (one, two and four 16-row tiles, partial ones too), 45 outputs (a
    partial second block of 32), two slices with a partial last slab, a transposed input view and a fused
    activation; partial and output buffers poisoned (NaN) first. Its known-wrong fixture (SUMS 1: the three
    products straight into the running sum, which the emulation truncates as the tensor cores do) fails the same
    check over one long slice that the kernel passes."""
    from convforge import gpu_dense
    from convforge.conv import cuda_emulate, split_tf32
    from convforge.engine import median_seconds
    if cuda_emulate.compiler() is None:
        pytest.skip("no C++ compiler (g++) for the host emulation")
    monkeypatch.setattr(gpu_dense, "scratch", lambda shape, device: torch.full(shape, float("nan")))
    gen = torch.Generator().manual_seed(19)
    weight = torch.randn(45, 1028, generator=gen)
    b = torch.randn(45, generator=gen)
    with cuda_emulate.emulated(sm_count=2):
        dense = gpu_dense.GpuDense(weight, b, median_seconds)
        assert "mma3" in dense.variants
        assert [gpu_dense.mma3_row_tiles(r) for r in (1, 16, 17, 33, 64)] == [1, 1, 2, 4, 4]
        assert gpu_dense.mma3_slices(19, 45, 1028, 2) == (2, 576)   # 2 x 2 blocks: the last slice 452 columns
        assert [dense.serves("mma3", r) for r in (1, 64, 65)] == [True, True, False]
        for rows in (3, 19, 64):
            x = torch.rand(rows, 1028, generator=gen) * 4 - 2
            ref = torch.nn.functional.linear(x.double(), weight.double(), b.double())
            for view in (x, x.t().contiguous().t()):
                out = dense.run("mma3", view)
                assert out.shape == ref.shape and not out.isnan().any()
                assert ((out.double() - ref).norm() / ref.norm()).item() <= 1e-5, rows
        tanh = gpu_dense.GpuDense(weight, b, median_seconds, "tanh")
        out = tanh.run("mma3", x)
        assert ((out.double() - torch.tanh(ref)).norm() / torch.tanh(ref).norm()).item() <= 1e-5
        # one slice of 8192 positive columns: 3072 truncating accumulations a sum in the wrong fixture
        w = torch.rand(32, 8192, generator=gen)
        x = torch.rand(16, 8192, generator=gen) * 255
        ref = x.double() @ w.double().T
        errors = []
        for sums in (0, 1):
            part = gpu_dense.scratch((1, 16, 32), x.device)
            gpu_dense.launch_mma3(x, split_tf32(w), part, 8192, sums=sums)
            errors.append(((part[0].double() - ref).norm() / ref.norm()).item())
        assert errors[0] <= 1e-5 < errors[1], errors


def _head_layers(gen, depth, outputs, bias, first_act="tanh", second_act=None, device="cpu"):
    from convforge import gpu_dense
    from convforge.engine import median_seconds
    w1 = torch.randn(outputs, depth, generator=gen) / depth ** 0.5
    w2 = torch.randn(10, outputs, generator=gen) / outputs ** 0.5
    b1, b2 = (torch.randn(outputs, generator=gen), torch.randn(10, generator=gen)) if bias else (None, None)
    first = gpu_dense.GpuDense(w1.to(device), None if b1 is None else b1.to(device), median_seconds, first_act)
    second = gpu_dense.GpuDense(w2.to(device), None if b2 is None else b2.to(device), median_seconds, second_act)

    def reference(x):
        act = {"tanh": torch.tanh, "relu": torch.relu, None: lambda v: v}
        F = torch.nn.functional
        h = act[first_act](F.linear(x.double().cpu(), w1.double(), None if b1 is None else b1.double()))
        return act[second_act](F.linear(h, w2.double(), None if b2 is None else b2.double()))
    return gpu_dense.DenseHead(first, second), first, reference


@pytest.mark.parametrize("bias", [True, False])
def test_dense_head_kernel_matches_float64(monkeypatch, bias):
    """dense_head_sum (gpu_dense.DenseHead: a split-K dense layer's slices, bias and activation, then the next dense
    layer, in one launch), run by the host emulation: within 1e-5 of float64 after gemv partials (5 slices) and
    tiles-fine ones (15), 45 outputs (not a multiple of the block's threads: 5 and 15 threads an output, one slice
    each), both layers' activations, a NaN input row kept NaN, and 1100 outputs (more than the block's threads);
    partial and output buffers poisoned (NaN) first. Every split-K form serving the rows is offered beside
    ``apart``."""
    from convforge import gpu_dense
    from convforge.conv import cuda_emulate
    if cuda_emulate.compiler() is None:
        pytest.skip("no C++ compiler (g++) for the host emulation")
    monkeypatch.setattr(gpu_dense, "scratch", lambda shape, device: torch.full(shape, float("nan")))
    gen = torch.Generator().manual_seed(23)
    with cuda_emulate.emulated(sm_count=2):
        head, first, reference = _head_layers(gen, 2052, 45, bias)
        assert head.has_kernel
        assert gpu_dense.tiles_slices(19, 45, 2052, 2, "tiles-fine")[0] == 15
        assert head.forms(19, first) == ["apart"] + [f"{v}+head" for v in first.split_k_forms(19)]
        assert {"gemv+head", "tiles-fine+head"} <= set(head.forms(19, first))
        for rows, form in ((7, "gemv+head"), (19, "tiles-fine+head")):   # (apart: each layer's timed choice)
            x = torch.rand(rows, 2052, generator=gen) * 4 - 2
            out = head.run(form, x)
            ref = reference(x)
            assert out.shape == ref.shape and not out.isnan().any(), form
            assert ((out.double() - ref).norm() / ref.norm()).item() <= 1e-5, (rows, form)
        relu, _, reference = _head_layers(gen, 2052, 45, bias, "relu", "tanh")
        x = torch.rand(9, 2052, generator=gen) * 4 - 2
        x[3] = float("nan")
        out, ref = relu.run("gemv+head", x), reference(x)
        keep = torch.arange(9) != 3
        assert out[3].isnan().all() and not out[keep].isnan().any()
        assert ((out[keep].double() - ref[keep]).norm() / ref[keep].norm()).item() <= 1e-5
        with pytest.raises(ValueError, match="unknown dense head form 'linear\\+head'"):
            head.run("linear+head", x)
        # more outputs than the block's threads: one thread an output, several outputs a thread
        wide, _, reference = _head_layers(gen, 1028, gpu_dense.HEAD_THREADS + 76, bias)
        x = torch.rand(3, 1028, generator=gen) * 4 - 2
        out, ref = wide.run("gemv+head", x), reference(x)
        assert ((out.double() - ref).norm() / ref.norm()).item() <= 1e-5
    big, _, _ = _head_layers(gen, 64, gpu_dense.HEAD_MAX_OUTPUTS + 1, bias)
    assert not big.has_kernel and big.forms(10, big.first) == ["apart"]


@pytest.mark.gpu
@needs_cuda
def test_dense_head_forms_on_the_gpu():
    """Every DenseHead form on a GPU at the presets' head sizes (fa17's 7200 -> 500 -> 10, fa18's 17496 -> 160
    -> 10, fa20's 32 -> 10 after relu): within 1e-5 of float64 for 10, 100 and 1000 rows (the tensor-core
    partials too), and bit-equal from one call to the next."""
    gen = torch.Generator().manual_seed(29)
    for depth, outputs, act in ((7200, 500, "tanh"), (17496, 160, "tanh"), (784, 32, "relu")):
        head, first, reference = _head_layers(gen, depth, outputs, True, act, device="cuda")
        assert head.has_kernel
        for rows in (10, 100, 1000):
            x = torch.rand(rows, depth, generator=gen).cuda() * 2 - 1
            ref = reference(x)
            forms = head.forms(rows, first)
            assert len(forms) > 2 and any(f.startswith("tc3") for f in forms), forms
            for form in forms:
                out = head.run(form, x)
                err = ((out.double().cpu() - ref).norm() / ref.norm()).item()
                assert err <= 1e-5, (depth, rows, form, err)
                assert torch.equal(out, head.run(form, x)), (depth, rows, form)


@pytest.mark.gpu
@needs_cuda
def test_gpu_dense_gemv_kernel_on_the_gpu(monkeypatch):
    """The same kernels (gemv, tiles, mma3) on a GPU, at every preset's first dense layer size: within 1e-5 of
    float64 with poisoned buffers, for 1 to 1000 rows, and bit-equal from one call to the next (their sums have a
    fixed order). mma3's known-wrong fixture (the products straight into the running sum) fails that check over
    one slice of the reduction at 64 rows, positive weights, on the layers of 4096 columns or more."""
    from convforge import gpu_dense
    from convforge.conv import cuda_common as cc, split_tf32
    from convforge.engine import median_seconds
    monkeypatch.setattr(gpu_dense, "scratch",
                        lambda shape, device: torch.full(shape, float("nan"), device=device))
    gen = torch.Generator(device="cuda").manual_seed(3)
    for outputs, depth in ((500, 7200), (140, 10816), (160, 17496), (160, 20184), (32, 1024), (10, 500)):
        weight = torch.randn(outputs, depth, device="cuda", generator=gen) / depth ** 0.5
        b = torch.randn(outputs, device="cuda", generator=gen)
        dense = gpu_dense.GpuDense(weight, b, median_seconds)
        assert "gemv" in dense.variants
        for rows in (1, 3, 10, 16, 100, 128):
            x = torch.rand(rows, depth, device="cuda", generator=gen) * 255
            ref = torch.nn.functional.linear(x.double(), weight.double(), b.double())
            out = dense.run("gemv", x)
            assert not out.isnan().any()
            assert ((out.double() - ref).norm() / ref.norm()).item() <= 1e-5, (outputs, depth, rows)
            assert torch.equal(out, dense.run("gemv", x))
            for variant in ("gemv4", "gemv8", "tiles", "tiles-fine", "tiles-tall", "mma3"):
                if dense.serves(variant, rows):
                    out = dense.run(variant, x)
                    assert ((out.double() - ref).norm() / ref.norm()).item() <= 1e-5, (variant, outputs, rows)
                    if variant == "mma3":
                        assert torch.equal(out, dense.run(variant, x))
        if depth >= 4096:   # positive weights: the truncations' bias adds up over a long slice
            x = torch.rand(64, depth, device="cuda", generator=gen) * 255
            ref = x.double() @ weight.double().abs().T
            part = gpu_dense.scratch((1, 64, outputs), x.device)
            gpu_dense.launch_mma3(x, split_tf32(weight.abs()), part, cc.cdiv(depth, 32) * 32, sums=1)
            assert ((part[0].double() - ref).norm() / ref.norm()).item() > 1e-5, ("mma3 SUMS 1", outputs, depth)
        x = torch.rand(1000, depth, device="cuda", generator=gen) * 255   # tiles beyond gemv's rows
        ref = torch.nn.functional.linear(x.double(), weight.double(), b.double())
        for variant in ("tiles", "tiles-tall"):
            out = dense.run(variant, x)
            assert ((out.double() - ref).norm() / ref.norm()).item() <= 1e-5, (variant, outputs, 1000)
            assert torch.equal(out, dense.run(variant, x))
        fused = gpu_dense.GpuDense(weight, b, median_seconds, "tanh")
        x = torch.rand(10, depth, device="cuda", generator=gen) * 255
        ref = torch.tanh(torch.nn.functional.linear(x.double(), weight.double(), b.double()))
        for variant in ("gemv", "gemv4", "linear", "output-major"):
            out = fused.run(variant, x)
            assert ((out.double() - ref).norm() / ref.norm()).item() <= 1e-5, (variant, outputs)


def _tc_layers():
    """Every preset's dense layer sizes (outputs, depth), then odd ones: depth not a multiple of the 32-column
    step (1030, 203), outputs odd and not a multiple of a block's 32 / 64 (45, 37)."""
    sizes = []
    for preset in PRESETS:
        for name, w in load_preset(preset).params.items():
            if name.endswith(".weight") and w.dim() == 2 and tuple(w.shape) not in sizes:
                sizes.append(tuple(w.shape))
    return sizes + [(45, 1030), (37, 203)]


@pytest.mark.gpu
@needs_cuda
def test_gpu_dense_tensor_core_3xtf32_matches_float64(monkeypatch):
    """The tensor-core forms (tc3, tc3-wide, tc3-deep: Triton, split TF32, split-K, gemv's sum kernel) at every preset's
    dense sizes and odd ones, 1 to 1000 rows (17, 100, 333 not a multiple of a block's rows): within 1e-5 of
    float64 with poisoned (NaN) partial and output buffers, on a transposed input view too, with a fused
    activation, and bit-equal from one call to the next. Plain TF32 through the same kernel and sum, the
    known-wrong form, is rejected by the same check at 1e-5."""
    pytest.importorskip("triton")
    from convforge import gpu_dense, gpu_dense_tc
    from convforge.engine import median_seconds
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("TF32 tensor cores need sm_80 or newer")
    monkeypatch.setattr(gpu_dense, "scratch",
                        lambda shape, device: torch.full(shape, float("nan"), device=device))
    gen = torch.Generator(device="cuda").manual_seed(21)
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    wrong = []
    for outputs, depth in _tc_layers():
        weight = torch.randn(outputs, depth, device="cuda", generator=gen) / depth ** 0.5
        b = torch.randn(outputs, device="cuda", generator=gen)
        dense = gpu_dense.GpuDense(weight, b, median_seconds)
        assert set(gpu_dense.TC) <= set(dense.variants) and dense.serves("tc3", 1)
        assert not set(gpu_dense.TC_HALF) & set(dense.variants)   # FP16 layers' forms only
        assert not set(gpu_dense.TF32_FORMS) & set(dense.variants)   # the fast path's only
        fast = gpu_dense.GpuDense(weight, b, median_seconds, tf32=True)
        assert set(gpu_dense.TF32_FORMS) <= set(fast.variants)
        for rows in (1, 17, 100, 333, 1000):
            x = torch.rand(rows, depth, device="cuda", generator=gen) * 255
            ref = torch.nn.functional.linear(x.double(), weight.double(), b.double())
            for variant in gpu_dense.TC:
                for view in (x, x.t().contiguous().t()):
                    out = dense.run(variant, view)
                    assert out.shape == ref.shape and not out.isnan().any()
                    err = ((out.double() - ref).norm() / ref.norm()).item()
                    assert err <= 1e-5, (variant, outputs, depth, rows, err)
                assert torch.equal(out, dense.run(variant, x))
            # the same kernel with plain TF32 products: not exact, and the check says so
            slices, length = gpu_dense.tc_slices(rows, outputs, depth, sm_count)
            part = gpu_dense.scratch((slices, rows, outputs), x.device)
            gpu_dense_tc.launch_part(x, weight, part, length, (gpu_dense.tc_rows_per_block(rows), 32, 32),
                                     gpu_dense.TC_WARPS, gpu_dense.TC_STAGES, precision="tf32")
            out = dense._sum(gpu_dense.kernel_specs()[0], part, rows, outputs, slices)
            wrong.append(((out.double() - ref).norm() / ref.norm()).item())
            for variant in gpu_dense.TF32_FORMS:   # the fast path's forms: within the reduced tolerance
                out = fast.run(variant, x)
                err = ((out.double() - ref).norm() / ref.norm()).item()
                assert not out.isnan().any() and err <= 1e-2, (variant, outputs, depth, rows, err)
        fused = gpu_dense.GpuDense(weight, b, median_seconds, "tanh")
        x = torch.rand(100, depth, device="cuda", generator=gen) * 255
        ref = torch.tanh(torch.nn.functional.linear(x.double(), weight.double(), b.double()))
        out = fused.run("tc3", x)
        assert ((out.double() - ref).norm() / ref.norm()).item() <= 1e-5, ("tanh", outputs, depth)
    assert min(wrong) > 1e-5, min(wrong)   # every plain-TF32 case fails the exact check


def test_fast_per_batch_keeps_the_faster_kernel_per_batch_size(monkeypatch):
    """FasterPerBatch times its kernels the first time a batch size comes and keeps the faster for that size,
    eager calls and CUDA-graph warm-ups apart; ``last`` names the kernel that ran."""
    import time as _time
    from convforge import engine, gpu_dense
    calls = []

    def kernel(name, seconds_by_rows):
        def run(x, out=None):
            calls.append(name)
            _time.sleep(seconds_by_rows(x.shape[0]))
            return x + (1 if name == "tc" else 2)
        return run
    ways = {"tc": kernel("tc", lambda rows: 0.004 if rows < 50 else 0.0),
            "exact": kernel("exact", lambda rows: 0.0 if rows < 50 else 0.004)}
    chooser = engine.FasterPerBatch(ways)
    assert chooser.last == "tc"
    small, large = torch.zeros(10, 1), torch.zeros(100, 1)
    assert torch.equal(chooser(small), small + 2) and chooser.last == "exact"
    assert torch.equal(chooser(large), large + 1) and chooser.last == "tc"
    calls.clear()
    chooser(small)
    assert calls == ["exact"]   # chosen once per size: no more timing
    assert chooser.choice == {10: "exact", 100: "tc"} and chooser.graph_choice == {}
    with gpu_dense.for_graph():
        chooser(small)
    assert chooser.graph_choice == {10: "exact"}


def test_gpu_dense_tensor_core_forms_plan(monkeypatch):
    """The tensor-core forms' plan (no GPU needed): a block's rows follow the batch, the reduction's slices are
    a multiple of the 32-column step and none is empty; the kernel specs are one table, built once."""
    from convforge import gpu_dense
    assert [gpu_dense.tc_rows_per_block(r) for r in (1, 16, 17, 32, 33, 100, 10000)] == [16, 16, 32, 32, 64, 64, 64]
    assert [gpu_dense.tc_rows_per_block(r, "tc-tall") for r in (1, 64, 65, 10000)] == [16, 64, 128, 128]
    assert gpu_dense.tc_slices(10000, 140, 10816, 132, "tc-tall") == (1, 10816)   # 79 x 3 tiles fill 132 SMs
    for rows, outputs, depth in ((100, 160, 17496), (10, 500, 7200), (333, 45, 1030), (1, 37, 203), (10000, 500, 7200)):
        for variant in gpu_dense.TC_ALL:
            slices, length = gpu_dense.tc_slices(rows, outputs, depth, 132, variant)
            assert length % gpu_dense.TC_ALL[variant][1] == 0 and (slices - 1) * length < depth <= slices * length
    # 2 x 5 tiles: min(8 x 132 // 10, 17496 // 256) = 68 slices wanted, of 258 columns -> 288: 61 slices
    assert gpu_dense.tc_slices(100, 160, 17496, 132) == (61, 288)
    assert gpu_dense.kernel_specs() is gpu_dense.kernel_specs()
