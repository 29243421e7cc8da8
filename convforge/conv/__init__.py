"""The one registry of convolution implementations.

Every implementation computes the course's layer (stride 1, no padding):

    y[b, m, h, w] = sum over c, p, q of x[b, c, h + p, w + q] * k[m, c, p, q]   (+ bias[m])

with x (B, C, H, W), k (M, C, K, K) and y (B, M, H-K+1, W-K+1), all float32 tensors on one device.
Each implementation is one module of this package that opens with a header (technique, the course
optimisation it reproduces, the bottleneck it expects) and provides:

    prepare(weight, bias=None) -> ConvFn
        One-time work (compiling, packing weights) happens here and is kept out of Op Time.
        ``weight`` is (M, C, K, K) float32, contiguous, on the implementation's device.
    ConvFn(x, out=None) -> Tensor
        ``x`` is (B, C, H, W) float32, contiguous, on the device. When ``out`` is given it must be
        written completely and returned (the harness poisons it with NaN first); otherwise the
        function allocates its result.

Optional keywords, passed only to a ``prepare`` that declares them: ``precision=`` (a module serving
several registry entries that differ only in precision, e.g. TF32 and FP16 tensor cores) and
``input_hw=(H, W)`` (the layer's input size when known, for kernels that bake it in at compile time so
that compiling stays out of Op Time; they must still accept any input size) and ``out_dtype=`` (a
reduced-precision kernel, or a fused one whose activation bounds its output, that can write FP16 for a consumer
that reads FP16; the returned tensor's dtype says what was written, and a prepare without the keyword writes
float32; ``prepare_fused`` takes it too) and ``in_dtype=`` (``torch.float16``: the ConvFn also accepts an FP16
``x``, the output of such a producer, and reads it as it is; float32 inputs still work).

Implementations with ``fuses=True`` also provide ``prepare_fused(weight, bias, activation, pool)``:
a ConvFn returning activation(conv(x) + bias) max-pooled over pool x pool windows with stride pool,
writing only the pooled map. A module may define ``unavailable_reason() -> str | None`` for checks
beyond "the device exists and the optional packages import".

To add an implementation: write its module, add one ``ConvImpl`` line to ``IMPLEMENTATIONS`` and, if it has
measured launch configurations, one ``convforge/tuning/<name>.json`` file read through ``convforge.tuning``
(CONTRIBUTING.md).
"""

from __future__ import annotations

import importlib
import inspect
import importlib.util
from dataclasses import dataclass
from typing import Optional, Protocol

import torch

from convforge.errors import UserError

EXACT_PRECISIONS = ("fp64", "fp32")
# Split-TF32 (three tensor-core products per multiply, CUTLASS's "3xTF32"): not fp32 arithmetic, but held
# to the exact tolerance. Kept apart from EXACT_PRECISIONS so "exact" still means FP32/FP64 units.
FP32_ACCURATE_PRECISIONS = EXACT_PRECISIONS + ("tf32x3",)
# The fused activations and the code each kernel's compile-time ACT constant gives them (CUDA C and Triton).
ACTIVATION_CODES = {None: 0, "tanh": 1, "relu": 2, "sigmoid": 3}
EXACT_TOLERANCE = 1e-5     # ||out - ref|| / ||ref|| for exact fp32 arithmetic (and 3xTF32)
REDUCED_TOLERANCE = 1e-2   # TF32 / FP16 / BF16 paths


def tolerance_for(precision: str) -> float:
    """The relative-error bound a kernel computing at ``precision`` is held to (fp32-accurate or reduced)."""
    return EXACT_TOLERANCE if precision in FP32_ACCURATE_PRECISIONS else REDUCED_TOLERANCE


class ConvFn(Protocol):
    def __call__(self, x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor: ...


@dataclass(frozen=True)
class ConvImpl:
    name: str
    module: str                    # module of this package holding prepare()
    devices: tuple[str, ...]       # "cpu", "cuda"
    precision: str                 # "fp64", "fp32" (exact), "tf32x3" (split TF32, exact tolerance) or "tf32", "fp16", "bf16" (reduced)
    description: str
    requires: tuple[str, ...] = ()  # optional Python packages it imports when prepared
    fuses: bool = False            # provides prepare_fused (conv + bias + activation + max pool)
    install_hint: str = ""
    compiles_per_shape: bool = False  # compiles at its first call of each input shape, also on a CPU
    graph_safe: bool = True        # False: a call reads device values on the host (no CUDA graph capture)

    @property
    def exact(self) -> bool:
        return self.precision in EXACT_PRECISIONS

    @property
    def tolerance(self) -> float:
        return tolerance_for(self.precision)

    def _module(self):
        return importlib.import_module(f"{__name__}.{self.module}")

    def unavailable_reason(self, device: str) -> Optional[str]:
        """None when this implementation can run on ``device`` here, else why not and how to get it."""
        if device not in self.devices:
            return f"runs on {' or '.join(self.devices)} only"
        if device == "cuda" and not torch.cuda.is_available():
            return "no CUDA GPU visible to PyTorch (needs an NVIDIA GPU and a CUDA build of torch)"
        for package in self.requires:
            if importlib.util.find_spec(package) is None:
                return f"needs the Python package '{package}'" + (f": {self.install_hint}" if self.install_hint else "")
        if importlib.util.find_spec(f"{__name__}.{self.module}") is None:
            return "not part of this build of convforge"
        hook = getattr(self._module(), "unavailable_reason", None)
        return hook() if hook else None

    def prepare(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                input_hw: Optional[tuple[int, int]] = None, config=None,
                out_dtype: Optional[torch.dtype] = None, in_dtype: Optional[torch.dtype] = None) -> ConvFn:
        module = self._module()
        wanted = {k: v for k, v in (("out_dtype", out_dtype), ("in_dtype", in_dtype)) if v is not None}
        return _call(module.prepare, weight.contiguous(), bias, precision=self.precision, input_hw=input_hw,
                     **wanted, **_config(module.prepare, config, self.name))

    def prepare_fused(self, weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str],
                      pool: int, input_hw: Optional[tuple[int, int]] = None, config=None,
                      out_dtype: Optional[torch.dtype] = None) -> ConvFn:
        if not self.fuses:
            raise TypeError(f"{self.name} does not fuse activation and pooling")
        fn = self._module().prepare_fused
        wanted = {"out_dtype": out_dtype} if out_dtype is not None else {}
        return _call(fn, weight.contiguous(), bias, activation, pool, precision=self.precision, input_hw=input_hw,
                     **wanted, **_config(fn, config, self.name))

    @property
    def header(self) -> str:
        """The module's header: technique, course optimisation, expected bottleneck."""
        spec = importlib.util.find_spec(f"{__name__}.{self.module}")
        if spec is None or spec.origin is None:
            return ""
        import ast
        with open(spec.origin, encoding="utf-8") as handle:
            return ast.get_docstring(ast.parse(handle.read())) or ""


def _config(function, config, name: str) -> dict:
    """``config=`` (a launch configuration other than the tuned one, for ``convforge sweep``) for a prepare
    that takes one; an error for one that has no such choice."""
    if config is None:
        return {}
    if "config" not in inspect.signature(function).parameters:
        raise TypeError(f"{name} takes no launch configuration")
    return {"config": config}


def _call(function, *args, **optional):
    """Call a module's prepare with the optional keywords it declares (precision, input_hw)."""
    accepted = inspect.signature(function).parameters
    return function(*args, **{k: v for k, v in optional.items() if k in accepted})


_NUMBA = "pip install numba"
_TRITON = "pip install 'convforge[triton]'"
_CUPY = "pip install 'convforge[cuda]'"

IMPLEMENTATIONS: tuple[ConvImpl, ...] = (
    # -- baselines ----------------------------------------------------------------------------------
    ConvImpl("reference", "reference", ("cpu",), "fp64",
             "float64 NumPy, the course pseudo-code's sum (the verification reference)"),
    ConvImpl("torch", "torch_conv", ("cpu", "cuda"), "fp32",
             "F.conv2d: the framework baseline, oneDNN on CPU, cuDNN with TF32 off on GPU (milestone 1)"),
    ConvImpl("torch-tf32", "torch_conv", ("cuda",), "tf32",
             "comparison baseline, not ours: F.conv2d with cuDNN's TF32 on (the yardstick of the reduced-precision "
             "entries)"),
    ConvImpl("torch-bf16", "torch_conv", ("cuda",), "bf16",
             "comparison baseline, not ours: F.conv2d on bfloat16 operands (cuDNN; weights converted once, the input "
             "each call, the bf16 output widened to float32): the yardstick of the BF16 entries"),
    ConvImpl("torch-compile", "torch_compile", ("cpu", "cuda"), "fp32",
             "comparison baseline, not ours: torch.compile (Inductor, max-autotune without CUDA graphs) of conv "
             "[+ act + pool] as one graph, TF32 off; compiles on the first call per input shape, which counts as "
             "preparation (bench's warm-up calls and the engine's warm-up pass take it), not op time", fuses=True,
             compiles_per_shape=True),
    # -- CPU (milestone 2) --------------------------------------------------------------------------
    ConvImpl("cpu-loops", "cpu_loops", ("cpu",), "fp32",
             "the course's seven-loop pseudo-code as written, Numba, one thread", ("numba",), install_hint=_NUMBA),
    ConvImpl("cpu-parallel", "cpu_parallel", ("cpu",), "fp32",
             "Numba, 16 images per vector, compile-time K and map blocks, in-register transposes, thread pool, "
             "optional fused act + pool", ("numba",), fuses=True, install_hint=_NUMBA),
    ConvImpl("cpu-winograd", "cpu_winograd", ("cpu",), "fp32",
             "Winograd F(m, K) along rows (9 points), cpu-parallel's register tiles for the products, 16 images "
             "per vector; the CPU engine's unpooled layers", ("numba",), install_hint=_NUMBA),
    ConvImpl("cpu-gemm", "cpu_gemm", ("cpu",), "fp32", "unroll (im2col) + BLAS matrix multiply, chunked"),
    # -- beyond the course: either device, through torch.fft -----------------------------------------
    ConvImpl("fft", "fft_conv", ("cpu", "cuda"), "fp32",
             "FFT convolution as cuDNN's FFT algorithms (no course step): real-FFT tiles (overlap-save), the channel "
             "sum a complex matrix product per frequency (TF32 off); a non-finite input takes a float64 direct path "
             "(one host read per call: not CUDA-graph capturable); for many-channel layers with K >= 5",
             graph_safe=False),
    # -- CUDA C through CuPy/NVRTC (milestones 3 and 4) ----------------------------------------------
    ConvImpl("cuda-naive", "cuda_naive", ("cuda",), "fp32",
             "one thread per output element, global memory only (milestone 3)", ("cupy",), install_hint=_CUPY),
    ConvImpl("cuda-tiled", "cuda_tiled", ("cuda",), "fp32",
             "input tile plus halo in shared memory", ("cupy",), install_hint=_CUPY),
    ConvImpl("cuda-constmem", "cuda_constmem", ("cuda",), "fp32",
             "weights in __constant__ memory, shared-memory input tile", ("cupy",), install_hint=_CUPY),
    ConvImpl("cuda-unroll-gemm", "cuda_unroll_gemm", ("cuda",), "fp32",
             "unroll (im2col) kernel + shared-memory tiled matrix multiply, batch chunked", ("cupy",),
             install_hint=_CUPY),
    ConvImpl("cuda-fused-gemm", "cuda_fused_gemm", ("cuda",), "fp32",
             "implicit GEMM: unroll fused into a register-tiled matmul, compile-time shapes, __restrict__",
             ("cupy",), install_hint=_CUPY),
    ConvImpl("cuda-tc-tf32", "cuda_tc", ("cuda",), "tf32",
             "implicit GEMM on tensor cores, TF32 inputs, fp32 accumulate; fused act + pool by torch after it", ("cupy",), fuses=True,
             install_hint=_CUPY),
    ConvImpl("cuda-tc-fp16", "cuda_tc", ("cuda",), "fp16",
             "implicit GEMM on tensor cores, FP16 inputs, fp32 accumulate; fused act + 2x2 pool in the epilogue (conv rows of a window in one lane)", ("cupy",), fuses=True,
             install_hint=_CUPY),
    ConvImpl("cuda-tc-3xtf32", "cuda_tc", ("cuda",), "tf32x3",
             "the gather kernel on split TF32: three mma.sync products a multiply, each k step's sum added in fp32 "
             "(fp32-accurate: exact tolerance); few-channel layers", ("cupy",), install_hint=_CUPY),
    ConvImpl("cuda-igemm-3xtf32", "cuda_igemm", ("cuda",), "tf32x3",
             "implicit GEMM over the whole batch on tensor cores, split TF32 (3 products, fp32-accurate: exact "
             "tolerance), cp.async multi-stage tiles; for many-channel layers", ("cupy",), install_hint=_CUPY),
    ConvImpl("cuda-igemm-tf32", "cuda_igemm", ("cuda",), "tf32",
             "the same implicit GEMM with one TF32 product (reduced precision)", ("cupy",), install_hint=_CUPY),
    ConvImpl("cuda-fused-layer", "cuda_fused_layer", ("cuda",), "fp32",
             "conv + bias + activation + max pool in one kernel, writes only the pooled map (cuda-direct's "
             "pooled kernel for one input channel, the register-tiled implicit GEMM otherwise)", ("cupy",),
             fuses=True, install_hint=_CUPY),
    ConvImpl("cuda-direct", "cuda_direct", ("cuda",), "fp32",
             "direct convolution, weights as constant-bank FFMA operands, register tiles of columns x maps, "
             "optional fused act + pool", ("cupy",), fuses=True, install_hint=_CUPY),
    ConvImpl("cuda-auto", "cuda_auto", ("cuda",), "fp32",
             "per layer shape, the fastest CUDA kernel held to the exact tolerance (fp32 or 3xTF32) according to the "
             "recorded bench results",
             ("cupy",), fuses=True, install_hint=_CUPY),
    # -- Triton -------------------------------------------------------------------------------------
    ConvImpl("triton-direct", "triton_direct", ("cuda",), "fp32",
             "direct convolution, tile of positions x maps per program, constexpr K and C", ("triton",),
             install_hint=_TRITON),
    ConvImpl("triton-gemm", "triton_gemm", ("cuda",), "fp32",
             "implicit GEMM with tl.dot, input_precision='ieee', autotuned blocks", ("triton",),
             install_hint=_TRITON),
    ConvImpl("triton-gemm-tf32", "triton_gemm", ("cuda",), "tf32",
             "implicit GEMM with tl.dot on TF32 tensor cores, autotuned blocks", ("triton",), install_hint=_TRITON),
    ConvImpl("triton-gemm-3xtf32", "triton_gemm", ("cuda",), "tf32x3",
             "implicit GEMM with tl.dot, input_precision='tf32x3': three TF32 tensor-core products per multiply "
             "(fp32-accurate, held to the exact tolerance)", ("triton",), install_hint=_TRITON),
    ConvImpl("triton-igemm-3xtf32", "triton_igemm", ("cuda",), "tf32x3",
             "implicit GEMM on tensor cores fed by TMA boxes of a channels-last split copy of the input (3 TF32 "
             "products, fp32-accurate: exact tolerance), zero padding and bias in the kernel; sm_90+, many-channel "
             "layers", ("triton",), install_hint=_TRITON),
    ConvImpl("triton-igemm-tf32", "triton_igemm", ("cuda",), "tf32",
             "the same TMA-fed implicit GEMM with one TF32 product (reduced precision)", ("triton",),
             install_hint=_TRITON),
    ConvImpl("triton-igemm-bf16", "triton_igemm", ("cuda",), "bf16",
             "the same TMA-fed implicit GEMM on bfloat16 operands (rounded to nearest even in the prologue and "
             "packing), fp32 accumulation (reduced precision)", ("triton",), install_hint=_TRITON),
    ConvImpl("triton-fused-layer", "triton_fused_layer", ("cuda",), "fp32",
             "conv + bias + activation + max pool in one Triton kernel, writes only the pooled map",
             ("triton",), fuses=True, install_hint=_TRITON),
    ConvImpl("triton-tc-fused", "triton_tc_fused", ("cuda",), "fp16",
             "conv on FP16 tensor cores (tl.dot, fp32 sums): input-row segments times Toeplitz weights (few "
             "maps) or an implicit-GEMM gather, bias + activation + max pool in the epilogue, writes only the "
             "pooled map", ("triton",), fuses=True,
             install_hint=_TRITON),
)

_BY_NAME = {impl.name: impl for impl in IMPLEMENTATIONS}

# What "--impl auto" picks, first available wins.
AUTO_PREFERENCE = {"cuda": ("cuda-auto", "triton-direct", "torch"), "cpu": ("cpu-winograd", "cpu-parallel", "torch")}


def names() -> list[str]:
    return [impl.name for impl in IMPLEMENTATIONS]


def get(name: str) -> ConvImpl:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UserError(f"unknown implementation '{name}'; choose one of: {', '.join(names())} "
                        "(see 'convforge impls')") from None


def resolve(name: str, device: str) -> ConvImpl:
    """The implementation to run on ``device``: ``auto`` picks the best available one."""
    if name == "auto":
        for candidate in AUTO_PREFERENCE[device]:
            if candidate in _BY_NAME and _BY_NAME[candidate].unavailable_reason(device) is None:
                return _BY_NAME[candidate]
        raise UserError(f"no convolution implementation is available on {device}")
    impl = get(name)
    reason = impl.unavailable_reason(device)
    if reason:
        raise UserError(f"implementation '{name}' cannot run on {device} here: {reason}")
    return impl


def add_bias(y: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """In-place bias add for implementations whose kernel has no bias epilogue."""
    if bias is not None:
        y += bias.view(1, -1, 1, 1)
    return y


def output_buffer(out: Optional[torch.Tensor], shape: tuple[int, ...], like: torch.Tensor,
                  dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """For kernel wrappers: (buffer the kernel writes, tensor to return). ``out`` itself when it is a
    contiguous ``dtype`` buffer of the right shape on the input's device, else a fresh tensor that
    ``finish_output`` copies into ``out`` afterwards. ``dtype``: float32, or float16 for a kernel asked for
    an FP16 output (``out_dtype``)."""
    if out is None:
        y = torch.empty(shape, dtype=dtype, device=like.device)
        return y, y
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != like.device:
        raise ValueError(f"out must be {str(dtype).removeprefix('torch.')} {tuple(shape)} on {like.device}, got "
                         f"{out.dtype} {tuple(out.shape)} on {out.device}")
    if out.is_contiguous():
        return out, out
    return torch.empty(shape, dtype=dtype, device=like.device), out


def finish_output(buffer: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    if buffer is not result:
        result.copy_(buffer)
    return result


def round_tf32(t: torch.Tensor) -> torch.Tensor:
    """For the tensor-core kernels' operands: t rounded to TF32, to nearest with ties away from zero (as cvt.rna);
    Inf and NaN unchanged."""
    bits = t.contiguous().view(torch.int32)
    return torch.where(torch.isfinite(t), (bits + 0x1000) & -0x2000, bits).view(torch.float32)


def split_tf32(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """3xTF32's operand parts (big, small), both TF32 values: big = t truncated to TF32, small = the rest rounded
    (|t - big - small| <= 2^-21 |t|). small has t's sign, so that an Inf met in the other operand gives products
    of one sign, never Inf - Inf: where the rest is zero it is t * 2^-30 (a 2^-30 relative change). A non-finite
    t has big = t and small = t * 2^-30, the same Inf or NaN (a caller that wants 0 there masks it)."""
    t = t.contiguous()
    finite = torch.isfinite(t)
    big = torch.where(finite, t.view(torch.int32) & -0x2000, t.view(torch.int32)).view(torch.float32)
    rest = torch.where(finite, t - big, torch.zeros_like(t))
    return big, torch.where(rest == 0, t * 2.0 ** -30, round_tf32(rest))


def check_input(x: torch.Tensor, weight: torch.Tensor,
                dtypes: tuple[torch.dtype, ...] = (torch.float32,)) -> tuple[int, int, int, int]:
    """The output shape for ``x``, or a clear error for an input no implementation serves: not a 4-d float32
    tensor on the weights' device (``dtypes``: also float16 for a layer prepared with ``in_dtype=torch.float16``),
    a channel count other than the weights', an input smaller than the kernel.
    Shapes, dtype and device only (a microsecond a call); any strides are fine (callers copy to contiguous)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"input must be a 4-d (B, C, H, W) tensor, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if x.dtype not in dtypes:
        raise TypeError(f"input must be {' or '.join(str(d).removeprefix('torch.') for d in dtypes)}, got {x.dtype}")
    if x.device != weight.device:
        raise ValueError(f"input is on {x.device}, the weights on {weight.device}")
    shape = output_shape(tuple(x.shape), tuple(weight.shape))
    if shape[2] < 1 or shape[3] < 1:
        raise ValueError(f"input {x.shape[2]}x{x.shape[3]} is smaller than the "
                         f"{weight.shape[2]}x{weight.shape[3]} kernel")
    return shape


def output_shape(x_shape, weight_shape) -> tuple[int, int, int, int]:
    batch, channels, height, width = x_shape
    maps, w_channels, k_h, k_w = weight_shape
    if channels != w_channels:
        raise ValueError(f"input has {channels} channels, weights expect {w_channels}")
    return batch, maps, height - k_h + 1, width - k_w + 1

