"""The engine: runs any network with any registered convolution implementation, timing each conv layer.

Op Time of a layer is its convolution calls as the engine makes them (including per-call work such as
staging weights), input already on the device, synchronised before and after, with CUDA events on a
GPU; summed over the chunks a batch is cut into. One-time preparation (compiling, packing weights) is
timed apart. Everything else (activations, pooling, fully-connected layers) runs in PyTorch float32, except on
the CPU whole-network path (cpu-winograd, the CPU's auto, or cpu-parallel): there the convs are fused with their
activation and max pool (cpu-parallel's kernels; with cpu-winograd, an unpooled 2x2 to 8x8 layer that reads and
writes the lane layout takes its Winograd kernel), the dense layers are convforge.cpu_dense's blocked GEMM with
bias and activation fused, and every intermediate buffer lives in an arena allocated once per chunk size and
reused across chunks and calls.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Union

import numpy as np
import torch

from convforge import conv
from convforge.errors import UserError
from convforge import gpu_dense
from convforge.gpu_dense import DenseHead, GpuDense
from convforge.models import Activation, Conv, ConvShape, Dense, Flatten, Network, Pool, apply_layer, fusion_after

# "exact": fp32 arithmetic throughout. "fast": FP16 tensor cores for the convolutions where they win (_layer_impl;
# the fused first convs too, FAST_FIRST_POOL; per batch size against the exact kernel, FAST_PER_BATCH) and TF32
# forms beside the exact ones for the dense layers (the faster per batch size; FP16 ones after a conv that wrote
# FP16, HALF_HANDOFF), all accumulating in fp32 (accuracy reported beside exact by the whole-network benchmark,
# convforge/harness/whole.py).
PRECISIONS = ("exact", "fast")
FAST_CONV = "cuda-tc-fp16"
# Many-channel layers whose activation and pool are fused, with few maps: triton-tc-fused's rows kernel (fa20 L2,
# 16 maps, relu + pool 4: 0.493 ms with its non-finite probe and fix-up against 1.371 for the exact fused kernel on
# an H100, benchmarks/2026-11-27-h100-tc-fused-fixup-first-convs; with 24 maps its gather kernel lost to the exact
# one: benchmarks/2026-11-27-h100-triton-tc-fused).
FAST_FUSED_CONV = "triton-tc-fused"
FAST_FUSED_MAX_MAPS = 16
# The fused one-channel first convs (act + 2x2 pool) on FAST_CONV's pool kernel (cuda/tc_pool.cu): FP16 tensor
# cores with each 2x2 window in one lane, only the pooled map written: 1.43-2.37x the exact fused kernel on the six
# presets' first convs, whole network exact / fast 2.24-3.26x (H100, benchmarks/2026-11-28-h100-fast-first-conv-
# tc-pool). Off: those convs run the exact kernel, as before.
FAST_FIRST_POOL = True
# The fast path hands a tensor-core conv's output to the dense layer after it in FP16 (half the bytes written
# and read back: sp18's conv output is 433 MB in fp32 at 10000 images) when the weights bound every value on the
# way: the conv's input comes out of tanh or sigmoid (|x| <= 1), so |conv| <= max over maps of sum |w| + |b|, and
# |dense| <= max over outputs of sum |W| * that. Bounds under HALF_BOUND leave FP16 (max 65504) ample room.
HALF_HANDOFF = True
HALF_BOUND = 2.0 ** 14
BOUNDED_ACTIVATIONS = ("tanh", "sigmoid")
# The fast path also hands a fused conv's output to the next conv in FP16 when its activation is bounded (tanh or
# sigmoid: |value| <= 1, FP16 rounding within 2^-11 relative, which the FP16 tensor-core conv applies to its
# input anyway) and that conv runs unfused on FAST_CONV's FP16-pairs launch (cuda_tc.stages_half_pairs): the first
# conv writes half the bytes and the second reads half, as they are (sp18 and sp19 1.033-1.039x,
# benchmarks/2026-11-28-h100-fast-first-conv-fp16-handoff). fa18 and fa19, whose second convs take fp32-image
# launches, gained 1.01-1.02x, and fa18's graphed fast pass at 10 images then measured 0.363 ms against 0.062-0.069
# in earlier records (cause not found: benchmarks/2026-11-28-h100-whole-network-after-merge), so they keep fp32.
# Read when an engine is built.
HALF_CONV_HANDOFF = True
# A fast-path conv on a tensor-core kernel keeps the exact implementation's kernel beside it and runs, per batch
# size, whichever measured faster (FasterPerBatch): at 10 images fa18's and fa19's second convs took 27.8 and
# 25.6 us of GPU time on cuda-tc-fp16 against 14.8 and 11.3 on the exact kernel (H200,
# benchmarks/2026-11-28-h200-small-batch-whole), while at 10000 the tensor cores win. Off: always the fast kernel.
FAST_PER_BATCH = True
# A dense layer followed by another (the network's head: every preset's FC -> act -> FC 10) also has one-launch
# forms (gpu_dense.DenseHead): the first layer's split-K partials, then one kernel for its sum, bias, activation
# and the second layer, each batch size taking the faster of those and the two layers apart. Off: apart always.
FUSE_HEAD = True

# Bound on the largest activation of one chunk, so memory stays flat for any number of images. On a GPU it
# is also at most FREE_MEMORY_SHARE of the memory free when the engine is built: a chunk holds its input,
# the largest activation and its successor, and some kernels' scratch (unroll + GEMM) at once.
CHUNK_BYTES = {"cpu": 256 << 20, "cuda": 4 << 30}
FREE_MEMORY_SHARE = 1 / 8

# The CPU whole-network path (see Engine._forward_cpu): the implementations it serves, and its chunk.
CPU_WHOLE_IMPLS = ("cpu-parallel", "cpu-winograd")
CPU_CHUNK = 2048
# The first conv reads the uint8 images itself (cpu_parallel's transposes convert them): no float32 copy of the
# chunk (the A/B toggles it; benchmarks/2026-11-26-cpu-whole-fa17-sp18-sp19)
RAW_INPUT = True


def default_chunk(device: str, activation_elements: int) -> int:
    """Images per chunk: the largest activation of a chunk within CHUNK_BYTES[device] and, on a GPU,
    within FREE_MEMORY_SHARE of the free memory (a GPU shared with other work gets smaller chunks)."""
    budget = CHUNK_BYTES[device]
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        budget = min(budget, int(free * FREE_MEMORY_SHARE))
    return max(1, budget // (4 * activation_elements))


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda asked for, but PyTorch sees no CUDA GPU here; use --device cpu, or "
                        "install a CUDA build of torch on a machine with an NVIDIA GPU")
    if device not in ("cpu", "cuda"):
        raise UserError(f"unknown device '{device}'; choose auto, cpu or cuda")
    return device


def check_precision(precision: str, device: str) -> str:
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision '{precision}'; choose {' or '.join(PRECISIONS)}")
    if precision == "fast" and device != "cuda":
        raise UserError("--precision fast runs on tensor cores: it needs --device cuda")
    return precision


# the spin ahead of a GPU-timed call: about 0.5 ms at 2 GHz, longer than the host's launch work for any
# implementation here, so the timed kernels are queued before the start event fires
LEAD_CYCLES = 1_000_000


class Stopwatch:
    """Times a region of device work: CUDA events on a GPU, the host clock after a sync on a CPU.

    On a GPU the start event is recorded after a synchronize, so by default the time also holds the host's
    work between that event and the kernel's start (argument packing, output allocation, the launch: some
    10-50 us, varying from process to process). ``lead_cycles`` > 0 queues a spin kernel of that many
    cycles ahead of the start event: the event then fires when the spin ends, by which time the host has
    queued the timed work, so the events bracket GPU time only.
    """

    def __init__(self, device: str, lead_cycles: int = 0):
        self.device = device
        self.lead_cycles = lead_cycles

    def __enter__(self):
        if self.device == "cuda":
            torch.cuda.synchronize()
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            if self.lead_cycles > 0:
                torch.cuda._sleep(self.lead_cycles)
            self._start.record()
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.device == "cuda":
            self._end.record()
            self._end.synchronize()
            self.seconds = self._start.elapsed_time(self._end) / 1e3
        else:
            self.seconds = time.perf_counter() - self._t0
        return False


def gpu_lead(device: str) -> int:
    """The spin to queue ahead of a GPU-only timing: LEAD_CYCLES on a GPU whose torch has the spin, else 0."""
    return LEAD_CYCLES if device == "cuda" and hasattr(torch.cuda, "_sleep") else 0


def median_seconds(fn: Callable[[], object], device: str, calls: int, launch_hidden: bool = True) -> float:
    """Median seconds of ``calls`` calls of ``fn()``, each on the device alone (the engine's own choices;
    the harness's ``time_calls`` adds rotation, budgets and counters for reported figures); on a GPU
    without its launch work unless ``launch_hidden`` is False (see Stopwatch)."""
    lead = gpu_lead(device) if launch_hidden else 0
    times = []
    for _ in range(calls):
        with Stopwatch(device, lead) as watch:
            fn()
        times.append(watch.seconds)
    return float(np.median(times))


@dataclass
class LayerResult:
    index: int                 # 1-based convolution layer number
    shape: ConvShape
    impl: str
    op_time_s: float = 0.0
    fused: str = ""            # e.g. "tanh+maxpool2" when the kernel also did those

    @property
    def gflops(self) -> float:
        return self.shape.flops / self.op_time_s / 1e9 if self.op_time_s > 0 else float("nan")

    def as_dict(self) -> dict:
        return {"layer": self.index, "shape": asdict(self.shape), "impl": self.impl,
                "op_time_s": self.op_time_s, "gflops": self.gflops, "fused": self.fused or None}


@dataclass
class InferenceResult:
    model: str
    images: int
    impl: str
    device: str
    correctness: float
    predictions: np.ndarray
    layers: list[LayerResult]
    prepare_time_s: float
    total_time_s: float
    extra: dict = field(default_factory=dict)
    precision: str = "exact"

    @property
    def images_per_s(self) -> float:
        return self.images / self.total_time_s if self.total_time_s > 0 else float("nan")

    def as_dict(self) -> dict:
        return {"model": self.model, "images": self.images, "impl": self.impl, "device": self.device,
                "precision": self.precision, "correctness": self.correctness,
                "layers": [layer.as_dict() for layer in self.layers], "prepare_time_s": self.prepare_time_s,
                "total_time_s": self.total_time_s, "images_per_s": self.images_per_s, **self.extra}


@dataclass
class _Step:
    """One stage of the compiled forward pass: a convolution call or a PyTorch layer."""
    layer: object
    prefix: str
    conv_fn: Optional[conv.ConvFn] = None
    result: Optional[LayerResult] = None
    skip: int = 0  # following layers the conv kernel already applied (fusion)
    # The fast path's conv with its tensor-core and exact kernels, chosen per batch size (FAST_PER_BATCH)
    per_batch: Optional["FasterPerBatch"] = None
    # The fast path's dense layer on FP16 weights, for an FP16 input from the conv before (HALF_HANDOFF)
    half_dense: Optional["GpuDense"] = None
    dense: object = None  # the CPU whole-network path's dense layer (convforge.cpu_dense.DenseLayer)
    # The CPU whole-network path: this step reads / writes cpu-parallel's lane layout (cpu_parallel.lane_shape)
    lanes_in: bool = False
    lanes_out: bool = False
    gpu_dense: Optional["GpuDense"] = None  # the GPU dense layer, forms measured (the fast path's: TF32 ones too)
    # The GPU dense layer and the dense layer right after it, with a one-launch form for both (FUSE_HEAD)
    head: Optional["DenseHead"] = None
    out_shape: tuple = ()  # per-image output shape (the CPU path's buffers)
    lane_buffer: Optional[Callable[[int], tuple]] = None  # rows -> the lane-layout output buffer's shape
    # The CPU whole-network path's first conv into the lane layout: it takes the (B, 1, S, S) uint8 images as
    # they are and converts them in its input transposes (no float copy of the batch written and read back)
    raw_input: bool = False

    def buffer_shape(self, rows: int) -> tuple:
        """The shape of this conv step's output buffer for ``rows`` images (the CPU whole-network path)."""
        return self.lane_buffer(rows) if self.lane_buffer else (rows, *self.out_shape)


def _absorbed_activation(walk: list, i: int, fuse: bool) -> Optional[str]:
    """The activation right after layer i of ``walk`` that its dense layer applies itself (``fuse``), else None."""
    following = walk[i + 1][0] if i + 1 < len(walk) else None
    return following.kind if fuse and isinstance(following, Activation) else None


def lanes_next(walk: list, j: int) -> bool:
    """Whether the layer at walk[j] (a Flatten skipped) reads cpu-parallel's lane layout on the CPU whole-network
    path: a conv (cpu-parallel's tiles compute in it), or a dense layer whose tiles take 16-image stripes (the
    lane layout is one). Then the conv before it writes that layout: no transposes out of and back into it."""
    j = _skip(walk, j, (Flatten,))
    if j < len(walk) and isinstance(walk[j][0], Conv):
        return True
    if j < len(walk) and isinstance(walk[j][0], Dense):
        from convforge.cpu_dense import lanes_supported
        return lanes_supported()
    return False


class Engine:
    """A network bound to one convolution implementation on one device, prepared once, run many times."""

    def __init__(self, network: Network, impl: Union[str, conv.ConvImpl] = "auto", device: str = "auto",
                 fuse: bool = True, chunk: Optional[int] = None, annotate: bool = False, precision: str = "exact"):
        self.network = network
        self.device = resolve_device(device)
        # A registry entry is taken as resolved by the caller (the CLI checks it once); a name is resolved here.
        self.impl = impl if isinstance(impl, conv.ConvImpl) else conv.resolve(impl, self.device)
        self.precision = check_precision(precision, self.device)
        self.params = {k: v.to(self.device) for k, v in network.params.items()}
        arch = network.architecture
        self.annotate = annotate  # name each layer in profiler traces (record_function + NVTX)
        # The CPU whole-network path: conv + act + pool fused, dense layers as blocked GEMMs with bias and
        # activation fused, every buffer allocated once and reused (the arena).
        self.cpu_whole = self.device == "cpu" and self.impl.name in CPU_WHOLE_IMPLS
        self._arena: dict = {}
        self.chunk = chunk or default_chunk(self.device, arch.max_activation_elements())
        if self.cpu_whole and not chunk:
            self.chunk = min(self.chunk, CPU_CHUNK)
        self.steps: list[_Step] = []
        self._warm_batches: set[int] = set()
        self._graphs: dict[int, GraphedForward] = {}
        walk = list(arch.walk())
        lanes = False   # the previous step wrote the lane layout
        half_convs = set()   # walk indices of the convs that write FP16 for their dense layer (HALF_HANDOFF)
        half_inputs = set()  # walk indices of the convs that read an FP16 input from the conv before (HALF_CONV_HANDOFF)
        conv_index = 0
        t0 = time.perf_counter()
        i = 0
        while i < len(walk):
            layer, prefix, shape_in, _ = walk[i]
            step = _Step(layer, prefix)
            if isinstance(layer, Conv):
                conv_index += 1
                weight, bias = self.params[f"{prefix}.weight"], self.params.get(f"{prefix}.bias")
                fuses = self.impl.fuses or self.cpu_whole   # the CPU whole path: cpu-parallel's fused kernels
                fusion = fusion_after(walk, i) if fuse and fuses else None
                impl = self._layer_impl(shape_in, layer.out_channels, fusion, layer.kernel)
                fusion = fusion if impl.fuses or self.cpu_whole else None
                shape = ConvShape(0, layer.out_channels, *shape_in, layer.kernel)
                step.result = LayerResult(conv_index, shape, impl.name)
                if fusion:
                    step.skip = fusion[2]
                step.lanes_in = lanes
                step.lanes_out = lanes = self.cpu_whole and lanes_next(walk, i + 1 + step.skip)
                step.raw_input = RAW_INPUT and step.lanes_out and not step.lanes_in and not self.steps
                if self.cpu_whole:
                    impl = self._cpu_whole_impl(step, weight, bias, fusion)
                    step.result.impl = impl.name
                if step.lanes_in or step.lanes_out:
                    from convforge.conv import cpu_parallel, cpu_winograd
                    if fusion:
                        step.conv_fn = cpu_parallel.prepare_fused(weight, bias, *fusion[:2], lanes_in=step.lanes_in,
                                                                  lanes_out=step.lanes_out, raw_input=step.raw_input)
                    elif impl.name == "cpu-winograd":
                        step.conv_fn = cpu_winograd.prepare_lanes(weight, bias)
                    else:
                        step.conv_fn = cpu_parallel.prepare_lanes(weight, bias, step.lanes_in, step.lanes_out,
                                                                  raw_input=step.raw_input)
                elif fusion:
                    reader = self._half_conv_reader(walk, i, fusion, fuse)
                    if reader >= 0:   # the delegate may still write float32; the reader takes either
                        half_inputs.add(reader)
                    step.conv_fn = impl.prepare_fused(weight, bias, *fusion[:2], input_hw=shape_in[1:],
                                                      **({"out_dtype": torch.float16} if reader >= 0 else {}))
                else:
                    dtypes = {"in_dtype": torch.float16} if i in half_inputs else {}
                    if precision == "fast" and HALF_HANDOFF and _half_handoff(walk, i, self.params):
                        half_convs.add(i)
                        dtypes["out_dtype"] = torch.float16
                    step.conv_fn = impl.prepare(weight, bias, input_hw=shape_in[1:], **dtypes)
                if precision == "fast" and impl is not self.impl and FAST_PER_BATCH and i not in half_inputs:
                    # the exact implementation's kernel for the same step (it cannot read an FP16 input)
                    exact = (self.impl.prepare_fused(weight, bias, *fusion[:2], input_hw=shape_in[1:]) if fusion
                             else self.impl.prepare(weight, bias, input_hw=shape_in[1:]))
                    step.conv_fn = step.per_batch = FasterPerBatch({impl.name: step.conv_fn, self.impl.name: exact})
                if fusion:
                    activation, pool, _ = fusion
                    step.result.fused = (f"{activation}+" if activation else "") + f"maxpool{pool}"
            elif isinstance(layer, Dense) and self.device == "cuda":
                # The fast path's layers have TF32 forms too, each timed against the exact ones per batch size.
                activation = _absorbed_activation(walk, i, fuse and gpu_dense.FUSE_ACTIVATION)
                step.skip = 1 if activation else 0
                weight, bias = self.params[f"{prefix}.weight"], self.params.get(f"{prefix}.bias")
                step.gpu_dense = GpuDense(weight, bias, median_seconds, activation, tf32=precision == "fast")
                if precision == "fast" and _conv_before(walk, i) in half_convs:
                    step.half_dense = GpuDense(weight.half().contiguous(), bias, median_seconds, activation)
                j = i + 1 + step.skip
                if fuse and FUSE_HEAD and j < len(walk) and isinstance(walk[j][0], Dense):
                    activation2 = _absorbed_activation(walk, j, fuse and gpu_dense.FUSE_ACTIVATION)
                    prefix2 = walk[j][1]
                    second = GpuDense(self.params[f"{prefix2}.weight"], self.params.get(f"{prefix2}.bias"),
                                      median_seconds, activation2, tf32=precision == "fast")
                    step.head = DenseHead(step.gpu_dense, second, step.half_dense)
                    step.skip += 1 + (1 if activation2 else 0)
            elif isinstance(layer, Dense) and self.cpu_whole:
                from convforge.cpu_dense import DenseLayer
                activation = _absorbed_activation(walk, i, fuse)
                step.skip = 1 if activation else 0
                step.dense = DenseLayer(self.params[f"{prefix}.weight"], self.params.get(f"{prefix}.bias"),
                                        activation, lanes=lanes)
                step.lanes_in, lanes = lanes, False
            elif isinstance(layer, Flatten):
                step.lanes_in = step.lanes_out = lanes
            step.out_shape = walk[i + step.skip][3]
            if step.conv_fn is not None and step.lanes_out:
                from convforge.conv.cpu_parallel import lane_shape
                step.lane_buffer = functools.partial(lane_shape, shape=step.out_shape)
            self.steps.append(step)
            i += 1 + step.skip
        if self.device == "cuda":
            torch.cuda.synchronize()
        self.prepare_time_s = time.perf_counter() - t0

    def forward(self, x: torch.Tensor, timed: bool = True) -> torch.Tensor:
        """Forward pass of one chunk already on the device; adds each conv call's time to its layer.

        ``timed=False`` leaves out the per-layer synchronisation, so that work on several streams overlaps.
        """
        if self.cpu_whole:   # chunk by chunk through the arena; the logits copied out
            n = x.shape[0]
            logits = None
            for start in range(0, max(n, 1), self.chunk):
                part = self._forward_cpu(x[start:start + self.chunk], timed)
                if logits is None:
                    logits = torch.empty((n, *part.shape[1:]), dtype=part.dtype)
                logits[start:start + part.shape[0]] = part
            return logits
        for step in self.steps:
            with self._annotation(step):
                if step.head is not None:
                    x = step.head(x.reshape(x.shape[0], -1))
                elif step.half_dense is not None and x.dtype == torch.float16:
                    x = step.half_dense(x.reshape(x.shape[0], -1))
                elif step.gpu_dense is not None:
                    x = step.gpu_dense(x)
                elif step.conv_fn is None:
                    x = apply_layer(step.layer, x, self.params, step.prefix)
                elif not timed:
                    x = step.conv_fn(x)
                else:
                    with Stopwatch(self.device) as watch:
                        x = step.conv_fn(x)
                    step.result.op_time_s += watch.seconds
                    if step.per_batch is not None:
                        step.result.impl = step.per_batch.last
        return x

    def _buffer(self, key, rows: int, shape: tuple) -> torch.Tensor:
        """The arena's float32 buffer ``key`` for ``rows`` images of ``shape``: allocated once for the largest
        batch seen, and the first ``rows`` of it (contiguous) for smaller ones, so that chunk after chunk and
        run after run write the same memory (no allocation, no first-touch page faults)."""
        buffer = self._arena.get(key)
        if buffer is None or buffer.shape[0] < rows or tuple(buffer.shape[1:]) != tuple(shape):
            buffer = self._arena[key] = torch.empty((rows, *shape), dtype=torch.float32)
        return buffer[:rows]

    def _forward_cpu(self, x: torch.Tensor, timed: bool = True) -> torch.Tensor:
        """The CPU whole-network pass of one chunk: every conv (fused with its activation and pool where the
        network allows) writes into its arena buffer; dense layers run convforge.cpu_dense's blocked GEMM with
        bias and activation fused, into 16-padded arena rows that the next dense layer reads in place; a
        layer neither absorbs (e.g. an activation after an unfused conv) runs in PyTorch. Returns the logits,
        a view into the arena that the next call overwrites."""
        rows = x.shape[0]
        base, ld = None, 0   # a dense output: its padded arena buffer and row stride
        for index, step in enumerate(self.steps):
            with self._annotation(step):
                if step.conv_fn is not None:
                    x = x.contiguous()
                    shape = step.buffer_shape(rows)
                    args = (x, self._buffer(index, shape[0], shape[1:]))
                    if step.lanes_in or step.lanes_out:
                        args += (rows,)   # the lane layout's buffers are padded to whole groups of images
                    if timed:
                        with Stopwatch(self.device) as watch:
                            x = step.conv_fn(*args)
                        step.result.op_time_s += watch.seconds
                    else:
                        x = step.conv_fn(*args)
                    base = None
                elif step.dense is not None:
                    dense = step.dense
                    if step.lanes_in:
                        base, ld = x.numpy(), dense.k
                    elif base is None:
                        x = x.reshape(rows, -1).contiguous()
                        base, ld = x.numpy(), dense.k
                    out = self._buffer(index, rows, (dense.np,))
                    dense(base, ld, out.numpy())
                    base, ld = out.numpy(), dense.np
                    x = out[:, :dense.n]
                elif isinstance(step.layer, Flatten) and base is None:
                    x = x if step.lanes_in else x.reshape(rows, -1)   # the lane layout is flat per group
                else:
                    x = apply_layer(step.layer, x, self.params, step.prefix)
                    base = None
        return x

    def _cpu_whole_impl(self, step: "_Step", weight: torch.Tensor, bias: Optional[torch.Tensor],
                        fusion) -> conv.ConvImpl:
        """On the CPU whole path: cpu-winograd (when it is the engine's entry) for an unpooled layer between two
        lane-layout steps whose weights it serves (the second convs of sp18, sp19, fa18, fa19: 1.15-1.8x
        cpu-parallel's time, benchmarks/2026-11-27-cpu-winograd-second-convs); cpu-parallel's kernels for
        every other layer."""
        if self.impl.name == "cpu-winograd" and not fusion and step.lanes_in and step.lanes_out:
            from convforge.conv import cpu_winograd
            if cpu_winograd.serves(weight, bias):
                return self.impl
        return conv.get("cpu-parallel")

    def _half_conv_reader(self, walk: list, i: int, fusion, fuse: bool) -> int:
        """The walk index of the conv that reads conv i's output in FP16 (HALF_CONV_HANDOFF), else -1: on the fast
        path, conv i's fused activation is bounded (BOUNDED_ACTIVATIONS) and the next layer after its fused ones is
        a conv that runs unfused on FAST_CONV's FP16-pairs launch (which takes an FP16 input as it is)."""
        if self.precision != "fast" or not HALF_CONV_HANDOFF or fusion[0] not in BOUNDED_ACTIVATIONS:
            return -1
        j = i + 1 + fusion[2]
        if j >= len(walk) or not isinstance(walk[j][0], Conv):
            return -1
        layer, _, (channels, height, width), _ = walk[j]
        following = fusion_after(walk, j) if fuse and self.impl.fuses else None
        impl = self._layer_impl((channels, height, width), layer.out_channels, following, layer.kernel)
        if impl.name != FAST_CONV or (following and impl.fuses):
            return -1
        from convforge.conv import cuda_tc
        return j if cuda_tc.stages_half_pairs(layer.out_channels, channels, height, width, layer.kernel) else -1

    def _layer_impl(self, shape_in: tuple, maps: int, fusion, kernel: int) -> conv.ConvImpl:
        """The implementation for a conv layer of input ``shape_in`` (channels, height, width). Exact: the engine's one
        implementation. Fast: unfused layers with several input channels go to the FP16 tensor-core kernel
        (the compute-bound second layers: 1.9-2.9x the best exact kernel, H200 run 10); fused one-channel layers
        that its pool kernel serves (cuda_tc.pool_serves: a 2x2 pool, K <= 9) go there (FAST_FIRST_POOL), other
        one-channel layers keep the exact kernels (triton-tc-fused took 1.0-2.1x their time on all five fused
        first convs, H100: benchmarks/2026-11-27-h100-tc-fused-fixup-first-convs).
        Layers whose activation and pool are fused keep them fused: on FP16 tensor cores (FAST_FUSED_CONV) up to
        FAST_FUSED_MAX_MAPS maps, else in the exact kernel (cuda-tc-fp16 plus a separate relu and pool 4 took
        as long as the fused exact kernel on fa20 L2, benchmarks/2026-11-25-h200-whole-network)."""
        if self.precision != "fast":
            return self.impl
        channels, height, width = shape_in
        if channels == 1:   # the fused first convs: FAST_CONV's pool kernel (FAST_FIRST_POOL)
            from convforge.conv import cuda_tc
            fast = conv.get(FAST_CONV)
            if not (FAST_FIRST_POOL and fusion is not None
                    and cuda_tc.pool_serves(channels, height, width, kernel, fusion[1], fast.precision)):
                return self.impl
            return fast if fast.unavailable_reason(self.device) is None else self.impl
        if fusion is not None and maps > FAST_FUSED_MAX_MAPS:
            return self.impl
        fast = conv.get(FAST_CONV if fusion is None else FAST_FUSED_CONV)
        return fast if fast.unavailable_reason(self.device) is None else self.impl

    def graphed(self, batch: int) -> "GraphedForward":
        """The untimed forward for ``batch`` images captured as one CUDA graph (kept per batch size).

        For 10 to 1000 images the pass is launch work: a replay issues every kernel of the network with one
        launch. The first call per batch size runs the pass uncaptured first (JIT compiling, autotuning,
        allocator warm-up stay out of the graph), then captures it."""
        if self.device != "cuda":
            raise UserError("CUDA graphs need --device cuda")
        if not self.impl.graph_safe:
            raise UserError(f"{self.impl.name} reads device values on the host every call: it cannot be "
                            "captured in a CUDA graph")
        graph = self._graphs.get(batch)
        if graph is None:
            graph = self._graphs[batch] = GraphedForward(self, batch)
        return graph

    def _annotation(self, step: _Step):
        if not self.annotate:
            return contextlib.nullcontext()
        label = (f"conv{step.result.index} [{step.result.impl}]" if step.result else
                 f"{type(step.layer).__name__.lower()} {step.prefix}".strip())
        stack = contextlib.ExitStack()
        stack.enter_context(torch.profiler.record_function(label))
        if self.device == "cuda":
            stack.enter_context(torch.cuda.nvtx.range(label))
        return stack

    def _check_images(self, images: np.ndarray) -> None:
        arch = self.network.architecture
        if images.ndim != 3 or images.shape[1:] != (arch.input_size, arch.input_size):
            raise UserError(f"{self.network.name} takes {arch.input_size}x{arch.input_size} images, "
                            f"got {images.shape[1:]}")

    def _result(self, predictions, labels, total: float, **extra) -> InferenceResult:
        correctness = float(np.mean(predictions == labels)) if labels is not None else float("nan")
        return InferenceResult(model=self.network.name, images=len(predictions), impl=self.impl.name,
                               device=self.device, correctness=correctness, predictions=predictions,
                               layers=[s.result for s in self.steps if s.result is not None],
                               prepare_time_s=self.prepare_time_s, total_time_s=total, extra=extra,
                               precision=self.precision)

    def run(self, images: np.ndarray, labels: Optional[np.ndarray] = None) -> InferenceResult:
        """Classify (N, S, S) uint8 images chunk by chunk; Op Time is summed over the chunks."""
        self._check_images(images)
        n = images.shape[0]
        for step in self.steps:
            if step.result is not None:
                step.result.op_time_s = 0.0
                step.result.shape = step.result.shape.with_batch(n)
        predictions = np.empty(n, dtype=np.int64)
        while True:   # the first pass may already find the GPU too full for the chunk
            try:
                self._warm_up(images)
                break
            except torch.OutOfMemoryError:
                pass
            self._halve_chunk([0.0 for s in self.steps if s.result is not None])
        t0 = time.perf_counter()
        with torch.inference_mode():
            start = 0
            while start < n:
                op_times = [s.result.op_time_s for s in self.steps if s.result is not None]
                try:
                    self._warm_up(images)   # nothing to do unless the chunk was just halved
                    block = torch.from_numpy(images[start:start + self.chunk]).to(self.device)
                    if self.cpu_whole and self.steps[0].raw_input:  # the first conv converts the uint8 images
                        logits = self._forward_cpu(block.unsqueeze(1))
                    elif self.cpu_whole:    # into the arena's input buffer, then the pass in the arena
                        x = self._buffer("input", block.shape[0], (1, *block.shape[1:]))
                        x.copy_(block.unsqueeze(1))
                        logits = self._forward_cpu(x)
                    else:
                        x = block.to(torch.float32).unsqueeze(1).contiguous()
                        logits = self.forward(x)
                    predictions[start:start + block.shape[0]] = logits.argmax(dim=1).cpu().numpy()
                    start += block.shape[0]
                    continue
                except torch.OutOfMemoryError:
                    pass
                # Outside the except clause: its traceback no longer holds the failed chunk's tensors.
                block = x = logits = None
                self._halve_chunk(op_times)
        if self.device == "cuda":
            torch.cuda.synchronize()
        return self._result(predictions, labels, time.perf_counter() - t0)

    def _halve_chunk(self, op_times: list[float]) -> None:
        """After an allocation failure (the GPU is shared, or a kernel needs more scratch than foreseen):
        free torch's cached blocks, halve the chunk and undo the failed chunk's partial Op Time, so the run
        goes on with the same answers. One warning per halving."""
        if self.chunk == 1:
            raise UserError(f"out of {self.device} memory with one image per chunk; free memory on the device "
                            "(other processes) or run with --device cpu")
        if self.device == "cuda":
            torch.cuda.empty_cache()
        self.chunk = max(1, self.chunk // 2)
        print(f"warning: out of {self.device} memory; continuing with chunks of {self.chunk} images",
              file=sys.stderr, flush=True)
        for step, seconds in zip([s for s in self.steps if s.result is not None], op_times):
            step.result.op_time_s = seconds

    def _warm_up(self, images: np.ndarray, chunk: Optional[int] = None) -> None:
        """On a GPU (or for an implementation that compiles per input shape), one untimed pass per chunk
        size first: JIT compilation and autotuning (Triton, NVRTC, Inductor) happen at the first call of a
        shape, and are one-time preparation, not Op Time."""
        if self.device != "cuda" and not self.impl.compiles_per_shape:
            return  # our CPU kernels compile in prepare(); a second pass would double a CPU run
        chunk = chunk or self.chunk
        sizes = {min(chunk, images.shape[0])}
        if images.shape[0] % chunk:
            sizes.add(images.shape[0] % chunk)
        t0 = time.perf_counter()
        with torch.inference_mode():
            for size in sorted(sizes - self._warm_batches):
                block = torch.from_numpy(images[:size]).to(self.device)
                self.forward(block.to(torch.float32).unsqueeze(1), timed=False)
                self._warm_batches.add(size)
        if self.device == "cuda":
            torch.cuda.synchronize()
        self.prepare_time_s += time.perf_counter() - t0

    def run_streamed(self, images: np.ndarray, labels: Optional[np.ndarray] = None, streams: int = 4,
                     chunk: Optional[int] = None) -> InferenceResult:
        """End-to-end pass from host memory, overlapping copies with compute (the course's streams step).

        The batch is cut into chunks taken round-robin by ``streams`` CUDA streams; each stream copies its
        chunk from pinned host memory, runs the network and copies the predictions back, all
        asynchronously, so one chunk's upload hides behind another's compute. Per-layer Op Time is not
        measured here (that needs a synchronisation per layer, which would serialise the streams).
        """
        if self.device != "cuda":
            raise UserError("streams overlap host-to-device copies with GPU compute: use --device cuda")
        self._check_images(images)
        n = images.shape[0]
        chunk = min(chunk or self.chunk, max(1, -(-n // (2 * streams))))  # at least two chunks per stream
        self._warm_up(images, chunk)
        host = torch.from_numpy(np.ascontiguousarray(images)).pin_memory()
        predictions = torch.empty(n, dtype=torch.int64).pin_memory()
        pool = [torch.cuda.Stream() for _ in range(streams)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            for i, start in enumerate(range(0, n, chunk)):
                stream = pool[i % streams]
                with torch.cuda.stream(stream):
                    block = host[start:start + chunk].to(self.device, non_blocking=True)
                    logits = self.forward(block.to(torch.float32).unsqueeze(1), timed=False)
                    predictions[start:start + block.shape[0]].copy_(logits.argmax(dim=1), non_blocking=True)
        torch.cuda.synchronize()
        total = time.perf_counter() - t0
        return self._result(predictions.numpy().copy(), labels, total, streams=streams, chunk=chunk)


def _skip(walk: list, j: int, kinds: tuple, step: int = 1) -> int:
    """The first index from j on, moving by ``step``, whose layer is none of ``kinds`` (len(walk) or -1 past
    either end)."""
    while 0 <= j < len(walk) and isinstance(walk[j][0], kinds):
        j += step
    return j


def _conv_before(walk: list, j: int) -> int:
    """The index in ``walk`` of the conv right before layer j with only Flatten layers between, else -1."""
    j = _skip(walk, j - 1, (Flatten,), -1)
    return j if j >= 0 and isinstance(walk[j][0], Conv) else -1


def _half_handoff(walk: list, i: int, params: dict) -> bool:
    """Whether the conv at walk[i] may write FP16 for the dense layer after it (HALF_HANDOFF): a dense layer
    follows it (Flatten between at most), its input comes out of a bounded activation (pools between), and the
    weights bound the conv's and the dense layer's values under HALF_BOUND."""
    j = _skip(walk, i + 1, (Flatten,))
    if j >= len(walk) or not isinstance(walk[j][0], Dense):
        return False
    k = _skip(walk, i - 1, (Pool, Flatten), -1)
    if k < 0 or not isinstance(walk[k][0], Activation) or walk[k][0].kind not in BOUNDED_ACTIVATIONS:
        return False
    conv_prefix, dense_prefix = walk[i][1], walk[j][1]
    weight, bias = params[f"{conv_prefix}.weight"], params.get(f"{conv_prefix}.bias")
    per_map = weight.abs().flatten(1).sum(1).double() + (bias.abs().double() if bias is not None else 0)
    conv_bound = float(per_map.max())
    dense_bound = float(params[f"{dense_prefix}.weight"].abs().sum(1).double().max()) * conv_bound
    return conv_bound < HALF_BOUND and dense_bound < HALF_BOUND


class FasterPerBatch:
    """A conv step's kernels by name (the fast path's tensor-core one first), each batch size run by whichever
    measured faster the first time that size came: on the GPU alone while a CUDA graph is warmed up
    (gpu_dense.for_graph: a replay pays no launch work), with the host's launch work for an eager call; the
    choices kept apart, as GpuDense keeps its forms'. Inside a capture with no choice yet: the first kernel."""

    def __init__(self, ways: dict):
        self.ways = ways
        self.last = next(iter(ways))
        self.choice: dict[int, str] = {}
        self.graph_choice: dict[int, str] = {}

    def __call__(self, x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        name = gpu_dense.per_batch_choice(self.choice, self.graph_choice, x, lambda: list(self.ways),
                                          lambda n, launch_hidden: self._seconds(n, x, launch_hidden))
        self.last = name or next(iter(self.ways))
        return self.ways[self.last](x, out)

    def _seconds(self, name: str, x: torch.Tensor, launch_hidden: bool) -> float:
        self.ways[name](x)   # compiling and first-call work stay out of the timing
        return median_seconds(lambda: self.ways[name](x), x.device.type, 5, launch_hidden)


class GraphedForward:
    """An engine's untimed forward for one batch size, replayed from a CUDA graph.

    ``__call__(x)`` copies ``x`` into the graph's static input and replays; the logits it returns live in
    the graph's static output, overwritten by the next replay (clone them to keep them). While it lives, do
    not call ``torch.cuda.empty_cache()``: that frees the cuBLAS workspaces its matrix products were captured
    with (seen on an H200: the bf16 dense layers then returned non-finite logits)."""

    def __init__(self, engine: Engine, batch: int):
        # The graph reads the engine's weights and buffers where they were at capture: it keeps the engine alive.
        # (Without this, `Engine(...).graphed(10)` let them be freed, and a replay after the next capture, whose
        # empty_cache returned that memory to the driver, faulted on an illegal address.)
        self.engine = engine
        size = engine.network.architecture.input_size
        self.input = torch.rand((batch, engine.network.architecture.in_channels, size, size), device="cuda") * 255
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        # The dense layers' forms for a graph are chosen by GPU time (gpu_dense.for_graph), apart from eager's.
        with torch.inference_mode(), torch.cuda.stream(side), gpu_dense.for_graph():
            for _ in range(2):   # compile, autotune and warm the allocator outside the capture
                engine.forward(self.input, timed=False)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(self.graph), gpu_dense.for_graph():
            self.output = engine.forward(self.input, timed=False)
        # Replayed once at once, and checked against the eager pass in the same forms: on an H200 (torch
        # 2.11), a bf16 dense graph first replayed only after other graphs were captured returned non-finite
        # logits, and never did when replayed before them.
        self.graph.replay()
        with torch.inference_mode(), gpu_dense.for_graph():
            eager = engine.forward(self.input, timed=False)
        if not torch.equal(self.output, eager):
            raise RuntimeError(f"the CUDA graph of {engine.network.name} at batch {batch} does not reproduce the "
                               "eager forward pass; run without graphs")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.input.copy_(x, non_blocking=True)
        self.graph.replay()
        return self.output
