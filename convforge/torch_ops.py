"""convforge inside PyTorch: the custom ops, the measuring ``auto`` dispatcher and its disk cache.

Ops (registered with ``torch.library.custom_op`` when this module is imported):

    torch.ops.convforge.conv2d(x, weight, bias, stride, padding, impl="auto")
    torch.ops.convforge.conv2d_act_pool(x, weight, bias, stride, padding, activation, pool, impl="auto")

``conv2d`` is F.conv2d (float32, zero padding, no dilation, one group); ``conv2d_act_pool`` is
max_pool2d(act(F.conv2d(...)), pool, pool) with act in none/relu/tanh/sigmoid. Forward runs a convforge
kernel from the registry (or torch, see below); backward is always torch's own convolution gradients
(``torch.nn.grad``, and for the fused op a recomputation of the conv in torch to route the pooling and
activation gradients), so a model using the ops stays trainable. Both ops have fake (meta)
implementations, so ``torch.compile(..., fullgraph=True)`` traces them without a graph break.

What the kernels serve: stride 1, square kernels, float32, CPU or CUDA. Zero padding is served by F.pad
followed by the kernel (its cost is part of what ``auto`` measures). Anything else (stride, non-square
kernels, other dtypes) runs in torch: ``auto`` picks torch, a named implementation raises a UserError.

``impl="auto"``: per call signature (batch, channels, image, maps, kernel, padding, bias, activation, pool)
and machine (device, GPU or CPU name, torch/triton/cupy/convforge versions) the dispatcher measures
torch (cuDNN or oneDNN) and the convforge candidates at first use, keeps the fastest whose output agrees
with torch's (relative error <= 1e-4), and remembers it in memory and in a JSON file under the user cache
folder (``$CONVFORGE_CACHE``, else ~/.cache/convforge; ``auto_choices.json``), shared by processes (writes
merge under a lock file, then an atomic rename), so a later process measures nothing.

One-time work per shape is bounded by ``CONVFORGE_AUTO_BUDGET_S`` (default 2) seconds beyond torch's own
first call (its warm-up, cuDNN's algorithm search under cudnn.benchmark, is what the caller's F.conv2d costs
anyway, and runs alone so that nothing disturbs cuDNN's timing); then every candidate's prepare, first
call (the compile: NVRTC through CuPy, Triton's JIT, cuFFT plans) and agreement check at once, in
``CONVFORGE_AUTO_JOBS`` daemon threads (default one per candidate on a GPU, one on a CPU or where the outputs
would crowd the GPU memory), on the caller's stream; auto stops waiting at 3/4 of the budget and times torch
and the candidates ready by then in alternating rounds for the rest. A compile cannot be interrupted: one
that is still running is left to finish in the background (it fills CuPy's and Triton's disk caches) and the
choice is recorded as ``incomplete``; when the late compile finishes, the next call of that shape in this
process measures again (cheaply, everything compiled), and a later process that finds an incomplete record
measures again too, at most ``MAX_ATTEMPTS`` times in all. A shape whose budget runs out early runs torch.

Per-weight compilation: the ops run kernels only with the weights as a run-time argument, so one compile
per shape serves every weight of that shape (a new weight, or a weight changed in place by an optimizer
step, costs only a re-pack: prepared functions are cached by implementation, shape and the weight's identity
and version counter). Where an implementation's default would compile the weights into the code, the op
passes the module the config that does not: triton-direct and triton-fused-layer with ``baked=False`` on the
one-channel layers (``triton_common.can_bake``), cuda-fused-layer's regtile design instead of its
one-channel cuda-direct design (``runtime_weight_config``). cuda-direct (each layer's weights in its own
constant-bank module) and cuda-auto (may delegate to it) are therefore never ``auto`` candidates; naming
them (``impl="cuda-direct"``) uses them at their own costs. Reduced-precision kernels (TF32, FP16) are never
``auto`` candidates either: the ops promise fp32 results. A kernel is chosen only when it beats torch by
3 % in the measurement (``MARGIN``), so a near tie stays with torch. fft (FFT convolution) is measured on
every conv shape on a GPU (``ANY_SHAPE``); its prepare transforms the weights (float64 FFTs, milliseconds
on a many-channel layer), which a new or changed weight pays again, and it reads a device value on the host
every call, so inside a CUDA graph capture auto runs torch where it chose fft.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
import json
import os
import statistics
import sys
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from convforge.errors import UserError
from convforge.files import warn_damaged_cache, write_atomically
from convforge.models import ACTIVATIONS

CACHE_FILE = "auto_choices.json"
CACHE_VERSION = 1
BUDGET_ENV = "CONVFORGE_AUTO_BUDGET_S"
DEFAULT_BUDGET_S = 2.0
JOBS_ENV = "CONVFORGE_AUTO_JOBS"   # warm-up threads (default: one per candidate on a GPU)
COMPILE_SHARE = 0.75   # of the budget, for the candidates' one-time work; the rest for timing rounds
DEFERRED = "prepared past the budget, not run"   # a warm-up's verdict when it stopped before launching
MAX_ATTEMPTS = 3       # processes that measure a shape whose record is incomplete (candidates left out)
MARGIN = 0.97      # a kernel must beat torch by 3 % in auto's measurement to be chosen
AGREEMENT = 1e-4   # a candidate whose output differs from torch's by more than this (relative) is rejected

# auto's candidates besides torch, per device and op (exact fp32, weights at run time; see the module doc).
CANDIDATES = {
    ("cuda", "conv"): ("cuda-fused-gemm", "triton-direct"),
    ("cuda", "fused"): ("cuda-fused-layer", "triton-fused-layer", "cuda-fused-gemm"),
    ("cpu", "conv"): ("cpu-parallel", "cpu-gemm"),
    ("cpu", "fused"): ("cpu-parallel",),
}
# The kernels were written for the course's layers (C*K*K <= 784, images <= 86 px). Outside this envelope
# they are not tried: the issue measured cuda-auto 1.2-9.6x slower than cuDNN at C*K*K of 4096-131072 and
# no result within 40 s on 1024 x 1024 images, and one such try would blow the 2 s budget by itself.
MAX_TAPS = 1600          # C * K * K
MAX_PIXELS = 512 * 512   # H * W of one (padded) input image
# Candidates measured on any shape, inside the envelope or not: fft (FFT convolution) was written for the
# many-channel layers beyond it and runs them at 2.2-47.6x cuDNN fp32 on gpu-mode's shapes and at 1.3-10.1x on
# 12 of 35 wide shapes, losing elsewhere (0.13-0.93x, mostly K <= 3; H200, 2026-11-26,
# benchmarks/2026-11-26-h200-fft-conv-gpumode-wide): auto's measurement decides per shape. cuda-igemm-3xtf32
# (implicit GEMM on tensor cores, fp32-accurate) wins many of the wide shapes fft loses: measured per shape too,
# the better of the two reaches a median 1.43x cuDNN fp32 over the 35 wide shapes (H100 and H200,
# benchmarks/2026-11-26-h100-wide-set-igemm-tuned). triton-igemm-3xtf32 (the same GEMM fed by TMA from a
# channels-last copy, sm_90+) ran gpu-mode's 256-px layers at 2.3-2.6x cuDNN fp32 and the wide set at a median
# 1.38x on its own (H100, benchmarks/2026-11-27-h100-triton-igemm-tma). It is measured only on layers of at least
# MIN_FLOPS: in auto_vs_cudnn's 72 shapes (same folder, call 9) it won at 7.7 and 9.7 GFLOP and never below, and
# on the small ones its Triton compile shares the host with the timing rounds (the run's first shape, a 0.01 ms
# layer, chose cuda-fused-gemm on call times 4 % apart and ran 2.7x cuDNN's GPU time).
ANY_SHAPE = {("cuda", "conv"): ("fft", "cuda-igemm-3xtf32", "triton-igemm-3xtf32")}
MIN_FLOPS = {"triton-igemm-3xtf32": 2e9}


# ------------------------------------------------------------------------------------------ call signature

@dataclass(frozen=True)
class Call:
    """Everything about one op call that decides which implementation is fastest."""
    op: str                  # "conv" or "fused"
    device: str              # "cpu" or "cuda"
    B: int
    C: int
    H: int
    W: int
    M: int
    KH: int
    KW: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    bias: bool
    dtype: str
    activation: str = "none"
    pool: int = 1

    @property
    def padded_hw(self) -> tuple[int, int]:
        return self.H + 2 * self.padding[0], self.W + 2 * self.padding[1]

    @property
    def flops(self) -> int:
        """Multiply-adds x 2 of the convolution (stride 1: what the kernels serve)."""
        hp, wp = self.padded_hw
        return 2 * self.B * self.M * self.C * self.KH * self.KW * max(0, hp - self.KH + 1) * max(0, wp - self.KW + 1)

    def key(self) -> str:
        fields = asdict(self)
        return ",".join(f"{k}={'x'.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in fields.items())


def unserved_reason(call: Call) -> Optional[str]:
    """Why the convforge kernels cannot compute this call (None when they can)."""
    if call.device not in ("cpu", "cuda"):
        return f"device {call.device}: convforge kernels run on cpu or cuda"
    if call.dtype != "float32":
        return f"dtype {call.dtype}: convforge kernels compute float32"
    if call.stride != (1, 1):
        return f"stride {call.stride}: convforge kernels compute stride 1"
    if call.KH != call.KW:
        return f"kernel {call.KH}x{call.KW}: convforge kernels take square kernels"
    hp, wp = call.padded_hw
    if hp < call.KH or wp < call.KW:
        return f"input {hp}x{wp} smaller than the {call.KH}x{call.KW} kernel"
    return None


def _call_of(op: str, x: torch.Tensor, weight: torch.Tensor, bias, stride, padding,
             activation: str = "none", pool: int = 1) -> Call:
    if x.dim() != 4 or weight.dim() != 4:
        raise UserError(f"convforge conv2d takes a 4-D input and weight, got {tuple(x.shape)} and "
                        f"{tuple(weight.shape)}; add a batch dimension with x.unsqueeze(0)")
    if x.shape[1] != weight.shape[1]:
        raise UserError(f"input has {x.shape[1]} channels but the weight expects {weight.shape[1]}")
    if activation not in _ACT_FN:
        raise UserError(f"unknown activation '{activation}'; choose one of: {', '.join(_ACT_FN)}")
    if int(pool) < 1:
        raise UserError(f"pool must be >= 1, got {pool}")
    dtype = str(x.dtype).replace("torch.", "") if x.dtype == weight.dtype else f"{x.dtype}/{weight.dtype}"
    return Call(op, x.device.type, *map(int, x.shape), int(weight.shape[0]), int(weight.shape[2]),
                int(weight.shape[3]), _pair(stride), _pair(padding), bias is not None, dtype.replace("torch.", ""),
                activation, int(pool))


def _pair(v) -> tuple[int, int]:
    v = [int(i) for i in v]
    if len(v) == 1:
        v = v * 2
    if len(v) != 2:
        raise UserError(f"stride and padding take one or two numbers, got {v}")
    return v[0], v[1]


# ----------------------------------------------------------------------------------------- torch paths

_ACT_FN = {"none": lambda y: y, **ACTIVATIONS}   # the networks' activation table, and none


def torch_forward(call: Call, x, weight, bias) -> torch.Tensor:
    """The op's result computed by torch alone (the fallback and the baseline auto measures)."""
    y = F.conv2d(x, weight, bias, call.stride, call.padding)
    if call.op == "fused":
        y = _ACT_FN[call.activation](y)
        if call.pool > 1:
            y = F.max_pool2d(y, call.pool, call.pool)
    return y.contiguous()   # the ops always return NCHW-contiguous results, as their fake implementations say


# ------------------------------------------------------------------------------------ kernel candidates

PER_WEIGHT_COMPILERS = ("cuda-direct", "cuda-auto")   # weights in a per-layer constant-bank module


def runtime_weight_config(impl: str, call: Call):
    """The launch config that keeps the weights a run-time kernel argument where ``impl``'s default for
    this shape would compile them into the code; None where the default already does (see the module doc)."""
    if impl == "cuda-fused-layer" and call.op == "fused" and call.C == 1:
        return {"kernel": "regtile"}   # its default one-channel design is cuda-direct's constant bank
    if impl in ("triton-direct", "triton-fused-layer"):
        from convforge.conv import triton_common
        if triton_common.can_bake(call.C, call.KH):   # the default bakes weights into the code here
            module = importlib.import_module(f"convforge.conv.{impl.replace('-', '_')}")
            cfg = module.choose_config(call.M, call.C, call.KH) if impl == "triton-direct" else \
                module.choose_config(call.M, call.C, call.KH, call.pool)
            return dataclasses.replace(cfg, baked=False)
    return None


def candidates(call: Call) -> list[str]:
    """The implementations auto measures for this call, torch first."""
    if unserved_reason(call) is not None:
        return ["torch"]
    hp, wp = call.padded_hw
    inside = call.C * call.KH * call.KW <= MAX_TAPS and hp * wp <= MAX_PIXELS
    from convforge import conv
    names = [n for n in (CANDIDATES.get((call.device, call.op), ()) if inside else ()) +
             ANY_SHAPE.get((call.device, call.op), ())
             if conv.get(n).unavailable_reason(call.device) is None and n not in PER_WEIGHT_COMPILERS
             and call.flops >= MIN_FLOPS.get(n, 0)]
    return ["torch"] + names


class _Prepared:
    """Prepared kernel functions, reused while the weight (and bias) tensor and its version are the same."""

    def __init__(self):
        self._entries: dict = {}
        self._lock = threading.Lock()

    @staticmethod
    def _identity(t: Optional[torch.Tensor]):
        if t is None:
            return None
        try:
            version = t._version
        except RuntimeError:   # inference tensors keep no version counter
            version = -1
        return t.data_ptr(), version

    def get(self, impl: str, call: Call, weight, bias) -> Callable:
        # Everything _prepare bakes into the function except the input size, which the kernels handle.
        key = (impl, call.op, call.device, call.M, call.C, call.KH, call.KW, call.padding, call.activation,
               call.pool, weight.data_ptr(), None if bias is None else bias.data_ptr())
        stamp = (self._identity(weight), self._identity(bias))
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                ref_w, ref_b, old_stamp, fn = entry
                if ref_w() is weight and (bias is None or ref_b() is bias) and old_stamp == stamp:
                    return fn
        # Prepared outside the lock: auto's warm-up threads prepare several implementations at once.
        fn = _prepare(impl, call, weight, bias)
        with self._lock:
            self._entries[key] = (weakref.ref(weight), weakref.ref(bias) if bias is not None else None, stamp, fn)
            if len(self._entries) > 256:   # a process churning through weights: drop the oldest
                self._entries.pop(next(iter(self._entries)))
        return fn

    def clear(self):
        with self._lock:
            self._entries.clear()


_prepared = _Prepared()


def _prepare(impl: str, call: Call, weight, bias) -> Callable:
    """fn(x) -> the op's result through ``impl``, padding with F.pad and finishing with torch where needed."""
    from convforge import conv
    entry = conv.resolve(impl, call.device)
    weight = weight.detach().contiguous()
    bias = bias.detach().contiguous() if bias is not None else None
    fuse_in_kernel = call.op == "fused" and entry.fuses and (call.activation != "none" or call.pool > 1)
    activation = None if call.activation == "none" else call.activation
    config = runtime_weight_config(impl, call if fuse_in_kernel else dataclasses.replace(call, op="conv"))
    # input_hw: modules that take it compile for this input size here, not at the first call, so that auto's
    # warm-up can compile without launching (see _WarmUps); other sizes still compile at their first call.
    hw = call.padded_hw
    if config is not None:   # the module's own prepare takes the config the registry entry does not pass on
        module = importlib.import_module(f"convforge.conv.{entry.module}")
        prep = module.prepare_fused if fuse_in_kernel else module.prepare
        extra = {"input_hw": hw} if "input_hw" in inspect.signature(prep).parameters else {}
        kernel = prep(weight, bias, activation, call.pool, config=config, **extra) if fuse_in_kernel \
            else prep(weight, bias, config=config, **extra)
    elif fuse_in_kernel:
        kernel = entry.prepare_fused(weight, bias, activation, call.pool, input_hw=hw)
    else:
        kernel = entry.prepare(weight, bias, input_hw=hw)
    ph, pw = call.padding
    act = _ACT_FN[call.activation]

    def run(x: torch.Tensor) -> torch.Tensor:
        x = x.detach()
        x = (F.pad(x, (pw, pw, ph, ph)) if ph or pw else x).contiguous()
        y = kernel(x)
        if call.op == "fused" and not fuse_in_kernel:
            y = act(y)
            if call.pool > 1:
                y = F.max_pool2d(y, call.pool, call.pool)
        return y

    return run


# -------------------------------------------------------------------------------------------- machine key

def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


_machine_keys: dict = {}


def machine_key(device: torch.device) -> str:
    """GPU name (or CPU model and thread count) and the torch/triton/cupy/convforge versions."""
    index = device.index if device.index is not None else (torch.cuda.current_device() if device.type == "cuda" else 0)
    memo = (device.type, index, torch.get_num_threads())
    if memo not in _machine_keys:
        if device.type == "cuda":
            name = torch.cuda.get_device_name(index)
            libs = [f"torch {torch.__version__}", f"triton {_version('triton')}",
                    f"cupy {_version('cupy-cuda12x') if _version('cupy-cuda12x') != 'none' else _version('cupy')}",
                    f"cudnn {torch.backends.cudnn.version()}"]
        else:
            from convforge.harness.probes import cpu_model
            name = f"{cpu_model()} x{torch.get_num_threads()} threads"
            libs = [f"torch {torch.__version__}", f"numba {_version('numba')}"]
        _machine_keys[memo] = f"{name} | " + ", ".join(libs + [f"convforge {_version('convforge')}"])
    return _machine_keys[memo]


# ------------------------------------------------------------------------------------------- disk cache

def cache_path() -> Path:
    from convforge.data import cache_dir
    return cache_dir() / CACHE_FILE


def _read_cache(path: Path) -> dict:
    """The valid choices in the shared file; a missing or older-version file is empty, a damaged one (truncated,
    garbage, wrong structure) too, with one warning: the next write replaces it with a whole file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):   # ValueError: not JSON, or not UTF-8
        warn_damaged_cache(path, "the auto choice cache")
        return {}
    if isinstance(data, dict) and "version" in data and data["version"] != CACHE_VERSION:
        return {}   # written by another version: re-measured and replaced, no warning
    if not isinstance(data, dict) or not isinstance(data.get("choices"), dict):
        warn_damaged_cache(path, "the auto choice cache")
        return {}
    choices = {k: v for k, v in data["choices"].items() if isinstance(v, dict) and isinstance(v.get("impl"), str)}
    if len(choices) != len(data["choices"]):
        warn_damaged_cache(path, "the auto choice cache")
    return choices


def _write_cache(path: Path, key: str, record: dict) -> None:
    """Merge one choice into the shared file: under an exclusive lock, read what others wrote, add ours,
    write a temporary file and rename it over the old one (readers never see half a file)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "a+") as lock:
            try:
                import fcntl
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            except ImportError:   # no fcntl (Windows): the rename still keeps the file whole
                pass
            choices = _read_cache(path)
            choices[key] = record
            write_atomically(path, lambda tmp: Path(tmp).write_text(
                json.dumps({"version": CACHE_VERSION, "choices": choices}, indent=1, sort_keys=True), encoding="utf-8"))
    except OSError:
        pass   # an unwritable cache only costs a re-measurement in the next process


# ------------------------------------------------------------------------------------------- dispatcher

def _budget_s() -> float:
    try:
        return max(0.0, float(os.environ.get(BUDGET_ENV, DEFAULT_BUDGET_S)))
    except ValueError:
        raise UserError(f"{BUDGET_ENV} must be a number of seconds, got '{os.environ[BUDGET_ENV]}'") from None


def _retry(record: dict) -> bool:
    """Whether a cached record left candidates out (budget spent) and may be measured again: their compiles
    are in CuPy's and Triton's disk caches by now if the process that started them lived long enough."""
    return bool(record.get("incomplete")) and int(record.get("attempt", 1)) < MAX_ATTEMPTS


def _timer(device: str) -> Callable[[Callable[[], object]], float]:
    """Seconds one call of fn takes: CUDA events around it on a GPU, the host clock after a sync on a CPU."""
    from convforge.engine import Stopwatch

    def time_one(fn) -> float:
        with Stopwatch(device) as watch:
            fn()
        return watch.seconds

    return time_one


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64, a chunk of images at a time (large outputs stay within memory);
    inf when shapes differ or ``a`` holds NaN/Inf."""
    if a.shape != b.shape:
        return float("inf")
    num = den = 0.0
    step = max(1, (1 << 24) // max(1, b[0].numel())) if b.dim() else 1
    for i in range(0, max(1, b.shape[0] if b.dim() else 1), step):
        x, y = (a[i:i + step], b[i:i + step]) if b.dim() else (a, b)
        if not torch.isfinite(x).all():
            return float("inf")
        x, y = x.to(torch.float64), y.to(torch.float64)
        num += float((x - y).square().sum())
        den += float(y.square().sum())
    return (num ** 0.5) / (den ** 0.5 if den > 0 else 1.0)


class _WarmUps:
    """Each candidate's one-time work (prepare, the first call that compiles, the agreement check), run in
    ``jobs`` daemon threads beside the caller so that the caller can stop waiting at a deadline.

    Compiles overlap where the compiler releases the GIL (NVRTC through CuPy, ptxas as Triton's subprocess).
    On a GPU the workers launch on the caller's stream (``_on_stream``) and synchronise it before reporting.
    A worker still running at the deadline keeps going (a compile cannot be interrupted): it fills the
    compile caches, then calls ``on_late``. Its first launch may then land among the caller's timing
    samples and inflate one (of up to eight, medians taken); ``on_late`` makes the next call of the shape
    measure again, undisturbed, so such a choice does not outlive that call."""

    def __init__(self, names, call: Call, x, weight, bias, expected, jobs: int, on_late: Callable[[str], None]):
        self.call, self.x, self.weight, self.bias, self.expected = call, x, weight, bias, expected
        self.on_late = on_late
        self.outcomes: dict[str, tuple] = {}   # impl -> (fn or None, agreement or failure note, seconds)
        self.started: dict[str, float] = {}
        self.abandoned = False
        self._todo = list(names)
        self.total = len(names)
        self._cond = threading.Condition()
        self._stream = torch.cuda.current_stream(x.device) if x.is_cuda else None
        for _ in range(max(1, min(jobs, len(names)))):
            threading.Thread(target=self._work, daemon=True, name="convforge-auto-warmup").start()

    def _work(self) -> None:
        while True:
            with self._cond:
                if not self._todo or self.abandoned:
                    return
                impl = self._todo.pop(0)
                self.started[impl] = time.perf_counter()
            outcome = self._warm_up(impl)
            with self._cond:
                self.outcomes[impl] = outcome
                late = self.abandoned
                self._cond.notify_all()
            if late and (outcome[0] is not None or outcome[1] == DEFERRED):
                self.on_late(impl)

    def _warm_up(self, impl: str) -> tuple:
        t0 = time.perf_counter()
        _warming.owner = self
        try:
            with torch.no_grad(), _on_stream(self._stream):
                fn = _prepared.get(impl, self.call, self.weight, self.bias)   # compiles where input_hw is taken
                _stop_triton_launches_when_abandoned()
                with self._cond:
                    if self.abandoned:   # past the deadline: no launch from here (the caller may be capturing a
                        return None, DEFERRED, time.perf_counter() - t0   # CUDA graph); the next call runs it
                result = fn(self.x)                         # compiles the others (Triton's JIT)
                diff = relative_difference(result, self.expected)
                del result
                if self._stream is not None:
                    torch.cuda.current_stream(self.x.device).synchronize()
        except _Abandoned:                   # Triton compiled past the deadline: launched at the next call
            return None, DEFERRED, time.perf_counter() - t0
        except Exception as exc:             # a kernel that cannot take this shape: not a candidate
            first_line = str(exc).splitlines()[0][:160] if str(exc) else ""
            return None, f"failed: {type(exc).__name__}: {first_line}", time.perf_counter() - t0
        if not diff <= AGREEMENT:
            return None, f"rejected: differs from torch by {diff:.2e}", time.perf_counter() - t0
        return fn, diff, time.perf_counter() - t0

    def wait(self, deadline: float) -> dict:
        """The outcomes once every candidate is done or ``deadline`` (perf_counter seconds) has passed; the
        candidates left then are abandoned (not started, or finishing in the background)."""
        with self._cond:
            while len(self.outcomes) < self.total:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._cond.wait(left)
            self.abandoned = True
            return dict(self.outcomes)


class _Abandoned(Exception):
    """Raised after a Triton compile in a warm-up thread whose measurement stopped waiting (no launch)."""


_warming = threading.local()   # .owner: the _WarmUps this thread works for
_hook_lock = threading.Lock()
_hook_installed = False


def _stop_triton_launches_when_abandoned() -> None:
    """Once per process, where Triton is loaded: a ``jit_post_compile_hook`` (it runs after a compile and
    before the launch, the kernel already cached) that raises ``_Abandoned`` in a warm-up thread whose
    measurement has stopped waiting; any hook set before is called first. Elsewhere it does nothing."""
    global _hook_installed
    if _hook_installed or "triton" not in sys.modules:
        return
    with _hook_lock:
        if _hook_installed:
            return
        try:
            from triton import knobs
            previous = knobs.runtime.jit_post_compile_hook
        except (ImportError, AttributeError):   # a Triton without knobs: warm-ups past the deadline launch
            _hook_installed = True
            return

        def hook(*args, **kwargs):
            result = previous(*args, **kwargs) if previous is not None else None
            owner = getattr(_warming, "owner", None)
            if owner is not None and owner.abandoned:
                raise _Abandoned()
            return result

        knobs.runtime.jit_post_compile_hook = hook
        _hook_installed = True


class _on_stream:
    """The caller's device and CUDA stream made current in a warm-up thread (None: a CPU, nothing to do).
    The caller's stream, not a side stream: tensors the kernels allocate (packed weights) then belong to the
    stream they are used on, so the caching allocator never hands them out while a launch still reads them."""

    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        if self.stream is not None:
            self._device = torch.cuda.device(self.stream.device)
            self._device.__enter__()
            self._ctx = torch.cuda.stream(self.stream)
            self._ctx.__enter__()
        return self.stream

    def __exit__(self, *exc):
        if self.stream is not None:
            self._ctx.__exit__(*exc)
            self._device.__exit__(*exc)
        return False


def _jobs(call: Call, x, n: int) -> int:
    """Warm-up threads: ``CONVFORGE_AUTO_JOBS`` if set, else one per candidate on a GPU (one on a CPU, whose
    candidates use every core already), one where the candidates' outputs at once would take more than a
    quarter of the free GPU memory."""
    text = os.environ.get(JOBS_ENV, "")
    if text:
        try:
            jobs = int(text)
        except ValueError:
            raise UserError(f"{JOBS_ENV} must be a whole number of threads, got '{text}'") from None
        if jobs < 1:
            raise UserError(f"{JOBS_ENV} must be at least 1, got {jobs}")
        return jobs
    if call.device != "cuda" or n <= 1:
        return 1
    hp, wp = call.padded_hw
    out_bytes = 4 * call.B * call.M * (hp - call.KH + 1) * (wp - call.KW + 1)
    free, _ = torch.cuda.mem_get_info(x.device)
    return n if out_bytes * n <= free / 4 else 1


class Dispatcher:
    """auto's choices: in memory, backed by the shared disk cache, measured on first use."""

    def __init__(self):
        self.choices: dict[str, dict] = {}   # machine key | call key -> record, as in the disk cache
        self._fast: dict = {}                 # (Call, device) -> impl
        self.generation = 0   # bumped by clear(), so callers' memos of choices expire with them
        self._lock = threading.RLock()
        self._stale: set = set()              # (Call, device) whose abandoned warm-up finished since

    def known(self, call: Call, device: torch.device) -> Optional[str]:
        """The choice already made in this process for ``call``, else None."""
        impl = self._fast.get((call, device))
        if impl is None:
            record = self.choices.get(f"{machine_key(device)} | {call.key()}")
            impl = record["impl"] if record else None
        return impl

    def choose(self, call: Call, x, weight, bias) -> str:
        fast = (call, x.device)
        impl = self._fast.get(fast)   # every call after the first: one dict lookup
        if impl is not None and not (self._stale and fast in self._stale):
            return impl
        if impl is not None and x.is_cuda and torch.cuda.is_current_stream_capturing():
            return impl   # a late compile has finished, but no measuring inside a CUDA graph capture: later
        key = f"{machine_key(x.device)} | {call.key()}"
        with self._lock:
            record = self.choices.get(key)
            stale = fast in self._stale   # a candidate left behind by the budget has finished compiling
            self._stale.discard(fast)
            if record is None or stale:
                previous = record if stale else _read_cache(cache_path()).get(key)
                if previous is None or previous.get("impl") not in candidates(call) or stale or _retry(previous):
                    attempt = previous.get("attempt", 1) + 1 if previous else 1
                    record = self.measure(call, x, weight, bias, attempt)
                    _write_cache(cache_path(), key, record)
                else:
                    record = previous
                self.choices[key] = record
            self._fast[fast] = record["impl"]
        return record["impl"]

    def _late(self, fast) -> None:
        """A warm-up abandoned at the deadline has finished: the next call of that shape measures again
        (cheaply: the kernels are compiled and prepared by then)."""
        with self._lock:
            self._stale.add(fast)

    def measure(self, call: Call, x, weight, bias, attempt: int = 1) -> dict:
        """Time torch and each candidate on this call's own tensors; the fastest that agrees with torch wins.

        torch first (its warm-up is cuDNN's algorithm search, not counted in the budget), then every
        candidate's one-time work at once (``_WarmUps``) until ``COMPILE_SHARE`` of the budget is spent, then
        rounds of torch and the ready candidates in turn as the rest of the budget allows (at least one, at
        most eight)."""
        budget, began = _budget_s(), time.perf_counter()
        time_one = _timer(call.device)
        notes: dict[str, str] = {}
        one_time: dict[str, float] = {}
        incomplete: list[str] = []
        names = candidates(call)[1:]
        jobs = _jobs(call, x, len(names)) if names else 0
        with torch.no_grad():
            fns = {"torch": lambda t: torch_forward(call, t, weight, bias)}
            expected = fns["torch"](x)   # the baseline: its errors (out of memory, ...) are the caller's
            if x.is_cuda:
                torch.cuda.synchronize(x.device)
            # The budget counts from here: torch's warm-up (cuDNN's algorithm search with cudnn.benchmark) is
            # what the caller's own first F.conv2d of this shape costs, and the candidates must not launch
            # while cuDNN times its algorithms on the same GPU.
            start = time.perf_counter()
            one_time["torch"] = round((start - began) * 1e3, 1)
            if names:
                fast = (call, x.device)
                warm = _WarmUps(names, call, x, weight, bias, expected, jobs, lambda impl: self._late(fast))
                outcomes = warm.wait(start + COMPILE_SHARE * budget)
                for impl in names:
                    if impl not in outcomes:
                        since = warm.started.get(impl)
                        notes[impl] = ("not measured: budget spent" if since is None else
                                       f"not measured: its one-time work ran past the budget (still going after "
                                       f"{time.perf_counter() - since:.1f} s)")
                        incomplete.append(impl)
                        continue
                    fn, verdict, seconds = outcomes[impl]
                    one_time[impl] = round(seconds * 1e3, 1)
                    if fn is None:
                        notes[impl] = verdict
                    else:
                        fns[impl] = fn
            del expected
            samples: dict[str, list] = {k: [] for k in fns}
            rounds, first = 0, time.perf_counter()
            while True:   # torch and the candidates in turn, so that drift and contention hit all alike
                for impl, fn in fns.items():
                    samples[impl].append(time_one(lambda: fn(x)))
                rounds += 1
                per_round = (time.perf_counter() - first) / rounds
                # another round must leave a round's time within the budget for what follows it: the record's
                # write and the caller's call (on an H100, 1024-px layers overran 2 s by 39 ms without it)
                if rounds >= 8 or time.perf_counter() + 2 * per_round > start + budget:
                    break
        times = {k: statistics.median(v) for k, v in samples.items()}
        best = min(times, key=times.get)
        if times[best] > MARGIN * times["torch"]:
            best = "torch"   # a tie within timing noise goes to torch: auto must not lose to it on a re-run
        record = {"impl": best, "times_ms": {k: round(v * 1e3, 5) for k, v in times.items()}, "notes": notes,
                  "one_time_ms": one_time, "rounds": rounds, "jobs": jobs,
                  "measured_s": round(time.perf_counter() - began, 3),
                  "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if incomplete:
            record.update(incomplete=incomplete, attempt=attempt)
        return record

    def clear(self) -> None:
        with self._lock:
            self.choices.clear()
            self._fast.clear()
            self._stale.clear()
            self.generation += 1


dispatcher = Dispatcher()


def auto_choice(op: str, x, weight, bias, stride, padding, activation: str = "none", pool: int = 1) -> Optional[str]:
    """What auto runs for this call in this process (None before its first call)."""
    return dispatcher.known(_call_of(op, x, weight, bias, stride, padding, activation, pool), x.device)


def forward(call: Call, x, weight, bias, impl: str) -> torch.Tensor:
    """The op's forward: auto's choice or the named implementation."""
    if impl == "auto":
        impl = dispatcher.choose(call, x, weight, bias)
        if impl != "torch" and x.is_cuda and torch.cuda.is_current_stream_capturing():
            from convforge import conv
            if not conv.get(impl).graph_safe:
                impl = "torch"   # auto's choice reads device values on the host: torch inside a graph capture
    if impl == "torch":
        return torch_forward(call, x, weight, bias)
    reason = unserved_reason(call)
    if reason:
        raise UserError(f"implementation '{impl}' cannot compute this call ({reason}); use impl='auto' or 'torch'")
    return _prepared.get(impl, call, weight, bias)(x)


# ------------------------------------------------------------------------------------------------ ops

@torch.library.custom_op("convforge::conv2d", mutates_args=())
def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: Sequence[int],
           padding: Sequence[int], impl: str = "auto") -> torch.Tensor:
    """F.conv2d(x, weight, bias, stride, padding) (zero padding, float32) computed by a convforge kernel.

    ``impl``: "auto" (measured per shape against torch, see convforge.torch_ops), "torch", or a registry
    name ("cuda-fused-gemm", "cpu-parallel", ...). Forward by convforge; backward by torch's own
    convolution gradients (torch.nn.grad.conv2d_input / conv2d_weight), so models stay trainable.
    """
    call = _call_of("conv", x, weight, bias, stride, padding)
    return forward(call, x, weight, bias, impl)


@conv2d.register_fake
def _conv2d_fake(x, weight, bias, stride, padding, impl="auto"):
    (sh, sw), (ph, pw) = _pair(stride), _pair(padding)
    ho = (x.shape[2] + 2 * ph - weight.shape[2]) // sh + 1
    wo = (x.shape[3] + 2 * pw - weight.shape[3]) // sw + 1
    return x.new_empty((x.shape[0], weight.shape[0], ho, wo))


def _conv2d_setup(ctx, inputs, output):
    x, weight, bias, stride, padding, _ = inputs
    ctx.save_for_backward(x, weight)
    ctx.stride, ctx.padding, ctx.has_bias = _pair(stride), _pair(padding), bias is not None


def _conv_grads(ctx, x, weight, grad_y):
    """Input, weight and bias gradients of a convolution (torch.nn.grad, i.e. torch's own kernels)."""
    gx = torch.nn.grad.conv2d_input(x.shape, weight, grad_y, ctx.stride, ctx.padding) \
        if ctx.needs_input_grad[0] else None
    gw = torch.nn.grad.conv2d_weight(x, weight.shape, grad_y, ctx.stride, ctx.padding) \
        if ctx.needs_input_grad[1] else None
    gb = grad_y.sum((0, 2, 3)) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return gx, gw, gb


def _conv2d_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    return (*_conv_grads(ctx, x, weight, grad), None, None, None)


conv2d.register_autograd(_conv2d_backward, setup_context=_conv2d_setup)


@torch.library.custom_op("convforge::conv2d_act_pool", mutates_args=())
def conv2d_act_pool(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: Sequence[int],
                    padding: Sequence[int], activation: str, pool: int, impl: str = "auto") -> torch.Tensor:
    """max_pool2d(act(F.conv2d(x, weight, bias, stride, padding)), pool, pool) in one op (act: none, relu,
    tanh, sigmoid; pool 1 for none), computed by a fused convforge kernel where one serves the shape.

    Forward by convforge; backward by torch: the convolution is recomputed in torch, the pooling and
    activation gradients routed through it, and the convolution's gradients taken with torch.nn.grad.
    """
    call = _call_of("fused", x, weight, bias, stride, padding, activation, pool)
    return forward(call, x, weight, bias, impl)


@conv2d_act_pool.register_fake
def _conv2d_act_pool_fake(x, weight, bias, stride, padding, activation, pool, impl="auto"):
    (sh, sw), (ph, pw) = _pair(stride), _pair(padding)
    ho = (x.shape[2] + 2 * ph - weight.shape[2]) // sh + 1
    wo = (x.shape[3] + 2 * pw - weight.shape[3]) // sw + 1
    return x.new_empty((x.shape[0], weight.shape[0], ho // pool, wo // pool))


def _fused_setup(ctx, inputs, output):
    x, weight, bias, stride, padding, activation, pool, _ = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.stride, ctx.padding, ctx.has_bias = _pair(stride), _pair(padding), bias is not None
    ctx.activation, ctx.pool = activation, int(pool)


def _fused_backward(ctx, grad):
    x, weight, bias = ctx.saved_tensors
    y = F.conv2d(x, weight, bias, ctx.stride, ctx.padding)   # recomputed: the forward kept only the pooled map
    a = _ACT_FN[ctx.activation](y)
    if ctx.pool > 1:
        k = [ctx.pool, ctx.pool]
        _, indices = F.max_pool2d(a, ctx.pool, ctx.pool, return_indices=True)
        grad = torch.ops.aten.max_pool2d_with_indices_backward(grad, a, k, k, [0, 0], [1, 1], False, indices)
    if ctx.activation == "relu":
        grad = grad * (y > 0).to(grad.dtype)
    elif ctx.activation == "tanh":
        grad = grad * (1 - a * a)
    elif ctx.activation == "sigmoid":
        grad = grad * a * (1 - a)
    return (*_conv_grads(ctx, x, weight, grad), None, None, None, None, None)


conv2d_act_pool.register_autograd(_fused_backward, setup_context=_fused_setup)


def _import_dynamo_on_demand(op) -> bool:
    """DYNAMO_NOTE: torch.library.custom_op wraps each kernel in torch._disable_dynamo, whose first call imports
    torch._dynamo (with sympy, Triton and FSDP's modules: 3.9 s on a 2-core CPU, and most of the 4.5 s the
    process's first auto call spent before measuring anything on an H200, benchmarks/2026-11-28-h200-igemm-
    pointwise-1x1, call 4). Dynamo cannot be tracing a call before it is imported, so until then the kernel runs
    as it is; from the first call that finds it imported on, it is wrapped in torch._dynamo.disable as the
    wrapper would have done. The wrapper caches what it calls in the kernel's ``__dynamo_disable`` attribute:
    this sets that attribute. Returns whether the op's kernels had that shape (else nothing is changed)."""
    kernels = getattr(op, "_backend_fns", None)
    targets = [getattr(k, "__wrapped__", None) for k in kernels.values()] if isinstance(kernels, dict) else []
    if not targets or not all(callable(t) and getattr(t, "__dynamo_disable", None) is None for t in targets):
        return False
    for target in targets:
        def on_demand(*args, _target=target, **kwargs):
            dynamo = sys.modules.get("torch._dynamo")
            if dynamo is None or not hasattr(dynamo, "disable"):    # absent, or still importing
                return _target(*args, **kwargs)
            try:
                disabled = dynamo.disable(_target, recursive=True, wrapping=False)
            except TypeError:   # a torch whose disable takes no ``wrapping``
                disabled = dynamo.disable(_target, recursive=True)
            setattr(_target, "__dynamo_disable", disabled)
            return disabled(*args, **kwargs)
        setattr(target, "__dynamo_disable", on_demand)
    return True


DYNAMO_ON_DEMAND = {op._name: _import_dynamo_on_demand(op) for op in (conv2d, conv2d_act_pool)}


def reset() -> None:
    """Forget in-memory choices and prepared kernels (the disk cache stays)."""
    dispatcher.clear()
    _prepared.clear()
