"""The GPU engine's exact dense layers: y = x W^T + b in whichever form measures fastest per batch size.

Four forms are cuBLAS calls; the others are this project's split-K kernels, launched through the CUDA C kernels'
launcher: ``gemv`` for 1-128 rows (``conv/cuda/dense_gemv.cu``: at 10 images a dense layer is a matrix-vector
product whose weights, 14.4 MB for fa17, dominate, and cuBLAS runs it on a handful of blocks) and ``tiles`` for
17-2048 rows (``conv/cuda/dense_tiles.cu``: a register-tiled product over slices of the reduction, for the
100-image layers whose 100 x 160 outputs cuBLAS covers with a few dozen blocks walking all 17496 columns);
``mma3`` for 1-64 rows (``conv/cuda/dense_mma3.cu``: split TF32 on mma.sync, the batch's rows in one block);
``tc3*`` for any rows (``gpu_dense_tc.py``, Triton: the same split-K on the tensor cores with split TF32, fp32
accurate, imported only when one runs; fa18's layer at 100 rows on an H100 26 us against 36 for tiles, at
10000 rows 1.01 against 1.38 ms for cuBLAS, benchmarks/2026-11-27-h100-dense-3xtf32).
Which form wins depends on the layer and the batch (no fixed rule held, see ``GpuDense``), so each layer times
them the first time a batch size comes, on the GPU alone, and keeps the choice.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
from typing import Callable, NamedTuple, Optional

import torch

from convforge.conv import ACTIVATION_CODES, cuda_common as cc   # the codes dense_gemv_sum takes
from convforge.conv import split_tf32   # the tc3 forms' weight parts

GEMV_ROWS = (4, 8, 16)    # the compiled row counts (CF_ROWS) of dense_gemv.cu: one group of rows per block
FUSE_ACTIVATION = True    # the engine hands a dense layer its following activation (off: A/B runs)
GEMV_MAX_ROWS = 128       # beyond, the weights' re-reads (one per group of 16 rows) outweigh cuBLAS's tiles
GEMV_SLICE = 512          # CF_KS: reduction columns per block
GEMV_OUTPUTS = 32         # CF_WARPS * CF_OUTS: outputs per block
TILES_ROWS = (17, 2048)   # the rows the tiles forms serve: from gemv's second group to where cuBLAS fills the GPU
TILE_N, TILE_K = 32, 16   # dense_tiles.cu's outputs a block and reduction slab (its rows: TILES below)
SUM_OUTPUTS, SUM_GROUPS = 32, 8        # dense_gemv_sum's block: outputs x groups of slices
TILES_PER_SM = 16         # split-K: slices enough for about this many blocks per SM ...
# ... per form: (rows a block, TILE_M; no slice shorter than this many columns, as each pays its pipeline's fill
# and a partial sum). No one setting won everywhere (100 rows on an H200: fa18 34.9 us at 256 against 37.5 at
# 128, sp18 28.7 against 25.0).
TILES = {"tiles": (64, 256), "tiles-fine": (64, 128), "tiles-tall": (128, 256)}
TILES_THREADS = 128       # dense_tiles.cu THREADS
# mma3 (dense_mma3.cu, split TF32 on mma.sync): a block takes all of 1-64 rows x 32 outputs over a slice; slices
# as the split-K forms (blocks wanted per SM, no slice shorter than this many columns), the length a multiple of
# its 64-column slab
MMA3_ROW_TILES = (1, 2, 4)   # the compiled 16-row tiles of a block (WARP_RT)
MMA3_PER_SM, MMA3_MIN_SLICE, MMA3_SLAB = 2, 128, 64
MMA3_PITCH, MMA3_SUM_PITCH, MMA3_THREADS = 80, 40, 128   # dense_mma3.cu's PITCH, SUM_PITCH, THREADS
TC_WARPS, TC_STAGES = 4, 3
# Read by each GpuDense when it is made:
FUSE_TC_EPILOGUE = True   # a tensor-core form over one slice adds bias + activation itself (off: A/B runs)
# an eager call's form is timed over this many calls launched back to back, launch work counted (see
# GpuDense.__call__); 1 times one call alone, the rule before (A/B runs)
EAGER_QUEUE = 4


class TcForm(NamedTuple):
    """A tensor-core form's launch shape: outputs a block (BN), reduction step (BK), no slice shorter than
    ``min_slice`` columns, blocks wanted per SM, the most rows a block (BM follows the batch up to it:
    tc_rows_per_block) and software-pipeline stages."""
    bn: int
    bk: int
    min_slice: int
    per_sm: int
    max_bm: int = 64
    stages: int = TC_STAGES


# The tensor-core forms (gpu_dense_tc.py, Triton, 3xTF32). At 100-10000 rows on an H100
# (benchmarks/2026-11-27-h100-dense-3xtf32) no one shape won every layer: 32 x 32 for sp18/sp19 at 100 rows,
# 64 x 64 for fa17 from 100 rows, 32 outputs x 64 columns for the 140/160-output layers at 10000 rows (fa18's
# 17496 -> 160: 1005 against 1152 us for tc3).
TC = {"tc3": TcForm(32, 32, 256, 8), "tc3-wide": TcForm(64, 64, 512, 4), "tc3-deep": TcForm(32, 64, 256, 8)}
# FP16 layers only (the fast path's fc1 after the FP16 hand-off): the same kernel in blocks of up to 128 rows with
# a 4-stage pipeline, one slice where the tiles fill the GPU. At 10000 rows on an H100, sp18's 10816 -> 140:
# 0.139 ms against 0.172 for tc3-wide and 0.197 for cuBLAS; sp19's 5184 -> 140: 0.087 / 0.093 / 0.111 (the best
# of 132 launch shapes, benchmarks/2026-11-27-h100-fast-dense-fp16-forms).
TC_HALF = {"tc-tall": TcForm(64, 64, 512, 2, max_bm=128, stages=4)}
# The fast path's fp32 layers (``tf32=True``) may also take one TF32 product instead of three: the same shapes.
TC_TF32 = {"tc1": TC["tc3"], "tc1-wide": TC["tc3-wide"], "tc1-deep": TC["tc3-deep"]}
TC_ALL = {**TC, **TC_HALF, **TC_TF32}
# Forms whose products round the operands to TF32: only a layer made with tf32=True (the fast path) has them.
TF32_FORMS = ("tf32-linear", *TC_TF32)


@functools.cache
def tiles_spec(rows_per_block: int) -> cc.KernelSpec:
    return cc.KernelSpec.of("dense_tiles.cu", TILE_M=rows_per_block)


@functools.cache
def kernel_specs() -> tuple[cc.KernelSpec, ...]:
    """Every compiled form of dense_gemv.cu (one per row count), then of dense_tiles.cu (one per block height),
    then of dense_mma3.cu (one per block's row tiles). Built once (the eager path asks for it on every call)."""
    return tuple([cc.KernelSpec.of("dense_gemv.cu", CF_ROWS=rows) for rows in GEMV_ROWS]
                 + [tiles_spec(m) for m in sorted({m for m, _ in TILES.values()})]
                 + [mma3_spec(t) for t in MMA3_ROW_TILES])


@functools.cache
def mma3_spec(row_tiles: int, sums: int = 0) -> cc.KernelSpec:
    """dense_mma3.cu for ``row_tiles`` x 16 rows; ``sums`` 1 is its known-wrong fixture (the tests')."""
    return cc.KernelSpec.of("dense_mma3.cu", WARP_RT=row_tiles, **({"SUMS": 1} if sums else {}))


def mma3_row_tiles(rows: int) -> int:
    """The fewest compiled 16-row tiles of dense_mma3.cu that hold ``rows`` (at most 64)."""
    return next(t for t in MMA3_ROW_TILES if 16 * t >= rows)


def mma3_slices(rows: int, outputs: int, depth: int, sm_count: int) -> tuple[int, int]:
    """(slices, slice length) of the reduction for mma3."""
    return split_reduction(depth, cc.cdiv(outputs, 32), MMA3_PER_SM * sm_count, MMA3_MIN_SLICE, MMA3_SLAB)


def launch_mma3(x: torch.Tensor, parts: tuple[torch.Tensor, torch.Tensor], part: torch.Tensor, slice_len: int,
                sums: int = 0) -> None:
    """part[s] = x[:, s-th slice] W[:, s-th slice]^T by dense_mma3.cu from the weights' TF32 ``parts``
    (split_tf32): x of at most 64 rows, contiguous and 16-byte aligned, K % 4 == 0, slice_len a multiple of 4.
    ``sums`` 1: the known-wrong fixture."""
    (rows, depth), outputs = x.shape, parts[0].shape[0]
    tiles = mma3_row_tiles(rows)
    smem = 4 * max(2 * (16 * tiles + 64) * MMA3_PITCH, 4 * 16 * tiles * MMA3_SUM_PITCH)   # its SMEM_BYTES
    cc.kernel(mma3_spec(tiles, sums), "dense_mma3_part", x.device)(
        (cc.cdiv(outputs, 32), cc.cdiv(depth, slice_len)), (MMA3_THREADS,),
        (cc.ptr(x), cc.ptr(parts[0]), cc.ptr(parts[1]), cc.ptr(part), cc.i32(rows), cc.i32(depth), cc.i32(outputs),
         cc.i32(slice_len)), shared_mem=smem)


def tc_rows_per_block(rows: int, variant: str = "tc3") -> int:
    """BM of a tensor-core form: the smallest power of two from 16 that holds the rows, at most the form's max_bm
    (an mma is 16 rows tall; 128 was slower for the 3xTF32 forms at 1000-10000 rows but for fa17's layer at 1000,
    and fastest for the FP16 one)."""
    cap = TC_ALL[variant].max_bm
    return next(m for m in (16, 32, 64, 128) if m >= rows or m == cap)


def tc_slices(rows: int, outputs: int, depth: int, sm_count: int, variant: str = "tc3") -> tuple[int, int]:
    """(slices, slice length) of the reduction for a tensor-core form: the length a multiple of its BK, every
    slice non-empty."""
    form = TC_ALL[variant]
    tiles = cc.cdiv(rows, tc_rows_per_block(rows, variant)) * cc.cdiv(outputs, form.bn)
    return split_reduction(depth, tiles, form.per_sm * sm_count, form.min_slice, form.bk)


def triton_present() -> bool:
    """Whether Triton can be imported (not importing it: a CPU machine never loads it)."""
    return importlib.util.find_spec("triton") is not None


def tiles_slices(rows: int, outputs: int, depth: int, sm_count: int, variant: str = "tiles") -> tuple[int, int]:
    """(slices, slice length) of the reduction for ``variant`` (a key of TILES): the length a multiple of
    TILE_K, every slice non-empty."""
    rows_per_block, min_slice = TILES[variant]
    tiles = cc.cdiv(rows, rows_per_block) * cc.cdiv(outputs, TILE_N)
    return split_reduction(depth, tiles, TILES_PER_SM * sm_count, min_slice, TILE_K)


def split_reduction(depth: int, tiles: int, blocks: int, min_slice: int, step: int) -> tuple[int, int]:
    """(slices, slice length) of a split-K reduction of ``depth`` columns over ``tiles`` output tiles: slices
    enough for about ``blocks`` blocks in all, none shorter than ``min_slice`` columns (each pays its pipeline's
    fill and a partial sum), the length a multiple of ``step``, every slice non-empty."""
    wanted = max(1, min(blocks // tiles, depth // min_slice))
    length = cc.cdiv(cc.cdiv(depth, wanted), step) * step
    return cc.cdiv(depth, length), length


def activate_(y: torch.Tensor, activation: Optional[str]) -> torch.Tensor:
    """``y`` with ``activation`` (None, "tanh", "relu" or "sigmoid") applied in place: tanh_, relu_, sigmoid_."""
    return y if activation is None else getattr(y, f"{activation}_")()


def scratch(shape: tuple, device: torch.device) -> torch.Tensor:
    """An uninitialised fp32 buffer for the gemv kernels (the tests poison it to prove every element written)."""
    return torch.empty(shape, device=device, dtype=torch.float32)


# (call, device, calls, launch hidden) -> median seconds
Measure = Callable[[Callable[[], object], str, int, bool], float]

# Set while a CUDA graph's forward is warmed up and captured (``for_graph``): see GpuDense.__call__.
_FOR_GRAPH = contextvars.ContextVar("convforge_dense_for_graph", default=False)


def per_batch_choice(choices: dict, graph_choices: dict, x: torch.Tensor, names: Callable[[], list],
                     seconds: Callable[[str, bool], float]) -> Optional[str]:
    """The choice for x's batch size, for a CUDA graph within ``for_graph`` (``graph_choices``) else for eager calls
    (``choices``): made the first time that size comes, the name among ``names()`` of least ``seconds(name,
    launch_hidden)``, and kept. None inside a graph capture with no choice yet (no measuring there)."""
    launch_hidden = _FOR_GRAPH.get()
    table = graph_choices if launch_hidden else choices
    name = table.get(x.shape[0])
    if name is None and not (x.is_cuda and torch.cuda.is_current_stream_capturing()):
        name = table[x.shape[0]] = min(names(), key=lambda n: seconds(n, launch_hidden))
    return name


@contextlib.contextmanager
def for_graph():
    """Within: the dense layers choose their forms for a CUDA graph (by GPU time alone; a replay pays no
    launch work), kept apart from the choices of eager calls."""
    token = _FOR_GRAPH.set(True)
    try:
        yield
    finally:
        _FOR_GRAPH.reset(token)


class GpuDense:
    """An exact fp32 dense layer in whichever of its forms measures fastest the first time a batch size comes
    (each timed by ``measure``, the engine's median of 5 calls; the choice is kept per batch size, for eager
    calls and for CUDA graphs apart, see ``__call__``):

    - ``linear``: ``x W^T + b`` with the weight as stored (F.linear);
    - ``transposed``: addmm with ``W^T`` stored contiguous. At 10000 images it took fa17's 7200 -> 500 layer
      from 2.07 to 1.58 ms on an H100 and made fa18's 17496 -> 160 layer 7 % slower: no fixed rule wins;
    - ``output-major``: ``(b + W x^T)^T``, returned as a transposed view: at 10-100 images cuBLAS's kernels for a
      500 x 100 output beat those for 100 x 500 (fa17 fc1 at 100 images: 36 against 71-81 us on an H200);
    - ``split-k``: S products over K/S each in one batched call, then their sum: the small-batch products
      otherwise run on a handful of blocks (fa17 fc1 at 10 images: 13 against 25-27 us), for K a multiple of S;
    - ``gemv``: dense_gemv.cu (module docstring) for at most 128 rows, K a multiple of 4, where CuPy can launch it,
      with the rows in one group of up to 16 per block; ``gemv4`` / ``gemv8`` in groups of 4 / 8 (each group
      reads the weights again, mostly from L2: at 10 rows groups of 4 took fa18's first dense layer from 16.1 to
      13.5 us on an H200, benchmarks/2026-11-26-h200-small-batch-fa18-fa19);
    - ``tiles`` / ``tiles-fine`` / ``tiles-tall``: dense_tiles.cu for TILES_ROWS, under the same conditions as
      gemv, in blocks of 64 / 64 / 128 rows over slices of at least 256 / 128 / 256 columns, summed by gemv's
      sum kernel;
    - ``mma3``: dense_mma3.cu for 1-64 rows, under gemv's conditions on an sm_80+ GPU: split TF32 on mma.sync
      (fp32-accurate; the weights split once, as for the tc3 forms), the rows all in one block per 32 outputs over
      slices of the reduction, summed by gemv's sum kernel. At 10 rows it ran the exact head 1.06-1.14x faster than
      the other forms for fa17, fa18 and fa19, and lost at 64-100 rows (H200,
      benchmarks/2026-11-29-h200-dense-mma3-small-batch);
    - ``tc3`` / ``tc3-wide`` / ``tc3-deep``: gpu_dense_tc.py's Triton kernel on the tensor cores with split
      TF32 (3xTF32, fp32-accurate; the weights split once, at the first such call), split-K, blocks of 32 / 64 /
      32 outputs over steps of 32 / 64 / 64 columns (TC), summed by gemv's sum kernel (over one slice the kernel
      adds bias and activation itself, FUSE_TC_EPILOGUE); for any rows, where Triton and CuPy are present and the
      GPU has TF32 (sm_80 on);
    - ``tc-tall``: the same kernel on FP16 layers only, in blocks of 128 rows x 64 outputs (TC_HALF);
    - ``tf32-linear`` (cuBLAS with TF32 on for the call) and ``tc1`` / ``tc1-wide`` / ``tc1-deep`` (the tc3 shapes
      with one TF32 product): reduced precision, on a layer made with ``tf32=True`` only (the fast path's fp32
      layers). They compete with the exact forms, so the fast path takes TF32 where it pays (at 10000 rows) and
      an exact form where the weights' bytes decide (10-100 rows: fa17's two layers at 10 rows took 19.6 us of
      cuBLAS TF32 GPU time, and 1.7 more for the tanh after, against 13.9 us for the exact forms on an H200,
      benchmarks/2026-11-28-h200-small-batch-whole).
    (benchmarks/2026-11-26-h100-h200-whole-network-floors/small_dense.txt)
    ``activation`` (None, tanh, relu, sigmoid) is applied to the output: inside gemv's sum kernel or the
    tensor-core kernel's one-slice epilogue, in place after the cuBLAS forms."""

    VARIANTS = ("linear", "transposed", "output-major", "split-k", "gemv", "gemv4", "gemv8", "tiles",
                "tiles-fine", "tiles-tall", "mma3", *TC, *TC_HALF, *TF32_FORMS)
    OWN_KERNELS = ("gemv", "gemv4", "gemv8", *TILES, "mma3")   # this project's kernels: the conditions of has_gemv
    GEMV_GROUPS = {"gemv": None, "gemv4": 4, "gemv8": 8}   # None: the smallest compiled group that holds the rows
    SPLITS = (16, 12, 8)     # the first that divides K into parts of at least MIN_SPLIT_DEPTH
    MIN_SPLIT_DEPTH = 256

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], measure: Measure,
                 activation: Optional[str] = None, tf32: bool = False):
        if activation not in ACTIVATION_CODES:
            raise ValueError(f"unknown activation {activation!r}; one of {', '.join(map(str, ACTIVATION_CODES))}")
        self.weight, self.bias, self.measure, self.activation = weight, bias, measure, activation
        self.tf32 = tf32 and weight.dtype == torch.float32 and weight.device.type == "cuda"
        # FP16 weights: the fast path's layer after a conv that wrote FP16 (engine.HALF_HANDOFF). FP16 products,
        # fp32 sums and bias; only cuBLAS's two layouts and the Triton tensor-core forms read FP16.
        self.half = weight.dtype == torch.float16
        self.weight_t = weight.t().contiguous()
        self._tc_parts = None   # the weights' TF32 parts for the split-TF32 forms (_weight_parts)
        self.bias_column = None if bias is None else bias[:, None].contiguous()
        depth = weight.shape[1]
        self.splits = next((s for s in self.SPLITS if depth % s == 0 and depth // s >= self.MIN_SPLIT_DEPTH), None)
        # the module's switches as they were when this layer was made (A/B runs build layers under each setting)
        self.eager_queue, self.fuse_tc_epilogue = EAGER_QUEUE, FUSE_TC_EPILOGUE
        self.choice: dict[int, str] = {}         # rows -> form, for eager calls
        self.graph_choice: dict[int, str] = {}   # rows -> form, for CUDA graphs (see __call__)
        self.has_gemv = (not self.half and weight.device.type == cc.DEVICE_TYPE and depth % 4 == 0
                         and weight.is_contiguous()
                         and weight.data_ptr() % 16 == 0 and (bias is None or bias.is_contiguous())
                         and (cc.DEVICE_TYPE != "cuda" or cc.unavailable_reason() is None))
        # mma.sync on TF32 operands: sm_80 on (the host emulation has it)
        self.has_mma = self.has_gemv and (cc.DEVICE_TYPE != "cuda"
                                          or torch.cuda.get_device_capability(weight.device) >= (8, 0))
        self.has_tc = (weight.device.type == "cuda" and cc.DEVICE_TYPE == "cuda" and weight.is_contiguous()
                       and (bias is None or bias.is_contiguous()) and triton_present()
                       and torch.cuda.get_device_capability(weight.device) >= (8, 0)
                       and cc.unavailable_reason() is None)

    @property
    def variants(self) -> tuple[str, ...]:
        """The forms this layer has (for any batch: ``gemv`` also needs at most 128 rows, see ``serves``)."""
        return tuple(v for v in self.VARIANTS if (v != "split-k" or self.splits)
                     and (v not in self.OWN_KERNELS or self.has_gemv) and (v not in TC_ALL or self.has_tc)
                     and (v != "mma3" or self.has_mma)
                     and (self.half or v not in TC_HALF) and (v not in TF32_FORMS or self.tf32)
                     and (not self.half or v in ("linear", "transposed", *TC, *TC_HALF)))

    def serves(self, variant: str, rows: int) -> bool:
        """Whether ``variant`` runs ``rows`` rows: gemv for at most GEMV_MAX_ROWS, its fixed groups only where
        the rows need more than one group (else they are plain ``gemv``), tiles for TILES_ROWS, the tensor-core
        forms while rows x K < 2^31."""
        if variant not in self.variants:
            return False
        if variant in TILES:
            return TILES_ROWS[0] <= rows <= TILES_ROWS[1]
        if variant == "mma3":
            return rows <= 16 * MMA3_ROW_TILES[-1]
        if variant in TC_ALL:   # any rows whose x offsets fit the Triton kernel's 32-bit index arithmetic
            return rows * self.weight.shape[1] < 2 ** 31
        if variant not in self.GEMV_GROUPS:   # the cuBLAS forms: any rows
            return True
        group = self.GEMV_GROUPS[variant]
        return rows <= GEMV_MAX_ROWS and (group is None or rows > group)

    def _split_k(self, variant: str, x: torch.Tensor) -> torch.Tensor:
        """gemv, tiles or tc3: the partial sums of the reduction's slices, then their ordered sum + bias +
        activation (over one slice a tensor-core form adds those itself, FUSE_TC_EPILOGUE)."""
        part, slices, spec = self.partials(variant, x, epilogue=self.fuse_tc_epilogue)
        return part if slices == 0 else self._sum(spec, part, x.shape[0], self.weight.shape[0], slices)

    def partials(self, variant: str, x: torch.Tensor, epilogue: bool = False) -> tuple:
        """(part, slices, spec) of a split-K form: part[s] = the s-th slice's product, no bias; ``spec`` holds the
        sum kernels (dense_gemv.cu). With ``epilogue``, a tensor-core form over one slice returns (y, 0, None):
        y with bias and activation, finished."""
        rows, depth = x.shape
        outputs = self.weight.shape[0]
        if variant in TC_ALL:   # Triton: any strides of x
            from convforge import gpu_dense_tc
            slices, length = tc_slices(rows, outputs, depth, cc.device_info(x.device).sm_count, variant)
            form = TC_ALL[variant]
            block = (tc_rows_per_block(rows, variant), form.bn, form.bk)
            precision = "tf32" if self.half or variant in TC_TF32 else "tf32x3"
            parts = self._weight_parts() if precision == "tf32x3" else None
            if slices == 1 and epilogue:   # y, bias and activation in the kernel's epilogue: no sum
                y = scratch((rows, outputs), x.device)
                gpu_dense_tc.launch_part(x, self.weight, y, length, block, TC_WARPS, form.stages, precision,
                                         self.bias, ACTIVATION_CODES[self.activation], parts)
                return y, 0, None
            part = scratch((slices, rows, outputs), x.device)
            gpu_dense_tc.launch_part(x, self.weight, part, length, block, TC_WARPS, form.stages, precision,
                                     parts=parts)
            return part, slices, kernel_specs()[0]
        if not x.is_contiguous() or x.data_ptr() % 16:
            x = x.contiguous() if not x.is_contiguous() else x.clone()
        if variant == "mma3":
            slices, length = mma3_slices(rows, outputs, depth, cc.device_info(x.device).sm_count)
            part = scratch((slices, rows, outputs), x.device)
            launch_mma3(x, self._weight_parts(), part, length)
            return part, slices, kernel_specs()[0]
        args = (cc.ptr(x), cc.ptr(self.weight))
        if variant in TILES:
            slices, length = tiles_slices(rows, outputs, depth, cc.device_info(x.device).sm_count, variant)
            part = scratch((slices, rows, outputs), x.device)
            rows_per_block = TILES[variant][0]
            cc.kernel(tiles_spec(rows_per_block), "dense_tiles_part", x.device)(
                (cc.cdiv(outputs, TILE_N), slices, cc.cdiv(rows, rows_per_block)), (TILES_THREADS,),
                (*args, cc.ptr(part), cc.i32(rows), cc.i32(depth), cc.i32(outputs), cc.i32(length)))
            return part, slices, kernel_specs()[0]
        group = self.GEMV_GROUPS[variant] or next((r for r in GEMV_ROWS if r >= rows), GEMV_ROWS[-1])
        spec = kernel_specs()[GEMV_ROWS.index(group)]
        slices = cc.cdiv(depth, GEMV_SLICE)
        part = scratch((slices, rows, outputs), x.device)
        cc.kernel(spec, "dense_gemv_part", x.device)(
            (cc.cdiv(outputs, GEMV_OUTPUTS), slices, cc.cdiv(rows, group)), (256,),
            (*args, cc.ptr(part), cc.i32(rows), cc.i32(depth), cc.i32(outputs)))
        return part, slices, spec

    def _weight_parts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The weights' TF32 parts (split_tf32) that the split-TF32 forms (tc3, mma3) read: split at the first such
        call and kept (twice the weights' bytes)."""
        if self._tc_parts is None:
            self._tc_parts = split_tf32(self.weight)
        return self._tc_parts

    def is_split_k(self, variant: str, rows: int) -> bool:
        """Whether ``variant`` is a split-K form (this project's kernels) that serves ``rows`` rows."""
        return (variant in self.OWN_KERNELS or variant in TC_ALL) and self.serves(variant, rows)

    def split_k_forms(self, rows: int) -> list:
        """The split-K forms that serve ``rows`` rows."""
        return [v for v in self.variants if self.is_split_k(v, rows)]

    def _sum(self, spec: cc.KernelSpec, part: torch.Tensor, rows: int, outputs: int, slices: int) -> torch.Tensor:
        """dense_gemv_sum: y = the slices of ``part`` added in order, + bias, activation."""
        y = scratch((rows, outputs), part.device)
        cc.kernel(spec, "dense_gemv_sum", part.device)(
            (cc.cdiv(rows * outputs, SUM_OUTPUTS),), (SUM_OUTPUTS * SUM_GROUPS,),
            (cc.ptr(part), cc.ptr(self.bias), cc.ptr(y), cc.i32(rows), cc.i32(outputs), cc.i32(slices),
             cc.i32(0 if self.bias is None else 1), cc.i32(ACTIVATION_CODES[self.activation])))
        return y

    def run(self, variant: str, x: torch.Tensor) -> torch.Tensor:
        if self.is_split_k(variant, x.shape[0]):
            return self._split_k(variant, x)
        y = self._product(variant, x)
        return activate_(y, self.activation)

    def _product(self, variant: str, x: torch.Tensor) -> torch.Tensor:
        if self.half and variant in ("linear", "transposed"):   # FP16 out of cuBLAS (fp32 sums), bias in fp32
            matmul = torch.backends.cuda.matmul
            reduced = matmul.allow_fp16_reduced_precision_reduction
            matmul.allow_fp16_reduced_precision_reduction = False   # fp32 split-K sums too (read at each call)
            try:
                y = torch.nn.functional.linear(x, self.weight) if variant == "linear" else torch.mm(x, self.weight_t)
            finally:
                matmul.allow_fp16_reduced_precision_reduction = reduced
            y = y.float()
            return y if self.bias is None else y.add_(self.bias)
        if variant == "linear":
            return torch.nn.functional.linear(x, self.weight, self.bias)
        if variant == "tf32-linear":   # TF32 is a process-wide cuBLAS switch read at each call: on for this one
            matmul = torch.backends.cuda.matmul
            allowed, matmul.allow_tf32 = matmul.allow_tf32, True
            try:
                return torch.nn.functional.linear(x, self.weight, self.bias)
            finally:
                matmul.allow_tf32 = allowed
        if variant == "transposed":
            return torch.mm(x, self.weight_t) if self.bias is None else torch.addmm(self.bias, x, self.weight_t)
        if variant == "output-major":
            if self.bias is None:
                return torch.mm(self.weight, x.t()).t()
            return torch.addmm(self.bias_column, self.weight, x.t()).t()
        if variant == "split-k" and self.splits:
            rows, depth = x.shape
            parts = torch.bmm(x.reshape(rows, self.splits, depth // self.splits).transpose(0, 1),
                              self.weight_t.view(self.splits, depth // self.splits, -1))
            y = parts.sum(0)
            return y if self.bias is None else y.add_(self.bias)
        raise ValueError(f"unknown dense variant {variant!r} for {x.shape[0]} rows; one of "
                         f"{', '.join(v for v in self.variants if self.serves(v, x.shape[0]))}")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """y for x, in the form chosen for this batch size: for a CUDA graph (within ``for_graph``) the fastest
        on the GPU alone, for an eager call the fastest per call of EAGER_QUEUE calls launched back to back, their
        launch work counted (``_seconds``).

        At 10-100 rows an eager pass is launch-bound and a Triton launch costs more host time than CuPy's or
        cuBLAS's: with GPU-time choices the engine's eager pass ran fa19 at 10 images in 0.42 ms against 0.24
        (benchmarks/2026-11-27-h100-dense-3xtf32, call 4), while its graph gained. At 10000 rows the pass is
        GPU-bound and a layer's launch work overlaps the earlier layers' GPU work. One call timed alone from an
        idle GPU (launch + GPU time, the rule before) misjudged that: for sp19's fast fc1 (before the one-slice
        epilogue) it took tc-tall in 2 of 8 fresh choices and cuBLAS in 6, at 129-135 us of GPU time against
        tc-tall's 91. Calls back to back cost each about the larger of the launch work and the GPU time (plus a
        1/EAGER_QUEUE share of the smaller): launch work still decides where it exceeds the GPU time (at 10,
        100 and 1000 rows cuBLAS in 23 of 24 choices, 24 before), GPU time where it is the larger: with the epilogue,
        tc-tall (53 us) 8 of 8 times, ahead of cuBLAS by about 60 us a call where one call alone puts it about
        30 us ahead (benchmarks/2026-11-27-h100-sp19-fast-dense-choice, call 1). Between the Triton forms, whose
        launch work (about 66 us) now exceeds their GPU time (53-60 us), the choice can still go either way
        (tc3-wide in that folder's call 2). Counting only the launch work that the GPU's backlog at the first
        call leaves (its call 3) took tc-tall every time but a Triton form for fa18's fc2 at 100 images, whose
        eager pass then took 1.42x as long: not kept."""
        variant = per_batch_choice(self.choice, self.graph_choice, x,
                                   lambda: [v for v in self.variants if self.serves(v, x.shape[0])],
                                   lambda v, launch_hidden: self._seconds(v, x, launch_hidden))
        return self.run(variant or "linear", x)   # no measuring inside a graph capture (callers warm up first)

    def _seconds(self, variant: str, x: torch.Tensor, launch_hidden: bool, calls: int = 5) -> float:
        """Median seconds of one call: on the GPU alone (a spin queued ahead hides the launch work) or, with
        ``launch_hidden`` False, a call's share of EAGER_QUEUE calls launched back to back, timed from the host's
        first launch to the GPU's end."""
        self.run(variant, x)   # cuBLAS picks and loads its kernel
        return form_seconds(lambda: self.run(variant, x), x, self.measure, self.eager_queue, launch_hidden, calls)


def form_seconds(call: Callable[[], object], x: torch.Tensor, measure: Measure, queue: int, launch_hidden: bool,
                 calls: int) -> float:
    """Median seconds of one ``call()`` by ``measure``: on the GPU alone, or (``launch_hidden`` False) a call's
    share of ``queue`` calls launched back to back, the launch work counted (GpuDense.__call__)."""
    if launch_hidden:
        return measure(call, x.device.type, calls, True)
    return measure(lambda: [call() for _ in range(queue)], x.device.type, calls, False) / queue


HEAD_MAX_ROWS = 1024      # DenseHead's one-launch forms: up to this many rows (a block a row) ...
HEAD_MAX_OUTPUTS = 2048   # ... and first-layer outputs (dense_head_sum's HEAD_MAX_N, its shared-memory row)
HEAD_THREADS = 1024       # dense_head_sum's block (these two are its #defines: tests/test_cuda_sources.py)


class DenseHead:
    """The network's head: a dense layer (with the activation it absorbed) and the dense layer right after it.
    For each batch size it takes the faster, as GpuDense chooses its forms (``per_batch_choice``), of:

    - ``apart``: the two layers' own calls, each in its own chosen form;
    - ``<form>+head`` for each split-K form of the first layer (gemv, tiles, tc3...; at most HEAD_MAX_ROWS rows):
      the form's partial products, then dense_head_sum (dense_gemv.cu), which adds the slices, bias and
      activation of a row and computes the second layer from them in one launch: the first layer's sum kernel
      and the second layer's product in one CUDA graph node instead of two or three. Where chosen, graphs ran
      1.00-1.06x faster at 100-1000 images (1.16x for fa20's fast path at 100) and 0.98-1.03x at 10 (H200,
      benchmarks/2026-11-28-h200-dense-head-one-launch).

    ``first_half``: the first layer on FP16 weights, for FP16 inputs (the fast path's HALF_HANDOFF); its choices
    are kept apart from the fp32 layer's."""

    def __init__(self, first: GpuDense, second: GpuDense, first_half: Optional[GpuDense] = None):
        self.first, self.second, self.first_half = first, second, first_half
        self.choices: dict[torch.dtype, tuple[dict, dict]] = {}   # input dtype -> (eager, graph) choices
        w2, b2 = second.weight, second.bias
        self.has_kernel = (first.weight.shape[0] <= HEAD_MAX_OUTPUTS and w2.shape[1] == first.weight.shape[0]
                           and w2.dtype == torch.float32 and w2.device.type == cc.DEVICE_TYPE
                           and w2.is_contiguous() and (b2 is None or b2.is_contiguous())
                           and (cc.DEVICE_TYPE != "cuda" or cc.unavailable_reason() is None))

    def forms(self, rows: int, layer: GpuDense) -> list:
        fused = layer.split_k_forms(rows) if self.has_kernel and rows <= HEAD_MAX_ROWS else []
        return ["apart"] + [f"{v}+head" for v in fused]

    def run(self, form: str, x: torch.Tensor, layer: Optional[GpuDense] = None) -> torch.Tensor:
        layer = layer or self._first_for(x)
        if form == "apart":
            return self.second(layer(x))
        variant = form.removesuffix("+head")
        if not layer.is_split_k(variant, x.shape[0]) or not self.has_kernel or x.shape[0] > HEAD_MAX_ROWS:
            raise ValueError(f"unknown dense head form {form!r} for {x.shape[0]} rows; one of "
                             f"{', '.join(self.forms(x.shape[0], layer))}")
        part, slices, spec = layer.partials(variant, x)
        rows, outputs = x.shape[0], layer.weight.shape[0]
        second = self.second
        y = scratch((rows, second.weight.shape[0]), x.device)
        cc.kernel(spec, "dense_head_sum", x.device)(
            (rows,), (HEAD_THREADS,),
            (cc.ptr(part), cc.ptr(layer.bias), cc.ptr(second.weight), cc.ptr(second.bias), cc.ptr(y), cc.i32(rows),
             cc.i32(outputs), cc.i32(slices), cc.i32(0 if layer.bias is None else 1),
             cc.i32(ACTIVATION_CODES[layer.activation]), cc.i32(second.weight.shape[0]),
             cc.i32(0 if second.bias is None else 1), cc.i32(ACTIVATION_CODES[second.activation])))
        return y

    def _first_for(self, x: torch.Tensor) -> GpuDense:
        return self.first_half if self.first_half is not None and x.dtype == torch.float16 else self.first

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        layer = self._first_for(x)
        eager, graph = self.choices.setdefault(x.dtype, ({}, {}))
        form = per_batch_choice(eager, graph, x, lambda: self.forms(x.shape[0], layer),
                                lambda f, launch_hidden: self._seconds(f, x, layer, launch_hidden))
        return self.run(form or "apart", x, layer)

    def _seconds(self, form: str, x: torch.Tensor, layer: GpuDense, launch_hidden: bool, calls: int = 5) -> float:
        """As GpuDense._seconds, after a first call (``apart``: the two layers make their own choices in it)."""
        self.run(form, x, layer)
        return form_seconds(lambda: self.run(form, x, layer), x, layer.measure, layer.eager_queue, launch_hidden,
                            calls)
