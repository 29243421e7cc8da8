"""cpu-winograd: the Toom-Cook matrices, the layer against float64 (lane layout and the registry's NCHW form),
its range checks (Inf, NaN, subnormal inputs and tiny weights go to the direct kernel) and its tile shapes."""

import numpy as np
import pytest
import torch

pytest.importorskip("numba")

from conftest import assert_nonfinite_as_torch  # noqa: E402
from convforge.conv import cpu_parallel, cpu_winograd  # noqa: E402
from convforge.harness.check import relative_error  # noqa: E402

TOLERANCE = 1e-5


def _reference(x, w, b):
    return torch.nn.functional.conv2d(x.double(), w.double(), None if b is None else b.double()).numpy()


def _layer(B, M, C, H, W, K, seed, bias=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(B, C, H, W, generator=g) * 2 - 1          # tanh-like maps, as the second convs read
    w = torch.randn(M, C, K, K, generator=g) / (C * K * K) ** 0.5
    b = torch.randn(M, generator=g) if bias else None
    return x, w, b


@pytest.mark.parametrize("m, r", [(1, 4), (2, 3), (3, 7), (5, 5), (6, 3), (2, 8), (6, 1), (4, 6)])
def test_toom_cook_matrices_compute_the_correlation(m, r):
    AT, G, BT = cpu_winograd.toom_cook(m, r)
    n = m + r - 1
    assert AT.shape == (m, n) and G.shape == (n, r) and BT.shape == (n, n)
    rng = np.random.default_rng(m * 10 + r)
    d, g = rng.standard_normal(n), rng.standard_normal(r)
    want = [sum(g[k] * d[i + k] for k in range(r)) for i in range(m)]
    np.testing.assert_allclose(AT @ ((G @ g) * (BT @ d)), want, rtol=1e-11, atol=1e-11)


def test_outputs_per_tile_keeps_nine_points():
    assert [cpu_winograd.outputs_per_tile(k) for k in (3, 5, 7, 8)] == [6, 5, 3, 2]
    for k in range(1, 12):   # m = 1 is the identity transform: no points
        m = cpu_winograd.outputs_per_tile(k)
        assert m == 1 or m + k - 1 <= cpu_winograd.MAX_POINTS, k


# (B, M, C, H, W, K): the course's unpooled second layers (fa18, fa19, sp18, sp19), then odd shapes: a partial
# group, output widths that are no multiple of m (the zero-filled last tile), H == K, one output, 2x2 and 8x8
# kernels, maps that are no multiple of the tile's block, one channel.
SHAPES = [(37, 24, 12, 33, 33, 7), (20, 24, 12, 33, 33, 5), (16, 16, 6, 30, 30, 5), (17, 16, 6, 22, 22, 5),
          (3, 5, 3, 11, 14, 3), (17, 7, 2, 10, 9, 8), (5, 3, 4, 12, 13, 2), (2, 1, 1, 7, 7, 7),
          (33, 13, 5, 7, 19, 7), (1, 9, 1, 6, 6, 4)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_layer_matches_float64(shape):
    B, M, C, H, W, K = shape
    x, w, b = _layer(*shape, seed=sum(shape), bias=B % 2 == 1)
    ref = _reference(x, w, b)
    fn = cpu_winograd.prepare(w, b)
    out = torch.full(ref.shape, float("nan"))
    assert fn(x, out) is out
    assert relative_error(out.numpy(), ref) <= TOLERANCE
    assert relative_error(fn(x).numpy(), ref) <= TOLERANCE


@pytest.mark.parametrize("config", [(2, 6, 4), (3, 8, 3), (4, 4, 6), (3, 6, 4, 8), (3, 5, 1)])
def test_tile_shapes_and_the_avx2_tile(config):
    """m, MB, TW and the vector lanes (8: the AVX2 tile, run twice per 16 images) given explicitly."""
    x, w, b = _layer(21, 24, 12, 20, 23, 7, seed=7)
    ref = _reference(x, w, b)
    out = torch.full(ref.shape, float("nan"))
    cpu_winograd.prepare(w, b, config=config)(x, out)
    assert relative_error(out.numpy(), ref) <= TOLERANCE


def test_lane_layout_writes_only_its_groups():
    """The engine's form: x and out in the lane layout, rows < groups * 16; a buffer with a spare group
    keeps that group as it was (NaN)."""
    x, w, b = _layer(37, 16, 6, 30, 30, 5, seed=3)
    ref = _reference(x, w, b)
    fn = cpu_winograd.prepare_lanes(w, b)
    buffer = torch.full(cpu_parallel.lane_shape(37 + 16, ref.shape[1:]), float("nan"))
    groups = -(-37 // 16)
    fn(cpu_parallel.to_lanes(x), buffer[:groups], 37)
    got = cpu_parallel.from_lanes(buffer[:groups], 37).numpy()
    assert relative_error(got, ref) <= TOLERANCE
    assert torch.isnan(buffer[groups:]).all()


def test_inf_and_nan_inputs_take_torch_positions():
    """A transform spreads one Inf over its tile as NaN: such a group is computed again by the direct kernel,
    so the non-finite positions are torch's and the other groups stay Winograd's."""
    x, w, b = _layer(40, 8, 3, 14, 15, 5, seed=11)
    x[3, 1, 4, 6] = float("inf")
    x[21, 0, 0, 0] = float("nan")
    x[33, 2, 9, 14] = -float("inf")
    ref = _reference(x, w, b)
    got = cpu_winograd.prepare(w, b)(x).numpy()
    want = torch.nn.functional.conv2d(x, w, b).numpy()
    bound = 1e-5 * np.abs(ref[np.isfinite(ref)]).max() * np.ones_like(ref)
    assert_nonfinite_as_torch(got, want, ref, bound, "cpu-winograd")


def test_out_of_range_groups_are_the_direct_kernels():
    """Per 16-image group: one with a subnormal image (2^-146: the transforms' fractions would drop its bits) or
    one value of 2^60 (they could overflow) is the direct kernel's result exactly; a group in range is
    Winograd's, within the tolerance of float64. Weights out of the range are refused at prepare."""
    x, w, b = _layer(40, 6, 4, 12, 12, 5, seed=5)
    x[19] *= 2.0 ** -146
    x[35, 1, 3, 3] = 2.0 ** 60
    got = cpu_winograd.prepare(w, b)(x).numpy()
    want = cpu_parallel.prepare(w, b)(x).numpy()
    assert np.array_equal(got[16:], want[16:])
    assert not np.array_equal(got[:16], want[:16])
    assert relative_error(got[:16], _reference(x[:16], w, b)) <= TOLERANCE
    assert not cpu_winograd.serves(w * 2.0 ** -140) and not cpu_winograd.serves(w * 2.0 ** 50)
    assert cpu_winograd.serves(w) and not cpu_winograd.serves(torch.zeros(2, 2, 9, 9))
    assert not cpu_winograd.serves(w, torch.tensor([float("nan")] * 6))
    ww = w * 2.0 ** 110
    assert np.array_equal(cpu_winograd.prepare(ww)(x).numpy(), cpu_parallel.prepare(ww)(x).numpy())


def test_bad_calls_say_what_is_wrong():
    x, w, _ = _layer(4, 3, 2, 9, 9, 3, seed=1)
    fn = cpu_winograd.prepare_lanes(w, None)
    with pytest.raises(ValueError, match="lane-layout"):
        fn(x, torch.empty(cpu_parallel.lane_shape(4, (3, 7, 7))), 4)
    with pytest.raises(ValueError, match="out must be"):
        fn(cpu_parallel.to_lanes(x), torch.empty(cpu_parallel.lane_shape(4, (3, 8, 8))), 4)
    with pytest.raises(ValueError, match="lane layout only"):
        cpu_winograd.prepare_lanes(w, None, lanes_out=False)
    with pytest.raises(ValueError, match="square"):
        cpu_winograd.prepare_lanes(torch.randn(3, 2, 3, 5), None)
