"""Comparing an implementation's output with the float64 reference: shared by verify and the tests."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


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


def random_case(shape_x: Sequence[int], shape_w: Sequence[int], seed: int, bias: bool = False):
    """Fresh random input, weights (and bias) of the scale the course's layers see; never zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(tuple(shape_x), generator=g) * 255.0 - 64.0
    w = torch.randn(tuple(shape_w), generator=g) * 0.05
    b = torch.randn(shape_w[0], generator=g) if bias else None
    return x, w, b
