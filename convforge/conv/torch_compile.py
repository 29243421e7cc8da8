"""torch-compile: the layer as torch.compile (TorchInductor) builds it. A comparison baseline, not ours.

Technique: no kernel of our own. ``prepare`` compiles ``F.conv2d(x, weight, bias)`` and ``prepare_fused``
the whole sequence ``max_pool2d(activation(conv2d(x, weight, bias)), pool)`` as one function, so that
Inductor may fuse the bias, activation and pooling into the convolution's epilogue (or pick its own
Triton convolution template on a GPU). ``torch.compile(..., dynamic=False, fullgraph=True)``: a static
graph per input shape, no graph breaks. Mode ``max-autotune-no-cudagraphs`` on both devices. On a GPU
Inductor times cuDNN/ATen against its Triton convolution templates per shape and keeps the fastest, and
tunes its generated kernels by coordinate descent. Plain ``max-autotune`` would also replay the call as a
CUDA graph, which copies every non-static input (here the whole batch of activations) into the graph's
own buffer on each call and returns an output that the next replay overwrites: an extra copy of the input
in every timed call, and a result the engine's next chunk would clobber. On a CPU there are no CUDA
graphs, so the two modes are the same; the convolution goes to oneDNN either way, and ``default`` mode
compiles no faster (measured: ``convforge verify`` over its 71 cases takes ~95 s with a cold Inductor
cache on a 2-core machine in either mode, ~10 s with a warm one; each new shape is a C++ compile).
Exact fp32: TF32 is off (``torch_conv.exact_fp32``) when the function is prepared and before every call,
so also while it compiles, and Inductor's Triton convolution template then computes ``tl.dot`` in IEEE fp32.
Compilation happens on the first call per input shape (``dynamic=False``), not in ``prepare``: it is
preparation, which ``convforge bench`` keeps out of the median through its untimed warm-up calls and the
engine on a GPU through its warm-up pass per chunk size. The engine on a CPU makes no warm-up pass, so
there ``convforge infer --impl torch-compile`` counts the compiles in Op Time (seconds per layer).
Each prepared function gets its own copy of the code object, because Dynamo keeps its compiled code and
its recompile limit (8 by default) per code object: sharing one across all prepared layers would make the
ninth shape of a run (bench, verify) fail under ``fullgraph=True``.
Course step: none; the framework's compiler, the row issue #6 asks for next to the hand-written kernels.
Bottleneck: whatever Inductor generates: on a GPU a cuDNN call or a Triton implicit-GEMM template plus
a fused pointwise/pooling kernel (the full-size conv output is written and read back unless the
template absorbs the epilogue); on a CPU a oneDNN call between layout conversions to channels-last.
"""

from __future__ import annotations

import os
import shutil
import sys
import types
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from convforge.conv import check_input, finish_output, output_buffer
from convforge.conv.torch_conv import exact_fp32
from convforge.models import ACTIVATIONS

MODE = "max-autotune-no-cudagraphs"


def unavailable_reason() -> Optional[str]:
    """Why torch.compile cannot work here: Dynamo unsupported on this Python, or no C++ compiler for Inductor."""
    try:
        from torch._dynamo.eval_frame import check_if_dynamo_supported
        check_if_dynamo_supported()
    except ImportError:  # an older torch without this check: torch.compile itself will say what is wrong
        pass
    except RuntimeError as exc:
        return f"torch.compile is not supported here: {exc}"
    # Inductor's own search list (its C++ code on a CPU; a GPU run compiles host code too): $CXX or g++
    # by default, read by torch._inductor.config when it is first imported. None stands for a conda g++ that
    # Inductor installs only when asked (TORCH_INDUCTOR_INSTALL_GXX).
    try:
        from torch._inductor import config
        search = config.cpp.cxx if isinstance(config.cpp.cxx, (list, tuple)) else (config.cpp.cxx,)
    except (ImportError, AttributeError):
        search = (os.environ.get("CXX", "g++"),)
    compilers = [str(c) for c in search if c is not None]
    if sys.platform == "win32":  # there Inductor takes $CXX or cl, whatever the list says
        compilers = [os.environ.get("CXX", "cl")]
    if os.environ.get("TORCH_INDUCTOR_INSTALL_GXX") or any(shutil.which(c) for c in compilers):
        return None
    return (f"TorchInductor needs a C++ compiler and none of {', '.join(compilers) or 'its candidates'} is on PATH "
            "(install one, e.g. apt-get install g++, or point $CXX at one)")


def _compiled(function: Callable) -> Callable:
    """``function`` compiled with a code object of its own (Dynamo's cache and recompile limit are per code object)."""
    fresh = types.FunctionType(function.__code__.replace(), function.__globals__, function.__name__,
                               function.__defaults__, function.__closure__)
    return torch.compile(fresh, mode=MODE, dynamic=False, fullgraph=True)


def _check_device(weight: torch.Tensor) -> None:
    if weight.device.type == "cuda":
        from torch.utils._triton import has_triton
        if not has_triton():
            raise RuntimeError("torch.compile on a GPU needs Triton, which is missing or cannot run here "
                               "(pip install triton, the version matching this torch)")


def _runner(compiled: Callable, weight: torch.Tensor):
    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        check_input(x, weight)  # a clear error for what the layer does not serve, before Dynamo sees it
        exact_fp32()  # (0.5 us) TF32 stays off even if something switched it on since prepare
        y = compiled(x)
        if out is None:
            return y
        buffer, result = output_buffer(out, tuple(y.shape), x)
        buffer.copy_(y)
        return finish_output(buffer, result)

    return run


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
    _check_device(weight)
    exact_fp32()

    def conv(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, weight, bias)

    return _runner(_compiled(conv), weight)


def prepare_fused(weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str], pool: int):
    """activation(conv(x) + bias) max-pooled over pool x pool windows of stride pool, compiled as one graph."""
    _check_device(weight)
    exact_fp32()
    act = ACTIVATIONS[activation] if activation else None
    pool = int(pool)

    def layer(x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, weight, bias)
        if act is not None:
            y = act(y)
        return F.max_pool2d(y, pool)

    return _runner(_compiled(layer), weight)
