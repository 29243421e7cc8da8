"""fft (convforge/conv/fft_conv.py): the tile planned for the call's batch (BATCH_PLAN) against float64 on a
CPU, both plans, several batch sizes through one prepared layer (spectra kept per tile size, bounded)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from convforge.conv import fft_conv


def test_batch_plan_changes_the_tile_and_stays_exact(monkeypatch):
    g = torch.Generator().manual_seed(5)
    w = torch.randn(6, 4, 5, 5, generator=g) * 0.05
    b = torch.randn(6, generator=g)
    assert fft_conv.plan(6, 4, 60, 60, 5, 16) != fft_conv.plan(6, 4, 60, 60, 5)   # the batch moves the tile
    for flag in (False, True):
        monkeypatch.setattr(fft_conv, "BATCH_PLAN", flag)
        fn = fft_conv.prepare(w, b)
        for batch in (1, 16, 3, 16):
            x = torch.rand(batch, 4, 60, 60, generator=g) * 255.0 - 64.0
            ref = F.conv2d(x.double(), w.double(), b.double())
            out = torch.full(ref.shape, float("nan"))
            got = fn(x, out=out)
            assert got is out
            error = float((got.double() - ref).norm() / ref.norm())
            assert error <= 1e-5, f"BATCH_PLAN {flag}, batch {batch}: {error:.3g}"


def test_plan_default_batch_is_one():
    assert fft_conv.plan(64, 64, 128, 128, 8) == fft_conv.plan(64, 64, 128, 128, 8, 1)
