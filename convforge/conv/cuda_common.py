"""Shared launcher for the CUDA C kernels in ``convforge/conv/cuda/`` (compiled at run time by NVRTC via CuPy).

Not an implementation itself: the ``cuda_*`` modules describe what to compile as ``KernelSpec``s (a ``.cu``
file and its compile-time constants) and launch through ``Kernel``. Everything that touches CuPy is
imported lazily, so the kernel modules import (and report themselves unavailable) without it.

- ``KernelSpec.options()`` is the one place compile options are made: ``-std=c++17`` plus one
  ``-DNAME=value`` per constant. CuPy adds ``-arch=sm_XY`` for the current device (and ``-ftz=true``);
  the CI test compiles the same sources with ``nvcc -arch=sm_90`` and these same options.
- ``kernel(spec, name)`` compiles once per (source text, constants) and process: CuPy keeps the module
  in memory and the cubin on disk (``~/.cupy/kernel_cache``), so a later process skips NVRTC.
- ``Kernel.__call__`` launches on PyTorch's current stream of the tensor's device, so kernels order
  with the surrounding torch work without synchronising. Launch-configuration errors raise at once;
  with ``CONVFORGE_CUDA_SYNC=1`` every launch is followed by a stream synchronise, so an illegal address
  is reported at the kernel that caused it.
- Pointers are passed as ``numpy.uint64`` of ``tensor.data_ptr()`` and every scalar as ``numpy.int32``
  (a bare Python int would go to the kernel as 8 bytes): no copies, no CuPy arrays.
- The launch itself is one ``cuLaunchKernel`` (CuPy's thin driver binding) with the arguments written into
  a reused per-thread parameter block and the stream read as torch's raw handle: CuPy's ``RawKernel``
  call (argument conversion, stream context) cost about half of a small layer's 36 us host time.
"""

from __future__ import annotations

import heapq
import itertools
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np
import torch

from convforge.conv import ACTIVATION_CODES, finish_output, output_buffer
from convforge.conv import check_input as conv_check_input

KERNEL_DIR = Path(__file__).resolve().parent / "cuda"
BASE_OPTIONS = ("-std=c++17",)
SYNC_ENV = "CONVFORGE_CUDA_SYNC"
INT32_MAX = 2**31 - 1
CONST_BANK_FLOATS = 16384   # the 64 KB __constant__ bank a module may fill (cuda-constmem, cuda-direct)
DEVICE_TYPE = "cuda"   # the host emulation (cuda_emulate) sets "cpu"


@dataclass(frozen=True)
class KernelSpec:
    """What to compile: a source file under ``cuda/`` and its compile-time constants (name -> int)."""
    source: str
    constants: tuple[tuple[str, int], ...] = ()

    @staticmethod
    def of(source: str, **constants: int) -> "KernelSpec":
        return KernelSpec(source, tuple(sorted((k, int(v)) for k, v in constants.items())))

    def options(self) -> tuple[str, ...]:
        return BASE_OPTIONS + tuple(f"-D{name}={value}" for name, value in self.constants)

    @property
    def path(self) -> Path:
        return KERNEL_DIR / self.source

    def constant(self, name: str) -> int:
        return dict(self.constants)[name]


_INCLUDE_RE = re.compile(r'^#include\s+"([\w.]+)"\s*$', re.MULTILINE)


def load_source(name: str) -> str:
    """A kernel's source with our own headers (``#include "x.cuh"`` of a file in the kernel folder) pasted
    in: NVRTC then needs no include path, and CuPy's cache key (the code) changes with the headers."""
    text = (KERNEL_DIR / name).read_text(encoding="utf-8")
    return _INCLUDE_RE.sub(lambda m: load_source(m.group(1)) if (KERNEL_DIR / m.group(1)).is_file()
                           else m.group(0), text)


def sources() -> list[Path]:
    """Every kernel source file (what the CI compile test must cover)."""
    return sorted(KERNEL_DIR.glob("*.cu"))


# -- CuPy, lazily ----------------------------------------------------------------------------------

def cupy():
    import cupy as cp  # the optional extra; imported only once a CUDA implementation is prepared
    return cp


_modules: dict = {}
_lock = threading.Lock()


def module(spec: KernelSpec):
    """The compiled module of ``spec`` (one per process and spec; NVRTC runs only on a disk-cache miss)."""
    key = (spec.source, spec.constants)
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            cp = cupy()
            mod = cp.RawModule(code=load_source(spec.source), options=spec.options())
            _modules[key] = mod
    return mod


def stream_handle(device: torch.device) -> int:
    return _current_stream(device.index if device.index is not None else torch.cuda.current_device())


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    sm_count: int
    smem_per_block_optin: int   # bytes a block may use after raising its dynamic limit
    smem_per_sm: int
    compute_capability: str


_device_info: dict = {}


def device_info(device: torch.device) -> DeviceInfo:
    index = device.index if device.index is not None else torch.cuda.current_device()
    info = _device_info.get(index)
    if info is None:
        cp = cupy()
        rt = cp.cuda.runtime
        with cp.cuda.Device(index) as dev:
            info = DeviceInfo(index, rt.deviceGetAttribute(rt.cudaDevAttrMultiProcessorCount, index),
                              rt.deviceGetAttribute(rt.cudaDevAttrMaxSharedMemoryPerBlockOptin, index),
                              rt.deviceGetAttribute(rt.cudaDevAttrMaxSharedMemoryPerMultiprocessor, index),
                              dev.compute_capability)
        _device_info[index] = info
    return info


_params = threading.local()


def _param_block(n: int):
    """This thread's parameter block for ``n`` arguments: 8-byte slots, a 32-bit view of them, and the
    address of the pointer array ``cuLaunchKernel`` reads. The driver copies the values at launch, so a
    block is reused by every launch of this thread with that many arguments."""
    blocks = getattr(_params, "blocks", None)
    if blocks is None:
        blocks = _params.blocks = {}
    block = blocks.get(n)
    if block is None:
        slots = np.zeros(max(n, 1), np.uint64)
        pointers = np.arange(max(n, 1), dtype=np.uint64) * np.uint64(8) + np.uint64(slots.ctypes.data)
        block = blocks[n] = (slots, slots.view(np.int32), pointers, int(pointers.ctypes.data))
    return block


def pack_arguments(args: tuple, name: str = "kernel") -> int:
    """Write ``args`` (numpy.uint64 pointers, numpy.int32 scalars) into this thread's parameter block and
    return the address of its pointer array, the ``kernelParams`` of ``cuLaunchKernel``."""
    slots, words, _, params = _param_block(len(args))
    for i, a in enumerate(args):
        if type(a) is np.uint64:
            slots[i] = a
        elif type(a) is np.int32:
            words[2 * i] = a        # little-endian: the low word of the slot, the 4 bytes the kernel reads
        else:
            raise TypeError(f"{name}: argument {a!r} is not numpy.uint64 / numpy.int32")
    return params


def _bound_devices() -> set:
    """Devices whose primary context this thread has made current: cuLaunchKernel needs a current context,
    and a thread that has only called cudaGetDevice may have none yet."""
    bound = getattr(_params, "bound", None)
    if bound is None:
        bound = _params.bound = set()
    return bound


def _stream_getter():
    """torch's current raw stream handle by device index; the private binding (used by Triton and
    Inductor for the same reason) skips building a ``torch.cuda.Stream`` per call."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


_current_stream = _stream_getter()


class Kernel:
    """One ``extern "C"`` kernel of a compiled spec, launched on PyTorch's current stream."""

    def __init__(self, spec: KernelSpec, name: str, device: torch.device):
        self.spec, self.name, self.device = spec, name, device
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        cp = cupy()
        with cp.cuda.Device(self.index):   # CuPy picks a RawKernel's per-device function by the current device
            self.raw = module(spec).get_function(name)
            self.raw.compile()
            self._function = int(self.raw.kernel.ptr)
            self._registers = int(self.raw.num_regs)
        self._launch = cp.cuda.driver.launchKernel
        self._get_device = cp.cuda.runtime.getDevice
        self._smem_limit = 48 * 1024

    def allow_shared(self, nbytes: int) -> None:
        """Raise the kernel's dynamic shared-memory limit (needed above 48 KB)."""
        if nbytes > self._smem_limit:
            cp = cupy()
            with cp.cuda.Device(self.index):
                self.raw.max_dynamic_shared_size_bytes = int(nbytes)
            self._smem_limit = int(nbytes)

    def blocks_per_sm(self, block: int, smem: int) -> int:
        """Resident blocks per multiprocessor for this block size and dynamic shared memory (occupancy API)."""
        cp = cupy()
        self.allow_shared(smem)
        with cp.cuda.Device(self.index):
            return int(cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(self._function, block, smem))

    @property
    def registers(self) -> int:
        return self._registers

    def __call__(self, grid: Sequence[int], block: Sequence[int], args: Iterable, shared_mem: int = 0) -> None:
        gx, gy, gz = dim3(grid)
        if gx <= 0 or gy <= 0 or gz <= 0:
            return  # nothing to do (an empty batch)
        if gx > INT32_MAX or gy > 65535 or gz > 65535:
            raise ValueError(f"{self.name}: grid {(gx, gy, gz)} exceeds the CUDA limits")
        bx, by, bz = dim3(block)
        shared_mem = int(shared_mem)
        if shared_mem > self._smem_limit:
            self.allow_shared(shared_mem)
        params = pack_arguments(tuple(args), self.name)
        if self._get_device() != self.index:
            with cupy().cuda.Device(self.index):   # its cudaSetDevice also makes that context current
                self._launch_here(gx, gy, gz, bx, by, bz, shared_mem, params)
            return
        bound = _bound_devices()
        if self.index not in bound:   # this thread's first launch here: cudaSetDevice binds the primary context
            cupy().cuda.runtime.setDevice(self.index)
            bound.add(self.index)
        self._launch_here(gx, gy, gz, bx, by, bz, shared_mem, params)

    def _launch_here(self, gx, gy, gz, bx, by, bz, shared_mem, params) -> None:
        stream = _current_stream(self.index)
        self._launch(self._function, gx, gy, gz, bx, by, bz, shared_mem, stream, params, 0)
        if os.environ.get(SYNC_ENV, "") not in ("", "0"):
            cupy().cuda.runtime.streamSynchronize(stream)  # raises here, at the kernel that faulted


def dim3(v: Sequence[int]) -> tuple[int, int, int]:
    """A grid or block of 1-3 sizes as three ints (missing ones 1)."""
    n = len(v)
    return int(v[0]), int(v[1]) if n > 1 else 1, int(v[2]) if n > 2 else 1


_kernels: dict = {}


def kernel(spec: KernelSpec, name: str, device: torch.device) -> Kernel:
    key = (spec, name, device.index)
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = Kernel(spec, name, device)
    return k


def global_ptr(spec: KernelSpec, name: str, device: torch.device) -> int:
    """Device address of a ``__device__`` / ``__constant__`` symbol of the spec's module on ``device``."""
    cp = cupy()
    with cp.cuda.Device(device.index):
        return int(module(spec).get_global(name).ptr)


def synchronize(device: torch.device) -> None:
    torch.cuda.synchronize(device)


def copy_async(dst: int, src: int, nbytes: int, device: torch.device) -> None:
    """Device-to-device copy on PyTorch's current stream (e.g. into a ``__constant__`` symbol)."""
    cp = cupy()
    with cp.cuda.Device(device.index):
        cp.cuda.runtime.memcpyAsync(int(dst), int(src), int(nbytes), cp.cuda.runtime.memcpyDeviceToDevice,
                                    stream_handle(device))


# -- module instances with a constant bank of their own ----------------------------------------------

_free_instances: list[int] = []   # released ids, smallest first (so a later process hits the disk cache)
_fresh_instances = itertools.count()


def acquire_instance() -> tuple[int, bool]:
    """A module instance id (compiled as -DCF_INSTANCE=id) no live layer holds, and whether it was used
    before: a kernel with a ``__constant__`` bank filled per layer needs its own module per layer, since
    several layers' kernels may run at once on different streams. A reused id's bank may still be read by
    kernels of the layer that freed it, so the caller synchronises before overwriting it."""
    with _lock:
        if _free_instances:
            return heapq.heappop(_free_instances), True
        return next(_fresh_instances), False


def release_instances(ids: list[int]) -> None:
    with _lock:
        for i in ids:
            heapq.heappush(_free_instances, i)


# -- arguments ---------------------------------------------------------------------------------------

def ptr(t: Optional[torch.Tensor]) -> np.uint64:
    """A device pointer argument (0 for None)."""
    return np.uint64(0 if t is None else t.data_ptr())


def i32(v: int) -> np.int32:
    v = int(v)
    if not -2**31 <= v <= INT32_MAX:
        raise ValueError(f"{v} does not fit a 32-bit kernel argument")
    return np.int32(v)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# -- the ConvFn contract -----------------------------------------------------------------------------

def is_half(name: str, dtype: torch.dtype) -> bool:
    """Whether a prepare's ``name`` dtype (out_dtype, in_dtype) asks for FP16 rather than float32, the two the
    kernels read and write; anything else is an error naming the argument."""
    if dtype not in (torch.float32, torch.float16):
        raise ValueError(f"{name} must be torch.float32 or torch.float16, got {dtype}")
    return dtype == torch.float16


def check_weight(weight: torch.Tensor, bias: Optional[torch.Tensor],
                 square: bool = True) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Float32, contiguous weight (M, C, K, K), or (M, C, KH, KW) where not ``square``, and bias (M,) on one
    CUDA device."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 4 or (square and weight.shape[2] != weight.shape[3]):
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must be (M, C, {'K, K' if square else 'KH, KW'}), got {shape}")
    if weight.device.type != DEVICE_TYPE:
        raise ValueError(f"weight must be on a {DEVICE_TYPE} device, got {weight.device}")
    weight = weight.detach().to(torch.float32).contiguous()
    if bias is not None:
        if tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"bias must be ({weight.shape[0]},), got {tuple(bias.shape)}")
        bias = bias.detach().to(device=weight.device, dtype=torch.float32).contiguous()
    return weight, bias


def check_input(x: torch.Tensor, weight: torch.Tensor, dtypes: tuple = (torch.float32,)) -> torch.Tensor:
    """``x`` checked (the registry's check_input) and as the kernels read it: contiguous and 16-byte aligned.
    A view with a storage offset is contiguous but may start mid-vector: the vectorised loads (float4,
    cp.async of 16 bytes) then fault with a misaligned address (found by tests/test_fuzz.py on an H200),
    so such an input is copied, as a strided one is."""
    conv_check_input(x, weight, dtypes)
    if not x.is_contiguous() or x.data_ptr() % 16:
        return x.clone(memory_format=torch.contiguous_format)
    return x


# The out= buffer protocol is the registry's, shared with the Triton wrappers.
output = output_buffer
finish = finish_output


def per_input_size(weight: torch.Tensor, make_layer, input_hw=None, dtypes: tuple = (torch.float32,)):
    """The registry's fn(x, out=None) over kernels compiled per input size: ``make_layer(h, w)`` builds the
    layer object for one (H, W) the first time that size is seen (in prepare when ``input_hw`` is given);
    ``run.layer_for(h, w)`` exposes it (the bench and tuning scripts read its geometry). ``dtypes``: the input
    dtypes the layers take (float16 too for an ``in_dtype=torch.float16`` prepare)."""
    layers: dict = {}

    def layer_for(h: int, w: int):
        if (h, w) not in layers:
            layers[(h, w)] = make_layer(h, w)
        return layers[(h, w)]

    if input_hw is not None:
        layer_for(*input_hw)

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = check_input(x, weight, dtypes)
        return layer_for(x.shape[2], x.shape[3])(x, out)

    run.layer_for = layer_for
    return run


def conv_out_shape(x: torch.Tensor, weight: torch.Tensor) -> tuple[int, int, int, int]:
    b, _, h, w = x.shape
    m, _, k, _ = weight.shape
    return b, m, h - k + 1, w - k + 1


def activation_code(activation: Optional[str]) -> int:
    """The kernels' ACT constant for ``activation`` (None or "none": no activation)."""
    try:
        return ACTIVATION_CODES[None if activation == "none" else activation]
    except KeyError:
        raise ValueError(f"unknown activation {activation!r}; choose tanh, relu, sigmoid or None") from None


def fusion_codes(activation: Optional[str], pool) -> tuple[int, int]:
    """(activation code, pool) for a fused kernel's constants, both checked."""
    code, pool = activation_code(activation), int(pool)
    if pool < 1:
        raise ValueError(f"pool must be >= 1, got {pool}")
    return code, pool


def tensor_core_unavailable_reason(needs: str) -> Optional[str]:
    """unavailable_reason, and compute capability 8.0 or newer (``needs``: what the kernel uses from it)."""
    reason = unavailable_reason()
    if reason:
        return reason
    major = torch.cuda.get_device_capability()[0]
    if major < 8:
        return f"needs compute capability 8.0 or newer for {needs} (this GPU is {major}.x)"
    return None


def unavailable_reason() -> Optional[str]:
    """Checks beyond the registry's (GPU visible, cupy importable): CuPy must reach NVRTC."""
    try:
        cp = cupy()
        cp.cuda.nvrtc.getVersion()
    except Exception as exc:  # a CuPy wheel for another CUDA major, or NVRTC missing
        detail = str(exc).splitlines()[0] if str(exc) else ""
        return (f"CuPy cannot run NVRTC here ({type(exc).__name__}: {detail}); "
                "install the CuPy wheel matching the CUDA driver, e.g. pip install cupy-cuda13x")
    return None
