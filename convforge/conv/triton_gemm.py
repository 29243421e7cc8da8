"""triton-gemm / triton-gemm-tf32: implicit GEMM with tl.dot, output positions x maps per program.

Technique: the convolution as the product (B*Ho*Wo) x (C*K*K) times (C*K*K) x M, never materialising
the unrolled input. Output positions are the dot's M side (BLOCK_P rows: the dot needs at least 16) and
the maps, zero-padded to a power of two of at least 16, its N side. The reduction runs over C*K*K in
BLOCK_K steps (padded to a multiple of 16, the dot's minimum); a per-shape table of input offsets
(c*H*W + p*W + q for each reduction index, built once per input size) turns the gather of an A tile
into one add per element, with no division in the loop. Weights are packed once, in prepare, as a
zero-padded (K_pad, N) matrix. The bias is fused in the epilogue. Block shapes, warps and pipeline
depth are chosen by ``triton.autotune`` keyed on the layer shape (one fixed configuration under
Triton's interpreter, which has no timer).
Precision: ``input_precision="ieee"`` (exact fp32, FMA units: the "triton-gemm" entry), "tf32"
(tensor cores, 10-bit mantissas: "triton-gemm-tf32") or "tf32x3" ("triton-gemm-3xtf32": each operand
split into a TF32 high part and a TF32 remainder, three tensor-core products a_hi*b_hi + a_hi*b_lo +
a_lo*b_hi; fp32-accurate, ~1e-6 relative, so held to the exact tolerance, but not fp32 arithmetic).
Course step: milestone 4's "unroll + shared-memory matrix multiply", with the unrolling fused into the
matrix multiply (implicit GEMM) and, for tf32, its tensor-core variant.
Bottleneck: for ieee, FP32 FMA issue plus the A gather (one address add and one 4-byte copy per A
element, then shared-memory operand loads): 68-78 % of the loop is FFMA on the C >= 4 layers in sm_90
SASS, less on C = 1 (one reduction step, maps padded to 16) and small M, so triton-direct is the faster
exact kernel there; for tf32, the gather and the output write (the tensor cores idle most of the time).
"""

from __future__ import annotations

import os

from typing import Optional

import torch

from convforge.conv import triton_common as common

triton, tl = common.triton, common.tl

PRECISIONS = ("fp32", "tf32", "tf32x3")
_INPUT_PRECISION = {"fp32": "ieee", "ieee": "ieee", "tf32": "tf32", "tf32x3": "tf32x3"}
K_ALIGN = 64          # reduction padding: a multiple of every BLOCK_K below


def _configs(precision: str):
    if precision == "ieee":   # FMA dot: modest tiles, the accumulators live in registers
        shapes = [(64, 16, 4, 2), (128, 16, 4, 2), (128, 32, 4, 2), (64, 32, 4, 3), (128, 16, 8, 3),
                  (256, 16, 8, 2), (128, 32, 8, 3), (64, 16, 2, 2)]
    else:                     # tensor cores: bigger tiles, deeper pipelines
        shapes = [(128, 32, 4, 3), (128, 64, 4, 3), (256, 32, 8, 3), (64, 32, 4, 4), (128, 16, 4, 4),
                  (256, 64, 8, 3), (64, 64, 4, 3), (128, 32, 8, 4)]
    return [triton.Config({"BLOCK_P": bp, "BLOCK_K": bk}, num_warps=nw, num_stages=ns) for bp, bk, nw, ns in shapes]


INTERPRETER_CONFIG = dict(BLOCK_P=64, BLOCK_K=16)
AUTOTUNE = os.environ.get("CONVFORGE_TRITON_AUTOTUNE", "1") != "0"


def _prune(configs, named_args, **kwargs):
    """Drop reduction steps longer than the (padded) reduction itself; keep at least one config."""
    kred = kwargs.get("KRED", named_args.get("KRED", 1 << 30))
    limit = max(16, common.pow2_at_least(kred))
    kept = [c for c in configs if c.kwargs["BLOCK_K"] <= limit]
    return kept or configs[:1]


if triton is not None:

    @triton.jit
    def _gemm_kernel(x_ptr, koff_ptr, w_ptr, b_ptr, y_ptr, B, size_class,
                     C: tl.constexpr, H: tl.constexpr, W: tl.constexpr, K: tl.constexpr, M: tl.constexpr,
                     BN: tl.constexpr, KRED: tl.constexpr, NPITCH: tl.constexpr, PRECISION: tl.constexpr,
                     HAS_BIAS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr):
        # size_class is not used here: it is part of the autotuning key (see size_class()).
        HO: tl.constexpr = H - K + 1
        WO: tl.constexpr = W - K + 1
        HOWO: tl.constexpr = HO * WO
        KSTEPS: tl.constexpr = (KRED + BLOCK_K - 1) // BLOCK_K
        EVEN_K: tl.constexpr = KRED % BLOCK_K == 0
        pos = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        valid = pos < B * HOWO
        b = tl.minimum(pos // HOWO, B - 1)          # past the end: re-read the last image, store nothing
        r = pos % HOWO
        h = r // WO
        x_base = b * (C * H * W) + h * W + (r - h * WO)
        n = tl.program_id(1) * BN + tl.arange(0, BN)
        acc = tl.zeros([BLOCK_P, BN], dtype=tl.float32)
        for step in range(KSTEPS):
            ks = step * BLOCK_K + tl.arange(0, BLOCK_K)
            koff = tl.load(koff_ptr + ks)           # padded with 0: a valid address, weight rows of 0
            a_ptrs = x_ptr + x_base[:, None] + koff[None, :]
            if EVEN_K:
                a = tl.load(a_ptrs)
            else:
                a = tl.load(a_ptrs, mask=(ks < KRED)[None, :], other=0.0)
            wt = tl.load(w_ptr + ks[:, None] * NPITCH + n[None, :])
            acc = tl.dot(a, wt, acc, input_precision=PRECISION)
        if HAS_BIAS:
            acc += tl.load(b_ptr + n)[None, :]
        y_off = b * (M * HOWO) + r
        tl.store(y_ptr + y_off[:, None] + n[None, :] * HOWO, acc, mask=valid[:, None] & (n[None, :] < M))

    _AUTOTUNED = {}

    def _kernel_for(precision: str):
        """The kernel, autotuned on a GPU (keyed on the layer shape), plain under the interpreter or when
        CONVFORGE_TRITON_AUTOTUNE=0 (verification over many random shapes, where tuning each is wasted)."""
        if common.INTERPRET or not AUTOTUNE:
            return _gemm_kernel
        if precision not in _AUTOTUNED:
            # cache_results: the choice is kept in Triton's cache directory, so only the first process
            # to meet a layer shape pays for the tuning (about 8 compiles and timings, seconds).
            _AUTOTUNED[precision] = triton.autotune(configs=_configs(precision), key=["C", "H", "W", "K", "M", "BN", "size_class"],
                                                    prune_configs_by={"early_config_prune": _prune},
                                                    cache_results=True)(_gemm_kernel)
        return _AUTOTUNED[precision]


def size_class(positions: int) -> int:
    """A coarse problem size for the autotuning key: a choice timed on a 2-image check (or kept on disk
    from one) must not be reused for a 10000-image batch. Never 1: Triton specialises that value."""
    return 2 if positions < 1 << 16 else 3 if positions < 1 << 21 else 4


def unavailable_reason() -> Optional[str]:
    return common.unavailable_reason()


def reduction_offsets(channels: int, height: int, width: int, kernel: int, device) -> torch.Tensor:
    """int32 offsets c*H*W + p*W + q for every reduction index (c, p, q), zero-padded to K_ALIGN."""
    kred = channels * kernel * kernel
    c, p, q = torch.meshgrid(torch.arange(channels), torch.arange(kernel), torch.arange(kernel), indexing="ij")
    offsets = torch.zeros(-(-kred // K_ALIGN) * K_ALIGN, dtype=torch.int32)
    offsets[:kred] = (c * (height * width) + p * width + q).reshape(-1).to(torch.int32)
    return offsets.to(device)


def block_n(maps: int) -> int:
    """Maps per program: a power of two from 16 (the dot's minimum N) to 64."""
    return min(64, max(16, common.pow2_at_least(maps)))


def kernel_constants(maps: int, channels: int, kernel: int, height: int, width: int, has_bias: bool,
                     input_precision: str) -> dict:
    """The compile-time arguments of _gemm_kernel other than the autotuned block shapes."""
    bn = block_n(maps)
    return dict(C=channels, H=height, W=width, K=kernel, M=maps, BN=bn, KRED=channels * kernel * kernel,
                NPITCH=bn * -(-maps // bn), PRECISION=input_precision, HAS_BIAS=has_bias)


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, precision: str = "fp32"):
    if precision not in _INPUT_PRECISION:
        raise ValueError(f"triton_gemm serves {', '.join(PRECISIONS)}, not {precision!r}")
    input_precision = _INPUT_PRECISION[precision]
    maps, channels, kernel, kernel_w = weight.shape
    if kernel != kernel_w:
        raise ValueError(f"square kernels only, got {kernel}x{kernel_w}")
    kred = channels * kernel * kernel
    n_blocks = -(-maps // block_n(maps))
    pitch = block_n(maps) * n_blocks
    # (K_pad, N_pad) weights: row (c, p, q), column m; zero rows past C*K*K and columns past M.
    packed = torch.zeros((-(-kred // K_ALIGN) * K_ALIGN, pitch), dtype=torch.float32, device=weight.device)
    packed[:kred, :maps] = weight.detach().reshape(maps, kred).t().to(torch.float32)
    packed_bias = common.pack_bias(bias, pitch, weight)
    kernel_fn = _kernel_for(input_precision)
    extra = dict(INTERPRETER_CONFIG, num_warps=4, num_stages=1) if common.INTERPRET or not AUTOTUNE else {}
    offsets: dict = {}     # input (H, W) -> (offset table, constants): one dict lookup per call

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        common.check_input(x, channels, kernel)
        batch, _, height, width = x.shape
        ho, wo = height - kernel + 1, width - kernel + 1
        buffer, result = common.output_for(out, (batch, maps, ho, wo), x)
        entry = offsets.get((height, width))
        if entry is None:
            entry = offsets[(height, width)] = (
                reduction_offsets(channels, height, width, kernel, x.device),
                dict(kernel_constants(maps, channels, kernel, height, width, bias is not None, input_precision),
                     **extra))
        koff, constants = entry
        x = common.contiguous_input(x)
        for xs, ys, n in common.batch_views(x, buffer, max(channels * height * width, maps * ho * wo)):
            positions = n * ho * wo

            def grid(meta, positions=positions):
                return (triton.cdiv(positions, meta["BLOCK_P"]), n_blocks)

            kernel_fn[grid](xs, koff, packed, packed_bias, ys, n, size_class(positions), **constants)
        return common.finish(buffer, result)

    return run
