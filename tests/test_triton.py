"""The Triton kernels against the float64 reference, on a GPU or, without one, in Triton's interpreter.

conftest.py sets TRITON_INTERPRET=1 before Triton is imported when PyTorch sees no CUDA GPU: the kernels
then run on the CPU on CPU tensors, with tl.dot in plain fp32, so every kernel (tf32 included) must meet
the exact tolerance there; on a GPU each meets its registry tolerance. Shapes are tiny (the interpreter
runs a kernel as NumPy calls per program) but cover every code path: K = 1 and 7, H != W, C = 1, 5 and
a run-time channel loop, M = 1, 7 and 50, vector widths 4, 2 and 1, pools 2, 4 and 3 with odd pooled
sizes, each activation, bias and no bias. Each call goes through check_call: output poisoned with NaN,
input compared with a clone, out buffer identity checked, with and without ``out``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed: pip install 'convforge[triton]'")

from convforge import conv  # noqa: E402
from convforge.conv import triton_common  # noqa: E402
from convforge.harness.check import (check_call, describe_mismatch, random_case, reference_layer,  # noqa: E402
                                     relative_error)

# tanh and sigmoid compute e^x and let it overflow to inf on purpose (1 - 2/inf = 1); NumPy warns.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp2:RuntimeWarning")

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu"
EXACT = 1e-5
REPO = Path(__file__).resolve().parents[1]

UNFUSED = ("triton-direct", "triton-gemm", "triton-gemm-tf32", "triton-fused-layer", "triton-igemm-3xtf32",
           "triton-igemm-tf32", "triton-igemm-bf16")

# (B, M, C, H, W, K): what each case exercises.
SHAPES = {
    "base V4":        (2, 4, 1, 12, 12, 5),    # W and W-K+1 divisible by 4: a lane owns 4 columns
    "V2":             (2, 12, 1, 14, 14, 5),   # divisible by 2 only
    "K1 C5":          (2, 7, 5, 6, 7, 1),      # 1x1 kernel, M = 7 (padded pass)
    "K7 HneW":        (2, 6, 2, 12, 10, 7),    # largest kernel, H != W
    "HneW odd":       (2, 5, 1, 9, 14, 3),     # odd sizes: one position per lane
    "M1":             (2, 1, 1, 8, 8, 3),      # a single map
    "M50":            (2, 50, 1, 12, 12, 5),   # fa17's 50 maps: 2 x (16+8) + 2 passes
    "loop C6":        (2, 16, 6, 10, 10, 5),   # C*K*K > 64: run-time channel loop
    "1x1 out":        (1, 3, 2, 7, 7, 7),      # kernel as large as the input
}


# Entries that round their operands to TF32 or bf16 themselves (not in tl.dot): reduced precision under the
# interpreter too.
ROUNDS_OPERANDS = ("triton-igemm-tf32", "triton-igemm-bf16")


def _tolerance(impl) -> float:
    return EXACT if INTERPRETED and impl.name not in ROUNDS_OPERANDS else impl.tolerance


def _case(shape, seed: int, bias: bool):
    batch, maps, channels, height, width, kernel = shape
    x, w, b = random_case((batch, channels, height, width), (maps, channels, kernel, kernel), seed, bias)
    return x.to(DEVICE), w.to(DEVICE), (None if b is None else b.to(DEVICE))


def _assert_close(result, fn, x, ref, tolerance, what):
    assert result.problem is None, f"{what}: {result.problem}"
    assert result.error <= tolerance, (f"{what}: relative error {result.error:.2e} > {tolerance:.0e}; "
                                       + describe_mismatch(fn(x), ref))


@pytest.mark.parametrize("name", UNFUSED)
@pytest.mark.parametrize("label", list(SHAPES))
def test_conv_matches_reference(name, label):
    impl = conv.get(name)
    shape = SHAPES[label]
    for bias in ((False, True) if label in ("base V4", "loop C6") else (len(label) % 2 == 1,)):
        x, w, b = _case(shape, seed=7 + len(label), bias=bias)
        fn = impl.prepare(w, b)
        ref = reference_layer(x, w, b)
        result = check_call(fn, x, ref, _tolerance(impl))
        _assert_close(result, fn, x, ref, _tolerance(impl), f"{name} {label} bias={bias}")


# (B, M, C, H, W, K, activation, pool, bias): pooled sizes given for H x W after the conv.
FUSED = [
    (2, 6, 1, 13, 13, 4, "tanh", 2, True),      # 10x10 -> 5x5 (odd pooled size)
    (2, 6, 1, 13, 13, 4, "relu", 4, False),     # 10x10 -> 2x2 (rows/cols past the last window)
    (2, 5, 2, 15, 12, 3, "sigmoid", 2, True),   # 13x10 -> 6x5
    (2, 5, 2, 15, 12, 3, None, 4, False),       # 13x10 -> 3x2, no activation
    (2, 50, 1, 12, 12, 5, "tanh", 2, False),    # fa17-like: 8x8 -> 4x4, three passes
    (2, 12, 1, 14, 14, 5, "tanh", 2, True),     # fa19-like
    (2, 16, 4, 13, 13, 7, "relu", 4, True),     # fa20 L2-like: run-time channel loop, 7x7 -> 1x1
    (2, 7, 3, 12, 11, 3, "sigmoid", 4, True),   # 10x9 -> 2x2, M = 7
    (2, 3, 1, 12, 12, 3, "tanh", 3, True),      # pool 3: not a power of two (loops over the window)
    (1, 4, 1, 6, 6, 5, "relu", 2, False),       # 2x2 -> 1x1
]


@pytest.mark.parametrize("case", FUSED, ids=lambda c: f"B{c[0]}M{c[1]}C{c[2]}H{c[3]}W{c[4]}K{c[5]}-{c[6]}-pool{c[7]}")
def test_fused_matches_reference(case):
    batch, maps, channels, height, width, kernel, activation, pool, bias = case
    impl = conv.get("triton-fused-layer")
    x, w, b = _case((batch, maps, channels, height, width, kernel), seed=maps + pool, bias=bias)
    fn = impl.prepare_fused(w, b, activation, pool)
    ref = reference_layer(x, w, b, activation, pool)
    result = check_call(fn, x, ref, _tolerance(impl))
    _assert_close(result, fn, x, ref, _tolerance(impl), f"fused {case}")


def test_fused_empty_pooled_output():
    """A pool larger than the conv output gives an empty map (as F.max_pool2d), not an error."""
    impl = conv.get("triton-fused-layer")
    x, w, b = _case((2, 3, 1, 6, 6, 5), seed=3, bias=True)
    y = impl.prepare_fused(w, b, "relu", 4)(x)
    assert tuple(y.shape) == (2, 3, 0, 0)


@pytest.mark.parametrize("name", UNFUSED)
def test_batch_of_one_and_fresh_data(name):
    """Same prepared weights, new inputs of another batch size: nothing is cached from the first call."""
    impl = conv.get(name)
    x, w, b = _case((3, 5, 2, 9, 9, 3), seed=11, bias=True)
    fn = impl.prepare(w, b)
    for seed, batch in ((12, 3), (13, 1)):
        x = _case((batch, 5, 2, 9, 9, 3), seed=seed, bias=False)[0]
        ref = reference_layer(x, w, b)
        _assert_close(check_call(fn, x, ref, _tolerance(impl)), fn, x, ref, _tolerance(impl), f"{name} B={batch}")


@pytest.mark.parametrize("label", ["base V4", "V2", "HneW odd", "M50", "loop C6"])
def test_baked_weights(label, monkeypatch):
    """Weights compiled in as constants (TileConfig(baked=True)), direct and fused: the same function; the
    channel-loop layers (C*K*K > 64) fall back to loaded weights."""
    from convforge.conv import triton_direct, triton_fused_layer
    x, w, b = _case(SHAPES[label], seed=31, bias=True)
    M, C, K = w.shape[0], w.shape[1], w.shape[2]
    cfg = triton_common.TileConfig(4, 16, 4, baked=True)
    constants = triton_direct.kernel_constants(M, C, K, x.shape[2], x.shape[3], True, cfg, (0.5,) * 4)
    assert constants["BAKED"] == triton_common.can_bake(C, K) == (label != "loop C6")
    ref = reference_layer(x, w, b)
    packed = []   # the weight buffer the kernel may read: zeroed below, a baked kernel must not notice
    pack = triton_common.pack_weights
    monkeypatch.setattr(triton_common, "pack_weights", lambda *a: packed.append(pack(*a)) or packed[-1])
    fn = triton_direct.prepare(w, b, config=cfg)
    tolerance = _tolerance(conv.get("triton-direct"))
    _assert_close(check_call(fn, x, ref, tolerance), fn, x, ref, tolerance, f"baked direct {label}")
    packed[-1].zero_()
    zeroed = fn(x)
    if constants["BAKED"]:
        assert torch.equal(zeroed, fn(x)) and float(relative_error(zeroed, ref)) <= tolerance, label
    else:   # the loaded path reads the buffer: the check above would have caught a baked kernel that did
        assert float(relative_error(zeroed, ref)) > 0.5, label
    ref = reference_layer(x, w, b, "tanh", 2)
    fn = triton_fused_layer.prepare_fused(w, b, "tanh", 2, config=cfg)
    _assert_close(check_call(fn, x, ref, tolerance), fn, x, ref, tolerance, f"baked fused {label}")


# (B, M, C, H, W, K) with C*K*K > 64 (run-time channel loop) and block configs (R, maps, warps, block rows):
# blocks of 4x2, 2x4, 8x1, 4x1 and 2x2 outputs per lane, output maps whose sizes the blocks do not divide
# (the last block row and column move back and overlap their neighbour), M not a multiple of the pass.
BLOCKS = [
    ((2, 7, 3, 13, 14, 5), (8, 8, 4, 4)),      # 9x10 out: rows 0-3, 4-7, 5-8; columns in pairs
    ((2, 24, 12, 9, 12, 3), (8, 12, 4, 2)),    # 2x4 blocks, 7x10 out, two passes of 12
    ((3, 5, 4, 14, 11, 5), (8, 8, 2, 8)),      # 8x1 blocks on 10x7 (one overlapping block row)
    ((2, 16, 4, 12, 12, 7), (4, 16, 4, 4)),    # 4x1 blocks, 7x7 kernel, one pass of 16 maps
    ((1, 9, 5, 8, 9, 5), (4, 8, 1, 2)),        # 2x2 blocks, one warp, M = 9 (a tail pass)
    ((5, 3, 4, 14, 11, 5), (8, 8, 1, 8)),      # one warp: 3 programs, the last with padding lanes
    ((3, 5, 4, 13, 14, 5), (8, 8, 1, 4)),      # one warp, 4x2: programs straddle images
]


@pytest.mark.parametrize("case", BLOCKS, ids=lambda c: "B{}M{}C{}H{}W{}K{}".format(*c[0]) + "-R{}x{}".format(
    c[1][3], c[1][0] // c[1][3]))
def test_direct_blocks(case):
    """triton-direct with each lane computing a block of neighbouring outputs (the many-channel layers)."""
    from convforge.conv import triton_direct
    shape, (r, maps, warps, rows) = case
    cfg = triton_common.TileConfig(r, maps, warps, block_rows=rows)
    x, w, b = _case(shape, seed=sum(shape) + rows, bias=rows != 8)
    constants = triton_direct.kernel_constants(shape[1], shape[2], shape[5], shape[3], shape[4], b is not None, cfg)
    assert (constants["RB"], constants["CB"]) == (rows, r // rows)
    fn = triton_direct.prepare(w, b, config=cfg)
    ref = reference_layer(x, w, b)
    tolerance = _tolerance(conv.get("triton-direct"))
    _assert_close(check_call(fn, x, ref, tolerance), fn, x, ref, tolerance, f"blocks {case}")


def test_block_config_must_tile_the_positions():
    for rows in (3, 16):
        with pytest.raises(ValueError, match="block_rows"):
            triton_common.TileConfig(8, 8, 4, block_rows=rows)


def test_blocks_are_the_many_channel_default_and_fall_back():
    """The many-channel preset layers take blocks; a block taller than the output map, or an unrolled
    (one-channel) layer, uses the flat layout instead."""
    from convforge import tuning
    from convforge.conv import triton_direct, triton_fused_layer
    for entry in tuning.entries("triton-direct"):
        (m, c, k), cfg = (entry["shape"][f] for f in "MCK"), triton_common.TileConfig(**entry["config"])
        if triton_common.can_bake(c, k):
            continue
        assert triton_direct.choose_config(m, c, k).block_rows > 0 and cfg.block_rows > 0
        assert triton_direct.kernel_constants(m, c, k, 40, 40, False, cfg)["RB"] == cfg.block_rows
    cfg = triton_common.TileConfig(8, 8, 4, block_rows=4)
    assert triton_direct.kernel_constants(6, 4, 7, 9, 12, False, cfg)["RB"] == 0        # 3 output rows
    assert triton_direct.kernel_constants(6, 1, 5, 20, 20, False, cfg)["RB"] == 0       # unrolled C = 1
    assert triton_fused_layer.choose_config(16, 4, 7, 4) == triton_common.TileConfig(16, 8, 4, block_rows=4)
    assert not triton_fused_layer.uses_blocks(cfg, 4, 7, 2)                              # rows != pool
    x, w, b = _case((2, 6, 4, 10, 13, 7), seed=5, bias=True)                             # 4x7 out
    fn = triton_direct.prepare(w, b, config=triton_common.TileConfig(8, 8, 4, block_rows=8))
    ref = reference_layer(x, w, b)
    tolerance = _tolerance(conv.get("triton-direct"))
    _assert_close(check_call(fn, x, ref, tolerance), fn, x, ref, tolerance, "block taller than the map")


def test_tuned_configs_follow_the_triton_version(monkeypatch):
    """An entry with a triton_min replaces the version-free entry of its shape from that Triton on, and only
    for its shape (triton-direct.json: fa18 L2 from 3.9)."""
    from convforge import tuning
    from convforge.conv import triton_direct
    entries = tuning.entries("triton-direct")
    (since_entry,) = [e for e in entries if "triton_min" in e]
    key = tuple(since_entry["shape"][f] for f in "MCK")
    since = tuning.version_tuple(since_entry["triton_min"])
    newer = triton_common.TileConfig(**since_entry["config"])
    general = {tuple(e["shape"][f] for f in "MCK"): triton_common.TileConfig(**e["config"]) for e in entries
               if "triton_min" not in e and "triton_max" not in e}
    older = general[key]
    assert newer != older
    monkeypatch.setattr(triton_common, "TRITON_VERSION", (since[0], since[1] - 1))
    assert triton_direct.choose_config(*key) == older
    for version in (since, (since[0], since[1] + 1), (since[0] + 1, 0)):
        monkeypatch.setattr(triton_common, "TRITON_VERSION", version)
        assert triton_direct.choose_config(*key) == newer
        for other, cfg in general.items():
            assert other == key or triton_direct.choose_config(*other) == cfg


# (B, M, C, H, W, K, activation, pool, bias, config): fused blocks of a window's full height.
FUSED_BLOCKS = [
    ((2, 16, 4, 15, 16, 5), "relu", 4, True, (16, 8, 4, 4)),    # a whole 4x4 window per lane, 11x12 conv
    ((2, 7, 3, 13, 14, 5), "relu", 4, False, (8, 8, 4, 4)),     # 4x2 blocks: two lanes per window
    ((2, 5, 4, 12, 11, 5), "tanh", 2, True, (4, 8, 2, 2)),      # pool 2, 2x2 blocks, 8x7 conv -> 4x3
    ((2, 6, 3, 12, 13, 5), "sigmoid", 4, True, (4, 8, 2, 4)),   # 4x1 blocks: four lanes per window
    ((1, 9, 5, 11, 10, 5), None, 2, False, (2, 8, 4, 2)),       # 2x1 blocks, M = 9
    ((3, 5, 4, 13, 14, 5), "tanh", 2, True, (4, 8, 1, 2)),      # one warp: several programs
    ((5, 3, 4, 16, 17, 5), "relu", 4, False, (8, 8, 1, 4)),     # one warp, two lanes per window
]


@pytest.mark.parametrize("case", FUSED_BLOCKS,
                         ids=lambda c: "M{}C{}H{}W{}K{}".format(*c[0][1:]) + f"-pool{c[2]}-R{c[4][0]}")
def test_fused_blocks(case):
    from convforge.conv import triton_fused_layer
    shape, activation, pool, bias, (r, maps, warps, rows) = case
    cfg = triton_common.TileConfig(r, maps, warps, block_rows=rows)
    assert triton_fused_layer.uses_blocks(cfg, shape[2], shape[5], pool)
    x, w, b = _case(shape, seed=sum(shape) + pool, bias=bias)
    fn = triton_fused_layer.prepare_fused(w, b, activation, pool, config=cfg)
    ref = reference_layer(x, w, b, activation, pool)
    tolerance = _tolerance(conv.get("triton-fused-layer"))
    _assert_close(check_call(fn, x, ref, tolerance), fn, x, ref, tolerance, f"fused blocks {case}")


# triton-tc-fused (FP16 tensor cores, fp16 operands also under the interpreter: always the 1e-2 tolerance).
# (B, M, C, H, W, K, activation, pool, bias)
TC_FUSED = [
    (2, 16, 4, 40, 40, 7, "relu", 4, True),     # fa20 L2: 34x34 -> 8x8 (two conv rows/cols past the windows)
    (2, 5, 3, 13, 13, 3, "tanh", 2, True),      # odd: 11x11 -> 5x5
    (2, 5, 3, 13, 13, 3, None, 1, False),       # pool 1: the plain convolution
    (2, 7, 3, 12, 11, 3, "sigmoid", 3, True),   # pool 3: windows padded to 16 rows
    (1, 70, 2, 9, 9, 3, "relu", 2, False),      # M = 70: two map blocks of 64 (gather kernel)
    (2, 12, 3, 14, 17, 5, "sigmoid", 4, False), # rows kernel: segments past the input row (masked)
]


def _tc_id(c) -> str:
    return f"B{c[0]}M{c[1]}C{c[2]}H{c[3]}W{c[4]}K{c[5]}-{c[6]}-pool{c[7]}"


@pytest.mark.parametrize("kernel", ["default", "gather"])
@pytest.mark.parametrize("case", TC_FUSED, ids=_tc_id)
def test_tc_fused_matches_reference(case, kernel):
    """The default (rows kernel where it fits) and the gather kernel, which serves every shape."""
    from convforge.conv import triton_tc_fused
    batch, maps, channels, height, width, kernel_size, activation, pool, bias = case
    impl = conv.get("triton-tc-fused")
    x, w, b = _case((batch, maps, channels, height, width, kernel_size), seed=maps + pool + 1, bias=bias)
    config = triton_tc_fused.INTERPRETER_CONFIG if kernel == "gather" else None
    fn = (triton_tc_fused.prepare_fused(w, b, activation, pool, config=config) if (activation or pool > 1)
          else triton_tc_fused.prepare(w, b, config=config))
    ref = reference_layer(x, w, b, activation, pool)
    _assert_close(check_call(fn, x, ref, impl.tolerance), fn, x, ref, impl.tolerance, f"tc fused {case} {kernel}")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_tc_fused_non_finite_inputs_land_as_in_torch(value):
    """The rows kernel's Toeplitz zeros multiply inputs outside an output's window (Inf * 0 = NaN): its probe and
    fix-up launch must put NaN / Inf only where fp32 arithmetic does."""
    import torch.nn.functional as F
    impl = conv.get("triton-tc-fused")
    x, w, b = _case((1, 5, 3, 13, 13, 3), seed=9, bias=True)
    x[0, 1, 4, 6] = value

    def torch_layer(inputs, pool):   # torch's float64 conv (+ tanh and max pool), the oracle for NaN/Inf positions
        out = F.conv2d(inputs.cpu().double(), w.cpu().double(), b.cpu().double())
        return F.max_pool2d(torch.tanh(out), pool) if pool > 1 else out

    for activation, pool in ((None, 1), ("tanh", 2)):
        fn = impl.prepare_fused(w, b, activation, pool) if pool > 1 else impl.prepare(w, b)
        want = torch_layer(x, pool)
        got = fn(x).cpu().double()
        for test in (torch.isnan, torch.isposinf, torch.isneginf):
            assert torch.equal(test(got), test(want)), (activation, pool, test.__name__)
        finite = torch.isfinite(want)
        assert (got[finite] - want[finite]).norm() <= impl.tolerance * want[finite].norm()
        # The next call on finite data through the same launch (its probe buffer reused) is all finite again.
        clean = x.clone()
        clean[0, 1, 4, 6] = 0.5
        want = torch_layer(clean, pool)
        assert (fn(clean).cpu().double() - want).norm() <= impl.tolerance * want.norm()


def test_tc_fused_checker_rejects_a_wrong_window_order(monkeypatch):
    """A kernel that pools the wrong rows (here: windows of the transposed layout) must fail the check."""
    from convforge.conv import triton_tc_fused
    x, w, b = _case((1, 5, 3, 13, 13, 3), seed=4, bias=True)
    fn = triton_tc_fused.prepare_fused(w, b, "tanh", 2)
    ref = reference_layer(x, w, b, "tanh", 2)
    wrong = lambda x, out=None: fn(x.transpose(2, 3).contiguous(), out)   # noqa: E731
    assert check_call(wrong, x, ref, conv.get("triton-tc-fused").tolerance).error > 1e-2


def test_gemm_tf32x3_is_exact():
    """The optional three-pass TF32 precision must meet the exact tolerance (it is fp32-accurate)."""
    from convforge.conv import triton_gemm
    x, w, b = _case((2, 16, 6, 10, 10, 5), seed=5, bias=True)
    fn = triton_gemm.prepare(w, b, precision="tf32x3")
    ref = reference_layer(x, w, b)
    _assert_close(check_call(fn, x, ref, EXACT), fn, x, ref, EXACT, "tf32x3")


@pytest.mark.parametrize("maps", list(range(1, 65)) + [100])
def test_map_plan_covers_every_map(maps):
    for r, cap in ((4, 24), (8, 8), (4, 16), (2, 32)):
        plan = triton_common.plan_maps(maps, r, cap)
        sizes = [plan.a, plan.b, plan.ta, plan.tb]
        assert all(s == 0 or s & (s - 1) == 0 for s in sizes), plan
        assert plan.a > 0 and plan.count >= 1 and plan.a + plan.b <= cap and plan.ta + plan.tb <= cap, plan
        assert maps <= plan.width < maps + max(plan.a, 1) + cap, plan
        assert plan.width - maps < (plan.a + plan.b) or plan.ta + plan.tb > 0 or plan.width == maps, plan


def test_registry_entries():
    for name in UNFUSED:
        impl = conv.get(name)
        assert impl.header.splitlines()[0].startswith(name.split("-tf32")[0].split("-bf16")[0]), impl.header[:80]
        assert impl._module().unavailable_reason() is None
    assert conv.get("triton-fused-layer").fuses
    assert conv.get("triton-tc-fused").fuses and conv.get("triton-tc-fused").precision == "fp16"
    assert conv.get("triton-tc-fused").header.startswith("triton-tc-fused")


def test_rejects_bad_input():
    impl = conv.get("triton-direct")
    x, w, b = _case((1, 3, 2, 8, 8, 3), seed=1, bias=False)
    fn = impl.prepare(w, b)
    with pytest.raises(ValueError):
        fn(x[:, :1])                                   # wrong channel count
    with pytest.raises(ValueError):
        fn(x, out=torch.empty(1, 3, 5, 5, device=DEVICE))  # wrong out shape


@pytest.mark.parametrize("name", ["triton-direct", "triton-fused-layer"])
def test_direct_kernels_refuse_kernels_past_unrolling(name):
    """They unroll every tap: a 12 x 12 kernel is refused in prepare with a pointer to the GEMM entries; 11 x 11
    is served."""
    impl = conv.get(name)
    with pytest.raises(ValueError, match="unrolls all 12x12 taps.*triton-gemm"):
        impl.prepare(torch.randn(2, 3, 12, 12, device=DEVICE))
    impl.prepare(torch.randn(2, 3, 11, 11, device=DEVICE))


def _supported_triton() -> str:
    """The triton requirement pyproject.toml states for the 'triton' extra, e.g. 'triton>=3.6,<3.10'."""
    return re.search(r'^triton = \["(triton[^"]*)"\]', (REPO / "pyproject.toml").read_text(), re.M).group(1)


def _triton_versions() -> list[str]:
    """The Triton versions the compile test covers: the oldest supported (the lower bound) and the one
    installed (the README's test command installs the newest in range); CONVFORGE_TEST_TRITON adds more,
    comma-separated (e.g. 3.7.1,3.8.0)."""
    oldest = re.search(r">=\s*([0-9.]+)", _supported_triton()).group(1)
    oldest += ".0" * (2 - oldest.count("."))
    extra = [v for v in os.environ.get("CONVFORGE_TEST_TRITON", "").split(",") if v]
    from importlib.metadata import PackageNotFoundError, version
    try:
        installed = version("triton")
    except PackageNotFoundError:
        installed = "installed"
    return list(dict.fromkeys([oldest, *extra, installed]))


def _triton_site(version: str) -> str:
    """A folder holding ``triton==version`` (pip --target, kept between runs), or "" for the installed one."""
    import subprocess
    import sys
    import triton
    if version == triton.__version__:
        return ""
    site = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "convforge-tests" / f"triton-{version}"
    if not (site / "triton" / "__init__.py").exists():
        run = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                              "--target", str(site), f"triton=={version}"], capture_output=True, text=True)
        if run.returncode:
            pytest.skip(f"could not install triton=={version} to compile with: {run.stderr.strip()[-300:]}")
    return str(site)


def test_installed_triton_is_supported():
    """The Triton the README's commands install lies inside the range pyproject.toml states."""
    import triton
    bounds = dict(re.findall(r"(>=|<)\s*([0-9.]+)", _supported_triton()))
    version = tuple(int(v) for v in re.match(r"(\d+)\.(\d+)", triton.__version__).groups())
    assert tuple(int(v) for v in bounds[">="].split(".")[:2]) <= version < tuple(
        int(v) for v in bounds["<"].split(".")[:2]), (triton.__version__, _supported_triton())


# Tile configs that are allowed to spill, and how much: (layer, kind) -> bytes per thread, the same under
# every supported Triton (see convforge/tuning/triton-direct.json for the measurement behind each).
SPILL_ALLOWED = {("sp18 L2", "direct"): 24, ("sp19 L2", "direct"): 24}


@pytest.mark.slow
@pytest.mark.parametrize("version", _triton_versions())
def test_sm90_code_keeps_sums_in_registers(version):
    """Compile every preset layer's tuned direct and fused kernels for sm_90 here (Triton ships ptxas; no
    GPU needed) under the oldest and the newest supported Triton, and check the design holds in the
    machine code: no register spills (but the measured, capped exceptions in SPILL_ALLOWED) and no
    shared memory (a layout mismatch shows up as a shuffle through shared memory at every tap)."""
    import subprocess
    import sys
    site = _triton_site(version)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if site:
        env["PYTHONPATH"] = os.pathsep.join([site, str(REPO)])
    probe = subprocess.run([sys.executable, "-c", "import triton, os; print(triton.__version__, "
                            "os.path.exists(os.path.join(os.path.dirname(triton.__file__), 'backends', "
                            "'nvidia', 'bin', 'ptxas')))"], capture_output=True, text=True, env=env, cwd=REPO)
    assert probe.returncode == 0, probe.stderr[-2000:]
    found, has_ptxas = probe.stdout.split()
    assert found == version, probe.stdout
    if has_ptxas != "True":
        pytest.skip(f"triton {found} has no bundled ptxas to compile sm_90 code with")
    run = subprocess.run([sys.executable, "-m", "convforge", "sweep", "--sass", "--layers",
                          "fa17,sp18,sp19,fa18,fa19,fa20"], capture_output=True, text=True, env=env, timeout=1200, cwd=REPO)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    assert len(lines) == 18, run.stdout      # every preset: L1 direct + fused, L2 direct (+ fused on fa20)
    for line in lines:
        assert "smem" not in line, f"triton {found}: {line}"
        label, kind = line[:8].strip(), line[8:].split()[0]
        spill = int(line.split("SPILLS ")[1].split()[0]) if "SPILLS" in line else 0
        assert spill <= SPILL_ALLOWED.get((label, kind), 0), f"triton {found}: {line}"
    assert sum("block=" in line for line in lines) == 6, run.stdout   # the five L2s, direct, and fa20's fused


def test_batches_past_int32_offsets_go_in_slices(monkeypatch):
    """A batch whose flat offsets would pass int32 is launched in consecutive slices: forced here by
    lowering the limit to a few images' worth, every implementation must still write every image."""
    x, w, b = _case((7, 5, 2, 11, 10, 3), seed=31, bias=True)
    per_image = max(2 * 11 * 10, 5 * 9 * 8)
    monkeypatch.setattr(triton_common, "INT32_LIMIT", 3 * per_image + (1 << 16))
    assert len(triton_common.batch_slices(7, per_image)) == 3          # images 0-2, 3-5, 6
    for name in UNFUSED:
        impl = conv.get(name)
        fn = impl.prepare(w, b)
        ref = reference_layer(x, w, b)
        _assert_close(check_call(fn, x, ref, _tolerance(impl)), fn, x, ref, _tolerance(impl), f"{name} sliced")
    fn = conv.get("triton-fused-layer").prepare_fused(w, b, "tanh", 2)
    ref = reference_layer(x, w, b, "tanh", 2)
    impl = conv.get("triton-fused-layer")
    _assert_close(check_call(fn, x, ref, _tolerance(impl)), fn, x, ref, _tolerance(impl), "fused sliced")
    # the block paths (C*K*K > 64), direct and fused, sliced too
    x, w, b = _case((7, 5, 4, 11, 10, 5), seed=32, bias=True)
    per_image = max(4 * 11 * 10, 5 * 7 * 6)
    monkeypatch.setattr(triton_common, "INT32_LIMIT", 3 * per_image + (1 << 16))
    from convforge.conv import triton_direct, triton_fused_layer
    cfg = triton_common.TileConfig(8, 8, 1, block_rows=4)
    fn, ref = triton_direct.prepare(w, b, config=cfg), reference_layer(x, w, b)
    _assert_close(check_call(fn, x, ref, _tolerance(impl)), fn, x, ref, _tolerance(impl), "blocks sliced")
    cfg = triton_common.TileConfig(4, 8, 1, block_rows=2)
    fn, ref = triton_fused_layer.prepare_fused(w, b, "relu", 2, config=cfg), reference_layer(x, w, b, "relu", 2)
    _assert_close(check_call(fn, x, ref, _tolerance(impl)), fn, x, ref, _tolerance(impl), "fused blocks sliced")
