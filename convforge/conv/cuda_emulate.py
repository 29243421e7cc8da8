"""Run the CUDA C kernels on the CPU, for checking them where there is no GPU (tests, CI).

Not an implementation: ``emulated()`` is a context manager under which the ``cuda_*`` modules' prepare()
accepts CPU tensors and launches their kernels through ``cuda/host_emulation.h`` compiled with g++ (one
OS thread per CUDA thread, blocks in sequence, mma.sync emulated per warp). The Python side (planning,
weight packing, chunking, grids, arguments) is the real code; only ``cuda_common``'s device calls are
swapped. It checks indexing, bounds, barriers and every output being written, at a tiny fraction of GPU
speed (keep shapes small); it says nothing about performance and cannot check the mma fragment layouts
themselves (the emulation implements the layouts the kernel comments state).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from convforge.conv import cuda_common as cc

SHIM = cc.KERNEL_DIR / "host_emulation.h"
# extern "C" __global__ void [__launch_bounds__(...) | A_BOUNDS_MACRO] name(
_KERNEL_RE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*|[A-Z][A-Z0-9_]*\s+)?'
                        r'(\w+)\s*\(')


def compiler() -> Optional[str]:
    return shutil.which(os.environ.get("CXX", "g++"))


def kernel_names(source: str) -> list[str]:
    return _KERNEL_RE.findall(source)


def translate(source: str) -> str:
    """CUDA source -> host C++: dynamic shared arrays become pointers into the block's buffer."""
    source = re.sub(r"extern\s+__shared__\s+(\w+)\s+(\w+)\s*\[\s*\]\s*;",
                    r"\1* const \2 = reinterpret_cast<\1*>(cf::dyn_smem());", source)
    return re.sub(r"\b__shared__\s+", "static ", source)


class _Library:
    def __init__(self, spec: cc.KernelSpec, build_dir: Path):
        source = cc.load_source(spec.source)
        names = kernel_names(source)
        launchers = "\n".join(
            f'extern "C" int cf_launch_{n}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, '
            f'unsigned bz, unsigned long smem, void** args) '
            f'{{ return cf::launch({n}, dim3(gx, gy, gz), dim3(bx, by, bz), smem, args); }}' for n in names)
        text = f'#include "{SHIM}"\n#line 1 "{spec.source}"\n{translate(source)}\n{launchers}\n'
        key = hashlib.sha256((text + repr(spec.options())).encode()).hexdigest()[:16]
        lib = build_dir / f"{Path(spec.source).stem}-{key}.so"
        if not lib.exists():
            src = build_dir / f"{Path(spec.source).stem}-{key}.cpp"
            src.write_text(text, encoding="utf-8")
            defines = [o for o in spec.options() if o.startswith("-D")]
            cmd = [compiler(), "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w", *defines,
                   "-o", str(lib), str(src)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"host build of {spec.source} failed:\n{done.stderr[-4000:]}")
        self.lib = ctypes.CDLL(str(lib))
        self.names = names


class EmuKernel:
    def __init__(self, library: _Library, name: str):
        self.fn = getattr(library.lib, f"cf_launch_{name}")
        self.fn.restype = ctypes.c_int
        self.name = name
        self.registers = 0

    def allow_shared(self, nbytes: int) -> None:
        pass

    def blocks_per_sm(self, block: int, smem: int) -> int:
        return 1

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        grid, block = cc.dim3(grid), cc.dim3(block)
        if min(grid) <= 0:
            return
        argv = ctypes.c_void_p(cc.pack_arguments(tuple(args), self.name))   # the block cuLaunchKernel gets
        self.fn(*[ctypes.c_uint(v) for v in grid + block], ctypes.c_ulong(int(shared_mem)), argv)


@contextlib.contextmanager
def emulated(sm_count: int = 2, smem_optin: int = 227 * 1024):
    """Swap cuda_common's device layer for the host emulation; CPU tensors stand in for device tensors."""
    if compiler() is None:
        raise RuntimeError("no C++ compiler (g++) for the host emulation")
    build_dir = Path(tempfile.mkdtemp(prefix="convforge-emu-"))
    libraries: dict = {}

    def library(spec):
        if spec not in libraries:
            libraries[spec] = _Library(spec, build_dir)
        return libraries[spec]

    def kernel(spec, name, device):
        return EmuKernel(library(spec), name)

    def global_ptr(spec, name, device):
        return ctypes.addressof(ctypes.c_float.in_dll(library(spec).lib, name))

    def copy_async(dst, src, nbytes, device):
        ctypes.memmove(int(dst), int(src), int(nbytes))

    def device_info(device):
        return cc.DeviceInfo(0, sm_count, smem_optin, smem_optin + 1024, "90")

    saved = {name: getattr(cc, name) for name in _SWAPPED}
    cc.kernel, cc.global_ptr, cc.copy_async, cc.device_info = kernel, global_ptr, copy_async, device_info
    cc.synchronize = lambda device: None
    cc.DEVICE_TYPE = "cpu"
    _active.append(saved)
    try:
        yield
    finally:
        _active.pop()
        for name, value in saved.items():
            setattr(cc, name, value)
        shutil.rmtree(build_dir, ignore_errors=True)


_SWAPPED = ("kernel", "global_ptr", "copy_async", "device_info", "synchronize", "DEVICE_TYPE")
_active: list = []   # the real device layers that the open emulated() contexts replaced, innermost last


@contextlib.contextmanager
def suspended():
    """The real device layer for the duration, inside an emulated() context too (a GPU test of a module whose
    emulated tests hold a module-wide emulation); a no-op outside one."""
    if not _active:
        yield
        return
    emulating = {name: getattr(cc, name) for name in _SWAPPED}
    for name, value in _active[0].items():
        setattr(cc, name, value)
    try:
        yield
    finally:
        for name, value in emulating.items():
            setattr(cc, name, value)
