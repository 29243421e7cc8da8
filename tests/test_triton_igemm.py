"""triton-igemm-3xtf32 / -tf32 / -bf16 (``conv/triton_igemm.py``): the TMA-fed implicit GEMM.

Against a float64 reference on fresh random data with the output poisoned with NaN (conftest's check_layer_call),
on a GPU (sm_90+) or, without one, in Triton's interpreter (tensor descriptors emulated, tl.dot in fp32: the
TF32 and BF16 entries still round their operands themselves, so they are held to their reduced tolerance there
too; the BF16 products are widened to fp32 there, INTERP_NOTE, so its bf16 tl.dot runs on the GPU only). Covered: zero
padding (square and per-side), rectangular kernels, bias, every tile form the chooser can return (several output
rows a program, columns past the row, maps and channels no multiple of the tile), 1x1 layers' pointwise kernel
(POINTWISE_NOTE), the channels-last prologue's bits, Inf/NaN inputs where torch's fp32 convolution puts them, the
tile chooser, and what the entry refuses.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="Triton is not installed: pip install 'convforge[triton]'")

from convforge import conv  # noqa: E402
from convforge.conv import triton_igemm  # noqa: E402
from conftest import check_layer_call  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRETED else "cuda"
NAMES = ("triton-igemm-3xtf32", "triton-igemm-tf32", "triton-igemm-bf16")
# the interpreter's NumPy warns where Inf - Inf and Inf * 0 make the NaN the tests expect
pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]
Tile = triton_igemm.Tile

if not INTERPRETED:
    reason = triton_igemm.unavailable_reason()
    pytestmark.append(pytest.mark.skipif(reason is not None, reason=reason or ""))

# (B, M, C, H, W, KH, KW, padding): what each case exercises.
SHAPES = {
    "plain":        (2, 5, 3, 12, 11, 5, 5, 0),
    "pad 1":        (2, 7, 4, 9, 9, 3, 3, 1),       # same-size output, zeros read past every edge
    "pad (2, 0)":   (1, 6, 2, 7, 10, 3, 5, (2, 0)),  # per-side padding, rectangular kernel
    "1x1":          (3, 9, 20, 5, 6, 1, 1, 0),       # C = 20: a k step of 32 channels, 12 of them zero
    "K = H":        (2, 3, 2, 7, 7, 7, 7, 0),        # one output per image
    "M 40 C 33":    (1, 40, 33, 6, 8, 2, 3, 0),      # two k steps of 32 channels, maps no multiple of 16
    "empty batch":  (0, 3, 2, 8, 8, 3, 3, 0),
}


def _data(B, M, C, H, W, KH, KW, seed, bias=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(B, C, H, W, generator=g) * 255.0 - 64.0
    w = torch.randn(M, C, KH, KW, generator=g) * 0.05
    b = torch.randn(M, generator=g) if bias else None
    return x, w, b


def _reference(x, w, b, padding):
    pad = (padding, padding) if isinstance(padding, int) else padding
    return F.conv2d(x.double(), w.double(), None if b is None else b.double(), padding=pad).numpy()


def _prepare(name, w, b, padding=0, config=None):
    impl = conv.get(name)
    fn = triton_igemm.prepare(w.to(DEVICE), None if b is None else b.to(DEVICE), precision=impl.precision,
                              padding=padding, config=config)
    return fn, impl.tolerance


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("label", list(SHAPES))
def test_matches_float64(name, label):
    B, M, C, H, W, KH, KW, padding = SHAPES[label]
    x, w, b = _data(B, M, C, H, W, KH, KW, seed=len(label), bias=len(label) % 2 == 0)
    fn, tolerance = _prepare(name, w, b, padding)
    check_layer_call(fn, x.to(DEVICE), _reference(x, w, b, padding), tolerance, f"{name} {label}")


# Tiles the chooser can return, forced on one small layer (20 maps, 12 channels, 9 x 13 outputs).
TILES = (Tile(1, 16, 16, 16, 4, 1), Tile(4, 16, 16, 16, 4, 2), Tile(2, 8, 32, 16, 4, 2),
         Tile(1, 64, 64, 16, 4, 3), Tile(8, 8, 16, 16, 4, 2))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("tile", TILES, ids=lambda t: f"R{t.r}TW{t.tw}BM{t.bm}")
def test_every_tile_form(name, tile):
    x, w, b = _data(2, 20, 12, 11, 15, 3, 3, seed=tile.r * 10 + tile.tw)
    fn, tolerance = _prepare(name, w, b, config=tile)
    check_layer_call(fn, x.to(DEVICE), _reference(x, w, b, 0), tolerance, f"{name} {tile}")


# 1x1 layers without padding (POINTWISE_NOTE): (B, M, C, H, W); positions no multiple of the tile, maps past it.
POINTWISE_SHAPES = {
    "one step":     (3, 9, 20, 5, 6),     # channels padded to the k step inside the kernel's mask
    "two steps":    (2, 40, 40, 7, 9),    # channels 40: two or three k steps, maps no multiple of 16
    "tall":         (1, 70, 5, 13, 11),   # more maps than a program's tile under the interpreter (16)
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("label", list(POINTWISE_SHAPES))
def test_pointwise_layers_match_float64(name, label):
    """1x1 layers take the pointwise kernel (no prologue), checked as every other layer; it agrees with the
    prologue path of the same entry within the entry's tolerance."""
    B, M, C, H, W = POINTWISE_SHAPES[label]
    x, w, b = _data(B, M, C, H, W, 1, 1, seed=len(label) + 40, bias=label != "tall")
    fn, tolerance = _prepare(name, w, b)
    assert fn.is_pointwise()
    ref = _reference(x, w, b, 0)
    check_layer_call(fn, x.to(DEVICE), ref, tolerance, f"{name} pointwise {label}")
    prologue, _ = _prepare(name, w, b)
    prologue.pointwise = False
    from convforge.harness.check import relative_error
    assert relative_error(prologue(x.to(DEVICE)), ref) <= tolerance


def test_pointwise_serves_1x1_layers_without_padding_only():
    w1, w3 = torch.randn(8, 16, 1, 1, device=DEVICE), torch.randn(8, 16, 3, 3, device=DEVICE)
    assert triton_igemm.prepare(w1, precision="tf32").is_pointwise()
    assert not triton_igemm.prepare(w1, precision="tf32", padding=1).is_pointwise()
    assert not triton_igemm.prepare(w3, precision="tf32").is_pointwise()
    assert not triton_igemm.prepare(w1, precision="tf32", config=Tile(1, 16, 16, 16, 4, 1)).is_pointwise()
    # 3xTF32 keeps the prologue past POINTWISE_3XTF32_MAX_C channels; TF32 and BF16 do not
    wide = torch.randn(8, triton_igemm.POINTWISE_3XTF32_MAX_C + 1, 1, 1, device=DEVICE)
    assert not triton_igemm.prepare(wide, precision="tf32x3").is_pointwise()
    assert triton_igemm.prepare(wide, precision="bf16").is_pointwise()


@pytest.mark.skipif(INTERPRETED, reason="70000 programs: minutes in the interpreter")
def test_pointwise_takes_any_batch():
    """More images than a grid's second axis holds (65535): every image computed."""
    x, w, b = _data(70000, 3, 2, 1, 2, 1, 1, seed=8)
    fn, tolerance = _prepare("triton-igemm-tf32", w, b)
    assert fn.is_pointwise()
    check_layer_call(fn, x.to(DEVICE), _reference(x, w, b, 0), tolerance, "tf32 pointwise, 70000 images")


@pytest.mark.parametrize("name", NAMES)
def test_pointwise_inf_and_nan_where_torch_puts_them(name):
    x, w, _ = _data(2, 6, 4, 5, 7, 1, 1, seed=6, bias=False)
    x = x.abs()                             # no cancelling sums: BF16's error stays within rtol element by element
    x[0, 1, 2, 3], x[1, 3, 4, 6], x[1, 0, 0, 0] = float("inf"), float("nan"), float("-inf")
    w = w.abs() + 0.01
    ref32 = F.conv2d(x, w)
    fn, _ = _prepare(name, w, None)
    assert fn.is_pointwise()
    got = fn(x.to(DEVICE)).cpu()
    assert torch.equal(torch.isnan(got), torch.isnan(ref32))
    assert torch.equal(torch.isposinf(got), torch.isposinf(ref32))
    assert torch.equal(torch.isneginf(got), torch.isneginf(ref32))
    finite = torch.isfinite(ref32)
    assert finite.any() and torch.allclose(got[finite], ref32[finite], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("splits", (2, 4, 7))
def test_split_k_sums_every_step_once(name, splits):
    """Split-K (SPLIT_NOTE) forced on a layer of 3 x 3 x 2 = 18 k steps (channels 40 in steps of 32, a step
    count no split number divides evenly): every step in exactly one split, the bias added once."""
    x, w, b = _data(2, 20, 40, 9, 11, 3, 3, seed=splits)
    fn, tolerance = _prepare(name, w, b)
    fn.splits_for = lambda *args: splits
    check_layer_call(fn, x.to(DEVICE), _reference(x, w, b, 0), tolerance, f"{name} {splits} splits")


def test_splits_fill_one_wave():
    """One image of 16 x 16 outputs and 512 maps on 132 SMs: 8 programs of 128 x 128 would leave 124 SMs idle."""
    w = torch.zeros(512, 512, 3, 3, device=DEVICE)
    layer = triton_igemm.prepare(w, precision="tf32x3")
    layer.sms = 132
    tile = Tile(8, 16, 128, 32, 8, 3)
    count = triton_igemm.programs(tile, 1, 512, 16, 16)
    assert count == 8
    assert layer.splits_for(tile, 1, 16, 16, steps=144) == 16          # capped at MAX_SPLITS
    assert layer.splits_for(tile, 1, 16, 16, steps=40) == 5             # at least MIN_SPLIT_STEPS steps each
    assert layer.splits_for(tile, 64, 16, 16, steps=144) == 1           # 512 programs fill the GPU


@pytest.mark.parametrize("name", NAMES)
def test_channels_last_prologue_bits(name):
    """The kernel-side copy equals the host-side split (3xTF32), TF32 rounding or bfloat16 conversion (torch's,
    to nearest even) of a zero-padded channels-last tensor, bit for bit, Inf and NaN included (big keeps them;
    small keeps an Inf's sign; a NaN whose payload is below bf16's bits stays NaN)."""
    parts = 2 if name == "triton-igemm-3xtf32" else 1
    x, w, _ = _data(2, 4, 5, 6, 7, 3, 3, seed=3, bias=False)
    x[0, 1, 2, 3], x[1, 4, 5, 6], x[0, 0, 0, 0] = float("inf"), float("-inf"), float("nan")
    x[1, 2, 3, 3] = 1.0 + 2.0 ** -20                          # a rest below TF32's last bit
    if name == "triton-igemm-bf16":   # ties (to even: down, then up), just past a tie, the largest float32 (to
        # Inf), subnormals (bf16 has them; TF32's split does not keep them), a NaN with its payload in the low bits
        x[1, 0, 0, :6] = torch.tensor([1 + 2.0 ** -8, -(1 + 3 * 2.0 ** -8), 1 + 2.0 ** -8 + 2.0 ** -23,
                                       torch.finfo(torch.float32).max, 3e-39, -5e-41])
        x[0, 3, 1, 1] = torch.tensor(0x7F800001, dtype=torch.int32).view(torch.float32)
    fn, _ = _prepare(name, w, None, padding=(1, 2))
    big, small = fn.channels_last(x.to(DEVICE), 16)
    want = torch.zeros(2, 8, 11, 16)
    want[:, 1:7, 2:9, :5] = x.permute(0, 2, 3, 1)
    flat = want.reshape(16, 11, 16)
    if name == "triton-igemm-bf16":
        assert big.dtype == torch.bfloat16
        got, ref = big.cpu().view(torch.int16), flat.to(torch.bfloat16).view(torch.int16)
        nan = torch.isnan(flat)
        assert torch.equal(torch.isnan(big.cpu()), nan) and torch.equal(got[~nan], ref[~nan])
        return
    want_big, want_small = conv.split_tf32(flat) if parts == 2 else (conv.round_tf32(flat), None)
    _assert_same_bits(big.cpu(), want_big)
    if parts == 2:
        _assert_same_bits(small.cpu(), want_small)
        finite = torch.isfinite(flat)
        off = (want_big.double() + want_small.double() - flat.double())[finite].abs()
        assert torch.all(off <= flat.double()[finite].abs() * 2.0 ** -21)
        assert torch.isposinf(want_small).sum() == 1 and torch.isneginf(want_small).sum() == 1


def _assert_same_bits(got, want):
    """Equal bit patterns, but a NaN may be any NaN (a GPU's NaN * 2^-30 is its canonical NaN)."""
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got.view(torch.int32)[~nan], want.view(torch.int32)[~nan])


def test_split_parts_sum_to_the_value():
    """big + small is within 2^-21 relative of the value, both are TF32 values (13 low bits zero), and small
    has the value's sign."""
    v = torch.randn(10000) * torch.exp(torch.randn(10000) * 10)
    big, small = conv.split_tf32(v)
    assert torch.all((big.view(torch.int32) & 0x1FFF) == 0) and torch.all((small.view(torch.int32) & 0x1FFF) == 0)
    assert torch.all(((big.double() + small.double()) - v.double()).abs() <= v.double().abs() * 2.0 ** -21)
    assert torch.all(torch.sign(small) == torch.sign(v))


@pytest.mark.parametrize("name", NAMES)
def test_inf_and_nan_where_torch_puts_them(name):
    x, w, _ = _data(1, 6, 4, 9, 9, 3, 3, seed=5, bias=False)
    x[0, 1, 2, 3] = float("inf")
    x[0, 2, 6, 6] = float("nan")
    w = w.abs() + 0.01                      # positive weights: Inf stays Inf (no Inf - Inf in fp32 either)
    ref32 = F.conv2d(x, w)
    fn, _ = _prepare(name, w, None)
    got = fn(x.to(DEVICE)).cpu()
    assert torch.equal(torch.isnan(got), torch.isnan(ref32))
    assert torch.equal(torch.isposinf(got), torch.isposinf(ref32))
    finite = torch.isfinite(ref32)
    assert finite.any() and torch.allclose(got[finite], ref32[finite], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("precision", triton_igemm.PRECISIONS)
@pytest.mark.parametrize("layer", [(2, 128, 128, 241, 241, 16, 16), (1, 128, 128, 225, 225, 32, 32),
                                   (8, 96, 48, 118, 118, 11, 11), (16, 32, 32, 120, 120, 9, 9),
                                   (8, 512, 512, 14, 14, 3, 3), (64, 64, 64, 54, 54, 3, 3),
                                   (4, 192, 96, 124, 124, 5, 5), (16, 128, 16, 1020, 1020, 5, 5),
                                   (1, 7, 3, 1, 1, 1, 1)])
def test_chosen_tile_fits_the_layer(precision, layer):
    B, M, C, HO, WO, KH, KW = layer
    t = triton_igemm.choose_tile(precision, B, M, C, HO, WO, KH, KW, sms=132)
    assert t.bn in (64, 128, 256) and t.r * t.tw == t.bn
    assert t.tw == min(t.bn, max(8, 1 << (WO - 1).bit_length()))     # an output row per program row
    assert 16 <= t.bm <= max(16, 1 << (M - 1).bit_length())            # no more maps than the layer's power of two
    assert t.bk == (16 if C <= 16 else 32 if C <= 32 or precision != "bf16" else 64)   # 128-byte box rows
    assert (t.warps, t.stages) in {(w, s) for _, _, w, s in triton_igemm.FORMS[precision]}


def test_big_layers_take_the_big_tiles():
    """gpu-mode's 256-px layers (the measured winners, TILE_NOTE): 128 x 128 for 3xTF32, 256 x 128 for TF32;
    TF32's other forms (TF32_NOTE) and BF16's (BF16_NOTE)."""
    assert triton_igemm.choose_tile("tf32x3", 2, 128, 128, 241, 241, 16, 16, 132) == Tile(1, 128, 128, 32, 8, 3)
    assert triton_igemm.choose_tile("tf32", 2, 128, 128, 241, 241, 16, 16, 132) == Tile(1, 256, 128, 32, 8, 3)
    # 8 images of 14 x 14 outputs, 512 maps: 128 x 128 leaves half the SMs idle
    assert triton_igemm.choose_tile("tf32x3", 8, 512, 512, 14, 14, 3, 3, 132).bm == 64
    # TF32_NOTE: 64 x 128 by default above 64 maps, 128 x 256 and 128 x 128 where they measured faster
    assert triton_igemm.choose_tile("tf32", 8, 512, 512, 14, 14, 3, 3, 132) == Tile(4, 16, 128, 32, 4, 3)
    assert triton_igemm.choose_tile("tf32", 4, 192, 96, 124, 124, 5, 5, 132) == Tile(1, 128, 256, 32, 8, 3)
    assert triton_igemm.choose_tile("tf32", 8, 96, 48, 118, 118, 11, 11, 132) == Tile(1, 128, 128, 32, 8, 4)
    # BF16_NOTE: 64 channels a step; 256 maps a program for 192 maps at 128 px, not for 8 images of 16 px
    assert triton_igemm.choose_tile("bf16", 2, 128, 128, 241, 241, 16, 16, 132) == Tile(1, 256, 128, 64, 8, 3)
    assert triton_igemm.choose_tile("bf16", 4, 192, 96, 124, 124, 5, 5, 132) == Tile(1, 128, 256, 64, 8, 3)
    assert triton_igemm.choose_tile("bf16", 8, 512, 512, 14, 14, 3, 3, 132).bm == 64
    assert triton_igemm.choose_tile("bf16", 16, 32, 16, 252, 252, 5, 5, 132) == Tile(1, 256, 32, 16, 8, 3)


@pytest.mark.skipif(INTERPRETED, reason="the interpreter's tl.dot sums in fp32: no truncating accumulator")
def test_checker_rejects_the_in_accumulator_sum():
    """SUMS_NOTE's fixture: summing a long reduction (C*K*K = 8192) in the tensor cores' accumulator misses the
    exact tolerance on the GPU, the fresh per-step sums meet it, on the same data."""
    x, w, _ = _data(2, 64, 128, 20, 20, 8, 8, seed=4, bias=False)
    ref = _reference(x, w, None, 0)
    fixed, _ = _prepare("triton-igemm-3xtf32", w, None)
    wrong, _ = _prepare("triton-igemm-3xtf32", w, None)
    wrong.sums = 1
    fixed.split_k = wrong.split_k = False   # split-K would shorten each sum (16 splits: 3.9e-6 on an H100)
    from convforge.harness.check import relative_error
    assert relative_error(fixed(x.to(DEVICE)), ref) <= conv.EXACT_TOLERANCE
    assert relative_error(wrong(x.to(DEVICE)), ref) > conv.EXACT_TOLERANCE


def test_refuses_bad_calls():
    x, w, b = _data(1, 3, 2, 8, 8, 3, 3, seed=1)
    with pytest.raises(ValueError, match="precision|serves"):
        triton_igemm.prepare(w.to(DEVICE), b, precision="fp16")
    with pytest.raises(ValueError, match="padding"):
        triton_igemm.prepare(w.to(DEVICE), b, padding=(1, -1))
    fn, _ = _prepare("triton-igemm-3xtf32", w, b)
    with pytest.raises(ValueError, match="channels|expected input"):
        fn(x[:, :1].to(DEVICE))
    with pytest.raises(ValueError, match="smaller"):
        fn(x[:, :, :2, :2].to(DEVICE))
    with pytest.raises(ValueError):
        fn(x.to(DEVICE), out=torch.empty(1, 3, 5, 5, device=DEVICE))
