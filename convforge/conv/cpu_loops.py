"""cpu-loops: the course's seven-loop convolution exactly as the pseudo-code writes it, Numba, one thread.

Technique: for b, for m, for h, for w, for c, for p, for q: y[b,m,h,w] += x[b,c,h+p,w+q] * k[m,c,p,q], in
that order, compiled by Numba (no ``parallel``, no ``fastmath``: the sum runs in the written order in
float32), the output element first set to the bias (or 0) because the harness poisons ``out``.
Course step: the CPU baseline every class started from (the Fall 2017 C++ loop nest took 12.2 s for
10000 images of its 50-map 5x5 layer).
Bottleneck: one core and the latency of the add: the (c, p, q) reduction is one chain of C*K*K
dependent scalar fp32 additions per output element (each also stored back to y, as written: the compiler
cannot prove y does not alias x), nothing is vectorised, so it runs at about one multiply-add per add
latency: 3 GFLOP/s on this 2-core AVX-512 machine (Fall 2017 layer, 10000 images: 4.7 s, where the
course's C++ took 12.2 s).

This module also holds the Numba plumbing the other Numba implementations share: Numba is imported only
when an implementation is prepared (``convforge impls`` must not import it), and compiled code is cached
on disk when possible (next to the source, else in Numba's user cache, else in convforge's cache folder;
without any writable place it still compiles, just every time).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from convforge.conv import finish_output, output_buffer, output_shape
from convforge.files import write_atomically


# ----------------------------------------------------------------------------- Numba plumbing

def numba_module():
    """Numba, imported on first use."""
    import numba
    return numba


def _convforge_numba_dir() -> str:
    from convforge.data import cache_dir
    return str(cache_dir() / "numba")


def jit(py_func: Callable, **options) -> Callable:
    """``numba.njit(cache=True, **options)(py_func)``, falling back when no cache folder is writable.

    Numba looks for a writable ``__pycache__`` next to the source, then its user-wide cache; when the
    package folder is read-only and there is no usable home either, it refuses ``cache=True`` at
    decoration time. Then convforge's cache folder is tried (through ``numba.config.CACHE_DIR``, only
    while decorating: the cache locator keeps its path), and at last no cache at all.
    """
    numba = numba_module()
    try:
        return numba.njit(cache=True, **options)(py_func)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        pass
    saved = numba.config.CACHE_DIR
    try:
        os.makedirs(_convforge_numba_dir(), exist_ok=True)
        numba.config.CACHE_DIR = _convforge_numba_dir()
        return numba.njit(cache=True, **options)(py_func)
    except (OSError, RuntimeError):
        return numba.njit(cache=False, **options)(py_func)
    finally:
        numba.config.CACHE_DIR = saved


def jit_generated(name: str, source: str, entry: str, **options) -> Callable:
    """Compile function ``entry`` of generated module ``source`` with Numba, cached on disk when possible.

    Numba caches only functions that live in a source file, so the source is written (once, atomically,
    under a name carrying its hash) to convforge's cache folder and imported from there; when that folder
    is not writable the source is executed from memory and compiled without a cache.
    """
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    module_name = f"convforge_generated_{name}_{digest}"
    try:
        directory = _convforge_numba_dir()
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, module_name + ".py")
        if not os.path.exists(path):
            write_atomically(Path(path), lambda tmp: Path(tmp).write_text(source, encoding="utf-8"))
        module = sys.modules.get(module_name)
        if module is None:
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            # Registered so that Numba can find the module again when it loads the cached code.
            sys.modules[module_name] = module
        return jit(getattr(module, entry), **options)
    except OSError:
        namespace: dict = {}
        exec(compile(source, f"<{module_name}>", "exec"), namespace)
        return numba_module().njit(**options)(namespace[entry])


def check_input(x: torch.Tensor, weight_shape) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """``x`` as a contiguous float32 NumPy array (zero-copy when it already is one) and the output shape."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 4:
        raise TypeError(f"expected a 4-d float32 CPU tensor, got {x.dim()}-d {x.dtype} on {x.device}")
    shape = output_shape(tuple(x.shape), tuple(weight_shape))
    if shape[2] < 1 or shape[3] < 1:
        raise ValueError(f"a {weight_shape[2]}x{weight_shape[3]} kernel does not fit a "
                         f"{x.shape[2]}x{x.shape[3]} input")
    return x.detach().contiguous().numpy(), shape


# ------------------------------------------------------------------------------------- the CPU's ISA

VECTOR_LANES_ENV = "CONVFORGE_CPU_VECTOR_LANES"  # 8 or 16: force the AVX2 or the AVX-512 kernels


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from Linux's /proc/cpuinfo (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def vector_lanes() -> int:
    """float32 lanes of the widest vector register the CPU kernels use: 16 with AVX-512 (32 zmm), else 8
    (AVX2: 16 ymm). The one place the CPU kernels and the FMA-peak probe size their vectors from; the
    environment variable VECTOR_LANES_ENV overrides it (the AVX-512 kernels still compile and run correctly
    on an AVX2 CPU, LLVM splitting each 16-lane vector in two: how they are tested there)."""
    forced = os.environ.get(VECTOR_LANES_ENV)
    if forced in ("8", "16"):
        return int(forced)
    return 16 if "avx512f" in cpu_flags() else 8


# ------------------------------------------------------------------------------------- the kernel

def _seven_loops(x, k, bias, y):
    batch, channels, _, _ = x.shape
    maps, _, kernel, _ = k.shape
    _, _, out_h, out_w = y.shape
    for b in range(batch):
        for m in range(maps):
            for h in range(out_h):
                for w in range(out_w):
                    y[b, m, h, w] = bias[m]
                    for c in range(channels):
                        for p in range(kernel):
                            for q in range(kernel):
                                y[b, m, h, w] += x[b, c, h + p, w + q] * k[m, c, p, q]


_KERNEL = None


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = jit(_seven_loops)
    return _KERNEL


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
    maps, channels, kernel, kernel_w = weight.shape
    if kernel != kernel_w:
        raise ValueError(f"square kernels only, got {kernel}x{kernel_w}")
    k = weight.detach().to(torch.float32).contiguous().numpy()
    b = np.zeros(maps, np.float32) if bias is None else bias.detach().to(torch.float32).contiguous().numpy()
    fn = _kernel()
    # Compile now (one tiny call of the same types), so the first timed call runs compiled code.
    fn(np.zeros((1, channels, kernel, kernel), np.float32), k, b, np.empty((1, maps, 1, 1), np.float32))

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        xn, shape = check_input(x, k.shape)
        target, result = output_buffer(out, shape, x)
        if shape[0]:
            fn(xn, k, b, target.numpy())
        return finish_output(target, result)

    return run
