"""The CUDA C kernels build, without a GPU: nvcc for sm_90 (and NVRTC where CuPy can reach it) compiles every
``.cu`` under convforge/conv/cuda/ with the -D constants the Python side passes, the register-tiled kernels
keep everything in registers, and the kernel modules import and report themselves unavailable without CuPy.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from convforge.conv import cuda_common as cc
from convforge.conv import (cuda_constmem, cuda_direct, cuda_fused_gemm, cuda_fused_layer, cuda_igemm, cuda_naive,
                            cuda_tc, cuda_tiled, cuda_unroll_gemm)

from conftest import nvcc_path

# fa18 L2 (the FLOP-heavy layer) and fa17 L1 (C = 1, output-bound), as (M, C, H, W, K)
REPRESENTATIVE = {"fa18 L2": (24, 12, 33, 33, 7), "fa17 L1": (50, 1, 28, 28, 5)}
CUDA_MODULES = ("cuda_naive", "cuda_tiled", "cuda_constmem", "cuda_unroll_gemm", "cuda_fused_gemm", "cuda_tc",
                "cuda_fused_layer", "cuda_direct", "cuda_auto", "cuda_igemm")


def _preset_layers():
    """Every distinct preset conv layer with the max pool a fusing kernel would absorb (None = none)."""
    from convforge.harness.sweep import preset_layers
    seen = {}
    for spec in preset_layers():
        s = spec.shape
        seen.setdefault((s.M, s.C, s.H, s.W, s.K), spec.fusion)
    return seen


def _specs() -> list[tuple[str, cc.KernelSpec]]:
    specs: dict = {}
    for label, shape in REPRESENTATIVE.items():
        for module in (cuda_naive, cuda_tiled, cuda_constmem, cuda_unroll_gemm, cuda_fused_gemm):
            for spec in module.kernel_specs(*shape):
                specs.setdefault(spec, f"{module.__name__.split('.')[-1]} {label}")
        for precision in cuda_tc.GATHER_PRECISIONS:
            for spec in cuda_tc.kernel_specs(*shape, precision=precision):
                specs.setdefault(spec, f"cuda_tc {precision} {label}")
        for precision in cuda_igemm.PRECISIONS:
            for spec in cuda_igemm.kernel_specs(*shape, precision=precision):
                specs.setdefault(spec, f"cuda_igemm {precision} {label}")
        for pool, activation in ((2, "tanh"), (4, "relu"), (2, "sigmoid")):
            for spec in cuda_fused_layer.kernel_specs(*shape, pool=pool, activation=activation):
                specs.setdefault(spec, f"cuda_fused_layer {activation}+pool{pool} {label}")
    # the default launch shape of every preset layer, plain and fused, so none of them may spill
    for shape, fusion in _preset_layers().items():
        label = "M=%d C=%d H=%d W=%d K=%d" % shape
        for spec in cuda_fused_gemm.kernel_specs(*shape):
            specs.setdefault(spec, f"cuda_fused_gemm {label}")
        for spec in cuda_direct.kernel_specs(*shape):
            specs.setdefault(spec, f"cuda_direct {label}")
        for precision in cuda_tc.GATHER_PRECISIONS:   # the kernel prepare() runs on each layer (e.g. fa20 L1's staged epilogue)
            specs.setdefault(cuda_tc.kernel_specs(*shape, precision=precision)[0], f"cuda_tc {precision} {label}")
        if fusion:
            activation, pool = fusion
            for spec in cuda_fused_layer.kernel_specs(*shape, pool=pool, activation=activation):
                specs.setdefault(spec, f"cuda_fused_layer {activation}+pool{pool} {label}")
            for spec in cuda_direct.kernel_specs(*shape, pool=pool, activation=cc.activation_code(activation)):
                specs.setdefault(spec, f"cuda_direct {activation}+pool{pool} {label}")
            if cuda_tc.pool_serves(*shape[1:], pool, "fp16"):   # the fast path's fused first convs
                for spec in cuda_tc.kernel_specs(*shape, precision="fp16", pool=pool,
                                                 activation=cc.activation_code(activation)):
                    specs.setdefault(spec, f"cuda_tc pool {activation}+pool{pool} {label}")
    # cuda-direct's sweep-only knobs: several rows per thread (plain and fused), a minimum-blocks bound, a rolled loop
    for shape, pool, config in (((50, 1, 28, 28, 5), 1, {"mg": 7, "r": 4, "nt": 128, "rows": 2, "minb": 4}),
                                ((6, 1, 48, 48, 5), 2, {"mg": 6, "r": 4, "nt": 128, "rows": 2}),
                                ((50, 1, 28, 28, 5), 1, {"mg": 13, "r": 4, "nt": 128, "uc": 0})):
        for spec in cuda_direct.kernel_specs(*shape, pool=pool, activation=cc.activation_code("tanh") if pool > 1 else 0,
                                             config=config):
            specs.setdefault(spec, f"cuda_direct {config} pool{pool} M=%d C=%d H=%d W=%d K=%d" % shape)
    # the pairs kernel at the edges of its planning limits: 24 maps (default_kernel's cap) and an FP16 plan
    # whose register estimate is close to PAIRS_MAX_REGS
    for shape, precision, config in (((24, 1, 30, 30, 7), "tf32", {}), ((12, 1, 72, 72, 7), "fp16", {"rt": 8})):
        spec = cuda_tc.plan_pairs(*shape, precision, config).spec()
        specs.setdefault(spec, f"cuda_tc pairs {precision} {config} M=%d C=%d H=%d W=%d K=%d" % shape)
    # the implicit GEMM's every tile config on a gpu-mode shape (M = C = 128, K = 16), both precisions
    for config in cuda_igemm.LAUNCH_CONFIGS:
        for precision in cuda_igemm.PRECISIONS:
            for spec in cuda_igemm.kernel_specs(128, 128, 256, 256, 16, precision, config):
                specs.setdefault(spec, f"cuda_igemm {precision} {config} gpumode 256x256 K16")
    # the GPU engine's small-batch dense kernel, every row count it is compiled for
    from convforge import gpu_dense
    for spec in gpu_dense.kernel_specs():
        specs.setdefault(spec, f"gpu_dense {spec.source} {dict(spec.constants)}")
    return [(label, spec) for spec, label in specs.items()]


SPECS = _specs()


def test_every_kernel_source_is_compiled_by_some_module():
    covered = {spec.source for _, spec in SPECS}
    on_disk = {path.name for path in cc.sources()}
    assert on_disk, "no .cu files found"
    assert on_disk <= covered, f"kernel sources no module compiles: {sorted(on_disk - covered)}"


@pytest.mark.slow
@pytest.mark.parametrize("label,spec", SPECS, ids=[label for label, _ in SPECS])
def test_nvcc_compiles_for_sm90(label, spec, tmp_path):
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc is not installed (the CUDA toolkit's compiler); these checks need it, not a GPU")
    cubin = tmp_path / "kernel.cubin"
    cmd = [nvcc, "-arch=sm_90", "-cubin", "-Xptxas", "-v", *spec.options(), "-o", str(cubin), str(spec.path)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, f"{label}: nvcc failed\n{' '.join(cmd)}\n{done.stderr[-4000:]}"
    assert cubin.stat().st_size > 0
    if spec.source == "igemm.cu":
        # the implicit GEMM at 128 registers (two 256-thread blocks an SM) with the staged epilogue keeps one
        # 4-byte value in local memory, reloaded once per k tile (nvcc 13.0: 8 bytes; cuobjdump: one LDL per
        # 16-wide k tile against 96 HMMA): allowed up to 16 bytes, no more
        spilled = [int(v) for v in re.findall(r"(\d+) bytes spill stores", done.stderr)]
        assert spilled and max(spilled) <= 16, f"{label}: spills\n{done.stderr}"
    elif spec.source in ("regtile.cu", "tc.cu", "tc_rows.cu", "tc_pairs.cu", "tc_pool.cu", "direct.cu",
                         "dense_gemv.cu", "dense_tiles.cu", "dense_mma3.cu"):
        # the register tiles must stay in registers: no kernel entry spills or has a stack frame (a called
        # device function, such as the tensor-core kernels' non-finite pass, may have its own frame)
        report = done.stderr
        entries = set(re.findall(r"Compiling entry function '([^']+)'", report))
        frames = {name: tuple(map(int, sizes)) for name, *sizes in re.findall(
            r"Function properties for (\S+)\s+(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
            report)}
        assert entries and all(frames.get(name) == (0, 0, 0) for name in entries), \
            f"{label}: a kernel spills or has a stack frame\n{report}"


def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc
        nvrtc.getVersion()
        return nvrtc
    except Exception:
        return None


@pytest.mark.slow
@pytest.mark.parametrize("label,spec", SPECS[:12], ids=[label for label, _ in SPECS[:12]])
def test_nvrtc_compiles_for_sm90(label, spec):
    """What CuPy does at run time (no CUDA include path): the sources must need no headers."""
    nvrtc = _nvrtc()
    if nvrtc is None:
        pytest.skip("CuPy with an NVRTC library is not installed here (pip install cupy-cuda13x)")
    prog = nvrtc.createProgram(cc.load_source(spec.source), spec.source, (), ())
    try:
        nvrtc.compileProgram(prog, [*spec.options(), "-arch=sm_90", "-ftz=true"])
    except Exception as exc:
        pytest.fail(f"{label}: NVRTC failed: {exc}\n{nvrtc.getProgramLog(prog)[-4000:]}")
    assert len(nvrtc.getCUBIN(prog)) > 0


def test_launch_configs_plan_for_every_preset_layer():
    """Every listed register tile either plans for each preset layer or is rejected with a reason."""
    for shape, fusion in _preset_layers().items():
        pool = fusion[1] if fusion else 1
        found = cuda_fused_gemm.candidate_configs(*shape, pool=pool)
        assert found, f"no launch configuration for {shape} pool {pool}"
        best = cuda_fused_gemm.plan(*shape, pool=pool)
        assert best.smem_bytes <= cuda_fused_gemm.SMEM_OPTIN_DEFAULT
        assert best.cfg.nt % 32 == 0 and best.cfg.bh % best.cfg.ht == 0
        assert best.cfg.ht % pool == 0 and best.cfg.wt % pool == 0
        for config in cuda_fused_gemm.LAUNCH_CONFIGS[:6]:
            try:
                geom = cuda_fused_gemm.plan(*shape, pool=pool, config=config)
            except ValueError:
                continue
            assert geom.cfg.tm == config["tm"]


def test_kernel_modules_import_and_report_unavailable_without_cupy():
    """In a fresh interpreter where ``import cupy`` fails: every module imports, every entry says why not."""
    script = textwrap.dedent(f"""
        import importlib, importlib.abc, importlib.util, sys

        class NoCupy(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "cupy" or name.startswith(("cupy.", "cupy_backends")):
                    raise ModuleNotFoundError("No module named 'cupy' (blocked by the test)")
                return None

        sys.meta_path.insert(0, NoCupy())
        real_find_spec = importlib.util.find_spec
        importlib.util.find_spec = lambda name, *a: None if name.split(".")[0] in ("cupy", "cupy_backends") \\
            else real_find_spec(name, *a)
        import torch
        torch.cuda.is_available = lambda: True      # pretend a GPU, so the missing package is the reason
        from convforge import conv
        for name in {CUDA_MODULES!r}:
            importlib.import_module("convforge.conv." + name)
        for impl in conv.IMPLEMENTATIONS:
            if impl.name.startswith("cuda-"):
                reason = impl.unavailable_reason("cuda")
                assert reason and "cupy" in reason, (impl.name, reason)
                assert impl.header, impl.name
        assert "cupy" not in sys.modules
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr


def test_launch_arguments_are_packed_as_the_kernel_reads_them():
    """cuLaunchKernel's kernelParams: one pointer per argument, to 8 bytes for a pointer and to the 4-byte
    int for an int32 (a slot reused from a wider value must still read back as the int). Blocks are per
    thread, so two threads packing at once do not share one."""
    import ctypes
    import threading

    import numpy as np

    def unpack(params, kinds):
        pointers = (ctypes.c_void_p * len(kinds)).from_address(params)
        return [(ctypes.c_uint64 if kind == "p" else ctypes.c_int32).from_address(pointers[i]).value
                for i, kind in enumerate(kinds)]

    wide = np.uint64(2**63 + 12345)
    cc.pack_arguments((wide, wide, wide))   # leave high bits in every slot of the 3-argument block
    params = cc.pack_arguments((np.uint64(2**40 + 5), np.int32(-7), np.int32(2**31 - 1)))
    assert unpack(params, "pii") == [2**40 + 5, -7, 2**31 - 1]
    with pytest.raises(TypeError, match="numpy.uint64"):
        cc.pack_arguments((np.uint64(1), 3), "conv_direct")

    seen = {}

    def pack_in_thread():
        seen["other"] = cc.pack_arguments((np.uint64(99), np.int32(1), np.int32(2)))

    worker = threading.Thread(target=pack_in_thread)
    worker.start()
    worker.join()
    assert seen["other"] != params
    assert unpack(params, "pii") == [2**40 + 5, -7, 2**31 - 1]


def test_dense_head_constants_match_the_kernel():
    """gpu_dense launches dense_head_sum with HEAD_THREADS threads and lets it take up to HEAD_MAX_OUTPUTS
    first-layer outputs: the kernel's own #defines (its block bound, its shared-memory row) must say the same."""
    from convforge import gpu_dense
    source = (cc.KERNEL_DIR / "dense_gemv.cu").read_text(encoding="utf-8")
    defines = dict(re.findall(r"^#define (HEAD_THREADS|HEAD_MAX_N) (\d+)$", source, re.M))
    assert defines == {"HEAD_THREADS": str(gpu_dense.HEAD_THREADS), "HEAD_MAX_N": str(gpu_dense.HEAD_MAX_OUTPUTS)}
