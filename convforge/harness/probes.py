"""What bench measures about the machine and the process, apart from the kernels it times: the roofline
ceilings (a device-to-device copy, an fp32 matrix product, on a CPU the FMA peak), the transparent-huge-page
settings and
torch's allocator's use of them (with the re-execution that switches it on), and the environment of a run
(versions, CPU, GPU). ``convforge bench`` and ``convforge sweep`` use them; rows record them."""

from __future__ import annotations

import os
import platform
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from convforge.errors import UserError
from convforge.harness import DEFAULT_BUDGET_S, MIN_REPEATS, THP_ENV
from convforge.harness.gpu_clocks import device_uuid
from convforge.harness.timing import time_calls
from convforge.models import ConvShape

COPY_BYTES = {"cuda": 1 << 30, "cpu": 256 << 20}  # the bandwidth ceiling's copy
MATMUL_SIZES = {"cuda": (8192,), "cpu": (1024, 1536, 2048)}  # the arithmetic ceiling: N x N x N products, the best
FMA_CHAINS, FMA_DEPTH = 12, 8                    # the CPU FMA-peak probe: independent one-register chains
FMA_CALL_S = 0.05                                 # seconds per FMA-probe call
THP_SYSFS = Path("/sys/kernel/mm/transparent_hugepage")
RESTARTED_ENV = "CONVFORGE_BENCH_RESTARTED"       # set in a bench that re-executed itself (no second restart)
THP_PROBE_BYTES = 64 << 20                        # above torch's 2 MiB huge-page threshold and glibc's largest
                                                  # mmap threshold: a fresh mapping of its own (never touched)


# ------------------------------------------------------------------------------------- ceilings

@dataclass(frozen=True)
class Ceilings:
    """This machine's measured rates: copy bandwidth (bytes read + written), read-only and write-only
    bandwidth, the fp32 matrix-product rate (TF32 off) and the fp32 FMA peak of a register-resident loop.

    A floor must be a floor: a kernel that only reads (most of a conv layer's traffic is its input) can
    beat the copy rate, and a direct convolution's FMAs can beat cuBLAS's SGEMM rate (H200 run of
    2026-11-25: four rows at 102-103 % of a copy/SGEMM floor). So the floor takes the best bandwidth and
    the best arithmetic rate measured; a rate not measured (None) is left out.

    A reduced-precision kernel's floor uses the tensor-core rate its arithmetic may reach (``precision``:
    "tf32" the TF32 matmul rate, "tf32x3" a third of it, "fp16"/"bf16" the FP16 rate, "mixed" for a network
    whose layers mix them, the fastest of all); else a TF32 kernel would run "above its floor"."""
    copy_gbps: float
    matmul_gflops: float
    fma_gflops: Optional[float] = None
    read_gbps: Optional[float] = None
    write_gbps: Optional[float] = None
    tf32_gflops: Optional[float] = None   # tensor cores, fp32 accumulation (GPU only)
    fp16_gflops: Optional[float] = None

    @property
    def bandwidth_gbps(self) -> float:
        return max(rate for rate in (self.copy_gbps, self.read_gbps, self.write_gbps) if rate)

    @property
    def compute_gflops(self) -> float:
        return max(rate for rate in (self.matmul_gflops, self.fma_gflops) if rate)

    def compute_gflops_for(self, precision: str = "fp32") -> float:
        """The arithmetic ceiling of a kernel computing at ``precision`` (see the class note)."""
        tensor = {"tf32": [self.tf32_gflops], "tf32x3": [self.tf32_gflops and self.tf32_gflops / 3],
                  "fp16": [self.fp16_gflops], "bf16": [self.fp16_gflops],
                  "mixed": [self.tf32_gflops, self.fp16_gflops]}.get(precision, [])
        return max([self.compute_gflops] + [rate for rate in tensor if rate])

    def floor_s(self, flops: int, bytes_moved: int, precision: str = "fp32") -> float:
        return max(bytes_moved / (self.bandwidth_gbps * 1e9), flops / (self.compute_gflops_for(precision) * 1e9))

    def layer_floor_s(self, shape: ConvShape, pool: Optional[int] = None, precision: str = "fp32") -> float:
        """The roofline floor of one conv layer; with ``pool`` (a fused call) only the pooled output is written."""
        out_h, out_w = shape.out_hw
        out_elements = None if not pool else shape.B * shape.M * (out_h // pool) * (out_w // pool)
        return self.floor_s(shape.flops, shape.bytes_moved(out_elements), precision)

    def describe(self) -> str:
        """One line for a run's header."""
        parts = [f"copy {self.copy_gbps:.1f}"]
        parts += [f"{name} {rate:.1f}" for name, rate in (("read", self.read_gbps), ("write", self.write_gbps)) if rate]
        fma = f", FMA peak {self.fma_gflops:.1f}" if self.fma_gflops else ""
        tensor = "".join(f", {name} tensor cores {rate:.1f}" for name, rate in
                         (("TF32", self.tf32_gflops), ("FP16", self.fp16_gflops)) if rate)
        return f"{', '.join(parts)} GB/s; fp32 matmul {self.matmul_gflops:.1f}{fma}{tensor} GFLOP/s"


def measure_ceilings(device: str, budget_s: float = DEFAULT_BUDGET_S) -> Ceilings:
    """Copy, read (a sum) and write (a fill) COPY_BYTES[device]; multiply N x N fp32 matrices (TF32 off)
    for each N of MATMUL_SIZES[device], on torch's threads; time the FMA peak (``fma_peak_gflops`` on a
    CPU, ``gpu_fma_peak_gflops`` on a GPU).

    Each ceiling is the fastest of its repeated runs (and of the matrix sizes), not the median: it bounds
    what the machine can do, and a run slowed by other work on the machine must not lower it. For the same
    reason each rate is then the best of this run and the earlier runs on this machine (``best_ceilings``).
    """
    from convforge.conv.torch_conv import exact_fp32
    exact_fp32()
    nbytes = COPY_BYTES[device]
    source = torch.ones(nbytes // 4, device=device)
    target = torch.empty_like(source)
    total = torch.empty((), device=device)

    def fastest(fn, inputs, budget):
        return float(np.min(time_calls(fn, inputs, device, budget_s=budget)))

    copy_s = fastest(lambda src: target.copy_(src), [source], budget_s / 2)
    read_s = fastest(lambda src: torch.sum(src, dim=0, out=total), [source], budget_s / 4)
    write_s = fastest(lambda value: target.fill_(value), [1.5], budget_s / 4)
    del source, target
    def matmul_gflops_at(n: int, dtype: torch.dtype, tf32: bool, budget: float) -> float:
        a, b = torch.rand(n, n, device=device, dtype=dtype), torch.rand(n, n, device=device, dtype=dtype)
        product = torch.empty(n, n, device=device, dtype=dtype)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            return 2 * n ** 3 / fastest(lambda left: torch.mm(left, b, out=product), [a], budget) / 1e9
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False

    sizes = MATMUL_SIZES[device]
    matmul_gflops = max(matmul_gflops_at(n, torch.float32, False, budget_s / len(sizes)) for n in sizes)
    fma = (fma_peak_gflops(torch.get_num_threads(), budget_s / 2) if device == "cpu"
           else gpu_fma_peak_gflops(budget_s / 4))
    tensor = {}
    if device == "cuda":   # the tensor-core rates that reduced-precision kernels are held to
        tensor = {"tf32_gflops": matmul_gflops_at(sizes[-1], torch.float32, True, budget_s / 4),
                  "fp16_gflops": matmul_gflops_at(sizes[-1], torch.float16, False, budget_s / 4)}
    measured = Ceilings(copy_gbps=2 * nbytes / copy_s / 1e9, matmul_gflops=matmul_gflops, fma_gflops=fma,
                        read_gbps=nbytes / read_s / 1e9, write_gbps=nbytes / write_s / 1e9, **tensor)
    return best_ceilings(device, measured)


CEILINGS_FILE = "ceilings.json"   # in the cache folder: the best rates measured per machine


def _machine(device: str) -> str:
    """The ceiling store's key. On a CPU it includes this boot's id: cloud VMs of one CPU model name differ in
    speed (the 2026-11-26 dev VM's FMA peak was 63 % of the previous one's), and a faster machine's rates kept
    under the model name alone would put a slower one's kernels far under their floor."""
    if device == "cuda":
        return f"cuda | {torch.cuda.get_device_name()}"
    return f"cpu | {cpu_model()} | {torch.get_num_threads()} threads | boot {boot_id()}"


def boot_id() -> str:
    """This boot of this machine (/proc/sys/kernel/random/boot_id), 'unknown' off Linux."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip() or "unknown"
    except OSError:
        return "unknown"


def best_ceilings(device: str, measured: Ceilings) -> Ceilings:
    """Each rate: the best of ``measured`` and of earlier runs on this machine (same CPU model and threads,
    or same GPU model), kept in the cache folder. A bench run on a loaded machine (the CPU FMA peak measured
    at loadavg 10-14 in one #26 run) would otherwise lower a ceiling and put kernels "above their floor".
    """
    import dataclasses
    import json
    from convforge.data import cache_dir
    from convforge.files import warn_damaged_cache, write_atomically
    path = cache_dir() / CEILINGS_FILE
    store: dict = {}
    if path.exists():
        try:
            store = json.loads(path.read_text())
            if not isinstance(store, dict) or not all(isinstance(v, dict) for v in store.values()):
                raise ValueError("not a table of machines")
        except (OSError, ValueError):
            warn_damaged_cache(path, "ceiling store")
            store = {}
    key = _machine(device)
    earlier = store.get(key, {})
    best = {}
    for f in dataclasses.fields(Ceilings):
        rates = [r for r in (getattr(measured, f.name), earlier.get(f.name)) if isinstance(r, (int, float)) and r > 0]
        best[f.name] = max(rates) if rates else None
    if best != earlier:
        store[key] = best
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, lambda tmp: Path(tmp).write_text(json.dumps(store, indent=1, sort_keys=True)))
        except OSError:   # a read-only cache folder: this run's rates still hold
            pass
    return Ceilings(**best)


def fma_chains_intrinsic(chains: int, depth: int, lanes: int):
    """The Numba intrinsic ``fma_chains(acc, n, a, b)``: ``chains`` independent chains s = fma(s, a, b) of
    ``lanes``-float vectors (one register of the CPU's widest kind), ``depth`` deep per trip, n trips, loaded
    from and stored to acc. Written in LLVM IR with explicit vector types because a Numba loop over lanes is
    vectorised at LLVM's preferred width, 256 bits on AVX-512 CPUs: such a probe measured half the zmm peak
    (112 against 225 GFLOP/s a core on this project's Xeon of 2026-11-25, where the conv tiles ran at 330)."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def fma_chains(typingctx, acc, n, a, b):
        sig = types.void(acc, n, a, b)

        def codegen(context, builder, signature, args):
            i32 = ir.IntType(32)
            vec = ir.VectorType(ir.FloatType(), lanes)
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * 3),
                                                 f"llvm.fma.v{lanes}f32")
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            trips = context.cast(builder, args[1], signature.args[1], types.int64)
            undef = ir.Constant(vec, ir.Undefined)

            def splat(value):
                one = builder.insert_element(undef, value, ir.Constant(i32, 0))
                return builder.shuffle_vector(one, undef, ir.Constant(ir.VectorType(i32, lanes), [0] * lanes))

            av, bv = splat(args[2]), splat(args[3])
            ptrs = [builder.bitcast(builder.gep(data, [ir.Constant(ir.IntType(64), i * lanes)]), vec.as_pointer())
                    for i in range(chains)]
            slots = [cgutils.alloca_once(builder, vec) for _ in range(chains)]
            for ptr, slot in zip(ptrs, slots):
                builder.store(builder.load(ptr, align=4), slot)
            with cgutils.for_range(builder, trips):
                values = [builder.load(slot) for slot in slots]
                for _ in range(depth):
                    values = [builder.call(fma, [v, av, bv]) for v in values]
                for v, slot in zip(values, slots):
                    builder.store(v, slot)
            for ptr, slot in zip(ptrs, slots):
                builder.store(builder.load(slot), ptr, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return fma_chains


def fma_source(lanes: Optional[int] = None) -> str:
    """A Numba kernel running ``fma_chains_intrinsic``'s FMA_CHAINS independent chains, FMA_DEPTH deep per
    pass, each one vector register of ``lanes`` floats (default: the CPU's, cpu_loops.vector_lanes), so the
    loop is bound by FMA throughput alone: enough independent chains to cover the FMA latency, loads and
    stores once per call."""
    from convforge.conv.cpu_loops import vector_lanes
    lanes = lanes or vector_lanes()
    return f'''"""Generated by convforge.harness.probes: the FMA-peak probe ({FMA_CHAINS} chains of {lanes} lanes, {FMA_DEPTH} deep)."""
from convforge.harness.probes import fma_chains_intrinsic

fma_chains = fma_chains_intrinsic({FMA_CHAINS}, {FMA_DEPTH}, {lanes})


def chains(acc, n, a, b):
    fma_chains(acc, n, a, b)
'''


def fma_peak_gflops(threads: int, budget_s: float = DEFAULT_BUDGET_S / 2) -> Optional[float]:
    """fp32 GFLOP/s of ``fma_source``'s kernel run on ``threads`` threads at once (Numba, GIL released),
    the best of repeated runs of about FMA_CALL_S each (at least MIN_REPEATS, then until ``budget_s``).
    None when Numba is not installed or cannot compile it (the figure is recorded, nothing depends on it)."""
    try:
        from convforge.conv.cpu_loops import jit_generated, vector_lanes
        lanes = vector_lanes()
        kernel = jit_generated("fma_peak", fma_source(lanes), "chains", nogil=True, fastmath={"contract"})
        accs = [np.zeros(FMA_CHAINS * lanes, np.float32) for _ in range(max(1, threads))]
        a, b = np.float32(0.999), np.float32(1e-3)  # the chains converge to 1: no overflow, no denormals
        kernel(accs[0], 1, a, b)                    # compile (or load from the disk cache)
    except Exception:  # ImportError without Numba; a compile error must not stop the bench
        return None
    flops_per_pass = 2 * FMA_CHAINS * lanes * FMA_DEPTH

    def run(passes: int) -> float:
        workers = [threading.Thread(target=kernel, args=(acc, passes, a, b)) for acc in accs]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return time.perf_counter() - started

    passes = 1000
    while (seconds := run(passes)) < FMA_CALL_S / 4:   # calibrate a pass count for about FMA_CALL_S
        passes *= 4
    passes = max(1, int(passes * FMA_CALL_S / seconds))
    best, runs, started = 0.0, 0, time.perf_counter()
    while runs < MIN_REPEATS or time.perf_counter() - started < budget_s:
        best = max(best, flops_per_pass * passes * len(accs) / run(passes) / 1e9)
        runs += 1
    return best


def gpu_fma_peak_gflops(budget_s: float = DEFAULT_BUDGET_S / 4, trips: int = 512) -> Optional[float]:
    """fp32 GFLOP/s of ``fma_probe``'s register-resident FMA chains on every SM of the current GPU, the best
    of repeated calls. None without Triton (or if it cannot compile the probe): the floor then uses the
    matrix-product rate alone, and the row records that the FMA peak was not measured."""
    try:
        from convforge.harness import fma_probe
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        out = torch.empty(sms * fma_probe.PROGRAMS_PER_SM * fma_probe.BLOCK, device="cuda")
        run, flops = fma_probe.launcher(out, sms, trips)
        run(None)
        torch.cuda.synchronize()
    except Exception:  # ImportError without Triton; a compile error must not stop the bench
        return None
    seconds = float(np.min(time_calls(run, [None], "cuda", budget_s=budget_s)))
    return flops / seconds / 1e9


# -------------------------------------------------------------------------------------- environment

def _package_versions(modules: Sequence[str]) -> dict[str, Optional[str]]:
    """Installed version of the distribution providing each importable module (None when absent)."""
    from importlib import metadata
    providers = metadata.packages_distributions()
    return {module: metadata.version(providers[module][0]) if module in providers else None for module in modules}


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), for result records and cache keys."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or platform.machine()


def thp_setting(name: str) -> Optional[str]:
    """The selected value of /sys/kernel/mm/transparent_hugepage/NAME ('madvise' from 'always [madvise] never')."""
    try:
        text = (THP_SYSFS / name).read_text(encoding="ascii")
    except OSError:  # not Linux, or no THP in this kernel
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else text.strip() or None


def torch_thp_alloc() -> Optional[bool]:
    """Whether torch's CPU allocator gives large tensors huge pages in this process.

    torch (c10/core/impl/alloc_cpu.cpp) reads THP_MEM_ALLOC_ENABLE once, into a static, at its first CPU
    allocation; when it was 1, every later allocation of 2 MiB or more is page-aligned and advised with
    madvise(MADV_HUGEPAGE). The probe allocates THP_PROBE_BYTES (untouched, so no memory is used) and checks
    both: a page-aligned address (torch's plain alignment is 64 bytes; glibc puts a mapped chunk's data 64
    bytes into its first page) and the advice, the 'hg' flag, on its mapping in /proc/self/smaps. The size
    gives the probe a fresh mapping: a smaller one may reuse heap memory that NumPy (which advises huge pages
    for its own arrays of 4 MiB or more) has flagged. None where there is no smaps.
    (Whether the kernel then backs it with huge pages is thp_setting('enabled').)
    """
    probe = torch.empty(THP_PROBE_BYTES // 4, dtype=torch.float32)
    address = probe.data_ptr()
    if address % (os.sysconf("SC_PAGESIZE") if hasattr(os, "sysconf") else 4096):
        return False
    try:
        with open("/proc/self/smaps", encoding="ascii", errors="replace") as handle:
            inside = False
            for line in handle:
                head = line.split(" ", 1)[0]
                if "-" in head and not head.endswith(":"):     # a mapping's first line: start-end perms ...
                    start, _, end = head.partition("-")
                    try:
                        inside = int(start, 16) <= address < int(end, 16)
                    except ValueError:
                        inside = False
                elif inside and head == "VmFlags:":
                    return "hg" in line.split()[1:]
    except OSError:
        return None
    return None


def _restart_with_environment(changes: dict) -> None:
    """Re-execute this command (same interpreter, same arguments) with ``changes`` in its environment.

    Returns (doing nothing) when this process is not `convforge bench` started from a command line, e.g.
    ``cli.main([...])`` called in-process, or when it is already the restarted one."""
    original = list(getattr(sys, "orig_argv", ()))
    arguments = sys.argv[1:]
    if (os.environ.get(RESTARTED_ENV) or not original or arguments[:1] != ["bench"]
            or len(original) < len(arguments) + 1 or original[len(original) - len(arguments):] != arguments):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *original[1:]], {**os.environ, **changes, RESTARTED_ENV: "1"})


def use_hugepages() -> None:
    """Make torch's CPU allocator give huge pages to every large tensor of this run (THP_MEM_ALLOC_ENABLE=1).

    Setting the variable is enough while torch has not yet allocated (it reads it at its first
    allocation); otherwise the bench re-executes itself with the variable set. In-process callers that
    cannot be restarted get a UserError saying how to set it.
    """
    previous = os.environ.get(THP_ENV)
    os.environ[THP_ENV] = "1"
    if torch_thp_alloc():
        return
    if previous is None:
        del os.environ[THP_ENV]
    else:
        os.environ[THP_ENV] = previous
    _restart_with_environment({THP_ENV: "1"})
    raise UserError(f"--hugepages: torch's allocator had already read {THP_ENV} (at its first allocation) in this "
                    f"process and did not take it; start the process with {THP_ENV}=1 in its environment"
                    + (" (/proc/self/smaps shows no MADV_HUGEPAGE advice)" if os.environ.get(RESTARTED_ENV) else ""))


def environment(device: str) -> dict:
    """Where and with what the rows were measured: the machine, library versions (None when absent), date,
    the transparent-huge-page settings and whether torch's allocator asks for huge pages."""
    on_gpu = device == "cuda"
    return {
        "machine": f"{platform.node()} ({platform.platform()})",
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if on_gpu else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        **_package_versions(("numba", "triton", "cupy")),
        "python": platform.python_version(),
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        # which physical GPU (machines are lent per session, and the host name does not tell them apart)
        "gpu_uuid": device_uuid(torch.cuda.current_device()) if on_gpu else None,
        "thp_enabled": thp_setting("enabled"),
        "thp_defrag": thp_setting("defrag"),
        "torch_thp_alloc": torch_thp_alloc(),
    }
