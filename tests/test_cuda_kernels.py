"""The CUDA C implementations compute the course's convolution: against the float64 reference, output poisoned
with NaN, on the preset layers and odd shapes, plain and fused, at each implementation's tolerance.

Two back ends run the same Python code (planning, weight packing, chunking, launches):
- a CUDA GPU through CuPy (skipped without one: "needs a CUDA GPU and cupy");
- the host emulation (``convforge.conv.cuda_emulate``: the kernels compiled with g++, one OS thread per CUDA
  thread) on small shapes, so CI without a GPU still checks every kernel's indexing, bounds and barriers.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from convforge import conv
from convforge.harness.check import poisoned, reference_layer, relative_error
from convforge.models import PRESETS
from conftest import assert_nonfinite_as_torch, check_layer_call as _check, needs_cxx

EXACT = ("cuda-naive", "cuda-tiled", "cuda-constmem", "cuda-unroll-gemm", "cuda-fused-gemm", "cuda-fused-layer",
         "cuda-direct", "cuda-auto", "cuda-igemm-3xtf32", "cuda-tc-3xtf32")
REDUCED = ("cuda-tc-tf32", "cuda-tc-fp16", "cuda-igemm-tf32")
FUSING = ("cuda-fused-layer", "cuda-direct", "cuda-auto")

# (B, M, C, H, W, K): edges (1x1 output, one row, one column, K = 1, K = H) and awkward sizes
ODD_SHAPES = (
    (1, 1, 1, 1, 1, 1), (2, 3, 2, 7, 7, 7), (3, 5, 3, 7, 40, 7), (2, 4, 2, 33, 5, 5), (2, 64, 16, 9, 9, 1),
    (5, 7, 3, 17, 23, 3), (2, 33, 5, 31, 29, 6), (1, 64, 16, 45, 38, 7), (3, 13, 1, 28, 30, 2),
    (0, 3, 2, 8, 8, 3),
)


def _has_gpu() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("cupy") is not None


needs_gpu = pytest.mark.skipif(not _has_gpu(), reason="needs a CUDA GPU and cupy")


def _preset_layers():
    """Distinct preset conv layers as (M, C, H, W, K) with the (activation, pool) a fusing kernel absorbs."""
    from convforge.harness.verify import model_layers
    seen = {}
    for preset in PRESETS.values():
        for spec in model_layers(preset.architecture):
            s = spec.shape
            seen.setdefault((s.M, s.C, s.H, s.W, s.K), spec.fusion)
    return seen


PRESET_LAYERS = _preset_layers()


def _data(shape, seed, bias, unit=False, device="cpu"):
    B, M, C, H, W, K = shape
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(B, C, H, W, generator=g) * 255.0 - 64.0
    std = 2.0 / (110.0 * (C * K * K) ** 0.5) if unit else 0.05   # unit: outputs of order 1 (tanh unsaturated)
    w = torch.randn(M, C, K, K, generator=g) * std
    b = torch.randn(M, generator=g) if bias else None
    return x.to(device), w.to(device), None if b is None else b.to(device)


def _tf32(t, nearest=True):
    """fp32 -> the TF32 value a tensor core multiplies: rounded to nearest, ties away (cvt.rna), or truncated."""
    bits = t.contiguous().view(torch.int32)
    bits = torch.where(torch.isfinite(t), (bits + 0x1000) & -0x2000, bits) if nearest else bits & -0x2000
    return bits.view(torch.float32)


def _reference(x, w, b, activation=None, pool=None):
    return reference_layer(x, w, b, activation, pool)


# -- on a GPU ------------------------------------------------------------------------------------------------

@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", EXACT + REDUCED)
@pytest.mark.parametrize("shape", list(PRESET_LAYERS), ids=lambda s: "M%d-C%d-H%d-W%d-K%d" % s)
def test_gpu_preset_layers(name, shape):
    impl = conv.get(name)
    for i, bias in enumerate((False, True)):
        x, w, b = _data((3, *shape), seed=zlib.crc32(f"{name}{shape}{i}".encode()), bias=bias, device="cuda")
        _check(impl.prepare(w, b), x, _reference(x, w, b), impl.tolerance, f"{name} {shape} bias={bias}")


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", EXACT + REDUCED)
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=lambda s: "B%d-M%d-C%d-H%d-W%d-K%d" % s)
def test_gpu_odd_shapes(name, shape):
    impl = conv.get(name)
    x, w, b = _data(shape, seed=sum(shape), bias=shape[0] % 2 == 1, device="cuda")
    _check(impl.prepare(w, b), x, _reference(x, w, b), impl.tolerance, f"{name} {shape}")


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", FUSING)
@pytest.mark.parametrize("case", [(s, f) for s, f in PRESET_LAYERS.items() if f] +
                         [((13, 3, 19, 23, 5), ("sigmoid", 2)), ((7, 2, 20, 17, 3), (None, 4)),
                          ((5, 4, 16, 16, 3), ("relu", 3)), ((64, 16, 12, 12, 5), ("tanh", 4))],
                         ids=lambda c: "M%d-C%d-H%d-W%d-K%d-" % c[0] + f"{c[1][0]}-pool{c[1][1]}")
def test_gpu_fused(name, case):
    shape, (activation, pool) = case
    impl = conv.get(name)
    x, w, b = _data((3, *shape), seed=sum(shape) + pool, bias=True, unit=True, device="cuda")
    ref = _reference(x, w, b, activation, pool)
    _check(impl.prepare_fused(w, b, activation, pool), x, ref, impl.tolerance, f"{name} {shape} {activation} {pool}")


@needs_gpu
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("shape,pool", [((24, 12, 33, 33, 7), 1), ((50, 1, 28, 28, 5), 1), ((12, 1, 72, 72, 7), 2),
                                        ((16, 4, 40, 40, 7), 4)])
def test_gpu_every_launch_config(shape, pool):
    """Every register tile the bench may sweep computes the same function."""
    from convforge.conv import cuda_fused_gemm, cuda_fused_layer
    x, w, b = _data((2, *shape), seed=7, bias=True, unit=pool > 1, device="cuda")
    activation = "relu" if pool > 1 else None
    ref = _reference(x, w, b, activation, pool if pool > 1 else None)
    geoms = cuda_fused_gemm.candidate_configs(*shape, pool=pool)
    tried = set()
    for geom in geoms:
        key = (geom.cfg.tm, geom.cfg.ht, geom.cfg.wt, geom.cfg.pu)
        if key in tried:
            continue
        tried.add(key)
        if pool > 1:
            fn = cuda_fused_layer.prepare_fused(w, b, activation, pool, config=geom.cfg)
        else:
            fn = cuda_fused_gemm.prepare(w, b, config=geom.cfg)
        _check(fn, x, ref, 1e-5, f"{shape} pool {pool} config {geom.cfg}")


@needs_gpu
@pytest.mark.gpu
def test_gpu_map_splits():
    """Map splits (ms > 1, grid.y) on the fa18 L2 shape and a pooled layer compute the same function."""
    from convforge.conv import cuda_fused_gemm, cuda_fused_layer
    x, w, b = _data((5, 24, 12, 33, 33, 7), seed=17, bias=True, device="cuda")
    ref = _reference(x, w, b)
    for config in ({"tm": 6, "wt": 4, "bh": 27, "ms": 4, "pipe": 1}, {"tm": 4, "wt": 4, "bh": 9, "ms": 3, "minb": 2},
                   {"tm": 3, "wt": 8, "bh": 14, "ms": 8}, {"tm": 12, "wt": 4, "bh": 27, "ms": 2, "pu": 7}):
        _check(cuda_fused_gemm.prepare(w, b, config=config), x, ref, 1e-5, f"config {config}")
    x, w, b = _data((3, 16, 4, 40, 40, 7), seed=18, bias=True, unit=True, device="cuda")
    _check(cuda_fused_layer.prepare_fused(w, b, "relu", 2, config={"tm": 4, "ht": 2, "wt": 4, "ms": 2}), x,
           _reference(x, w, b, "relu", 2), 1e-5, "fused-layer ms 2")


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("precision", ("tf32", "fp16"))
def test_gpu_tc_launch_configs(precision):
    from convforge.conv import cuda_tc
    x, w, b = _data((2, 24, 12, 33, 33, 7), seed=11, bias=True, device="cuda")
    ref = _reference(x, w, b)
    for config in cuda_tc.LAUNCH_CONFIGS:
        _check(cuda_tc.prepare(w, b, precision=precision, config=config), x, ref, 1e-2, f"tc {precision} {config}")
    for shape in ((3, 50, 1, 28, 28, 5), (2, 4, 1, 86, 86, 7), (3, 6, 1, 48, 47, 5), (2, 5, 3, 12, 11, 9)):
        x, w, b = _data(shape, seed=12, bias=True, device="cuda")
        ref = _reference(x, w, b)
        for config in cuda_tc.ROWS_LAUNCH_CONFIGS + ({"kernel": "rows", "pipe": 2}, {"kernel": "rows", "epi": 1},
                                                     {"kernel": "rows", "epi": 1, "nc": 4, "ib": 1}):
            _check(cuda_tc.prepare(w, b, precision=precision, config=config), x, ref, 1e-2,
                   f"tc rows {precision} {shape} {config}")


@needs_gpu
@pytest.mark.gpu
def test_gpu_tc_3xtf32_launch_shapes():
    """cuda-tc-3xtf32 at every launch shape the sweep tries, on the presets' plain second convs (64 images, so
    blocks loop over images) and on 3 images (blocks share an image's tiles): exact tolerance, where one TF32
    product (the known-wrong fixture) is not; NaN / +-Inf land where torch puts them."""
    from convforge.conv import cuda_tc
    from convforge.harness.sweep import _tc_candidates
    for shape in ((64, 24, 12, 33, 33, 7), (64, 24, 12, 33, 33, 5), (64, 16, 6, 30, 30, 5), (3, 16, 6, 22, 22, 5)):
        x, w, b = _data(shape, seed=21, bias=True, unit=True, device="cuda")
        ref = _reference(x, w, b)
        for config in _tc_candidates(cuda_tc, *shape[1:], "tf32x3"):
            _check(cuda_tc.prepare(w, b, precision="tf32x3", config=config), x, ref, 1e-5, f"3xtf32 {shape} {config}")
        one = relative_error(cuda_tc.prepare(w, b, precision="tf32")(x), ref)
        assert one > 1e-5, f"one TF32 product on {shape}: {one:.3g}, expected over the exact tolerance"
    _check_nonfinite(lambda w, b: cuda_tc.prepare(w, b, precision="tf32x3"), (4, 24, 12, 33, 33, 7), 84, "cuda",
                     "tc gather 3xtf32 (GPU)")


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name,shape", [(n, (1500, 16, 6, 22, 22, 5)) for n in EXACT + REDUCED] +
                         [(n, (1500, 16, 1, 22, 22, 5)) for n in REDUCED])   # C = 1: the rows kernel
def test_gpu_large_batch_side_stream_and_strided_out(name, shape):
    """Persistent blocks looping over many images, a non-default stream, a non-contiguous out buffer."""
    impl = conv.get(name)
    x, w, b = _data(shape, seed=3, bias=True, device="cuda")
    ref = F.conv2d(x.double(), w.double(), b.double())
    fn = impl.prepare(w, b)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = torch.full((1500, 16, 18, 18), float("nan"), device="cuda").transpose(2, 3)  # strided view
        if shape[2] == 1:   # the rows kernel's several units per block, with one and with two buffers
            from convforge.conv import cuda_tc
            for pipe in (1, 2):
                rows = cuda_tc.prepare(w, b, precision=impl.precision, config={"kernel": "rows", "pipe": pipe})
                error = float(((rows(x).double() - ref).norm() / ref.norm()).item())
                assert error <= impl.tolerance, f"{name} rows pipe {pipe}: relative error {error:.3g}"
        got = fn(x, out=out)
        total = got.sum()  # torch work ordered after the kernel on the same stream
    torch.cuda.current_stream().wait_stream(side)
    assert got is out
    error = float(((got.double() - ref).norm() / ref.norm()).item())
    assert error <= impl.tolerance, f"{name}: relative error {error:.3g}"
    assert torch.isfinite(total)


@needs_gpu
@pytest.mark.gpu
def test_gpu_constmem_layers_on_concurrent_streams():
    """Each prepared layer has its own constant bank, so layers may run on several streams at once."""
    impl = conv.get("cuda-constmem")
    cases = [_data((64, 8, 3, 30, 30, 5), seed=s, bias=True, device="cuda") for s in (1, 2, 3)]
    fns = [impl.prepare(w, b) for _, w, b in cases]
    streams = [torch.cuda.Stream() for _ in cases]
    outs = []
    for _ in range(3):
        for (x, w, b), fn, stream in zip(cases, fns, streams):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                outs.append(fn(x))
    torch.cuda.synchronize()
    for i, got in enumerate(outs):
        x, w, b = cases[i % len(cases)]
        ref = F.conv2d(x.double(), w.double(), b.double())
        assert float(((got.double() - ref).norm() / ref.norm()).item()) <= impl.tolerance


@needs_gpu
@pytest.mark.gpu
def test_gpu_constmem_chunks_large_filter_banks():
    """Filter banks over 64 KB go through the constant bank in pieces (maps, then channels)."""
    impl = conv.get("cuda-constmem")
    for shape in ((2, 40, 9, 12, 12, 7), (1, 2, 350, 8, 8, 7)):
        x, w, b = _data(shape, seed=5, bias=True, device="cuda")
        _check(impl.prepare(w, b), x, _reference(x, w, b), impl.tolerance, f"constmem {shape}")


# -- on the host emulation (no GPU needed) ------------------------------------------------------------------


def _module_prepare(name):
    impl = conv.get(name)
    module = importlib.import_module(f"convforge.conv.{impl.module}")
    if getattr(module, "PRECISIONS", None):
        return lambda w, b, **kw: module.prepare(w, b, precision=impl.precision, **kw), impl.tolerance
    return module.prepare, impl.tolerance


EMULATED_SHAPES = ((2, 5, 3, 12, 11, 5), (1, 1, 1, 1, 1, 1), (2, 3, 2, 7, 7, 7), (3, 4, 2, 9, 30, 3),
                   (2, 10, 1, 16, 16, 5), (0, 3, 2, 8, 8, 3))


@needs_cxx
@pytest.mark.slow
@pytest.mark.parametrize("name", EXACT + REDUCED)
def test_emulated_odd_shapes(emulation, name):
    prepare, tolerance = _module_prepare(name)
    for i, shape in enumerate(EMULATED_SHAPES):
        x, w, b = _data(shape, seed=100 + i, bias=i % 2 == 0)
        _check(prepare(w, b), x, _reference(x, w, b), tolerance, f"{name} {shape} (emulated)")


@needs_cxx
@pytest.mark.slow
@pytest.mark.parametrize("activation,pool", [("tanh", 2), ("relu", 4), ("sigmoid", 2), (None, 3)])
def test_emulated_fused(emulation, activation, pool):
    from convforge.conv import cuda_auto, cuda_direct, cuda_fused_layer
    shape = (2, 6, 2, 19, 23, 5)
    x, w, b = _data(shape, seed=pool, bias=True, unit=True)
    ref = _reference(x, w, b, activation, pool)
    _check(cuda_fused_layer.prepare_fused(w, b, activation, pool), x, ref, 1e-5, f"fused {activation} {pool}")
    _check(cuda_direct.prepare_fused(w, b, activation, pool), x, ref, 1e-5, f"direct fused {activation} {pool}")
    _check(cuda_auto.prepare_fused(w, b, activation, pool), x, ref, 1e-5, f"auto fused {activation} {pool}")
    one = (2, 5, 1, 17, 21, 5)                               # one channel: cuda-fused-layer's direct design
    x, w, b = _data(one, seed=pool + 10, bias=True, unit=True)
    fn = cuda_fused_layer.prepare_fused(w, b, activation, pool)
    assert type(fn.layer_for(17, 21)).__name__ == "DirectLayer"
    _check(fn, x, _reference(x, w, b, activation, pool), 1e-5, f"fused one channel {activation} {pool}")


@needs_cxx
@pytest.mark.slow
@pytest.mark.parametrize("activation,pool", [("relu", 2), (None, 4)])
def test_emulated_fused_nan_pools_to_nan(emulation, activation, pool):
    """A NaN in a pooling window pools to NaN and relu keeps it, as torch's max_pool2d and relu do (fmaxf
    drops NaN: found by tests/test_fuzz.py on an H200); other windows are unchanged."""
    import torch.nn.functional as F
    from convforge.conv import cuda_direct, cuda_fused_layer
    for shape in ((1, 3, 1, 12, 12, 1), (1, 4, 2, 13, 13, 3)):   # one channel (direct.cu), several (regtile.cu)
        x, w, b = _data(shape, seed=pool, bias=True, unit=True)
        x[0, 0, 5, 6] = float("nan")
        y = F.conv2d(x, w, b)
        want = F.max_pool2d(F.relu(y) if activation else y, pool)
        for name, fn in (("direct", cuda_direct.prepare_fused(w, b, activation, pool)),
                         ("fused-layer", cuda_fused_layer.prepare_fused(w, b, activation, pool))):
            got = fn(x)
            assert torch.equal(torch.isnan(got), torch.isnan(want)), f"{name} {shape}: NaN positions differ"
            finite = ~torch.isnan(want)
            assert torch.allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6), f"{name} {shape}"


@needs_cxx
@pytest.mark.slow
def test_emulated_global_memory_paths(emulation):
    """Shapes too large for shared memory read input and weights from global memory instead."""
    from convforge.conv import cuda_fused_gemm, cuda_fused_layer, cuda_tc
    original = emulation.cc.device_info
    emulation.cc.device_info = lambda device: emulation.cc.DeviceInfo(0, 2, 600, 2048, "90")
    try:
        shape = (2, 9, 3, 13, 15, 5)
        x, w, b = _data(shape, seed=9, bias=True, unit=True)
        geom = cuda_fused_gemm.plan(9, 3, 13, 15, 5, 1, smem_optin=600)
        assert not geom.xsmem
        _check(cuda_fused_gemm.prepare(w, b), x, _reference(x, w, b), 1e-5, "fused-gemm global")
        _check(cuda_fused_layer.prepare_fused(w, b, "tanh", 2), x, _reference(x, w, b, "tanh", 2), 1e-5,
               "fused-layer global")
        for precision in cuda_tc.GATHER_PRECISIONS:
            assert not cuda_tc.plan(9, 3, 13, 15, 5, precision, smem_optin=600).bsmem
            _check(cuda_tc.prepare(w, b, precision=precision), x, _reference(x, w, b), conv.tolerance_for(precision),
                   f"tc {precision} global")
    finally:
        emulation.cc.device_info = original


@needs_cxx
@pytest.mark.slow
def test_emulated_constmem_chunks_and_private_banks(emulation):
    """Large filter banks go in pieces; two prepared layers keep their own constant banks."""
    from convforge.conv import cuda_constmem
    for shape in ((1, 40, 9, 9, 9, 7), (1, 2, 350, 7, 8, 7)):
        x, w, b = _data(shape, seed=1, bias=True)
        _check(cuda_constmem.prepare(w, b), x, _reference(x, w, b), 1e-5, f"constmem {shape}")
    first, second = _data((2, 4, 2, 10, 10, 3), seed=2, bias=False), _data((2, 4, 2, 10, 10, 3), seed=3, bias=False)
    fn1, fn2 = cuda_constmem.prepare(first[1], None), cuda_constmem.prepare(second[1], None)
    for (x, w, b), fn in ((first, fn1), (second, fn2), (first, fn1)):
        _check(fn, x, _reference(x, w, b), 1e-5, "constmem, two layers alive")


@needs_cxx
@pytest.mark.slow
def test_emulated_direct_tiles_pieces_and_alignment(emulation):
    """cuda-direct: strips that do and do not divide the row (vector and scalar paths), several map groups,
    filter banks split into pieces, the channel loop rolled and unrolled, pointers only 4-byte aligned, a
    minimum-blocks launch bound, evict-first stores and several stored rows per thread."""
    from convforge.conv import cuda_direct
    cases = [((2, 10, 1, 16, 16, 5), None, {"mg": 4, "r": 4, "minb": 2}), ((2, 10, 1, 16, 17, 5), None, {"mg": 5, "r": 4}),
             ((1, 7, 1, 13, 14, 3), ("tanh", 2), {"mg": 3, "r": 4, "cs": 1}), ((2, 6, 1, 15, 16, 3), ("relu", 2), {"mg": 6, "r": 2}),
             ((1, 12, 3, 11, 13, 3), None, {"mg": 6, "r": 2}), ((1, 5, 2, 9, 9, 3), (None, 3), {"mg": 2, "r": 3}),
             # several stored rows per thread: plain (12 rows in tiles of 3), pooled (6 in tiles of 2), rolled C
             ((2, 6, 1, 14, 13, 3), None, {"mg": 3, "r": 4, "rows": 3}),
             ((1, 4, 1, 15, 16, 3), ("relu", 2), {"mg": 4, "r": 2, "rows": 2}),
             ((1, 6, 3, 10, 10, 3), None, {"mg": 6, "r": 4, "rows": 2, "uc": 0}),
             # row tiles in sequence down a strip (one channel): 4-wide, 2-wide and partial strips, pooled,
             # with several rows per tile, two map groups
             ((2, 6, 1, 16, 16, 5), None, {"mg": 3, "r": 4, "chunk": 4}),
             ((1, 5, 1, 14, 11, 3), None, {"mg": 5, "r": 4, "chunk": 3}),
             ((1, 4, 1, 13, 14, 3), None, {"mg": 4, "r": 2, "chunk": 11}),
             ((2, 6, 1, 14, 13, 3), ("tanh", 2), {"mg": 3, "r": 2, "chunk": 2}),
             ((1, 4, 1, 15, 16, 3), ("relu", 2), {"mg": 4, "r": 2, "rows": 2, "chunk": 3})]
    for shape, fusion, config in cases:
        x, w, b = _data(shape, seed=sum(shape), bias=True, unit=True)
        ref = _reference(x, w, b, *(fusion or (None, None)))
        fn = (cuda_direct.prepare_fused(w, b, *fusion, config=config) if fusion
              else cuda_direct.prepare(w, b, config=config))
        _check(fn, x, ref, 1e-5, f"direct {shape} {fusion} {config}")
    with pytest.raises(ValueError, match="must divide"):
        cuda_direct.prepare(w, b, config={"mg": 4, "r": 2, "rows": 5})(x)   # 8 stored rows in tiles of 5
    with pytest.raises(ValueError, match="one input channel"):
        cuda_direct.prepare(torch.randn(4, 2, 3, 3), None, config={"mg": 4, "r": 2, "chunk": 2})(torch.randn(1, 2, 8, 8))
    # a bank over 64 KB (pieces of maps) and a rolled channel loop
    shape = (1, 40, 9, 9, 9, 7)
    assert len(cuda_direct.pieces(40, 9, 7)) > 1
    x, w, b = _data(shape, seed=5, bias=True)
    _check(cuda_direct.prepare(w, b), x, _reference(x, w, b), 1e-5, "direct pieces")
    # vector loads and stores fall back to scalar ones on pointers aligned to 4 bytes only
    x, w, b = _data((2, 4, 1, 12, 12, 5), seed=6, bias=False)
    flat = torch.empty(x.numel() + 1)
    shifted = flat[1:].view_as(x).copy_(x)
    assert shifted.data_ptr() % 16 != 0
    _check(cuda_direct.prepare(w, None, config={"mg": 4, "r": 4}), shifted, _reference(x, w, None), 1e-5,
           "direct misaligned")


@needs_cxx
@pytest.mark.slow
def test_emulated_launch_configs(emulation):
    """A spread of listed register tiles (and both kernel-row unrolls) on a small layer."""
    from convforge.conv import cuda_fused_gemm
    shape = (2, 12, 3, 14, 13, 5)
    x, w, b = _data(shape, seed=4, bias=True)
    ref = _reference(x, w, b)
    for config in ({"tm": 12, "ht": 2, "wt": 4, "pu": 1}, {"tm": 5, "ht": 1, "wt": 8, "pu": 5},
                   {"tm": 3, "ht": 1, "wt": 4, "nt": 32, "bh": 3}, {"tm": 4, "ht": 1, "wt": 1},
                   {"tm": 6, "ht": 2, "wt": 2, "nt": 64, "bh": 2}):
        _check(cuda_fused_gemm.prepare(w, b, config=config), x, ref, 1e-5, f"config {config}")


@needs_cxx
def test_emulated_map_splits(emulation):
    """ms > 1 splits the map groups over grid.y: same function, weights staged per split, global paths too."""
    from convforge.conv import cuda_fused_gemm, cuda_fused_layer
    shape = (3, 12, 3, 14, 13, 5)
    x, w, b = _data(shape, seed=21, bias=True, unit=True)
    ref = _reference(x, w, b)
    for config in ({"tm": 4, "ht": 1, "wt": 4, "ms": 3}, {"tm": 3, "ht": 2, "wt": 2, "ms": 2, "bh": 4, "pipe": 1},
                   {"tm": 6, "ht": 1, "wt": 8, "ms": 2, "pu": 5}, {"tm": 2, "ht": 1, "wt": 4, "ms": 6, "nt": 32}):
        geom = cuda_fused_gemm.plan(12, 3, 14, 13, 5, 1, config=config)
        assert geom.cfg.ms == config["ms"] and geom.items == geom.mg // geom.cfg.ms * geom.rt * geom.g
        assert dict(geom.spec().constants)["CF_MS"] == config["ms"]
        _check(cuda_fused_gemm.prepare(w, b, config=config), x, ref, 1e-5, f"config {config}")
    _check(cuda_fused_layer.prepare_fused(w, b, "tanh", 2, config={"tm": 4, "ht": 2, "wt": 2, "ms": 3}), x,
           _reference(x, w, b, "tanh", 2), 1e-5, "fused-layer ms 3")
    assert "CF_MS" not in dict(cuda_fused_gemm.plan(12, 3, 14, 13, 5, 1, config={"tm": 4}).spec().constants)
    with pytest.raises(ValueError, match="ms must divide"):
        cuda_fused_gemm.plan(12, 3, 14, 13, 5, 1, config={"tm": 4, "ms": 2})
    original = emulation.cc.device_info
    emulation.cc.device_info = lambda device: emulation.cc.DeviceInfo(0, 2, 600, 2048, "90")
    try:   # input and weights from global memory (no shared memory to speak of)
        _check(cuda_fused_gemm.prepare(w, b, config={"tm": 4, "ms": 3}), x, ref, 1e-5, "global ms 3")
    finally:
        emulation.cc.device_info = original


@needs_cxx
def test_emulated_tc_gather_streaming_stores(emulation):
    """The gather kernel with evict-first output stores (cs=1), both precisions, an odd layer."""
    from convforge.conv import cuda_tc
    shape = (2, 10, 3, 11, 13, 5)
    x, w, b = _data(shape, seed=77, bias=True)
    for precision in cuda_tc.GATHER_PRECISIONS:
        fn = cuda_tc.prepare(w, b, precision=precision, config={"kernel": "gather", "rm": 1, "nt": 64, "cs": 1})
        assert fn.layer_for(shape[3], shape[4]).geom.cs == 1
        _check(fn, x, _reference(x, w, b), conv.tolerance_for(precision), f"tc gather cs=1 {precision}")


@needs_cxx
def test_emulated_tc_gather_splits_small_batches_over_blocks(emulation):
    """Fewer images than resident blocks: the gather kernel splits each image's position tiles over blocks (grid.y),
    both precisions, finite inputs and NaN / +-Inf ones (a block that saw one redoes its images' non-finite outputs,
    other blocks' tiles included)."""
    from convforge.conv import cuda_common as cc, cuda_tc
    shape = (1, 10, 3, 19, 21, 5)
    x, w, b = _data(shape, seed=78, bias=True)
    for precision in cuda_tc.GATHER_PRECISIONS:
        config = {"kernel": "gather", "rm": 1, "nt": 64}
        fn = cuda_tc.prepare(w, b, precision=precision, config=config)
        layer = fn.layer_for(shape[3], shape[4])
        grid = layer.grid(1)
        assert len(grid) == 2 and grid[0] == 1 and 1 < grid[1] <= cc.cdiv(layer.geom.pt, 2), grid
        assert layer.grid(layer.grid_cap) == (layer.grid_cap,)
        _check(fn, x, _reference(x, w, b), conv.tolerance_for(precision), f"tc gather grid.y {precision}")
        _check_nonfinite(lambda w, b: cuda_tc.prepare(w, b, precision=precision, config=config), shape, 79, "cpu",
                         f"tc gather grid.y {precision}", fp16_overflow=precision == "fp16")


@needs_cxx
def test_emulated_tc_3xtf32_is_exact_where_one_product_is_not(emulation):
    """3xTF32 on the gather kernel meets the exact tolerance on a preset-like second conv (C*K*K = 588, fa18 L2's
    reduction) and an odd one, at every launch shape the sweep tries; the one-product TF32 kernel on the same data,
    the known-wrong fixture for that tolerance, does not. Only the gather kernel serves 3xTF32, and it writes fp32."""
    from convforge.conv import cuda_tc
    for shape, seed in (((2, 24, 12, 13, 12, 7), 81), ((3, 5, 3, 9, 14, 4), 82)):
        x, w, b = _data(shape, seed=seed, bias=True, unit=True)
        ref = _reference(x, w, b)
        for config in ({"rm": 1, "nt": 64}, {"rm": 2, "nt": 128}, {"rm": 4, "nt": 128}):
            _check(cuda_tc.prepare(w, b, precision="tf32x3", config=config), x, ref, 1e-5, f"3xtf32 {shape} {config}")
        tf32 = relative_error(cuda_tc.prepare(w, b, precision="tf32")(x), ref)
        assert 1e-5 < tf32 <= 1e-2, f"one TF32 product: relative error {tf32:.3g}, expected between 1e-5 and 1e-2"
    with pytest.raises(ValueError, match="gather kernel only"):
        cuda_tc.prepare(w, b, precision="tf32x3", config={"kernel": "rows"})(x)
    with pytest.raises(ValueError, match="writes float32"):
        cuda_tc.prepare(w, b, precision="tf32x3", out_dtype=torch.float16)
    _check_nonfinite(lambda w, b: cuda_tc.prepare(w, b, precision="tf32x3"), (2, 6, 3, 12, 11, 5), 83, "cpu",
                     "tc gather 3xtf32")


@needs_cxx
@pytest.mark.slow
def test_emulated_tc_rows_kernel(emulation):
    """The tensor-core rows kernel (banded filter rows): several images per unit, odd widths, more than one
    channel, 9x9 filters, one and two staging buffers, map groups, both precisions."""
    from convforge.conv import cuda_tc
    cases = (((2, 10, 1, 16, 16, 5), None), ((3, 4, 1, 13, 19, 7), {"ib": 2}),
             ((2, 5, 3, 12, 11, 5), {"nc": 1, "mt": 2}), ((5, 6, 1, 12, 12, 5), {"nt": 64, "pipe": 2}),
             ((2, 3, 2, 20, 26, 9), {"nc": 4}), ((1, 1, 1, 1, 1, 1), None),
             # 2 emulated SMs, 5 units: each block loops over several units, with one and two buffers
             ((9, 3, 1, 10, 9, 3), {"ib": 2, "nt": 32, "pipe": 1}), ((9, 3, 1, 10, 9, 3), {"ib": 2, "nt": 32, "pipe": 2}),
             # the staged epilogue: output widths of 4k (16-byte rows), 4k+2 and odd, 1 to 4 column tiles
             ((2, 4, 1, 20, 20, 5), {"epi": 1, "nc": 4}), ((3, 5, 1, 13, 19, 7), {"epi": 1, "nc": 2, "ib": 2}),
             ((2, 3, 1, 12, 14, 3), {"epi": 1, "nc": 1}), ((2, 6, 2, 11, 17, 5), {"epi": 1, "nc": 3, "mt": 2}),
             ((5, 4, 1, 10, 16, 3), {"epi": 1, "nt": 64, "pipe": 2}),
             # evict-first stores on both epilogues; 5 column tiles per warp tile
             ((2, 4, 1, 20, 45, 5), {"epi": 1, "nc": 5, "cs": 1}), ((2, 3, 1, 12, 15, 3), {"nc": 5, "cs": 1}))
    for i, (shape, config) in enumerate(cases):
        x, w, b = _data(shape, seed=200 + i, bias=i % 2 == 0)
        for precision in cuda_tc.PRECISIONS:
            fn = cuda_tc.prepare(w, b, precision=precision, config=dict(config or {}, kernel="rows"))
            geom = fn.layer_for(shape[3], shape[4]).geom
            assert isinstance(geom, cuda_tc.RowsGeometry)
            _check(fn, x, _reference(x, w, b), 1e-2, f"tc rows {precision} {shape} {config}")


@needs_cxx
def test_emulated_tc_pairs_kernel(emulation):
    """The tensor-core pairs kernel (two output columns per mma row, 4 maps x 2 shifts per B tile), both
    precisions: even and odd output widths, partial map tiles, several channels, K 1 to 7 (FP16's odd K
    leaves a zero row in the last k step), images per unit, tiles per warp step, a unit's last partial tile,
    truncation instead of rounding, evict-first stores."""
    from convforge.conv import cuda_tc
    cases = (((2, 4, 1, 20, 20, 7), None), ((3, 12, 1, 13, 19, 7), {"rt": 1}), ((2, 5, 2, 12, 11, 5), {"nt": 64}),
             ((2, 3, 1, 9, 14, 3), {"ib": 2, "rt": 3}), ((9, 6, 1, 10, 9, 5), {"ib": 2, "nt": 32}),
             ((2, 7, 3, 8, 10, 4), {"round": 0, "cs": 1}), ((1, 2, 1, 3, 6, 1), None), ((1, 1, 1, 1, 1, 1), None))
    for i, (shape, config) in enumerate(cases):
        x, w, b = _data(shape, seed=260 + i, bias=i % 2 == 0)
        for precision in cuda_tc.PRECISIONS:
            fn = cuda_tc.prepare(w, b, precision=precision, config=dict(config or {}, kernel="pairs"))
            assert isinstance(fn.layer_for(shape[3], shape[4]).geom, cuda_tc.PairsGeometry)
            _check(fn, x, _reference(x, w, b), 1e-2, f"tc pairs {precision} {shape} {config}")
            # and exactly (fp32 accumulation only) against float64 on the inputs as the tensor cores see them:
            # TF32 rounded to nearest (truncated with round 0) with weights rounded to nearest, or FP16
            if precision == "fp16":
                xr, wr = x.half().float(), w.half().float()
            else:
                xr, wr = _tf32(x, nearest=(config or {}).get("round", 1) == 1), _tf32(w, nearest=True)
            _check(fn, x, _reference(xr, wr, b), 1e-5, f"tc pairs {precision} {shape} {config}, rounded inputs")


@needs_cxx
def test_emulated_tc_rows_staged_epilogue_never_gets_a_misaligned_out(emulation):
    """The staged epilogue's 16-byte stores: an out= buffer 8 bytes off a 16-byte boundary is written through
    an aligned temporary (a GPU would fault on the misaligned stores) and still filled correctly."""
    from convforge.conv import cuda_tc
    shape = (2, 4, 1, 13, 12, 5)                                   # 8 output columns: rows of 4k floats
    x, w, b = _data(shape, seed=230, bias=True)
    ref = _reference(x, w, b)
    for epi, alignment in ((1, 16), (0, 8)):
        fn = cuda_tc.prepare(w, b, precision="fp16", config={"kernel": "rows", "nc": 1, "epi": epi})
        layer = fn.layer_for(shape[3], shape[4])
        assert layer.store_alignment == alignment
        launched, kernel = [], layer.kernel
        layer.kernel = lambda grid, block, args, **kw: (launched.append(int(args[0])), kernel(grid, block, args, **kw))
        flat = torch.full((ref.size + 2,), float("nan"))
        out = flat[2:].view(ref.shape)                              # data_ptr = 8 (mod 16)
        assert out.data_ptr() % 16 == 8
        _check(fn, x, ref, 1e-2, f"misaligned out, epi {epi}")
        got = fn(x, out=out)
        assert got is out and relative_error(out, ref) <= 1e-2
        assert launched and all(ptr % alignment == 0 for ptr in launched), (epi, launched)


def test_fused_layer_design_by_channel_count():
    """cuda-fused-layer compiles cuda-direct's pooled kernel for one input channel and the register-tiled
    GEMM for several, unless the config names a design; a bad name is refused."""
    from convforge.conv import cuda_direct, cuda_fused_layer
    assert [s.source for s in cuda_fused_layer.kernel_specs(50, 1, 28, 28, 5, 2, "tanh")] == ["direct.cu"]
    assert [s.source for s in cuda_fused_layer.kernel_specs(16, 4, 40, 40, 7, 4, "relu")] == ["regtile.cu"]
    assert [s.source for s in cuda_fused_layer.kernel_specs(50, 1, 28, 28, 5, 2, "tanh",
                                                            config={"kernel": "regtile"})] == ["regtile.cu"]
    kind, cfg = cuda_fused_layer.design(4, {"kernel": "direct", "mg": 4, "r": 4})
    assert kind == "direct" and cfg == {"mg": 4, "r": 4}
    assert cuda_fused_layer.design(1, cuda_direct.DirectConfig(5, 2))[0] == "direct"
    with pytest.raises(ValueError, match="kernel must be one of"):
        cuda_fused_layer.design(1, {"kernel": "tc"})
    assert cuda_fused_layer.design(1, {"nt": 128})[0] == "regtile"      # a config without a design name
    # a sweep's --write-auto names the design of a cuda-fused-layer winner (its two designs share field names)
    from convforge.harness.sweep import _auto_config
    row = _auto_config("cuda-fused-layer", 1, cuda_direct.DirectConfig(6, 2, nt=256))
    assert row["kernel"] == "direct" and cuda_fused_layer.design(1, row)[0] == "direct"
    assert [s.source for s in cuda_fused_layer.kernel_specs(12, 1, 72, 72, 7, 2, "tanh", config=row)] == ["direct.cu"]
    regtile = _auto_config("cuda-fused-layer", 4, cuda_fused_layer.gemm.RegTileConfig(tm=4, nt=128))
    assert regtile["kernel"] == "regtile" and cuda_fused_layer.design(4, regtile)[0] == "regtile"
    assert _auto_config("cuda-direct", 1, cuda_direct.DirectConfig(6, 2)).keys().isdisjoint({"kernel"})


def test_tc_rows_planning():
    """The rows kernel's geometry: conflict-free pitches, images per unit chosen to fill 16-row tiles,
    its limits refused with a reason, and the tuned choice per precision."""
    from convforge.conv import cuda_tc
    g = cuda_tc.plan_rows(50, 1, 28, 28, 5, "tf32")
    assert g.pitch % 8 == 4 and g.ib * g.ho % 16 == 0 and g.row_waste == 0
    assert cuda_tc.plan_rows(50, 1, 28, 28, 5, "fp16").pitch % 16 == 8
    assert cuda_tc.plan_rows(4, 1, 86, 86, 7, "tf32", {"pipe": 2}).smem_bytes > \
        cuda_tc.plan_rows(4, 1, 86, 86, 7, "tf32").smem_bytes
    plain, staged = (cuda_tc.plan_rows(4, 1, 86, 86, 7, "fp16", {"nc": 4, "ib": 1, "epi": e}) for e in (0, 1))
    assert staged.smem_bytes - plain.smem_bytes == 4 * (128 // 32) * 16 * 40   # a 16 x 40-word scratch per warp
    assert cuda_tc.plan_rows(4, 1, 86, 86, 7, "fp16", {"nc": 1, "epi": 1}).epitch == 8   # 8 (mod 32): no conflicts
    with pytest.raises(ValueError, match="epi must be"):
        cuda_tc.plan_rows(4, 1, 30, 30, 5, "tf32", {"epi": 2})
    with pytest.raises(ValueError, match="K <= 9"):
        cuda_tc.plan_rows(4, 1, 30, 30, 11, "tf32")
    with pytest.raises(ValueError, match="unknown launch parameters"):
        cuda_tc.plan_rows(4, 1, 30, 30, 5, "tf32", {"warps": 4})
    assert cuda_tc.default_kernel(1, 5) == "rows" and cuda_tc.default_kernel(6, 5) == "gather"
    assert cuda_tc.default_kernel(1, 7, 12) == "pairs" and cuda_tc.default_kernel(1, 7, 4) == "rows"
    assert cuda_tc.default_kernel(1, 9, 12) == "rows" and cuda_tc.default_kernel(1, 5, 50) == "rows"
    pairs = cuda_tc.plan_pairs(4, 1, 86, 86, 7, "tf32")
    assert pairs.npr == 40 and pairs.ntl == 1 and pairs.b_registers == 14 and pairs.pitch % 32 == 24
    assert cuda_tc.plan_pairs(12, 1, 72, 72, 7, "fp16").b_registers == 3 * 4 * 2
    with pytest.raises(ValueError, match="K <= 7"):
        cuda_tc.plan_pairs(4, 1, 30, 30, 9, "tf32")
    with pytest.raises(ValueError, match="holds B in registers"):
        cuda_tc.plan_pairs(24, 12, 33, 33, 7, "tf32")
    assert isinstance(cuda_tc.plan_any(16, 6, 30, 30, 5, "fp16"), cuda_tc.TcGeometry)
    from convforge import tuning
    for entry in tuning.entries("cuda-tc"):   # every tuned entry is a valid plan
        cuda_tc.plan_any(**entry["shape"], config=entry["config"])



# -- non-finite inputs on the tensor-core kernels (issue #22) ------------------------------------------------
# The rows and pairs kernels multiply by banded weight matrices (zero taps) and the gather kernel re-reads a
# window's first element with a zero weight, so before the fix one NaN or Inf input turned whole 16 x 8 tiles
# NaN (Inf * 0). Now the outputs a non-finite value reached are recomputed in exact fp32 inside the kernel.

# (B, M, C, H, W, K) and the kernel config; None: what prepare() picks (the tuned kernel on preset layers)
TC_NONFINITE_PRESETS = (((1, 50, 1, 28, 28, 5), None), ((1, 12, 1, 72, 72, 7), None), ((1, 12, 1, 70, 70, 5), None),
                        ((1, 4, 1, 86, 86, 7), None), ((1, 16, 6, 22, 22, 5), None), ((1, 24, 12, 33, 33, 5), None))
TC_NONFINITE_ODD = (
    ((1, 1, 1, 1, 1, 1), {"kernel": "gather"}), ((1, 1, 1, 1, 1, 1), {"kernel": "rows"}),
    ((1, 1, 1, 1, 1, 1), {"kernel": "pairs"}),
    ((2, 5, 3, 12, 11, 5), {"kernel": "gather", "rm": 1, "nt": 64}), ((2, 9, 3, 9, 10, 3), {"kernel": "gather", "rm": 4}),
    ((3, 4, 1, 13, 19, 7), {"kernel": "rows", "ib": 2}), ((2, 5, 3, 12, 11, 5), {"kernel": "rows", "nc": 1, "mt": 2}),
    ((5, 6, 1, 12, 12, 5), {"kernel": "rows", "nt": 64, "pipe": 2}), ((3, 5, 1, 13, 19, 7), {"kernel": "rows", "epi": 1, "ib": 2}),
    ((2, 3, 2, 20, 26, 9), {"kernel": "rows", "nc": 4}), ((2, 4, 1, 20, 45, 5), {"kernel": "rows", "epi": 1, "nc": 5, "cs": 1}),
    ((3, 12, 1, 13, 19, 7), {"kernel": "pairs", "rt": 1}), ((2, 7, 3, 8, 10, 4), {"kernel": "pairs", "round": 0, "cs": 1}),
    ((9, 6, 1, 10, 9, 5), {"kernel": "pairs", "ib": 2, "nt": 32}), ((2, 3, 1, 9, 14, 3), {"kernel": "pairs", "ib": 2, "rt": 3}),
)


def _nonfinite_spots(shape, seed, fp16_overflow=False):
    """Where the non-finite values go: the first and the last element of the batch (the gather kernel's padded k
    re-reads a window's first element), an interior +Inf next to a -Inf (Inf - Inf = NaN where both reach), and
    a few seeded ones; FP16 also gets a finite 1e5, which converts to infinity in half precision."""
    B, M, C, H, W, K = shape
    g = torch.Generator().manual_seed(seed)
    spots = [(0, 0, 0, 0, math.inf), (B - 1, C - 1, H - 1, W - 1, math.nan),
             (B // 2, C // 2, H // 2, W // 2, math.inf), (B // 2, C // 2, H // 2, min(W - 1, W // 2 + 1), -math.inf)]
    for value in (math.nan, -math.inf, math.inf):
        spots.append(tuple(int(torch.randint(0, n, (1,), generator=g)) for n in (B, C, H, W)) + (value,))
    if fp16_overflow:   # first, so that a non-finite spot on the same element wins
        spots.insert(0, tuple(int(torch.randint(0, n, (1,), generator=g)) for n in (B, C, H, W)) + (1.0e5,))
    return spots


def _check_nonfinite(prepare, shape, seed, device, what, fp16_overflow=False):
    """``prepare(w, b)``'s layer on x with NaN / +Inf / -Inf (spots above): the NaN, +Inf and -Inf positions of
    the output are those of torch's fp32 conv on the CPU, and every finite value is within 1e-2 x its terms'
    magnitudes of the float64 reference (element-wise, as tests/test_fuzz.py's property), with out poisoned
    with NaN and without. Returns the prepared layer."""
    x, w, b = _data(shape, seed=seed, bias=seed % 2 == 0)
    fn = prepare(w.to(device), None if b is None else b.to(device))
    spots = _nonfinite_spots(shape, seed, fp16_overflow)
    for i, c, h, col, value in spots:
        x[i, c, h, col] = value
    want = F.conv2d(x, w, b).numpy().astype(np.float64)
    ref = reference_layer(x, w, b)
    clean = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0).abs()
    magnitude = reference_layer(clean, w.abs(), None if b is None else b.abs())
    assert not np.isfinite(want).all(), f"{what}: the case should reach non-finite outputs"
    for out in (poisoned(want.shape, device), None):
        got = fn(x.to(device), out=out).cpu().numpy().astype(np.float64)
        label = f"{what} spots={spots} out={'poisoned' if out is not None else None}"
        assert_nonfinite_as_torch(got, want, np.asarray(ref, dtype=np.float64), 1e-2 * np.asarray(magnitude), label)
    return fn


@needs_cxx
@pytest.mark.slow
@pytest.mark.parametrize("precision", ("tf32", "fp16"))
@pytest.mark.parametrize("case", TC_NONFINITE_PRESETS + TC_NONFINITE_ODD,
                         ids=lambda c: "B%d-M%d-C%d-H%d-W%d-K%d" % c[0] + "-" + str((c[1] or {}).get("kernel", "tuned")))
def test_emulated_tc_nonfinite_inputs_as_torch(emulation, precision, case):
    """NaN, +Inf and -Inf in the input of every tensor-core kernel (gather, rows, pairs) on the preset layers
    (the tuned kernel) and odd shapes and launch configs: NaN/Inf where torch's fp32 conv has them, the rest
    within the reduced-precision bound; FP16 also gets a finite input beyond half precision's range."""
    from convforge.conv import cuda_tc
    shape, config = case
    fn = _check_nonfinite(lambda w, b: cuda_tc.prepare(w, b, precision=precision, config=config), shape,
                          zlib.crc32(repr(case).encode()), "cpu", f"tc {precision} {shape} {config}",
                          fp16_overflow=precision == "fp16")
    if config:
        assert {"gather": cuda_tc.TcGeometry, "rows": cuda_tc.RowsGeometry,
                "pairs": cuda_tc.PairsGeometry}[config["kernel"]] is type(fn.layer_for(shape[3], shape[4]).geom)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("precision", ("tf32", "fp16"))
@pytest.mark.parametrize("case", TC_NONFINITE_PRESETS + TC_NONFINITE_ODD +
                         (((1500, 16, 1, 22, 22, 5), {"kernel": "rows"}), ((1500, 16, 1, 22, 22, 5), {"kernel": "pairs"}),
                          ((1500, 16, 6, 22, 22, 5), {"kernel": "gather"})),
                         ids=lambda c: "B%d-M%d-C%d-H%d-W%d-K%d" % c[0] + "-" + str((c[1] or {}).get("kernel", "tuned")))
def test_gpu_tc_nonfinite_inputs_as_torch(precision, case):
    """The emulated test's cases on the GPU (the real mma.sync and its NaN/Inf handling), and 1500 images: persistent
    blocks over many units, of which only some hold a non-finite value."""
    from convforge.conv import cuda_tc
    shape, config = case
    _check_nonfinite(lambda w, b: cuda_tc.prepare(w, b, precision=precision, config=config), shape,
                     zlib.crc32(repr(case).encode()), "cuda", f"tc {precision} {shape} {config}",
                     fp16_overflow=precision == "fp16")


def test_emulation_is_suspended_for_gpu_tests(emulation):
    """Inside the module's emulation, ``suspended`` puts the real device layer back and then the emulated one."""
    from convforge.conv import cuda_common as cc
    assert cc.DEVICE_TYPE == "cpu"
    with emulation.suspended():
        assert cc.DEVICE_TYPE == "cuda"
    assert cc.DEVICE_TYPE == "cpu"


HALF_OUTPUT_CASES = (((3, 16, 6, 22, 22, 5), {"kernel": "gather"}),
                     ((2, 5, 3, 12, 11, 5), {"kernel": "gather", "rm": 1}),
                     ((2, 24, 12, 17, 19, 7), None))


def _check_half_output(shape, config, device, seed):
    """cuda-tc-fp16 asked for an FP16 output (the engine's fast-path hand-off to a dense layer): the gather kernel
    writes float16 within the reduced tolerance of float64, into a NaN-poisoned float16 ``out`` and into its own
    buffer, NaN/Inf where torch's fp32 conv has them (its exact pass stores FP16 too); other kernels say float32."""
    from convforge.conv import cuda_tc
    x, w, b = _data(shape, seed=seed, bias=True)
    fn = cuda_tc.prepare(w.to(device), b.to(device), precision="fp16", config=config, out_dtype=torch.float16)
    ref = _reference(x, w, b)
    out = torch.full(ref.shape, float("nan"), dtype=torch.float16, device=device)
    got = fn(x.to(device), out=out)
    assert got is out and got.dtype == torch.float16
    assert relative_error(got.float(), ref) <= 1e-2
    fresh = fn(x.to(device))
    assert fresh.dtype == torch.float16 and relative_error(fresh.float(), ref) <= 1e-2
    for i, c, h, col, value in _nonfinite_spots(shape, seed):
        x[i, c, h, col] = value
    want = F.conv2d(x, w, b).numpy().astype(np.float64)
    got = fn(x.to(device)).float().cpu().numpy().astype(np.float64)
    clean = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0).abs()
    bound = 1e-2 * np.asarray(reference_layer(clean, w.abs(), b.abs()), dtype=np.float64)
    assert_nonfinite_as_torch(got, want, np.asarray(reference_layer(x, w, b), dtype=np.float64), bound,
                              f"tc fp16 half output {shape} {config}")
    with pytest.raises(ValueError, match="float16"):
        fn(x.to(device), out=torch.empty(ref.shape, device=device))
    rows = cuda_tc.prepare(w.to(device), b.to(device), precision="fp16", config={"kernel": "rows"},
                           out_dtype=torch.float16)
    assert rows(x.to(device)).dtype == torch.float32   # only the gather kernel writes FP16


# The gather kernel's FP16 image pairs (xh=1: FP16 only, even widths): K odd (each kernel row padded with a zero tap,
# whose input is the next row's first or the image's padding) and even, a 1 x 2 image, sp19 L2's tuned launch.
XH_CASES = (((2, 5, 3, 12, 10, 5), {"kernel": "gather", "xh": 1, "rm": 1, "nt": 64}),
            ((2, 9, 3, 9, 10, 4), {"kernel": "gather", "xh": 1, "rm": 4}),
            ((1, 1, 1, 1, 2, 1), {"kernel": "gather", "xh": 1}),
            ((2, 16, 6, 22, 22, 5), {"kernel": "gather", "xh": 1, "rm": 2, "nt": 128, "cs": 1}))


def _check_xh(shape, config, device, seed):
    """xh=1 against float64 (reduced tolerance, out poisoned), NaN/Inf where torch puts them, and with an FP16
    output."""
    from convforge.conv import cuda_tc
    x, w, b = _data(shape, seed=seed, bias=True)
    fn = cuda_tc.prepare(w.to(device), b.to(device), precision="fp16", config=config)
    assert fn.layer_for(shape[3], shape[4]).geom.xh == 1
    _check(fn, x.to(device), _reference(x, w, b), 1e-2, f"tc xh {shape} {config}")
    _check_nonfinite(lambda w, b: cuda_tc.prepare(w, b, precision="fp16", config=config), shape, seed + 1, device,
                     f"tc xh {shape} {config}", fp16_overflow=True)
    _check_half_output(shape, config, device, seed + 2)


@needs_cxx
@pytest.mark.parametrize("case", XH_CASES, ids=str)
def test_emulated_tc_fp16_image_pairs(emulation, case):
    _check_xh(*case, "cpu", zlib.crc32(repr(case).encode()))


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("case", XH_CASES + (((1500, 16, 6, 30, 30, 5), {"kernel": "gather", "xh": 1}),), ids=str)
def test_gpu_tc_fp16_image_pairs(case):
    _check_xh(*case, "cuda", zlib.crc32(repr(case).encode()))


def test_tc_fp16_image_pairs_refuse_odd_widths_and_tf32():
    from convforge.conv import cuda_tc
    with pytest.raises(ValueError, match="xh=1"):
        cuda_tc.plan(16, 6, 22, 21, 5, "fp16", {"xh": 1})
    with pytest.raises(ValueError, match="xh=1"):
        cuda_tc.plan(16, 6, 22, 22, 5, "tf32", {"xh": 1})
    geom = cuda_tc.plan(16, 6, 30, 30, 5, "fp16", {"xh": 1})
    assert (geom.ke, geom.kr, geom.kp, geom.xs_floats) == (6, 180, 192, 2 * (6 * 30 * 30 // 2 + 1))


@needs_cxx
@pytest.mark.parametrize("case", HALF_OUTPUT_CASES[:2], ids=str)
def test_emulated_tc_fp16_half_output(emulation, case):
    _check_half_output(*case, "cpu", zlib.crc32(repr(case).encode()))


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("case", HALF_OUTPUT_CASES, ids=str)
def test_gpu_tc_fp16_half_output(case):
    _check_half_output(*case, "cuda", zlib.crc32(repr(case).encode()))


# -- the fast path's FP16 hand-off from the first conv to the second (engine.HALF_CONV_HANDOFF) ---------------
# cuda-direct writes FP16 (out_dtype, CF_OUT_HALF) and the gather kernel reads it (in_dtype, CF_IN_HALF).

# (B, M, C, H, W, K), fusion or None, launch config: 2-wide stores (sp19 L1's tuned shape at 20 x 20), 4-wide, a
# partial last strip (scalar stores), row tiles in sequence, several map groups, plain (unpooled)
DIRECT_HALF_CASES = (((2, 6, 1, 20, 20, 5), ("tanh", 2), {"mg": 6, "r": 4, "nt": 128}),
                     ((2, 6, 1, 28, 28, 5), ("tanh", 2), {"mg": 3, "r": 8}),
                     ((1, 4, 1, 16, 16, 3), ("sigmoid", 2), {"mg": 2, "r": 4, "cs": 1}),
                     ((2, 6, 1, 14, 13, 3), ("tanh", 2), {"mg": 3, "r": 2, "chunk": 2}),
                     ((2, 5, 1, 12, 12, 5), None, {"mg": 5, "r": 4}))


def _check_direct_half_output(shape, fusion, config, device, seed):
    """cuda-direct asked for FP16: float16 within the reduced tolerance of float64 into a NaN-poisoned float16 out
    and its own buffer, also on 4-byte aligned pointers (scalar stores); fused, NaN/Inf where torch's fp32
    conv + activation + pool has them."""
    from convforge.conv import cuda_direct
    x, w, b = _data(shape, seed=seed, bias=True, unit=True)
    def prepare(**kw):
        if fusion:
            return cuda_direct.prepare_fused(w.to(device), b.to(device), *fusion, config=config, **kw)
        return cuda_direct.prepare(w.to(device), b.to(device), config=config, **kw)

    fn = prepare(out_dtype=torch.float16)
    ref = _reference(x, w, b, *(fusion or (None, None)))
    out = torch.full(ref.shape, float("nan"), dtype=torch.float16, device=device)
    got = fn(x.to(device), out=out)
    assert got is out and got.dtype == torch.float16
    assert relative_error(got.float(), ref) <= 1e-2, relative_error(got.float(), ref)
    exact = prepare()(x.to(device))   # the fp32 kernel, rounded to FP16 the same way (nearest even)
    assert exact.dtype == torch.float32 and torch.equal(exact.half(), got), f"direct half {shape} {config}"
    flat = torch.empty(x.numel() + 1, device=device)
    shifted = flat[1:].view_as(x).copy_(x.to(device))
    assert shifted.data_ptr() % 16 != 0
    assert torch.equal(fn(shifted), got)
    with pytest.raises(ValueError, match="float16"):
        fn(x.to(device), out=torch.empty(ref.shape, device=device))
    if fusion:
        for i, c, h, col, value in _nonfinite_spots(shape, seed):
            x[i, c, h, col] = value
        act = {"tanh": torch.tanh, "sigmoid": torch.sigmoid}[fusion[0]]
        want = F.max_pool2d(act(F.conv2d(x, w, b)), fusion[1]).numpy().astype(np.float64)
        assert not np.isfinite(want).all()
        got = fn(x.to(device)).float().cpu().numpy().astype(np.float64)
        assert_nonfinite_as_torch(got, want, want, np.full(want.shape, 2e-3), f"direct half {shape} non-finite")


@needs_cxx
@pytest.mark.parametrize("case", DIRECT_HALF_CASES, ids=str)
def test_emulated_direct_half_output(emulation, case):
    _check_direct_half_output(*case, "cpu", zlib.crc32(repr(case).encode()))


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("case", DIRECT_HALF_CASES + (((1500, 6, 1, 48, 48, 5), ("tanh", 2), None),
                                                      ((1500, 6, 1, 64, 64, 5), ("tanh", 2), None)), ids=str)
def test_gpu_direct_half_output(case):
    _check_direct_half_output(*case, "cuda", zlib.crc32(repr(case).encode()))


# (B, M, C, H, W, K), config: sp19 L2's tuned launch (FP16 pairs), odd and even K with pairs, a 1 x 2 image, the
# fp32-image gather (IMG % 4 == 0: 8-byte loads, else scalar ones), the rows kernel (widens FP16 first)
TC_HALF_INPUT_CASES = (((3, 16, 6, 22, 22, 5), {"kernel": "gather", "xh": 1, "rm": 2, "nt": 128, "cs": 1}),
                       ((2, 5, 3, 12, 10, 5), {"kernel": "gather", "xh": 1, "rm": 1, "nt": 64}),
                       ((2, 9, 3, 9, 10, 4), {"kernel": "gather", "xh": 1, "rm": 4}),
                       ((1, 1, 1, 1, 2, 1), {"kernel": "gather", "xh": 1}),
                       ((2, 5, 3, 12, 11, 5), {"kernel": "gather", "rm": 1}),
                       ((2, 7, 4, 9, 9, 3), {"kernel": "gather"}),
                       ((2, 5, 3, 9, 11, 3), {"kernel": "gather", "nt": 64}),
                       ((2, 6, 1, 12, 12, 5), {"kernel": "rows"}))


def _check_tc_half_input(shape, config, device, seed):
    """cuda-tc-fp16 given an FP16 x (in_dtype): within the reduced tolerance of float64 over the FP16 values, into
    NaN-poisoned float32 and float16 outs; the same layer still takes a float32 x; NaN/Inf in the FP16 x land
    where torch's fp32 conv of the widened x puts them (the exact pass reads FP16)."""
    from convforge.conv import cuda_tc
    B, M, C, H, W, K = shape
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(B, C, H, W, generator=g) * 2 - 1).half()      # a tanh'd, pooled map: |x| <= 1
    w = torch.randn(M, C, K, K, generator=g) / (C * K * K) ** 0.5
    b = torch.randn(M, generator=g) * 0.1
    ref = _reference(x.float(), w, b)
    for out_dtype in (torch.float32, torch.float16):
        fn = cuda_tc.prepare(w.to(device), b.to(device), precision="fp16", config=config, out_dtype=out_dtype,
                             in_dtype=torch.float16)
        layer = fn.layer_for(H, W)
        assert getattr(layer.geom, "in_half", False) == (config["kernel"] == "gather")
        out = torch.full(ref.shape, float("nan"), dtype=layer.out_dtype, device=device)
        got = fn(x.to(device), out=out)
        assert got is out
        assert relative_error(got.float(), ref) <= 1e-2, f"tc half input {shape} {config}"
        assert relative_error(fn(x.to(device)).float(), ref) <= 1e-2
        assert relative_error(fn(x.float().to(device)).float(), ref) <= 1e-2   # a float32 x: the other kernel
    xs = x.float()
    for i, c, h, col, value in _nonfinite_spots(shape, seed):
        xs[i, c, h, col] = value
    x = xs.half()
    want = F.conv2d(x.float(), w, b).numpy().astype(np.float64)
    clean = torch.nan_to_num(x.float(), nan=0.0, posinf=0.0, neginf=0.0).abs()
    bound = 1e-2 * np.asarray(reference_layer(clean, w.abs(), b.abs()), dtype=np.float64)
    got = fn(x.to(device)).float().cpu().numpy().astype(np.float64)
    assert_nonfinite_as_torch(got, want, np.asarray(reference_layer(x.float(), w, b), dtype=np.float64), bound,
                              f"tc half input {shape} {config} non-finite")


@needs_cxx
@pytest.mark.parametrize("case", TC_HALF_INPUT_CASES, ids=str)
def test_emulated_tc_fp16_half_input(emulation, case):
    _check_tc_half_input(*case, "cpu", zlib.crc32(repr(case).encode()))


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("case", TC_HALF_INPUT_CASES + (((1500, 16, 6, 22, 22, 5), None), ((1500, 16, 6, 30, 30, 5), None),
                                                        ((1500, 16, 6, 22, 22, 5), {"kernel": "gather"})), ids=str)
def test_gpu_tc_fp16_half_input(case):
    shape, config = case
    _check_tc_half_input(shape, config or {"kernel": "gather", **(cuda_tc_tuned(shape) or {})}, "cuda",
                         zlib.crc32(repr(case).encode()))


def cuda_tc_tuned(shape):
    """The tuned FP16 config of a (B, M, C, H, W, K) layer, without its "kernel" key."""
    from convforge.conv import cuda_tc
    cfg = cuda_tc.tuned_config(*shape[1:], "fp16") or {}
    return {k: v for k, v in cfg.items() if k != "kernel"}


def test_tc_half_input_refuses_tf32():
    from convforge.conv import cuda_tc
    with pytest.raises(ValueError, match="in_dtype"):
        cuda_tc.prepare(torch.randn(4, 2, 3, 3), None, precision="tf32", in_dtype=torch.float16)
    geom = cuda_tc.plan(16, 6, 22, 22, 5, "fp16", {"xh": 1}, in_half=True)
    assert geom.in_half and geom.xsmem and geom.spec().constant("CF_IN_HALF") == 1


# -- the pool kernel (cuda/tc_pool.cu): conv + act + 2x2 max pool on FP16 tensor cores, each window in one lane --
# (B, M, C, H, W, K), activation, launch config (None: the tuned or modelled one). Odd widths and heights (a conv
# row or column past the last window), one and several channels, one to five column tiles a warp tile, units that
# straddle images, both staging modes, a 1x1 pooled map.
TC_POOL_CASES = (
    ((3, 4, 1, 16, 18, 7), "relu", None), ((2, 5, 1, 12, 12, 5), "tanh", None),
    ((3, 6, 2, 13, 15, 3), "sigmoid", {"ib": 2, "nc": 1}), ((4, 9, 1, 11, 20, 5), None, {"pipe": 2, "mt": 3}),
    ((2, 4, 1, 30, 30, 7), "relu", {"nc": 5, "cs": 1}), ((5, 3, 1, 11, 10, 9), "tanh", {"nt": 64}),
    ((1, 1, 1, 2, 2, 1), "relu", None), ((3, 7, 1, 4, 3, 2), None, {"ib": 3, "nc": 2}),
    ((1, 12, 1, 40, 38, 5), "tanh", {"mt": 4, "nt": 64}),   # one unit's 48 tiles split over blocks (grid.y)
)


def _check_tc_pool(shape, activation, config, device, seed):
    """prepare_fused of cuda-tc-fp16 on the pool kernel: float32 and FP16 outputs within the reduced tolerance of
    float64 (poisoned out and fresh); then NaN / +-Inf / an FP16-overflowing input: NaN and Inf where torch's fp32
    conv + activation + max pool put them, finite values within 1e-2 x their window terms' magnitude."""
    from convforge.conv import cuda_tc
    x, w, b = _data(shape, seed=seed, bias=seed % 2 == 0, unit=True)
    w, b = w.to(device), None if b is None else b.to(device)
    ref = _reference(x, w.cpu(), None if b is None else b.cpu(), activation, 2)
    fn = cuda_tc.prepare_fused(w, b, activation, 2, precision="fp16", config=config)
    layer = fn.layer_for(shape[3], shape[4])
    assert isinstance(layer, cuda_tc.PoolLayer)
    if layer.geom.tiles >= 2 * layer.geom.nt // 32 and shape[0] <= layer.geom.ib:
        assert layer.grid(shape[0])[1] > 1, "a unit's tiles are split over blocks when units are few"
    _check(fn, x.to(device), ref, 1e-2, f"tc pool {shape} {activation} {config}")
    half = cuda_tc.prepare_fused(w, b, activation, 2, precision="fp16", config=config, out_dtype=torch.float16)
    out = torch.full(ref.shape, float("nan"), dtype=torch.float16, device=device)
    got = half(x.to(device), out=out)
    assert got is out and relative_error(got.float(), ref) <= 1e-2, f"tc pool FP16 out {shape}"
    spots = _nonfinite_spots(shape, seed, fp16_overflow=True)
    for i, c, h, col, value in spots:
        x[i, c, h, col] = value
    act = {None: lambda v: v, "tanh": torch.tanh, "relu": torch.relu, "sigmoid": torch.sigmoid}[activation]
    want = act(F.max_pool2d(F.conv2d(x, w.cpu(), None if b is None else b.cpu()), 2)).numpy().astype(np.float64)
    clean = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0).abs()
    magnitude = F.max_pool2d(torch.from_numpy(np.asarray(reference_layer(clean, w.abs().cpu(),
                                                                      None if b is None else b.abs().cpu()))), 2)
    for run in (fn, half):
        got = run(x.to(device)).float().cpu().numpy().astype(np.float64)
        assert_nonfinite_as_torch(got, want, np.asarray(_reference(x, w.cpu(), None if b is None else b.cpu(),
                                                                   activation, 2), dtype=np.float64),
                                  1e-2 * np.asarray(magnitude, dtype=np.float64) + (1e-3 if run is half else 0.0),
                                  f"tc pool {shape} {activation} {config} spots={spots}")


@needs_cxx
@pytest.mark.slow
@pytest.mark.parametrize("case", TC_POOL_CASES, ids=lambda c: "B%d-M%d-C%d-H%d-W%d-K%d" % c[0] + f"-{c[1]}")
def test_emulated_tc_pool_kernel(emulation, case):
    _check_tc_pool(*case, "cpu", zlib.crc32(repr(case).encode()))


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("case", TC_POOL_CASES + tuple(((1500, M, 1, H, W, K), fusion[0], None)
                                                        for (M, C, H, W, K), fusion in PRESET_LAYERS.items()
                                                        if C == 1 and fusion is not None and fusion[1] == 2),
                         ids=lambda c: "B%d-M%d-C%d-H%d-W%d-K%d" % c[0] + f"-{c[1]}")
def test_gpu_tc_pool_kernel(case):
    """The emulated cases on the GPU (the real mma.sync fragments), and the preset first convs at 1500 images."""
    _check_tc_pool(*case, "cuda", zlib.crc32(repr(case).encode()))


@needs_cxx
def test_emulated_tc_fused_beyond_the_pool_kernel(emulation):
    """What the pool kernel does not serve (TF32, a pool of 3, K > 9, a tile past shared memory) runs the unfused
    kernel and torch's pool; a launch shape asked for by name that does not fit fails as asked."""
    from convforge.conv import cuda_tc
    for shape, activation, pool, precision in (((2, 4, 1, 14, 15, 5), "tanh", 2, "tf32"),
                                               ((2, 4, 1, 14, 15, 5), "relu", 3, "fp16"),
                                               ((1, 3, 1, 14, 12, 11), None, 2, "fp16"),
                                               # verify's random case 2: one image's 14 channels of 65x92 alone
                                               # outgrow shared memory (409 KB) -- found by verify on an H200
                                               ((1, 12, 14, 65, 92, 1), "sigmoid", 2, "fp16")):
        x, w, b = _data(shape, seed=pool, bias=True, unit=True)
        fn = cuda_tc.prepare_fused(w, b, activation, pool, precision=precision)
        assert isinstance(fn.layer_for(shape[3], shape[4]), cuda_tc.UnfusedPool)
        _check(fn, x, _reference(x, w, b, activation, pool), 1e-2, f"tc fused {shape} {pool} {precision}")
    with pytest.raises(cuda_tc.TileTooLarge, match="does not fit shared memory"):
        cuda_tc.prepare_fused(w, b, activation, 2, config={"ib": 1})(x)


def test_tc_pool_planning():
    """The pool kernel's geometry: pitches of 4 or 12 (mod 16) floats (conflict-free 8-byte loads of rows two
    apart), column tiles without padding on the preset first convs, the tuned or modelled launch as a config."""
    from convforge.conv import cuda_tc
    for M, H, K, nc in ((50, 28, 5, 3), (6, 64, 5, 4), (6, 48, 5, 3), (12, 72, 7, 3), (12, 70, 5, 3), (4, 86, 7, 5)):
        g = cuda_tc.plan_pool(M, 1, H, H, K, config={})          # the modelled launch
        assert g.pitch % 16 in (4, 12) and g.pitch >= max(H, g.cg * g.nc * 8 + 8)
        assert g.nc == nc and g.ct <= g.cg * g.nc and g.mt * g.nc * 4 <= cuda_tc.ROWS_MAX_ACC
        tuned = cuda_tc.plan_pool(M, 1, H, H, K)                  # convforge/tuning/cuda-tc-pool.json's winner
        assert cuda_tc.pool_config(M, 1, H, H, K) == {key: getattr(tuned, key) for key in cuda_tc.POOL_CONFIG_KEYS}
        assert tuned.ct <= tuned.cg * tuned.nc and tuned.pitch % 16 in (4, 12)
    assert cuda_tc.plan_pool(4, 1, 86, 86, 7, config={"pipe": 2}).smem_bytes > \
        cuda_tc.plan_pool(4, 1, 86, 86, 7, config={"pipe": 2, "ib": 1}).smem_bytes / 2
    assert not cuda_tc.pool_serves(1, 28, 28, 11, 2, "fp16") and not cuda_tc.pool_serves(1, 28, 28, 5, 2, "tf32")
    assert not cuda_tc.pool_serves(1, 5, 5, 5, 2, "fp16") and not cuda_tc.pool_serves(1, 28, 28, 5, 4, "fp16")
    with pytest.raises(ValueError, match="unknown launch parameters"):
        cuda_tc.plan_pool(4, 1, 30, 30, 5, config={"rm": 2})
    with pytest.raises(ValueError, match="bad launch parameters"):
        cuda_tc.plan_pool(4, 1, 30, 30, 5, config={"nc": 5, "mt": 6})
