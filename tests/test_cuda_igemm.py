"""cuda-igemm-3xtf32 / cuda-igemm-tf32 (``cuda/igemm.cu``): the batch-wide implicit GEMM on tensor cores.

Against a float64 reference on fresh random data with the output poisoned with NaN, at each entry's tolerance
(3xTF32: the exact 1e-5), on the host emulation (g++, no GPU) and, where there is one, on a GPU: seed shapes,
shapes that are no multiple of the tiles (M, N = B*HO*WO, K = C*KH*KW), rectangular kernels, C not a multiple
of 8, batch 1 and 0, every tile config, Inf/NaN inputs, and what the entries refuse.
"""

from __future__ import annotations

import importlib.util
import zlib

import pytest
import torch
import torch.nn.functional as F

from convforge import conv
from convforge.conv import cuda_igemm
from convforge.harness.check import poisoned, relative_error
from conftest import check_layer_call as _check, needs_cxx

NAMES = ("cuda-igemm-3xtf32", "cuda-igemm-tf32")

# (B, M, C, H, W, KH, KW)
SHAPES = (
    (2, 5, 3, 12, 11, 5, 5),        # one tile of everything, KR = 75 (5 k tiles of 16: the ring wraps)
    (1, 1, 1, 1, 1, 1, 1),          # 1 x 1 output, KR = 1
    (2, 3, 2, 7, 7, 7, 7),          # K = H: one output per image
    (1, 70, 9, 10, 9, 3, 2),        # rectangular kernel, C = 9
    (3, 33, 17, 9, 12, 1, 4),       # 1 x 4 kernel, M just past 32
    (3, 16, 8, 13, 14, 2, 2),       # N = 468: four position tiles, the last partial
    (2, 130, 20, 6, 7, 3, 3),       # M = 130: two map tiles of 128, KR = 180 (12 k tiles)
    (1, 64, 64, 10, 10, 3, 3),      # many channels, batch 1
    (0, 3, 2, 8, 8, 3, 3),          # empty batch
)
# larger ones for the GPU: gpu-mode-like (K 8 and 16, 64-128 channels), batch 64, odd sizes
GPU_SHAPES = ((4, 64, 64, 40, 40, 8, 8), (2, 128, 128, 36, 36, 16, 16), (64, 96, 48, 17, 19, 3, 3),
              (3, 100, 36, 57, 43, 5, 5), (2, 200, 40, 30, 33, 3, 7))


def _data(shape, seed, bias=True):
    B, M, C, H, W, KH, KW = shape
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(B, C, H, W, generator=g) * 255.0 - 64.0
    w = torch.randn(M, C, KH, KW, generator=g) * 0.05
    b = torch.randn(M, generator=g) if bias else None
    return x, w, b


def _reference(x, w, b):
    """float64 (torch's CPU convolution in double: the NumPy reference takes square kernels only)."""
    return F.conv2d(x.double().cpu(), w.double().cpu(), None if b is None else b.double().cpu()).numpy()


def _prepare(name, w, b, **kw):
    impl = conv.get(name)
    return cuda_igemm.prepare(w, b, precision=impl.precision, **kw), impl.tolerance


# -- planning (no compiler, no GPU) -------------------------------------------------------------------------

def test_registry_entries_and_headers():
    for name, precision in zip(NAMES, ("tf32x3", "tf32")):
        impl = conv.get(name)
        assert impl.module == "cuda_igemm" and impl.precision == precision and impl.devices == ("cuda",)
        assert "Technique" in impl.header and "Course step" in impl.header
    assert conv.get("cuda-igemm-3xtf32").tolerance == conv.EXACT_TOLERANCE
    assert conv.get("cuda-igemm-tf32").tolerance == conv.REDUCED_TOLERANCE
    if not torch.cuda.is_available():
        assert conv.get("cuda-igemm-3xtf32").unavailable_reason("cuda")


def test_planning():
    g = cuda_igemm.plan(128, 64, 128, 128, 8, 8, "tf32x3")
    assert (g.bm, g.bn, g.nt, g.kr, g.kp % g.bk) == (128, 128, 256, 4096, 0)
    assert g.smem_bytes == 4 * 3 * (2 * 128 * 16 + 16 * 136)
    assert cuda_igemm.plan(64, 64, 32, 32, 3, 3, "tf32").bm == 64
    assert cuda_igemm.plan(16, 64, 32, 32, 3, 3, "tf32").bm == 32
    assert cuda_igemm.plan(128, 64, 32, 32, 3, 3, "tf32").smem_bytes < g.smem_bytes   # no small A part
    spec = cuda_igemm.plan(8, 3, 20, 21, 3, 5, "tf32x3").spec()
    assert ("CF_KH", 3) in spec.constants and ("CF_KW", 5) in spec.constants and ("CF_SPLIT", 3) in spec.constants
    assert not any(name.startswith("CF_B") and name == "CF_B" for name, _ in spec.constants)   # batch: an argument
    for config in cuda_igemm.LAUNCH_CONFIGS:
        cuda_igemm.plan(100, 20, 30, 30, 3, 3, "tf32x3", config)
    for bad in ({"bk": 8}, {"wm": 24}, {"stages": 1}, {"bogus": 1}, {"bm": 128, "wm": 64, "bn": 512, "wn": 32}):
        with pytest.raises(ValueError):
            cuda_igemm.plan(100, 20, 30, 30, 3, 3, "tf32x3", bad)
    with pytest.raises(ValueError):
        cuda_igemm.plan(100, 20, 30, 30, 3, 3, "tf32x3", {"stages": 8}, smem_optin=100 * 1024)
    with pytest.raises(ValueError):
        cuda_igemm.plan(10, 2, 8, 8, 3, 3, "fp16")


def test_weight_split_is_exact_to_2_pow_minus_21_and_keeps_the_sign(monkeypatch):
    monkeypatch.setattr(cuda_igemm, "fragment_order", lambda a, geom: a)   # the split, in row-major order
    g = cuda_igemm.plan(7, 3, 9, 9, 3, 3, "tf32x3")
    w = torch.randn(7, 3, 3, 3, generator=torch.Generator().manual_seed(3)) * torch.logspace(-3, 3, 7).view(-1, 1, 1, 1)
    big, small = cuda_igemm.pack_weights(w, g)
    assert big.shape == small.shape == (g.mtiles * g.bm, g.kp)
    for part in (big, small):
        assert torch.all(part.view(torch.int32) & 0x1FFF == 0)     # TF32 bit patterns
    a = w.reshape(7, -1).double()
    approx = big[:7, :27].double() + small[:7, :27].double()
    assert torch.all((approx - a).abs() <= a.abs() * 2.0 ** -21)
    assert torch.all(big[7:] == 0) and torch.all(big[:, 27:] == 0) and torch.all(small[:, 27:] == 0)
    assert torch.all(torch.sign(small[:7, :27]) == torch.sign(w.reshape(7, -1)))   # Inf inputs: no Inf - Inf
    inf = cuda_igemm.pack_weights(torch.full((1, 1, 1, 1), float("inf")), cuda_igemm.plan(1, 1, 2, 2, 1, 1, "tf32x3"))
    assert inf[0][0, 0] == float("inf") and inf[1][0, 0] == 0


def test_fragment_order():
    """Element (row, col) of the padded A lands where lane g*4+t's register a0..a3 of its tile expects it."""
    g = cuda_igemm.plan(40, 5, 9, 9, 3, 3, "tf32", {"bm": 32, "bn": 128, "bk": 16, "wm": 32, "wn": 32})
    rows, cols = g.mtiles * g.bm, g.kp
    a = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)
    flat = cuda_igemm.fragment_order(a, g)
    kt_count = g.kp // g.bk
    for row, col in ((0, 0), (9, 3), (17, 21), (45, 47), (63, 5), (38, 44)):
        mt, r = divmod(row, g.bm)
        kt, c = divmod(col, g.bk)
        rg, rr = divmod(r, 16)
        ks, cc = divmod(c, 8)
        h, gg = divmod(rr, 8)
        u, t = divmod(cc, 4)
        index = ((((mt * kt_count + kt) * (g.bk // 8) + ks) * (g.bm // 16) + rg) * 32 + gg * 4 + t) * 4 + u * 2 + h
        assert flat[index] == a[row, col], (row, col)


# -- the host emulation --------------------------------------------------------------------------------------


@needs_cxx
@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_emulated_shapes(emulation, name):
    for i, shape in enumerate(SHAPES):
        x, w, b = _data(shape, seed=zlib.crc32(f"{name}{shape}".encode()), bias=i % 2 == 0)
        fn, tolerance = _prepare(name, w, b)
        error = _check(fn, x, _reference(x, w, b), tolerance, f"{name} {shape} (emulated)")
        if name == "cuda-igemm-3xtf32" and shape[0]:
            assert error < 2e-6, f"{shape}: 3xTF32 error {error:.3g} is not fp32-like"


@needs_cxx
@pytest.mark.slow
def test_emulated_every_tile_config(emulation):
    shape = (2, 70, 12, 11, 13, 3, 2)      # KR = 72, N = 2*9*12 = 216: partial tiles in every dimension
    x, w, b = _data(shape, seed=11)
    ref = _reference(x, w, b)
    for config in cuda_igemm.LAUNCH_CONFIGS + cuda_igemm.SMALL_CONFIGS + ({**cuda_igemm.LAUNCH_CONFIGS[1], "epi": 0},):
        for name in NAMES:
            fn, tolerance = _prepare(name, w, b, config=config)
            _check(fn, x, ref, tolerance, f"{name} {config} (emulated)")
            assert fn.layer_for(11, 13).geom.epi == config.get("epi", fn.layer_for(11, 13).geom.epi)


# channels a multiple of 16 / 32: the channel-innermost k order (korder 1) serves them
KORDER_SHAPES = ((2, 40, 16, 9, 11, 3, 2), (1, 70, 32, 7, 8, 2, 3), (3, 16, 48, 6, 6, 1, 1))


@needs_cxx
@pytest.mark.slow
def test_emulated_channel_innermost_k_order(emulation):
    """korder 1 (k = (p, q, c)) against float64, both k orders and both BK on one shape, rectangular kernels,
    partial map and position tiles; where BK does not divide C, korder 1 is refused and the default falls back."""
    for i, shape in enumerate(KORDER_SHAPES):
        x, w, b = _data(shape, seed=40 + i, bias=i % 2 == 0)
        ref = _reference(x, w, b)
        C = shape[2]
        for config in ({"korder": 1}, {"korder": 1, **cuda_igemm.LAUNCH_CONFIGS[3]}, {"korder": 0}):
            if C % config.get("bk", 16):
                with pytest.raises(ValueError):
                    cuda_igemm.plan(*shape[1:], "tf32x3", config)
                continue
            for name in NAMES:
                fn, tolerance = _prepare(name, w, b, config=config)
                assert fn.layer_for(*shape[3:5]).geom.korder == config["korder"]
                error = _check(fn, x, ref, tolerance, f"{name} {shape} {config} (emulated)")
                if name == "cuda-igemm-3xtf32":
                    assert error < 2e-6, f"{shape} {config}: 3xTF32 error {error:.3g}"
    assert cuda_igemm.plan(8, 20, 9, 9, 3, 3, "tf32x3").korder == 0                 # 20 channels: 16 does not divide them
    assert cuda_igemm.plan(8, 32, 9, 9, 3, 3, "tf32x3").korder == cuda_igemm.KORDER_DEFAULT


def test_choose_splits():
    """Split-K's model (SPLIT_NOTE): a grid that balances over the multiprocessors keeps one split (gpu-mode's
    256-px layers on an H100's 132: 396 and 908 blocks of 128 x 128); a small grid over a long reduction splits
    (46 blocks, 968 k tiles: the H100 measured 17 splits 3x faster than one); the partial outputs' cost holds the
    count down; a forced count is capped by the k tiles and leaves no split empty."""
    ks = 2 * 128 * 128 * 16 / cuda_igemm.SM_RATE["tf32x3"]
    assert cuda_igemm.choose_splits(396, 8192, 132, ks, 1e-5) == (1, 8192)
    assert cuda_igemm.choose_splits(908, 2048, 132, ks, 1e-5) == (1, 2048)
    s, kts = cuda_igemm.choose_splits(46, 968, 132, ks, 8 * 256 * 54 * 54 / 3e12)
    assert 8 <= s <= 32 and (s - 1) * kts < 968 <= s * kts
    assert cuda_igemm.choose_splits(46, 968, 132, ks, 1.0)[0] == 1          # partial outputs too dear to split
    assert cuda_igemm.choose_splits(8, 20, 132) == (2, 10)                  # at least SPLITK_MIN_KTILES each
    assert cuda_igemm.choose_splits(8, 15, 132) == (1, 15)
    assert cuda_igemm.choose_splits(1, 5, 132, forced=3) == (3, 2)
    assert cuda_igemm.choose_splits(1, 5, 132, forced=4) == (3, 2)    # 4 splits of 2 tiles: the 4th would be empty
    assert cuda_igemm.choose_splits(1, 5, 132, forced=9) == (5, 1)
    for blocks in (1, 7, 100, 300, 1000):
        for kt in (1, 9, 64, 1000):
            s, kts = cuda_igemm.choose_splits(blocks, kt, 132, ks, 1e-6)
            assert (s - 1) * kts < kt <= s * kts


@needs_cxx
@pytest.mark.slow
def test_emulated_split_k(emulation):
    """Split-K against float64: forced 2, 3 (uneven k tiles), more splits than k tiles, both k orders, with
    and without bias and out; and the automatic choice on a small grid with a long reduction (2 emulated SMs)."""
    shape = (1, 20, 32, 6, 7, 3, 3)          # KR = 288: 18 k tiles of 16; N = 20: one block per map tile
    x, w, b = _data(shape, seed=21)
    ref = _reference(x, w, b)
    for config in ({"splitk": 2}, {"splitk": 3, "korder": 1}, {"splitk": 5, "korder": 1}, {"splitk": 40}):
        for name in NAMES:
            fn, tolerance = _prepare(name, w, b, config=config)
            error = _check(fn, x, ref, tolerance, f"{name} {config} (emulated)")
            layer = fn.layer_for(6, 7)
            assert layer.splits(1)[0] == min(config["splitk"], 18)
            if name == "cuda-igemm-3xtf32":
                assert error < 2e-6, f"{config}: 3xTF32 error {error:.3g}"
    x, w, _ = _data((2, 8, 64, 4, 4, 3, 3), seed=22, bias=False)   # KR = 576: 36 k tiles; 1 block
    fn, tolerance = _prepare("cuda-igemm-3xtf32", w, None)
    assert fn.layer_for(4, 4).splits(2)[0] > 1
    _check(fn, x, _reference(x, w, None), tolerance, "auto split (emulated)")


@needs_cxx
@pytest.mark.slow
def test_emulated_tuned_config_per_batch_size(emulation, monkeypatch):
    """A tuning entry (cuda_igemm.TUNING_NOTE) for one batch size runs its own config and split there, against
    float64; other batch sizes and explicit configs keep the default; the file's entries are valid."""
    shape = (3, 20, 16, 9, 10, 3, 3)
    x, w, b = _data(shape, seed=31)
    tuned = {**cuda_igemm.SMALL_CONFIGS[0], "splitk": 2}
    monkeypatch.setattr(cuda_igemm, "tuned_config",
                        lambda B, *rest: dict(tuned) if B == 3 and rest == (20, 16, 9, 10, 3, 3, "tf32x3") else None)
    fn, tolerance = _prepare("cuda-igemm-3xtf32", w, b)
    layer = fn.layer_for(9, 10)
    error = _check(fn, x, _reference(x, w, b), tolerance, "tuned config (emulated)")
    assert error < 2e-6
    run = layer.for_batch(3)
    assert run is not layer and (run.geom.bm, run.geom.bn) == (16, 64) and run.splits(3)[0] == 2
    assert layer.for_batch(2) is layer and layer.geom.bm == 32
    _check(fn, x[:2], _reference(x[:2], w, b), tolerance, "default config beside a tuned one (emulated)")
    fixed, _ = _prepare("cuda-igemm-3xtf32", w, b, config={"bm": 64})
    assert fixed.layer_for(9, 10).for_batch(3) is fixed.layer_for(9, 10)


def test_tuning_file_entries_plan():
    """Every entry of convforge/tuning/cuda-igemm.json (if any) plans on its own layer."""
    from convforge import tuning
    for entry in tuning.entries(cuda_igemm.TUNING_IMPL):
        s = entry["shape"]
        g = cuda_igemm.plan(s["M"], s["C"], s["H"], s["W"], s["K"], s["K"], s["precision"], entry["config"])
        assert g.splitk == entry["config"].get("splitk", 0)


@needs_cxx
@pytest.mark.slow
def test_emulated_inf_and_nan_stay_where_fp32_puts_them(emulation):
    """3xTF32's small part of an infinite input is zero, not Inf - Inf: the output is +-Inf where torch's fp32
    convolution gives +-Inf, NaN where it gives NaN, and finite values elsewhere."""
    x, w, _ = _data((1, 6, 4, 9, 9, 3, 3), seed=5, bias=False)
    x[0, 1, 2, 3] = float("inf")
    x[0, 2, 6, 6] = float("nan")
    w = w.abs() + 0.01                                   # positive weights: Inf stays Inf (no Inf - Inf in fp32 either)
    ref32 = F.conv2d(x, w)
    for name in NAMES:
        fn, _ = _prepare(name, w, None)
        got = fn(x)
        assert torch.equal(torch.isnan(got), torch.isnan(ref32)), name
        assert torch.equal(torch.isposinf(got), torch.isposinf(ref32)), name
        finite = torch.isfinite(ref32)
        assert finite.any() and torch.allclose(got[finite], ref32[finite], rtol=1e-2, atol=1e-2)


@needs_cxx
@pytest.mark.slow
def test_emulated_long_reduction_meets_the_exact_tolerance(emulation):
    """C*K*K = 4608 on the bench's data (outputs of one sign-heavy magnitude): the emulated tensor cores round
    each mma's sum toward zero, as the H100's did. Accumulating everything in the mma accumulator (flush 0)
    misses 1e-5 (the H100: 2.8e-5 at C*K*K = 4096); per-k-step partial sums (the default) meet it."""
    from convforge.harness.check import random_case
    x, w, _ = random_case((1, 512, 5, 5), (8, 512, 3, 3), seed=2)
    ref = _reference(x, w, None)
    fixed, _ = _prepare("cuda-igemm-3xtf32", w, None)
    assert relative_error(fixed(x), ref) <= conv.EXACT_TOLERANCE
    unflushed, _ = _prepare("cuda-igemm-3xtf32", w, None, config={"flush": 0})
    assert relative_error(unflushed(x), ref) > conv.EXACT_TOLERANCE


@needs_cxx
@pytest.mark.slow
def test_emulated_accuracy_on_wide_dynamic_range(emulation):
    """Inputs spanning 2^-20..2^20 and weights 1e-3..1e3: 3xTF32 still meets the exact tolerance; one TF32
    product does not."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 16, 8, 8, generator=g) * 2.0 ** torch.randint(-20, 21, (2, 16, 8, 8), generator=g).float()
    w = torch.randn(8, 16, 3, 3, generator=g) * torch.logspace(-3, 3, 8).view(-1, 1, 1, 1)
    ref = _reference(x, w, None)
    fn, _ = _prepare("cuda-igemm-3xtf32", w, None)
    assert relative_error(fn(x), ref) <= conv.EXACT_TOLERANCE
    fn1, _ = _prepare("cuda-igemm-tf32", w, None)
    assert relative_error(fn1(x), ref) > conv.EXACT_TOLERANCE


@needs_cxx
def test_emulated_denormals_read_as_zero(emulation):
    """As every CUDA kernel here (CuPy compiles with -ftz): a denormal input or weight counts as zero. Channel 0
    holds denormal inputs against 2^100 weights (products ~2^-30, they would dominate), channel 1 normal inputs
    against tiny weights (products ~2^-36), channel 2 normal inputs against a denormal weight times 2^-20."""
    g = torch.Generator().manual_seed(8)
    x = torch.rand(2, 3, 6, 6, generator=g) + 0.5
    x[:, 0] *= 2.0 ** -130
    w = torch.rand(3, 3, 2, 2, generator=g) + 0.5
    w[:, 0] *= 2.0 ** 100
    w[:, 1] *= 2.0 ** -36
    w[:, 2] *= 2.0 ** -128
    tiny = torch.finfo(torch.float32).tiny
    assert bool((x[:, 0].abs() < tiny).all()) and bool((w[:, 2].abs() < tiny).all())
    flushed = [torch.where(t.abs() < tiny, 0.0, t) for t in (x, w)]
    ref = _reference(flushed[0], flushed[1], None)
    assert relative_error(torch.from_numpy(_reference(x, w, None)).float(), ref) > 0.5   # the flush matters
    for name in NAMES:
        fn, tolerance = _prepare(name, w, None)
        assert relative_error(fn(x), ref) <= tolerance, name


@needs_cxx
def test_emulated_refuses_what_it_does_not_serve(emulation):
    x, w, b = _data((1, 4, 3, 8, 8, 3, 3), seed=1)
    fn, _ = _prepare("cuda-igemm-3xtf32", w, b)
    with pytest.raises(ValueError):
        fn(torch.zeros(1, 2, 8, 8))                       # channels
    with pytest.raises(ValueError):
        fn(torch.zeros(3, 8, 8))                          # rank
    with pytest.raises(ValueError):
        fn(torch.zeros(1, 3, 2, 8))                       # smaller than the kernel
    with pytest.raises(TypeError):
        fn(x.double())
    with pytest.raises(ValueError):
        fn(x, out=torch.zeros(1, 4, 5, 5))                # wrong out shape
    with pytest.raises(ValueError):
        cuda_igemm.prepare(w[0], b)                       # weight rank
    with pytest.raises(ValueError):
        cuda_igemm.prepare(w, b[:2])                      # bias shape


# -- on a GPU ------------------------------------------------------------------------------------------------

needs_gpu = pytest.mark.skipif(not (torch.cuda.is_available() and importlib.util.find_spec("cupy")),
                               reason="needs a CUDA GPU and cupy")


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_gpu_shapes_and_configs(name):
    for i, shape in enumerate(SHAPES + GPU_SHAPES):
        x, w, b = _data(shape, seed=zlib.crc32(f"{name}{shape}gpu".encode()), bias=i % 2 == 0)
        fn, tolerance = _prepare(name, w.cuda(), None if b is None else b.cuda())
        _check(fn, x.cuda(), _reference(x, w, b), tolerance, f"{name} {shape}")
    x, w, b = _data((2, 70, 12, 11, 13, 3, 2), seed=11)
    for config in cuda_igemm.LAUNCH_CONFIGS + cuda_igemm.SMALL_CONFIGS:
        fn, tolerance = _prepare(name, w.cuda(), b.cuda(), config=config)
        _check(fn, x.cuda(), _reference(x, w, b), tolerance, f"{name} {config}")
    # both k orders (and BK 16 / 32) where BK divides the channels: the seed-like and gpu-mode-like shapes
    for i, shape in enumerate(KORDER_SHAPES + GPU_SHAPES[0:3:2]):
        x, w, b = _data(shape, seed=zlib.crc32(f"{name}{shape}korder".encode()), bias=i % 2 == 1)
        ref = _reference(x, w, b)
        for config in ({"korder": 0}, {"korder": 1}, {"korder": 1, **cuda_igemm.LAUNCH_CONFIGS[3]}):
            if shape[2] % config.get("bk", 16) == 0:
                fn, tolerance = _prepare(name, w.cuda(), None if b is None else b.cuda(), config=config)
                _check(fn, x.cuda(), ref, tolerance, f"{name} {shape} {config}")


@needs_gpu
@pytest.mark.gpu
def test_gpu_tuning_entries_run_exact():
    """Every convforge/tuning/cuda-igemm.json entry's config and split, at a batch of 2 on its layer cut to 3
    rows of outputs (the full reduction), against float64 with a NaN-poisoned output."""
    from convforge import tuning
    for entry in tuning.entries(cuda_igemm.TUNING_IMPL):
        s = entry["shape"]
        rows = min(s["H"], s["K"] + 2)
        x, w, b = _data((2, s["M"], s["C"], rows, s["W"], s["K"], s["K"]), seed=s["M"] + s["C"] + s["K"])
        fn = cuda_igemm.prepare(w.cuda(), b.cuda(), precision=s["precision"], config=entry["config"])
        _check(fn, x.cuda(), _reference(x, w, b), 1e-5, f"tuned {s}")
