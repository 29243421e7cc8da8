"""cpu-loops, cpu-parallel and cpu-gemm against the float64 reference.

Fresh random data (never zeros) for every case, the output poisoned with NaN before each call, on every
preset's conv layer shape at a small batch and on odd shapes (channels, maps, K = 1, H = W = K, W != H,
batches that are not a multiple of the 16-image groups), with and without bias: the relative error
||out - ref|| / ||ref|| must stay within the exact-fp32 tolerance (1e-5).
"""

from __future__ import annotations

import subprocess
import sys
import zlib

import numpy as np
import pytest
import torch

from convforge import conv
from convforge.conv import cpu_parallel
from convforge.conv.reference import conv2d_float64
from convforge.harness.check import describe_mismatch, poisoned, random_case, relative_error
from convforge.models import PRESETS

IMPLS = ("cpu-loops", "cpu-parallel", "cpu-gemm")
TOLERANCE = conv.EXACT_TOLERANCE

# (M, C, H, W, K) of every preset's conv layers, each once.
PRESET_LAYERS = sorted({(s.M, s.C, s.H, s.W, s.K)
                        for preset in PRESETS.values() for s in preset.architecture.conv_shapes(1)})
ODD = [  # (B, M, C, H, W, K)
    (3, 7, 5, 13, 9, 3),    # odd everything, W != H
    (2, 5, 3, 7, 11, 1),    # K = 1
    (4, 4, 3, 5, 5, 5),     # H = W = K: one output pixel
    (3, 3, 1, 20, 40, 4),   # even K, wide input (output rows longer than 16)
    (2, 2, 2, 9, 30, 7),    # output narrower than 16 columns on one side only
    (37, 6, 2, 12, 20, 5),  # 2 full 16-image groups and a partial one: several work items
]
CASES = ([pytest.param((2 + i % 3, m, c, h, w, k), id=f"layer-M{m}-C{c}-{h}x{w}-K{k}")
          for i, (m, c, h, w, k) in enumerate(PRESET_LAYERS)]
         + [pytest.param(case, id="odd-B{}-M{}-C{}-{}x{}-K{}".format(*case)) for case in ODD])


def _check(impl_name: str, case, bias: bool, seed: int) -> None:
    batch, maps, channels, height, width, kernel = case
    x, w, b = random_case((batch, channels, height, width), (maps, channels, kernel, kernel), seed=seed, bias=bias)
    ref = conv2d_float64(x.numpy(), w.numpy(), None if b is None else b.numpy())
    fn = conv.get(impl_name).prepare(w, b)
    out = poisoned(ref.shape)
    returned = fn(x, out)
    assert returned is out
    err = relative_error(out, ref)
    assert err <= TOLERANCE, f"{impl_name} {case} bias={bias}: relative error {err:.2e}; {describe_mismatch(out, ref)}"
    fresh = fn(x)  # allocating path
    assert fresh.shape == ref.shape and fresh.dtype == torch.float32
    assert relative_error(fresh, ref) <= TOLERANCE


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("impl_name", IMPLS)
def test_matches_float64_reference(impl_name, case, bias):
    _check(impl_name, case, bias, seed=zlib.crc32(repr((impl_name, case, bias)).encode()))


@pytest.mark.parametrize("layer", [pytest.param(layer, id="M{}-C{}-{}x{}-K{}".format(*layer))
                                   for layer in PRESET_LAYERS])
def test_parallel_full_groups(layer):
    """Batches of whole 16-image groups take cpu-parallel's vector transposes in and out of the lane layout."""
    maps, channels, height, width, kernel = layer
    _check("cpu-parallel", (32, maps, channels, height, width, kernel), bias=True, seed=sum(layer))


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("impl_name", ["cpu-parallel", "cpu-gemm"])
def test_thread_counts(impl_name, threads):
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _check(impl_name, (21, 12, 6, 17, 19, 5), bias=True, seed=threads)
    finally:
        torch.set_num_threads(saved)


def test_rejects_wrong_shapes_and_types():
    x, w, _ = random_case((2, 3, 8, 8), (4, 3, 3, 3), seed=1)
    for name in IMPLS:
        fn = conv.get(name).prepare(w)
        with pytest.raises(ValueError):
            fn(torch.rand(2, 2, 8, 8))           # channels differ from the weights'
        with pytest.raises(ValueError):
            fn(torch.rand(2, 3, 2, 8))           # kernel taller than the input
        with pytest.raises(TypeError):
            fn(x.double())
        with pytest.raises(ValueError):
            fn(x, torch.empty(2, 4, 5, 5))       # out of the wrong shape


def test_empty_batch():
    _, w, b = random_case((1, 3, 8, 8), (4, 3, 3, 3), seed=2, bias=True)
    for name in IMPLS:
        y = conv.get(name).prepare(w, b)(torch.empty(0, 3, 8, 8))
        assert tuple(y.shape) == (0, 4, 6, 6)


def test_noncontiguous_out_is_written():
    x, w, b = random_case((3, 2, 9, 9), (4, 2, 3, 3), seed=5, bias=True)
    ref = conv2d_float64(x.numpy(), w.numpy(), b.numpy())
    for name in IMPLS:
        out = poisoned((3, 7, 7, 4)).permute(0, 3, 1, 2)  # (3, 4, 7, 7), channels-last strides
        assert conv.get(name).prepare(w, b)(x, out) is out
        assert relative_error(out, ref) <= TOLERANCE


def test_numba_imported_only_when_prepared():
    code = ("import sys\n"
            "import convforge.conv.cpu_loops, convforge.conv.cpu_parallel, convforge.conv.cpu_gemm\n"
            "from convforge import conv\n"
            "for name in ('cpu-loops', 'cpu-parallel', 'cpu-gemm'):\n"
            "    conv.get(name).unavailable_reason('cpu'); conv.get(name).header\n"
            "assert 'numba' not in sys.modules, 'numba imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_generated_kernel_without_writable_cache(monkeypatch, tmp_path):
    """No writable cache folder: the generated kernel still compiles (without a disk cache) and is right."""
    from convforge.conv import cpu_loops, cpu_parallel
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("CONVFORGE_CACHE", str(blocker / "cache"))
    source = cpu_parallel.kernel_source(3, 2) + "\n# variant compiled without a cache\n"
    fn = cpu_loops.jit_generated("test_no_cache", source, "conv", nogil=True, fastmath={"contract"})
    x, w, b = random_case((5, 2, 8, 9), (4, 2, 3, 3), seed=7, bias=True)
    y = np.full((5, 4, 6, 7), np.nan, np.float32)
    fn(x.numpy(), w.numpy(), b.numpy(), y, 4, 0, 1, 0, 2)
    assert relative_error(y, conv2d_float64(x.numpy(), w.numpy(), b.numpy())) <= TOLERANCE


def test_jit_falls_back_when_numba_cannot_cache():
    """A function without a source file cannot be cached by Numba: jit() compiles it anyway."""
    from convforge.conv.cpu_loops import jit
    namespace: dict = {}
    exec("def add_one(a):\n    return a + 1\n", namespace)
    assert jit(namespace["add_one"])(41) == 42


@pytest.mark.parametrize("vector", [16, 8], ids=["avx512", "avx2"])
def test_choose_block(monkeypatch, vector):
    """Per ISA: the fewest padded maps, then the most FMAs per load; accumulators, input vectors and a
    broadcast always within the registers."""
    from convforge.conv import cpu_parallel
    accumulators, max_block, registers, _ = cpu_parallel.TILES[vector]
    for name, value in zip(cpu_parallel.TILE_NAMES, cpu_parallel.TILES[vector]):
        monkeypatch.setattr(cpu_parallel, name, value)
    chosen = {m: (cpu_parallel.choose_block(m, 5), cpu_parallel.choose_width(cpu_parallel.choose_block(m, 5)))
              for m in (4, 6, 12, 16, 24, 50)}
    if vector == 16:
        assert chosen == {4: (4, 6), 6: (6, 4), 12: (6, 4), 16: (4, 6), 24: (6, 4), 50: (5, 4)}
    else:
        assert chosen == {4: (4, 3), 6: (6, 2), 12: (4, 3), 16: (4, 3), 24: (4, 3), 50: (5, 2)}
    for maps in range(1, 60):
        for kernel in (1, 3, 5, 7, 11):
            block = cpu_parallel.choose_block(maps, kernel)
            width = cpu_parallel.choose_width(block)
            assert 1 <= block <= min(maps, max_block)
            assert block * width <= accumulators and block * width + width + 1 <= registers


@pytest.mark.parametrize("case", [pytest.param((37, m, c, h, w, k), id=f"layer-M{m}-C{c}-{h}x{w}-K{k}")
                                  for m, c, h, w, k in PRESET_LAYERS]
                         + [pytest.param(case, id="odd-B{}-M{}-C{}-{}x{}-K{}".format(*case)) for case in ODD])
def test_parallel_tiles_of_each_isa(cpu_tiles, case):
    """The AVX-512 tiles (16 lanes, up to 4 x 4) and the AVX2 ones (8 lanes, two calls per position, up to
    4 x 3) on every preset layer (37 images: two full 16-image groups and a partial one) and the odd shapes."""
    from convforge.conv import cpu_parallel
    batch, maps, _, _, _, kernel = case
    block = cpu_parallel.choose_block(maps, kernel)
    assert cpu_parallel.VECTOR == cpu_tiles and block * cpu_parallel.choose_width(block) <= cpu_parallel.TILE_ACCUMULATORS
    _check("cpu-parallel", case, bias=True, seed=zlib.crc32(repr((case, cpu_tiles)).encode()))


@pytest.mark.parametrize("config", [(4, 3, 8), (6, 2, 8), (12, 1, 8), (4, 4, 16), (8, 2, 16), (6, 1, 16), (3, 5, 16)],
                         ids=lambda c: "MB{}-TW{}-v{}".format(*c))
def test_parallel_explicit_tile_configs(config):
    """Every tile the A/B measured (config=(MB, TW, lanes)), on fa18's second layer at 33 images, and
    with fusion on a 12-map first layer: exact whatever the tile."""
    import torch.nn.functional as F
    x, w, b = random_case((33, 12, 15, 13), (24, 12, 7, 7), seed=sum(config), bias=True)
    ref = conv2d_float64(x.numpy(), w.numpy(), b.numpy())
    out = poisoned(ref.shape)
    conv.get("cpu-parallel").prepare(w, b, config=config)(x, out)
    assert relative_error(out, ref) <= TOLERANCE, describe_mismatch(out, ref)
    x, w, b = random_case((21, 1, 30, 31), (12, 1, 5, 5), seed=sum(config) + 1, bias=True)
    ref = F.max_pool2d(torch.tanh(torch.from_numpy(conv2d_float64(x.numpy(), w.numpy(), b.numpy()))), 2, 2).numpy()
    out = poisoned(ref.shape)
    conv.get("cpu-parallel").prepare_fused(w, b, "tanh", 2, config=config)(x, out)
    assert relative_error(out, ref) <= TOLERANCE, describe_mismatch(out, ref)


@pytest.mark.parametrize("config", [(2, 4, 16), (1, 6, 16), (4, 2, 16), (1, 8, 16), (2, 2, 8), (1, 4, 8), (3, 2, 8)],
                         ids=lambda c: "MB{}-TW{}-v{}".format(*c))
@pytest.mark.parametrize("case", [(37, 12, 1, 30, 31, 5, "tanh"), (21, 6, 1, 48, 48, 5, "tanh"),
                                  (18, 4, 1, 20, 21, 7, "relu"), (33, 5, 3, 9, 8, 3, "sigmoid"), (5, 3, 1, 6, 6, 3, None)],
                         ids=lambda c: "B{}-M{}-C{}-{}x{}-K{}-{}".format(*c))
def test_parallel_pooled_tiles(case, config):
    """The pooled tile (conv + 2 x 2 max pool + activation in registers, config=(MB, TW, lanes, True)) of
    either ISA's width: maps padded to whole blocks, pooled rows narrower than the tile, the last tile
    overlapping its neighbour, partial 16-image groups, several channels; NaN-poisoned output vs float64."""
    import torch.nn.functional as F
    from convforge.models import ACTIVATIONS
    batch, maps, channels, height, width, kernel, activation = case
    x, w, b = random_case((batch, channels, height, width), (maps, channels, kernel, kernel),
                          seed=zlib.crc32(repr((case, config)).encode()), bias=True)
    ref = torch.from_numpy(conv2d_float64(x.numpy(), w.numpy(), b.numpy()))
    ref = F.max_pool2d(ACTIVATIONS[activation](ref) if activation else ref, 2, 2).numpy()
    out = poisoned(ref.shape)
    conv.get("cpu-parallel").prepare_fused(w, b, activation, 2, config=config + (True,))(x, out)
    assert relative_error(out, ref) <= TOLERANCE, describe_mismatch(out, ref)
    # The same tile storing straight into y's lane layout (the engine's path): one group more of NaN after the
    # output must stay NaN (a padded map of the last block stores nothing), lanes never mix.
    from convforge.conv import cpu_parallel
    groups = -(-batch // 16)
    lanes = torch.full(cpu_parallel.lane_shape(batch + 16, ref.shape[1:]), float("nan"))
    cpu_parallel.prepare_fused(w, b, activation, 2, config=config + (True,), lanes_out=True)(x, lanes[:groups], batch)
    got = cpu_parallel.from_lanes(lanes[:groups], batch).numpy()
    assert relative_error(got, ref) <= TOLERANCE, describe_mismatch(got, ref)
    assert torch.isnan(lanes[groups:]).all()


@pytest.mark.parametrize("lanes_out", [False, True], ids=["rows", "lanes"])
def test_pooled_tile_nan_windows(lanes_out):
    """The pooled tile's 2 x 2 max (MAXPS and a NaN fix-up) pools a window holding a NaN to NaN, as torch does,
    and infinities like torch: NaN and inf pixels at random places, the NaN pattern and the values compared."""
    import torch.nn.functional as F
    from convforge.conv import cpu_parallel
    gen = torch.Generator().manual_seed(26)
    w, b = torch.randn(6, 1, 5, 5, generator=gen), torch.randn(6, generator=gen)
    fn = cpu_parallel.prepare_fused(w, b, "tanh", 2, config=(2, 4, 16, True), lanes_out=lanes_out)
    for trial in range(6):
        x = torch.randn(20, 1, 20, 21, generator=gen)
        x.view(-1)[torch.randint(0, x.numel(), (3,), generator=gen)] = float("nan")
        x.view(-1)[torch.randint(0, x.numel(), (2 * (trial % 2),), generator=gen)] = float("inf")
        ref = F.max_pool2d(torch.tanh(torch.from_numpy(conv2d_float64(x.numpy(), w.numpy(), b.numpy()))), 2, 2)
        if lanes_out:
            out = torch.full(cpu_parallel.lane_shape(20, (6, 8, 8)), float("nan"))
            got = cpu_parallel.from_lanes(fn(x, out, 20), 20)
        else:
            got = fn(x)
        assert torch.equal(torch.isnan(got), torch.isnan(ref)), trial
        keep = ~torch.isnan(ref)
        assert relative_error(got[keep].numpy(), ref[keep].float().numpy()) <= TOLERANCE


@pytest.mark.parametrize("vector", [16, 8], ids=["avx512", "avx2"])
def test_choose_pooled(monkeypatch, vector):
    """The pooled tile's (MB, TW): TW even, accumulators, inputs and a broadcast within the registers."""
    from convforge.conv import cpu_parallel
    _, max_block, registers, accumulators = cpu_parallel.TILES[vector]
    for name, value in zip(cpu_parallel.TILE_NAMES, cpu_parallel.TILES[vector]):
        monkeypatch.setattr(cpu_parallel, name, value)
    if vector == 16:
        assert {m: cpu_parallel.choose_pooled(m) for m in (4, 6, 12, 50)} == {4: (2, 4), 6: (2, 4), 12: (2, 4), 50: (2, 4)}
    for maps in range(1, 60):
        block, width = cpu_parallel.choose_pooled(maps)
        assert width % 2 == 0 and 1 <= block <= min(maps, max_block)
        assert 2 * width * block <= accumulators and 2 * width * block + 2 * width + 1 <= registers


@pytest.mark.parametrize("case", [(37, 6, 2, 12, 20, 5), (33, 4, 2, 12, 9, 5), (17, 3, 1, 11, 7, 3)],
                         ids=["one-row-bands", "bands-of-4-rows", "short-last-band"])
def test_parallel_accumulator_bands(monkeypatch, case):
    """cpu-parallel accumulates a band of output rows and writes it back as one run of each plane: with a
    tiny band budget the bands are single rows, several rows, or end with a short band (16-float chunks
    overlapping, or the scalar path when a run is shorter than 16)."""
    from convforge.conv import cpu_parallel
    monkeypatch.setattr(cpu_parallel, "ACC_BYTES", 4096)
    monkeypatch.setattr(cpu_parallel, "_KERNELS", {})
    for bias in (False, True):
        _check("cpu-parallel", case, bias, seed=zlib.crc32(repr((case, bias)).encode()))


# ------------------------------------------------------------------ cpu-parallel's fused conv + act + pool

FUSED = [  # (B, M, C, H, W, K, activation, pool)
    (37, 50, 1, 28, 28, 5, "tanh", 2),      # fa17's layer; 2 full 16-image groups and a partial one
    (21, 17, 3, 19, 23, 3, "sigmoid", 2),   # odd maps, channels, W != H, odd conv output (cropped by the pool)
    (18, 16, 4, 40, 40, 7, "relu", 4),      # fa20's second layer, pool 4
    (5, 3, 2, 11, 9, 3, None, 3),           # no activation, pool 3
    (33, 12, 5, 21, 22, 4, "tanh", 1),      # pool 1 (activation only), even K
    (16, 6, 1, 9, 9, 5, "relu", 4),         # pooled plane of one pixel: the scalar write-back
    (35, 6, 1, 64, 64, 5, "tanh", 2),       # sp18's layer (AVX-512: the pooled tile, 3 blocks of 2 maps)
    (19, 12, 1, 70, 69, 5, "tanh", 2),      # fa19's layer, W odd: the last pooled tile overlaps its neighbour
    (17, 5, 1, 8, 9, 5, "relu", 2),         # pooled rows of 2 and 2: narrower than a tile (2-column tiles)
    (16, 7, 2, 10, 12, 3, "tanh", 2),       # two channels, odd maps (1-map pooled tiles), whole groups
]


@pytest.mark.parametrize("case", FUSED, ids=lambda c: "B{}-M{}-C{}-{}x{}-K{}-{}-pool{}".format(*c))
def test_parallel_fused_matches_float64(cpu_tiles, case):
    import torch.nn.functional as F
    from convforge.models import ACTIVATIONS
    batch, maps, channels, height, width, kernel, activation, pool = case
    x, w, b = random_case((batch, channels, height, width), (maps, channels, kernel, kernel),
                          seed=zlib.crc32(repr(case).encode()), bias=True)
    ref = torch.from_numpy(conv2d_float64(x.numpy(), w.numpy(), b.numpy()))
    if activation:
        ref = ACTIVATIONS[activation](ref)
    ref = F.max_pool2d(ref, pool, pool).numpy()
    fn = conv.get("cpu-parallel").prepare_fused(w, b, activation, pool)
    out = poisoned(ref.shape)
    assert fn(x, out) is out
    err = relative_error(out, ref)
    assert err <= TOLERANCE, f"{case}: relative error {err:.2e}; {describe_mismatch(out, ref)}"
    assert relative_error(fn(x), ref) <= TOLERANCE


LANE_CASES = [  # (M, C, H, W, K, activation, pool); pool 0: prepare_lanes (no activation, no pool)
    (6, 1, 64, 64, 5, "tanh", 2),     # sp18's first layer (AVX-512: the pooled tile)
    (16, 6, 30, 30, 5, None, 0),      # sp18's second layer, unfused (the dense layer reads its lanes)
    (24, 12, 33, 33, 5, None, 0),     # fa19's second layer
    (16, 4, 40, 40, 7, "relu", 4),    # fa20's second layer, pool 4 (band + pool pass)
    (7, 3, 13, 9, 3, "sigmoid", 2),   # odd maps, channels, W != H (pooled rows narrower than a tile)
    (5, 2, 7, 11, 1, None, 0),        # K = 1, odd maps
]


@pytest.mark.parametrize("layout", [(False, True), (True, True), (True, False)], ids=["out", "in-out", "in"])
@pytest.mark.parametrize("case", LANE_CASES, ids=lambda c: "M{}-C{}-{}x{}-K{}-{}-pool{}".format(*c))
def test_parallel_lane_layouts(cpu_tiles, case, layout):
    """cpu-parallel reading and/or writing the lane layout (prepare_lanes, prepare_fused(lanes_in=, lanes_out=))
    as the CPU engine chains its layers: batches of 37 (two whole groups and a partial one, NaN in its extra
    lanes), then 16 and 5 through the same function into reused output buffers poisoned with NaN, on 1 and 2
    threads, against float64."""
    import torch.nn.functional as F
    from convforge.conv import cpu_parallel
    from convforge.models import ACTIVATIONS
    maps, channels, height, width, kernel, activation, pool = case
    lanes_in, lanes_out = layout
    x, w, b = random_case((37, channels, height, width), (maps, channels, kernel, kernel),
                          seed=zlib.crc32(repr((case, layout)).encode()), bias=True)
    if pool:
        fn = cpu_parallel.prepare_fused(w, b, activation, pool, lanes_in=lanes_in, lanes_out=lanes_out)
    else:
        fn = cpu_parallel.prepare_lanes(w, b, lanes_in, lanes_out)
    ho, wo = height - kernel + 1, width - kernel + 1
    per_image = (maps, ho // pool, wo // pool) if pool else (maps, ho, wo)
    shape = cpu_parallel.lane_shape(37, per_image) if lanes_out else (37, *per_image)
    buffer = torch.full(shape, float("nan"))
    saved = torch.get_num_threads()
    try:
        for rows, threads in ((37, 2), (16, 1), (5, 2)):
            torch.set_num_threads(threads)
            xb = torch.randn(rows, channels, height, width) * 100 if rows != 37 else x
            ref = torch.from_numpy(conv2d_float64(xb.numpy(), w.numpy(), b.numpy()))
            ref = F.max_pool2d(ACTIVATIONS[activation](ref) if activation else ref, pool, pool) if pool else ref
            buffer.fill_(float("nan"))
            n = -(-rows // 16) if lanes_out else rows
            out = fn(cpu_parallel.to_lanes(xb) if lanes_in else xb, buffer[:n], rows)
            got = cpu_parallel.from_lanes(out, rows) if lanes_out else out
            err = relative_error(got.numpy(), ref.numpy())
            assert err <= TOLERANCE, f"{case} {layout} B={rows}: {err:.2e}; {describe_mismatch(got.numpy(), ref.numpy())}"
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("case", [(6, 1, 64, 64, 5, "tanh", 2), (7, 3, 13, 9, 3, "sigmoid", 2), (5, 2, 7, 11, 1, None, 0),
                                  (4, 1, 3, 3, 1, None, 0)], ids=lambda c: "M{}-C{}-{}x{}-K{}-{}-pool{}".format(*c))
def test_parallel_lanes_from_uint8(cpu_tiles, case):
    """The engine's first layer reads its raw uint8 images (converted in the input transposes; a plane of fewer
    than 16 pixels by the scalar repack): batches of 37, 16 and 5 into a reused NaN-poisoned lane-layout
    buffer, 1 and 2 threads, against float64 of the images as floats; prepared with raw_input (the uint8 form
    compiled at prepare time) and, for the 3 x 3 plane, without (compiled at its first call)."""
    import torch.nn.functional as F
    from convforge.conv import cpu_parallel
    from convforge.models import ACTIVATIONS
    maps, channels, height, width, kernel, activation, pool = case
    _, w, b = random_case((1, channels, height, width), (maps, channels, kernel, kernel),
                          seed=zlib.crc32(repr(("uint8", case)).encode()), bias=True)
    if pool:
        fn = cpu_parallel.prepare_fused(w, b, activation, pool, lanes_out=True, raw_input=True)
    else:   # the last case without raw_input: its uint8 form compiled at the first call
        fn = cpu_parallel.prepare_lanes(w, b, False, True, raw_input=kernel > 1 or height > 3)
    ho, wo = height - kernel + 1, width - kernel + 1
    per_image = (maps, ho // pool, wo // pool) if pool else (maps, ho, wo)
    buffer = torch.full(cpu_parallel.lane_shape(37, per_image), float("nan"))
    g = torch.Generator().manual_seed(7)
    saved = torch.get_num_threads()
    try:
        for rows, threads in ((37, 2), (16, 1), (5, 2)):
            torch.set_num_threads(threads)
            xb = torch.randint(0, 256, (rows, channels, height, width), generator=g, dtype=torch.uint8)
            ref = torch.from_numpy(conv2d_float64(xb.double().numpy(), w.numpy(), b.numpy()))
            ref = F.max_pool2d(ACTIVATIONS[activation](ref) if activation else ref, pool, pool) if pool else ref
            buffer.fill_(float("nan"))
            out = fn(xb, buffer[:-(-rows // 16)], rows)
            got = cpu_parallel.from_lanes(out, rows)
            err = relative_error(got.numpy(), ref.numpy())
            assert err <= TOLERANCE, f"{case} B={rows}: {err:.2e}; {describe_mismatch(got.numpy(), ref.numpy())}"
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "band"])
@pytest.mark.parametrize("config", [(4, 6), (3, 5), (4, 1)], ids=lambda c: "MB{}-TW{}".format(*c))
def test_unpooled_tiles_into_lanes(cpu_tiles, config, direct):
    """The unpooled layer writing y's lane layout from its tiles (DIRECT_STORES) or through the band, with map
    blocks that pad the maps (7 maps in blocks of 4 or 3: a last block stores only its real maps) and rows with
    remainder tiles (Wo % TW): against float64, the buffer NaN-poisoned, and the groups after the output's
    still NaN (no write past it)."""
    from convforge.conv import cpu_parallel
    maps, channels, height, width, kernel = 7, 3, 12, 15, 3
    x, w, b = random_case((37, channels, height, width), (maps, channels, kernel, kernel),
                          seed=zlib.crc32(repr((config, direct)).encode()), bias=True)
    saved = cpu_parallel.DIRECT_STORES
    cpu_parallel.DIRECT_STORES = direct
    try:
        fn = cpu_parallel.prepare_lanes(w, b, True, True, config=config)
    finally:
        cpu_parallel.DIRECT_STORES = saved
    ref = conv2d_float64(x.numpy(), w.numpy(), b.numpy())
    buffer = torch.full(cpu_parallel.lane_shape(37 + 32, (maps, height - kernel + 1, width - kernel + 1)), float("nan"))
    out = fn(cpu_parallel.to_lanes(x), buffer[:3], 37)
    err = relative_error(cpu_parallel.from_lanes(out, 37).numpy(), ref)
    assert err <= TOLERANCE, f"{config} direct={direct}: {err:.2e}"
    assert torch.isnan(buffer[3:]).all()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("small_work", [0, None], ids=["items", "small-one-item"])
def test_dense_layer_reads_lane_layout(threads, small_work):
    """cpu_dense with ``lanes``: the inputs in cpu-parallel's lane layout (groups, K, 16), read in place (no pack),
    NaN in a last partial group's extra lanes; blocks of NC rounded to whole groups (40 -> 48), KC slices with a
    tail; batches of different sizes in a row through the reused scratch into NaN-poisoned outputs, split into
    work items as a large layer is (small_work 0) and as one item (SMALL_WORK's default for a layer this small)."""
    from convforge import cpu_dense
    from convforge.models import ACTIVATIONS
    if not cpu_dense.lanes_supported():
        pytest.skip("this CPU's dense tiles take stripes of other than 16 images")
    k, n = 7 * 16 + 5, 3 * 16 * 3 + 16 + 7
    g = torch.Generator().manual_seed(26)
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    layer = cpu_dense.DenseLayer(w, b, "tanh", blocking=(48, 40), lanes=True)
    if small_work is not None:
        layer.small_work = small_work
    assert len(layer.work_items(203, 2)) == (1 if small_work is None else 6)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in (203, 61, 9, 1, 130):
            x = torch.randn(rows, k, generator=g)
            lanes = cpu_parallel.to_lanes(x.reshape(rows, k, 1, 1)).reshape(-1)
            out = np.full((rows, cpu_dense.padded(n)), np.nan, np.float32)
            layer(lanes.numpy(), k, out)
            ref = ACTIVATIONS["tanh"](torch.nn.functional.linear(x.double(), w.double(), b.double()))
            assert np.isfinite(out).all(), rows
            assert relative_error(out[:, :n], ref.numpy()) <= TOLERANCE, rows
    finally:
        torch.set_num_threads(saved)


def test_fused_tanh_and_sigmoid_over_the_float32_range():
    """The vectorised tanh (a rational fit) against float64 tanh, saturation included, in the pool kernel and
    in the pooled tile."""
    from convforge.models import ACTIVATIONS
    impl = conv.get("cpu-parallel")
    x = torch.linspace(-30, 30, 16 * 9 * 7).reshape(16, 1, 9, 7).contiguous()
    w = torch.ones(1, 1, 1, 1)
    for activation in ("tanh", "sigmoid"):
        out = impl.prepare_fused(w, None, activation, 1)(x).double()
        ref = ACTIVATIONS[activation](x.double())
        assert float((out - ref).abs().max()) < 1e-6, activation
        # pool 2: the pooled tile on AVX-512
        x2 = torch.linspace(-30, 30, 16 * 2 * 24 * 24).reshape(32, 1, 24, 24).contiguous()
        out = impl.prepare_fused(w, None, activation, 2)(x2).double()
        ref = ACTIVATIONS[activation](torch.nn.functional.max_pool2d(x2.double(), 2, 2))
        assert float((out - ref).abs().max()) < 1e-6, activation
        # the pooled tile storing into the lane layout (the engine's path)
        from convforge.conv import cpu_parallel
        lanes = torch.empty(cpu_parallel.lane_shape(32, (1, 12, 12)))
        cpu_parallel.prepare_fused(w, None, activation, 2, lanes_out=True)(x2, lanes, 32)
        assert float((cpu_parallel.from_lanes(lanes, 32).double() - ref).abs().max()) < 1e-6, activation


@pytest.mark.parametrize("tile", [None, (6, 1), (8, 3), (12, 2), (8, 2), (4, 1)],
                         ids=["this-cpu", "avx2", "avx512", "12x2", "8x2", "4x1"])
@pytest.mark.parametrize("shape", [(37, 50, 21, "tanh"), (13, 7, 5, None), (9, 33, 17, "sigmoid"),
                                   (40, 300, 140, "relu"), (6, 16, 10, None), (61, 600, 500, "tanh"),
                                   (25, 40, 48, None)])
def test_dense_layer_matches_float64(shape, tile):
    """cpu_dense's blocked GEMM: tiles of MR images x PR panels of each ISA (AVX2 6 x 1, AVX-512 8 x 3 in
    stripes of 16 packed by register transposes; 12 x 2 and 6 x 1 in stripes of one tile packed by the
    scalar loop), a narrower group of the leftover panels, partial stripes and tiles, KC slices (K = 300, 600),
    padded panels; the output poisoned with NaN."""
    from convforge import cpu_dense
    from convforge.models import ACTIVATIONS
    rows, k, n, activation = shape
    g = torch.Generator().manual_seed(rows * 1000 + k)
    x, w, b = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    layer = cpu_dense.DenseLayer(w, b, activation, tile=tile)
    out = np.full((rows, cpu_dense.padded(n)), np.nan, np.float32)
    layer(x.numpy(), k, out)
    ref = torch.nn.functional.linear(x.double(), w.double(), b.double())
    ref = ACTIVATIONS[activation](ref) if activation else ref
    assert relative_error(out[:, :n], ref.numpy()) <= TOLERANCE
    # rows read with a longer stride (a padded dense output feeding the next layer)
    wide = np.full((rows, k + 5), np.nan, np.float32)
    wide[:, :k] = x.numpy()
    out2 = np.empty_like(out)
    layer(wide, k + 5, out2)
    assert np.array_equal(out, out2)


def test_dense_buffers_start_at_64_bytes():
    """cpu_dense's packed W, bias and scratch start at a multiple of 64 bytes (NumPy's large arrays start 16
    bytes past a page: each 16-float load of W spanned two cache lines), hold what they should and stay
    contiguous float32, for a large W (mmap'd by malloc) and a small one."""
    from convforge import cpu_dense
    for n, k in ((500, 7200), (37, 50)):
        w = torch.randn(n, k, generator=torch.Generator().manual_seed(n))
        layer = cpu_dense.DenseLayer(w, torch.ones(n), None)
        arrays = [layer.wp, layer.bias] + [a for pair in layer.scratch(3) for a in pair]
        assert all(a.ctypes.data % 64 == 0 and a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)
        wpad = np.zeros((layer.np, k), np.float32)
        wpad[:n] = w.numpy()
        ref = np.concatenate([p.reshape(-1) for p in (
            wpad[:layer.panels // layer.group * layer.group * 16].reshape(-1, layer.group * 16, k).transpose(0, 2, 1),
            wpad[layer.panels // layer.group * layer.group * 16:].T)])
        assert np.array_equal(layer.wp, ref)
        assert np.array_equal(layer.bias[:n], np.ones(n, np.float32)) and not layer.bias[n:].any()


@pytest.mark.parametrize("tile", [None, (6, 1), (12, 2)], ids=["this-cpu", "avx2", "12x2"])
@pytest.mark.parametrize("threads", [1, 2])
def test_dense_layer_blocks_and_reused_scratch(tile, threads):
    """cpu_dense with a small blocking (KC = 48: slices with a tail that is no multiple of 16; NC = 40: several
    blocks per work item, blocks ending inside a stripe) and its scratch reused across calls: batches of
    different sizes in a row (larger, smaller, a partial stripe, larger again), each from fresh random data
    into a NaN-poisoned output, rows read with a stride longer than K; each within 1e-5 of float64."""
    from convforge import cpu_dense
    from convforge.models import ACTIVATIONS
    k, n = 7 * 16 + 5, 3 * 16 * 3 + 16 + 7         # 117 inputs; 167 outputs: 11 panels
    g = torch.Generator().manual_seed(408)
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    layer = cpu_dense.DenseLayer(w, b, "tanh", tile=tile, blocking=(48, 40))
    layer.small_work = 0            # work items as for a large layer (this one is under SMALL_WORK)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in (203, 61, 9, 1, 130):
            x = torch.randn(rows, k, generator=g)
            wide = np.full((rows, k + 3), np.nan, np.float32)
            wide[:, :k] = x.numpy()
            out = np.full((rows, cpu_dense.padded(n)), np.nan, np.float32)
            layer(wide, k + 3, out)
            ref = ACTIVATIONS["tanh"](torch.nn.functional.linear(x.double(), w.double(), b.double()))
            assert np.isfinite(out).all(), rows
            assert relative_error(out[:, :n], ref.numpy()) <= TOLERANCE, rows
            assert not out[:, n:].any(), rows          # the padded columns: zero weights, zero bias, tanh(0)
    finally:
        torch.set_num_threads(saved)


def test_dense_weight_packing_groups_and_leftover():
    """pack_weight: groups of PR panels interleaved per k, then the leftover panels as one narrower group."""
    from convforge import cpu_dense
    k, panels = 5, 5
    w = np.arange(panels * 16 * k, dtype=np.float32).reshape(panels * 16, k)
    wp = cpu_dense.pack_weight(w, panels, 3)
    assert wp.size == w.size
    first = wp[:k * 48].reshape(k, 48)
    assert np.array_equal(first, w[:48].T)
    rest = wp[k * 48:].reshape(k, 32)
    assert np.array_equal(rest, w[48:80].T)
