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

UNFUSED = ("triton-direct", "triton-gemm", "triton-gemm-tf32", "triton-fused-layer")

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


def _tolerance(impl) -> float:
    return EXACT if INTERPRETED else impl.tolerance


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
        assert impl.header.splitlines()[0].startswith(name.split("-tf32")[0]), impl.header[:80]
        assert impl._module().unavailable_reason() is None
    assert conv.get("triton-fused-layer").fuses


def test_rejects_bad_input():
    impl = conv.get("triton-direct")
    x, w, b = _case((1, 3, 2, 8, 8, 3), seed=1, bias=False)
    fn = impl.prepare(w, b)
    with pytest.raises(ValueError):
        fn(x[:, :1])                                   # wrong channel count
    with pytest.raises(ValueError):
        fn(x, out=torch.empty(1, 3, 5, 5, device=DEVICE))  # wrong out shape


@pytest.mark.slow
def test_sm90_code_keeps_sums_in_registers():
    """Compile fa17 and sp18 for sm_90 here (Triton ships ptxas; no GPU needed) and check the design
    holds in the machine code: no register spills and no shared memory in the direct and pool-2 fused
    kernels (a layout mismatch shows up as a shuffle through shared memory at every tap)."""
    import shutil
    import subprocess
    import sys
    import triton
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas) and not shutil.which("ptxas"):
        pytest.skip("this Triton has no bundled ptxas to compile sm_90 code with")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "convforge.conv.triton_common", "sass", "--layers", "fa17,sp18"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    assert len(lines) == 5, run.stdout
    for line in lines:
        assert "SPILLS" not in line and "smem" not in line, line


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
