"""fft: convolution by real FFTs, the channel sum as one complex matrix product per frequency (torch.fft).

Technique: FFT convolution, as cuDNN's FFT and FFT_TILING algorithms do it; our own code over torch.fft
(cuFFT on a GPU, pocketfft on a CPU) and a batched complex matrix product (cuBLAS / the CPU BLAS). The
layer's correlation y = x (*) k is, per tile of Th x Tw input pixels, the circular correlation of size
Th x Tw: y_tile = irfft2(rfft2(x_tile) . conj(rfft2(k padded to Th x Tw))), whose first Th-K+1 x Tw-K+1
outputs are exact (no wrap-around reaches them). The sum over input channels is, per frequency f, the
product Y[f] (tiles x M) = X[f] (tiles x C) @ W[f] (C x M): 8 C M real flops per tile and frequency instead
of the direct sum's 2 C M K^2 per output, so K >= 5 layers with many channels do a fraction of a GEMM's work.
Images larger than the tile are cut into overlapping tiles (overlap-save) so that the weight spectrum,
M x C x Th x (Tw/2+1) complex64 kept by prepare, stays under WEIGHT_BYTES (a whole 256 x 256 spectrum of
gpu-mode's 128 x 128-channel layers would be 4.3 GB), and a call works through its tiles in chunks whose
spectra stay under WORK_BYTES. The tile size is chosen per input size and batch size (BATCH_PLAN) by a cost
model (plan), from the FFT-friendly sizes (factors 2, 3, 5, 7). The bias is added to each tile's DC frequency,
at no extra pass.
Course step: none; beyond the course (its steps are direct and unrolled / implicit-GEMM convolution). It
reproduces no course optimisation.
Precision: fp32 FFTs and an fp32 complex product (TF32 switched off for it on every call). The error of an
FFT is relative to the norm of the whole transformed signal, not to each output; measured 1.7e-7 to 5.7e-7
of ||y|| against float64 on all 39 gpu-mode and wide shapes on an H200 (cuFFT), 2.0e-7 to 3.4e-7 on 12 of
them on a CPU (benchmarks/2026-11-26-h200-fft-conv-gpumode-wide). An output much smaller than the
outputs around it (cancellation) gets the same absolute error as its neighbours, so its own relative error
can be large: the norm-relative 1e-5 of the registry holds, an element-wise one does not.
Extreme magnitudes: the weights are scaled by a power of two (exact) at prepare, and an input whose largest
|value| is outside 2^-SCALE_RANGE..2^SCALE_RANGE as well, so that nothing overflows or falls into fp32's
denormals inside the transforms; the scale comes back through the matrix product's alpha.
Non-finite input: an FFT spreads one NaN or Inf over every output of its tile, while the contract wants
torch's positions. So each call reduces |x| to its maximum (one pass over x; NaN or Inf if any element is),
queues the transforms of the unscaled input, and only then reads that maximum on the host (the GPU stays busy
meanwhile). A non-finite input is then computed again by the direct path, F.conv2d in float64 rounded to
fp32 (torch's NaN/Inf positions, exact finite values), an input out of the range above again scaled; non-
finite weights or bias (known at prepare) take the direct path on every call. The read is a host
synchronisation on every call: a call cannot be captured in a CUDA graph (it raises a RuntimeError inside
a capture; the registry marks it graph_safe=False).
Bottleneck expected: memory traffic of the layout changes around the FFTs (tiles out of the image, the X
spectrum into and the Y spectrum out of the product's frequency-major layout, cuFFT's c2r input copy, the
crop into the output): on an H200 these copies took 39-49 % of the GPU time, the complex product 13-26 %,
the FFTs 27-37 % (torch.profiler, scripts/fft_profile.py). Measured (H200, 2026-11-26, same benchmark):
2.2-2.6x cuDNN fp32 on gpu-mode's 128-px layers and 22.5x / 47.6x on its 256-px ones; on the wide set 1.3-10.1x
on 12 of 35 shapes (K >= 5, many channels), 0.13-0.93x on the others (K <= 3, small C, 1024-px images).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import torch
import torch.nn.functional as F

from convforge.conv import check_input, finish_output, output_buffer

WEIGHT_BYTES = 1 << 30     # the weight spectrum prepare keeps, at most
WORK_BYTES = 1 << 30       # a chunk's tiles, spectra and their transposed copies, at most (one tile row at least)
SCALE_RANGE = 40           # an input whose largest |value| is 2^-40..2^40 is transformed as it is
FFT_RADICES = (2, 3, 5, 7)  # cuFFT's fast radices; pocketfft takes any size
# The cost model's rates (an H100's order of magnitude: fp32 complex GEMM, device memory). Only their ratio
# and the per-operation overhead steer the choice of tile; the choice is not tuned per GPU.
MODEL_FLOPS_PER_S = 40e12
MODEL_BYTES_PER_S = 2.5e12
MODEL_CHUNK_S = 100e-6     # launches and small-operation overhead per chunk (about ten operations)


@lru_cache(maxsize=None)
def fast_sizes(limit: int) -> tuple[int, ...]:
    """The sizes up to ``limit`` with no prime factor above 7, ascending."""
    sizes = {1}
    for radix in FFT_RADICES:
        grown = set(sizes)
        for size in sizes:
            while size * radix <= limit:
                size *= radix
                grown.add(size)
        sizes = grown
    return tuple(sorted(sizes))


def fast_size_at_least(n: int) -> int:
    return next(s for s in fast_sizes(8 * n) if s >= n)


@dataclass(frozen=True)
class Plan:
    """Tiles of th x tw input pixels, each giving sh x sw outputs; nh x nw of them cover an image."""
    th: int
    tw: int
    sh: int
    sw: int
    nh: int
    nw: int

    @property
    def freqs(self) -> int:
        return self.th * (self.tw // 2 + 1)

    def weight_bytes(self, maps: int, channels: int) -> int:
        return maps * channels * self.freqs * 8

    def tile_bytes(self, maps: int, channels: int) -> int:
        """One tile's share of a chunk: its input tile, its X and Y spectra twice (the FFT's layout and the
        product's), its output tile."""
        return (channels + maps) * (self.th * self.tw * 4 + 2 * self.freqs * 8)

    def rows_per_chunk(self, maps: int, channels: int) -> int:
        """Tile rows (of one image) per chunk: as many as WORK_BYTES holds, at least one."""
        return max(1, WORK_BYTES // (self.nw * self.tile_bytes(maps, channels)))

    def seconds(self, batch: int, maps: int, channels: int) -> float:
        """Modelled time of a call: the complex product's flops, ~3 passes over each tile and spectrum, the
        weight spectrum read once per chunk, and a fixed cost per chunk."""
        tiles = batch * self.nh * self.nw
        flops = 8.0 * channels * maps * self.freqs * tiles
        chunks = math.ceil(batch * self.nh / self.rows_per_chunk(maps, channels))
        moved = 3.0 * tiles * self.tile_bytes(maps, channels) + chunks * self.weight_bytes(maps, channels)
        return flops / MODEL_FLOPS_PER_S + moved / MODEL_BYTES_PER_S + chunks * MODEL_CHUNK_S


def tiling(height: int, width: int, kernel: int, th: int, tw: int) -> Plan:
    sh, sw = th - kernel + 1, tw - kernel + 1
    return Plan(th, tw, sh, sw, math.ceil((height - kernel + 1) / sh), math.ceil((width - kernel + 1) / sw))


# BATCH_PLAN: choose the tile for the call's batch size (the model's time for B images) rather than for one
# image; a spectrum is then kept per tile size (the latest SPECTRA_KEPT). Measured on an H100 (2026-11-26,
# benchmarks/2026-11-26-h100-wide-set-igemm-tuned, sweep.py fftab, A/B interleaved in one process): the tile
# changes on 22 of the 35 gpumode / wide shapes under 1024 px, 1.01-1.70x faster on 20 of them (1.5-1.7x on
# six batch 8-64 K = 3 layers, 1.40x on 32 x 64 x 16 x 112 px K = 7), slower on two: 0.84x on 4 x 128 x 64 x
# 128 px K = 3 (a 45 x 45 tile), 0.96x on gpu-mode's 2 x 128 x 256 px K = 16 (96 x 96); errors unchanged
# (1.6e-7 - 5.2e-7 against float64). The model has no per-radix FFT cost.
BATCH_PLAN = True
SPECTRA_KEPT = 2


@lru_cache(maxsize=256)
def plan(maps: int, channels: int, height: int, width: int, kernel: int, batch: int = 1) -> Plan:
    """The tile size for an input size: the cheapest by the model for ``batch`` images (1 by default, so that
    the weight spectrum prepared for an input size serves every batch size), among FFT-friendly sizes from K
    up to the whole image, whose weight spectrum fits WEIGHT_BYTES; the smallest tile when none fits."""
    full_h, full_w = fast_size_at_least(height), fast_size_at_least(width)
    options = {tiling(height, width, kernel, min(t, full_h), min(t, full_w))
               for t in fast_sizes(max(full_h, full_w)) if t >= kernel}
    fitting = [p for p in options if p.weight_bytes(maps, channels) <= WEIGHT_BYTES]
    if not fitting:
        return min(options, key=lambda p: p.weight_bytes(maps, channels))
    return min(fitting, key=lambda p: (p.seconds(batch, maps, channels), p.th * p.tw))


def _exponent(value: float) -> int:
    """e with value = m * 2^e, 0.5 <= m < 1 (0 for 0): dividing by 2^e brings the value below 1, exactly."""
    return math.frexp(value)[1]


def weight_spectrum(weight: torch.Tensor, th: int, tw: int, exponent: int) -> torch.Tensor:
    """conj(rfft2(weight * 2^-exponent, zero-padded to th x tw)) as (freqs, C, M) complex64.

    Computed in float64 and rounded once (prepare time), a slice of maps at a time so that the float64
    transform never takes more than WEIGHT_BYTES beside the result."""
    maps, channels = weight.shape[:2]
    freqs = th * (tw // 2 + 1)
    result = torch.empty((freqs, channels, maps), dtype=torch.complex64, device=weight.device)
    step = max(1, WEIGHT_BYTES // (channels * freqs * 16))
    for m0 in range(0, maps, step):
        part = torch.ldexp(weight[m0:m0 + step].double(), torch.tensor(-exponent, dtype=torch.float64))
        spectrum = torch.fft.rfft2(part, s=(th, tw)).conj()        # (m, C, th, tw/2+1)
        result[:, :, m0:m0 + step] = spectrum.reshape(spectrum.shape[0], channels, freqs).permute(2, 1, 0)
    return result


def _tiles(x: torch.Tensor, p: Plan, kernel: int, i0: int, i1: int) -> torch.Tensor:
    """Tile rows i0..i1 of images x (b, C, H, W) as (b * (i1 - i0) * nw, C, th, tw), zeros past the image."""
    batch, channels, height, width = x.shape
    r0, r1 = i0 * p.sh, (i1 - 1) * p.sh + p.th
    c1 = (p.nw - 1) * p.sw + p.tw
    rows = x[:, :, r0:min(r1, height)]
    if rows.shape[2] < r1 - r0 or width < c1:
        rows = F.pad(rows, (0, c1 - width, 0, r1 - r0 - rows.shape[2]))
    tiles = rows.unfold(2, p.th, p.sh).unfold(3, p.tw, p.sw)   # (b, C, i1-i0, nw, th, tw), a view
    return tiles.permute(0, 2, 3, 1, 4, 5).reshape(-1, channels, p.th, p.tw)


def _scatter(tiles: torch.Tensor, y: torch.Tensor, p: Plan, i0: int, i1: int) -> None:
    """Write the valid sh x sw corner of tile rows i0..i1 (b, i1-i0, nw, M, th, tw) into y (b, M, Ho, Wo):
    whole tiles in one strided copy, the partial last tile row / column in at most three more."""
    out_h, out_w = y.shape[2:]
    full_rows, full_cols = out_h // p.sh, out_w // p.sw
    row_parts = [(i0, min(i1, full_rows), p.sh)] + ([(full_rows, i1, out_h - full_rows * p.sh)]
                                                     if i1 > full_rows else [])
    col_parts = [(0, full_cols, p.sw)] + ([(full_cols, p.nw, out_w - full_cols * p.sw)] if p.nw > full_cols else [])
    for a0, a1, rows in row_parts:
        for b0, b1, cols in col_parts:
            if a1 <= a0 or b1 <= b0:
                continue
            src = tiles[:, a0 - i0:a1 - i0, b0:b1, :, :rows, :cols]      # (b, ni, nj, M, rows, cols)
            dst = y[:, :, a0 * p.sh:a0 * p.sh + (a1 - a0) * rows, b0 * p.sw:b0 * p.sw + (b1 - b0) * cols]
            dst.unflatten(3, (b1 - b0, cols)).unflatten(2, (a1 - a0, rows)).permute(0, 2, 4, 1, 3, 5).copy_(src)


def _chunks(batch: int, nh: int, rows: int):
    """(image range, tile-row range) blocks of at most ``rows`` tile rows: whole images when one fits."""
    if rows >= nh:
        step = rows // nh
        for b0 in range(0, batch, step):
            yield b0, min(batch, b0 + step), 0, nh
    else:
        for b in range(batch):
            for i0 in range(0, nh, rows):
                yield b, b + 1, i0, min(nh, i0 + rows)


def direct_float64(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], y: torch.Tensor) -> None:
    """y = conv(x) + bias in float64, rounded to fp32: exact, NaN/Inf where torch's fp32 puts them. A few
    images at a time (WORK_BYTES of float64 input and output)."""
    batch, channels, height, width = x.shape
    per_image = 8 * (channels * height * width + y[0].numel())
    step = max(1, WORK_BYTES // per_image)
    w64 = weight.double()
    b64 = None if bias is None else bias.double()
    for b0 in range(0, batch, step):
        y[b0:b0 + step] = F.conv2d(x[b0:b0 + step].double(), w64, b64)


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, input_hw: Optional[tuple[int, int]] = None):
    maps, channels, kernel, kernel_w = weight.shape
    if kernel != kernel_w:
        raise ValueError(f"square kernels only, got {kernel}x{kernel_w}")
    weight = weight.detach().to(torch.float32).contiguous()
    bias = None if bias is None else bias.detach().to(torch.float32).contiguous()
    finite = bool(torch.isfinite(weight).all()) and (bias is None or bool(torch.isfinite(bias).all()))
    largest = float(weight.abs().max()) if finite and weight.numel() else 0.0
    w_exp = _exponent(largest) if largest > 0 else 0
    spectra: dict = {}   # (th, tw) -> weight spectrum; the latest SPECTRA_KEPT tile sizes' (memory stays bounded)

    def spectrum(p: Plan) -> torch.Tensor:
        key = (p.th, p.tw)
        if key not in spectra:
            while len(spectra) >= SPECTRA_KEPT:
                spectra.pop(next(iter(spectra)))
            spectra[key] = weight_spectrum(weight, p.th, p.tw, w_exp)
        return spectra[key]

    if input_hw is not None and finite:
        spectrum(plan(maps, channels, *input_hw, kernel))   # one-time work stays out of Op Time

    def transform(x: torch.Tensor, x_exp: int, y: torch.Tensor) -> None:
        """y = conv(x) + bias through the FFT tiles, x taken as x * 2^-x_exp (exactly)."""
        if x_exp:   # in two exact steps: 2^-x_exp itself may be out of fp32's range
            half = -x_exp // 2
            x = x.mul(math.ldexp(1.0, half)).mul_(math.ldexp(1.0, -x_exp - half))
        p = plan(maps, channels, x.shape[2], x.shape[3], kernel, x.shape[0] if BATCH_PLAN else 1)
        w_hat = spectrum(p)
        alpha = math.ldexp(1.0, x_exp + w_exp) / (p.th * p.tw)   # the scales back, and irfft2's 1/N
        zero = torch.zeros((), dtype=torch.complex64, device=x.device)
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False             # cuBLAS's complex product in fp32
        try:
            for b0, b1, i0, i1 in _chunks(x.shape[0], p.nh, p.rows_per_chunk(maps, channels)):
                spec = torch.fft.rfft2(_tiles(x[b0:b1], p, kernel, i0, i1))       # (tiles, C, th, tw/2+1)
                tiles = spec.shape[0]
                x_hat = spec.reshape(tiles, channels, p.freqs).permute(2, 0, 1)     # (freqs, tiles, C)
                y_hat = torch.baddbmm(zero.expand(p.freqs, tiles, maps), x_hat, w_hat, beta=0, alpha=alpha)
                if bias is not None:
                    y_hat[0] += bias    # frequency 0 (DC) of each tile: + bias at every output
                y_tiles = torch.fft.irfft2(y_hat.permute(1, 2, 0).reshape(tiles, maps, p.th, p.tw // 2 + 1),
                                           s=(p.th, p.tw), norm="forward")
                _scatter(y_tiles.view(b1 - b0, i1 - i0, p.nw, maps, p.th, p.tw), y[b0:b1], p, i0, i1)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        shape = check_input(x, weight)
        if x.is_cuda and torch.cuda.is_current_stream_capturing():   # the read of max|x| would fail there
            raise RuntimeError("fft reads the input's maximum on the host on every call (its non-finite "
                               "check): it cannot be captured in a CUDA graph; use another implementation")
        x = x.detach().contiguous()
        target, result = output_buffer(out, shape, x)
        if target.numel() == 0:
            return finish_output(target, result)
        if not finite:
            direct_float64(x, weight, bias, target)
            return finish_output(target, result)
        # Optimistic: x's largest |value| (one pass; NaN if any is NaN, Inf if any is infinite) is queued first
        # and read on the host after the transforms are queued, so the GPU never waits for the host; an input
        # that needed scaling or is not finite (rare) is then computed again, scaled or by the direct path.
        x_max = torch.linalg.vector_norm(x, float("inf"))
        transform(x, 0, target)
        x_max = float(x_max)
        if not math.isfinite(x_max):
            direct_float64(x, weight, bias, target)
        elif x_max > 0 and abs(_exponent(x_max)) > SCALE_RANGE:
            transform(x, _exponent(x_max), target)
        return finish_output(target, result)

    return run
