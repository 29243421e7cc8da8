"""Shared test set-up.

Triton's interpreter runs its kernels on the CPU; it must be switched on before Triton is imported,
so it is set here, first, on machines without a CUDA GPU.
"""

import os
import shutil
from pathlib import Path

try:
    import torch
    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from convforge.harness.check import describe_mismatch, poisoned, relative_error

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(os.environ.get("CONVFORGE_FIXTURES", REPO.parent / "shared" / "fixtures"))


@pytest.fixture(scope="session")
def has_cuda() -> bool:
    return _HAS_CUDA


@pytest.fixture()
def cli(capsys):
    """Run the convforge command in-process: returns (exit status, stdout, stderr)."""
    from convforge.cli import main

    def run(*argv):
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """A folder with the real Fashion-MNIST files (tests that need them skip, saying how to get them)."""
    from convforge import data
    try:
        return data.find_data_dir(None, "test", allow_download=False)
    except Exception:
        pytest.skip("Fashion-MNIST is not installed: apt-get install -y dataset-fashion-mnist")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Each test session gets its own cache folder, so no test depends on a user's cache."""
    cache = tmp_path_factory.getbasetemp() / "convforge-cache"
    monkeypatch.setenv("CONVFORGE_CACHE", str(cache))
    yield


def nvcc_path():
    return shutil.which("nvcc")


@pytest.fixture(params=[16, 8], ids=["avx512-tiles", "avx2-tiles"])
def cpu_tiles(request, monkeypatch):
    """cpu-parallel and cpu_dense (and the CPU engine over them) with the register tiles of one ISA, whatever this CPU has:
    the 16-lane AVX-512 tiles compile to pairs of ymm on an AVX2 CPU, the 8-lane AVX2 tiles run as they are
    on an AVX-512 one, so both are checked on either machine. Returns the vector lanes."""
    from convforge import cpu_dense
    from convforge.conv import cpu_parallel
    vector = request.param
    monkeypatch.setattr(cpu_parallel, "VECTOR", vector)
    for name, value in zip(cpu_parallel.TILE_NAMES, cpu_parallel.TILES[vector]):
        monkeypatch.setattr(cpu_parallel, name, value)
    for name, value in zip(("MR", "PR", "KC", "NC"), cpu_dense.TILES[vector] + cpu_dense.BLOCKING[vector]):
        monkeypatch.setattr(cpu_dense, name, value)     # the dense layers' tile and blocking of that ISA
    return vector


# -- the CUDA kernels' host emulation (tests/test_cuda_kernels.py, tests/test_cuda_igemm.py) -----------------

def _emulation_available() -> bool:
    from convforge.conv import cuda_emulate
    return cuda_emulate.compiler() is not None


needs_cxx = pytest.mark.skipif(not _emulation_available(), reason="needs a C++20 compiler (g++) for the host emulation")


@pytest.fixture(autouse=True)
def _real_device_for_gpu_tests(request):
    """A test marked ``gpu`` runs on the real CUDA launcher even where the module's emulated tests hold the
    module-scoped ``emulation`` (on a GPU machine with g++, test_cuda_igemm's GPU tests otherwise ran emulated
    and refused their CUDA tensors)."""
    if request.node.get_closest_marker("gpu") is None:
        yield
        return
    from convforge.conv import cuda_emulate
    with cuda_emulate.suspended():
        yield


@pytest.fixture(scope="module")
def emulation():
    from convforge.conv import cuda_emulate
    with cuda_emulate.emulated(sm_count=2):
        yield cuda_emulate


def check_layer_call(fn, x, ref, tolerance, what):
    """One prepared layer called with a NaN-poisoned ``out`` and without: both within ``tolerance`` of the
    float64 ``ref``, ``out`` returned, a fresh float32 output on x's device, x unchanged. Returns the error of
    the ``out`` call."""
    original = x.clone()
    out = poisoned(ref.shape, x.device)
    got = fn(x, out=out)
    assert got is out, f"{what}: did not return the out buffer"
    error = relative_error(got, ref)
    assert error <= tolerance, f"{what}: relative error {error:.3g} > {tolerance:g}; {describe_mismatch(got, ref)}"
    again = fn(x)
    assert again.dtype == torch.float32 and again.device == x.device and tuple(again.shape) == ref.shape
    fresh = relative_error(again, ref)
    assert fresh <= tolerance, f"{what} (no out): relative error {fresh:.3g}; {describe_mismatch(again, ref)}"
    assert torch.equal(x, original), f"{what}: modified its input"
    return error


def assert_nonfinite_as_torch(got, want, ref, bound, label):
    """``got``'s NaN, +Inf and -Inf positions are those of torch's fp32 result ``want``, and where both
    ``want`` and the float64 ``ref`` are finite, ``|got - ref| <= bound`` element by element (all NumPy
    arrays of one shape)."""
    import numpy as np
    for name, test in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
        differ = np.argwhere(test(got) != test(want))
        assert differ.size == 0, (f"{label}: {name} positions differ from torch's at "
                                  f"{[tuple(map(int, d)) for d in differ[:5]]} of {differ.shape[0]} "
                                  f"(got {got[tuple(differ[0])]}, torch {want[tuple(differ[0])]})")
    finite = np.isfinite(want) & np.isfinite(ref)
    off, limit = np.abs(got - ref)[finite], bound[finite]
    assert np.all(off <= limit), \
        f"{label}: finite values off by up to {float(np.max(off / np.maximum(limit, 1e-300))):.3g} x the bound"
