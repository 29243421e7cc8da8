"""Comparing an implementation's output with the float64 reference: shared by verify, bench and the tests.

``check_call`` is the one place a convolution function is called under scrutiny: output poisoned with NaN,
input compared with a clone, the returned buffer's identity checked, the error measured in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from convforge.conv.reference import conv2d_float64
from convforge.models import ACTIVATIONS

# Root mean square of the input values random_case draws (uniform on [-64, 191]): sets the weight scale
# that puts a convolution's output near unit size.
_INPUT_RMS = math.sqrt(255.0 ** 2 / 12 + 63.5 ** 2)
LARGE_IM2COL_BYTES = 1 << 30   # reference_layer: above this per image, torch's float64 convolution
# A check compares at most this many outputs with float64 (checked_part). Bench's wide layers of 1024 x 1024
# images with 128 maps have 268 M outputs at B = 2: drawing, computing and comparing them in float64 on the
# host took seconds per call, and three of four wide bench chunks ran out of time
# (benchmarks/2026-11-25-h100-igemm-3xtf32-fix).
CHECKED_OUTPUTS = 1 << 24


def poisoned(shape: Sequence[int], device: str | torch.device = "cpu") -> torch.Tensor:
    """An output buffer full of NaN, so that any element a kernel fails to write is caught."""
    return torch.full(tuple(shape), float("nan"), dtype=torch.float32, device=device)


def relative_error(out: torch.Tensor | np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref|| in float64; inf when out holds NaN or Inf (an unwritten or broken output)."""
    got = out.detach().cpu().double().numpy() if isinstance(out, torch.Tensor) else np.asarray(out, np.float64)
    if got.shape != ref.shape:
        raise ValueError(f"output shape {got.shape} differs from the reference's {ref.shape}")
    if not np.all(np.isfinite(got)):
        return float("inf")
    norm = np.linalg.norm(ref)
    return float(np.linalg.norm(got - ref) / (norm if norm > 0 else 1.0))


def describe_mismatch(out: torch.Tensor | np.ndarray, ref: np.ndarray, limit: int = 5) -> str:
    """The first few differing elements (and how many are NaN), for a readable failure message."""
    got = out.detach().cpu().double().numpy() if isinstance(out, torch.Tensor) else np.asarray(out, np.float64)
    bad = ~np.isclose(got, ref, rtol=1e-4, atol=1e-4 * (np.abs(ref).max() or 1.0))
    idx = np.argwhere(bad)[:limit]
    items = ", ".join(f"{tuple(int(v) for v in i)}: got {got[tuple(i)]:.6g}, want {ref[tuple(i)]:.6g}" for i in idx)
    return f"{int(bad.sum())} of {bad.size} elements differ ({int(np.isnan(got).sum())} NaN); first: {items}"


def random_case(shape_x: Sequence[int], shape_w: Sequence[int], seed: int, bias: bool = False,
                unit_output: bool = False, device: str | torch.device = "cpu"):
    """Fresh random input, weights (and bias) of the scale the course's layers see; never zeros.

    ``unit_output`` scales the weights so the convolution's output is of order 1, where tanh and sigmoid
    are not saturated and a wrong activation or pooling window shows in the output. ``device``: where the
    values are drawn (its own generator, so other values than the CPU's for the same seed): bench's timed
    inputs of up to 10^9 values are drawn on the GPU, in milliseconds instead of the CPU's tens of seconds.
    """
    g = torch.Generator(device).manual_seed(seed)
    x = torch.rand(tuple(shape_x), generator=g, device=device).mul_(255.0).sub_(64.0)
    fan_in = shape_w[1] * shape_w[2] * shape_w[3]
    weight_std = 2.0 / (_INPUT_RMS * math.sqrt(fan_in)) if unit_output else 0.05
    w = torch.randn(tuple(shape_w), generator=g, device=device) * weight_std
    b = torch.randn(shape_w[0], generator=g, device=device) if bias else None
    return x, w, b


def checked_part(shape: Sequence[int]) -> tuple[int, int]:
    """(images, maps): the leading part of an output of ``shape`` (B, M, H, W) that a check compares with the
    float64 reference: all of it up to CHECKED_OUTPUTS elements, else image 0's first maps (at least one).
    ``check_call`` then requires the rest of the output to be finite (written over the NaN poison)."""
    batch, maps, height, width = shape
    if batch * maps * height * width <= CHECKED_OUTPUTS:
        return batch, maps
    return 1, max(1, min(maps, CHECKED_OUTPUTS // max(1, height * width)))


def reference_layer(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                    activation: Optional[str] = None, pool: Optional[int] = None) -> np.ndarray:
    """conv + bias, then the activation, then a pool x pool max pool of stride pool: all in float64.

    The convolution is the NumPy reference, except for layers whose im2col matrix per image exceeds
    ``LARGE_IM2COL_BYTES`` (the many-channel, large-kernel shapes of ``bench --shapes``: 53 GB an image for
    gpu-mode's 256 x 256, K = 32, 128 channels): there torch's float64 convolution computes it, on the GPU when
    there is one (cuDNN in double precision), else on the CPU. Float64 either way."""
    b_, c_, h_, w_ = x.shape
    m_, _, kh_, kw_ = weight.shape
    if 8 * (h_ - kh_ + 1) * (w_ - kw_ + 1) * c_ * kh_ * kw_ > LARGE_IM2COL_BYTES:
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        with torch.no_grad():
            y = torch.nn.functional.conv2d(x.to(dev, torch.float64), weight.to(dev, torch.float64),
                                           None if bias is None else bias.to(dev, torch.float64)).cpu().numpy()
    else:
        y = conv2d_float64(x.cpu().numpy(), weight.cpu().numpy(), None if bias is None else bias.cpu().numpy())
    if activation is not None:
        y = ACTIVATIONS[activation](torch.from_numpy(y)).numpy()   # the network's own functions, in float64
    if pool:
        batch, maps, height, width = y.shape
        rows, cols = height // pool, width // pool
        y = y[:, :, :rows * pool, :cols * pool].reshape(batch, maps, rows, pool, cols, pool).max(axis=(3, 5))
    return y


def describe_exception(exc: BaseException) -> str:
    """'TypeName: first line of the message', for one-line failure reports."""
    message = str(exc).strip()
    return f"{type(exc).__name__}: {message.splitlines()[0]}" if message else type(exc).__name__


@dataclass
class CallCheck:
    """What one scrutinised call showed: its relative error and, when it is wrong, what is wrong."""
    error: float
    problem: Optional[str] = None


def check_call(fn: Callable, x: torch.Tensor, ref: np.ndarray, tolerance: float,
               shape: Optional[Sequence[int]] = None) -> CallCheck:
    """Call ``fn(x, out=poisoned)`` and ``fn(x)``; both must match ``ref`` and leave ``x`` unchanged.

    With ``out`` given the function must write all of it and return that very tensor (the engine and
    the benchmark rely on it); without, it must return a float32 tensor of the expected shape on
    ``x``'s device. ``shape``: the whole output's, when ``ref`` covers only its leading images and maps
    (``checked_part``); then that part is compared and the rest must be finite. An exception from the
    function is a failed check, not a crash of the harness.
    """
    shape = tuple(ref.shape) if shape is None else tuple(shape)
    images, maps = ref.shape[:2]
    original = x.clone()
    worst = 0.0
    for with_out in (True, False):
        out = poisoned(shape, x.device) if with_out else None
        call = f"fn(x, out={'poisoned' if with_out else 'None'})"
        try:
            result = fn(x, out=out) if with_out else fn(x)
        except Exception as exc:  # a broken kernel is a verification failure to report, not a crash
            return CallCheck(float("inf"), f"{call} raised {describe_exception(exc)}")
        if not torch.equal(x, original):
            return CallCheck(float("inf"), f"{call} modified its input x")
        if with_out and result is not out:
            return CallCheck(float("inf"), f"{call} returned a different tensor instead of the out buffer")
        if not isinstance(result, torch.Tensor):
            return CallCheck(float("inf"), f"{call} returned {type(result).__name__}, not a tensor")
        if result.dtype != torch.float32 or result.device != x.device:
            return CallCheck(float("inf"), f"{call} returned {result.dtype} on {result.device}, "
                                           f"not float32 on {x.device}")
        if tuple(result.shape) != shape:
            return CallCheck(float("inf"), f"{call} returned shape {tuple(result.shape)}, expected {shape}")
        compared = result[:images, :maps]
        if compared.shape != result.shape and not bool(torch.isfinite(result).all()):
            return CallCheck(float("inf"), f"{call} left NaN or Inf outside the {images} image(s) x {maps} "
                                           "map(s) compared with float64")
        error = relative_error(compared, ref)
        if not error <= tolerance:
            return CallCheck(error, f"{call}: relative error {error:.3g} > {tolerance:g}; "
                                    f"{describe_mismatch(compared, ref)}")
        worst = max(worst, error)
    return CallCheck(worst)


def progress_bar(enabled: bool = True):
    """The progress display verify and bench show on stderr while they run (stdout stays for results)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True, disable=not enabled)
