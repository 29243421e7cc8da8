"""torch: the framework's own convolution, F.conv2d (oneDNN on a CPU, cuDNN on a GPU).

Technique: whatever the library picks; on a GPU cuDNN runs with TF32 off so that it is an exact fp32
baseline, with ``cudnn.benchmark`` on so it picks its fastest algorithm for each shape. "torch-tf32" (precision
``tf32``) is the reduced-precision yardstick: cuDNN with TF32 on for its own calls only (the flags are restored
after each call, so the fp32 baseline in the same process stays exact). "torch-bf16" (precision ``bf16``) is the
BF16 entries' yardstick: cuDNN on bfloat16 operands, the weights converted once here, the float32 input each
call, and cuDNN's bf16 output widened to float32 (the registry's contract), conversions counted in its time.
Course step: milestone 1, the framework's convolution before it is swapped for your own.
Bottleneck: library algorithms tuned for many channels; these layers have 1 to 12 input channels.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from convforge.conv import check_input, finish_output, output_buffer

PRECISIONS = ("fp32", "tf32", "bf16")


def exact_fp32() -> None:
    """Make cuDNN and cuBLAS compute in true fp32 (no TF32) and pick the fastest algorithm per shape."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, precision: str = "fp32"):
    if precision not in PRECISIONS:
        raise ValueError(f"torch's convolution here is {', '.join(PRECISIONS)}, not {precision!r}")
    exact_fp32()
    tf32 = precision == "tf32"
    bf16 = precision == "bf16"
    if bf16:   # converted once: the weights are the layer's, not the call's
        operands = (weight.to(torch.bfloat16), None if bias is None else bias.to(torch.bfloat16))
    else:
        operands = (weight, bias)

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        shape = check_input(x, weight)  # F.conv2d would take a 3-d input as one unbatched image
        if tf32:
            with torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False, allow_tf32=True):
                y = F.conv2d(x, *operands)
        else:
            y = F.conv2d(x.to(torch.bfloat16) if bf16 else x, *operands)
        if out is None:
            return y.float()
        buffer, result = output_buffer(out, shape, x)
        buffer.copy_(y)
        return finish_output(buffer, result)

    return run
