"""cuda-tc-tf32 / cuda-tc-fp16: implicit GEMM on the tensor cores (``cuda/tc.cu``), fp32 accumulate.

Technique: warp-level ``mma.sync`` (m16n8k8 TF32, m16n8k16 FP16) through inline PTX (no headers, so NVRTC
needs no CUDA include path; the fragment layouts are the PTX ISA's, written out in the kernel). Output
positions are the GEMM's M dimension (16-row tiles, CF_RM per warp), maps its N (8-column tiles, M padded
to 8), and the reduction C*K*K is padded to the instruction's k with zero weights. Each lane gathers its A
fragment straight from the image staged in shared memory (a per-block table of k -> byte offset); the
weights are packed on the host in fragment order, converted (TF32 rounding in the kernel, FP16 on the
host) and staged once per block. Blocks loop over images.
Course step: beyond the course's fp32 kernels, its "tensor cores" / "FP16" optimisations (reduced
precision, declared: tolerance 1e-2).
Bottleneck: the A-fragment gathers (one shared load, one add and a conversion per element; 8 per k step
per 16 rows), not the tensor cores: fa18 L2 has 48 FLOPs per gathered element.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch

from convforge.conv import cuda_common as cc

PRECISIONS = ("tf32", "fp16")
SOURCE = "tc.cu"
SMEM_OPTIN_DEFAULT = 227 * 1024
LAUNCH_CONFIGS: tuple[dict, ...] = (
    {"rm": 1, "nt": 128}, {"rm": 2, "nt": 128}, {"rm": 2, "nt": 256}, {"rm": 4, "nt": 128},
    {"rm": 4, "nt": 256}, {"rm": 2, "nt": 256, "round": 0}, {"rm": 4, "nt": 256, "round": 0},
)
DEFAULT_CONFIG = {"rm": 2, "nt": 256, "round": 1}


@dataclass(frozen=True)
class TcGeometry:
    M: int
    C: int
    H: int
    W: int
    K: int
    precision: str
    rm: int = 2
    nt: int = 256
    round: int = 1
    xsmem: bool = True
    bsmem: bool = True

    @property
    def kstep(self): return 16 if self.precision == "fp16" else 8
    @property
    def kr(self): return self.C * self.K * self.K
    @property
    def ks(self): return cc.cdiv(self.kr, self.kstep)
    @property
    def kp(self): return self.ks * self.kstep
    @property
    def ntl(self): return cc.cdiv(self.M, 8)
    @property
    def img(self): return self.C * self.H * self.W
    @property
    def xs_floats(self): return cc.cdiv(self.img, 4) * 4 if self.xsmem else 0
    @property
    def bs_words(self): return self.ks * self.ntl * 64 if self.bsmem else 0
    @property
    def smem_bytes(self): return 4 * (self.xs_floats + self.bs_words + self.kp)

    def spec(self) -> cc.KernelSpec:
        return cc.KernelSpec.of(SOURCE, CF_M=self.M, CF_C=self.C, CF_H=self.H, CF_W=self.W, CF_K=self.K,
                                CF_PREC=1 if self.precision == "fp16" else 0, CF_RM=self.rm, CF_NT=self.nt,
                                CF_XSMEM=int(self.xsmem), CF_BSMEM=int(self.bsmem), CF_TF32_ROUND=self.round)


def plan(M: int, C: int, H: int, W: int, K: int, precision: str, config: Optional[dict] = None,
         smem_optin: int = SMEM_OPTIN_DEFAULT) -> TcGeometry:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    cfg = {**DEFAULT_CONFIG, **(config or {})}
    unknown = set(cfg) - {"rm", "nt", "round"}
    if unknown:
        raise ValueError(f"unknown launch parameters {sorted(unknown)}")
    if cfg["rm"] < 1 or cfg["nt"] % 32 or not 32 <= cfg["nt"] <= 1024:
        raise ValueError(f"bad launch parameters {cfg}")
    geom = TcGeometry(M, C, H, W, K, precision, int(cfg["rm"]), int(cfg["nt"]), int(cfg["round"]))
    for xsmem, bsmem in ((True, True), (True, False), (False, True), (False, False)):
        g = replace(geom, xsmem=xsmem, bsmem=bsmem)
        if g.smem_bytes <= smem_optin:
            return g
    raise ValueError(f"the k-offset table of C*K*K = {geom.kr} does not fit shared memory")


def kernel_specs(M: int, C: int, H: int, W: int, K: int, precision: str = "tf32", config=None,
                 **_) -> list[cc.KernelSpec]:
    return [plan(M, C, H, W, K, precision, config).spec()]


def pack_fragments(weight: torch.Tensor, geom: TcGeometry) -> torch.Tensor:
    """B = weights^T (C*K*K x maps, zero padded) in fragment order: [k step][map tile][lane][register]."""
    M = weight.shape[0]
    wmat = torch.zeros(geom.ntl * 8, geom.kp, dtype=torch.float32, device=weight.device)
    wmat[:M, :geom.kr] = weight.reshape(M, -1)
    dev = weight.device
    ks = torch.arange(geom.ks, device=dev).view(-1, 1, 1, 1)
    nt = torch.arange(geom.ntl, device=dev).view(1, -1, 1, 1)
    lane = torch.arange(32, device=dev).view(1, 1, -1, 1)
    n = nt * 8 + lane // 4                                   # column (map): groupID
    if geom.precision == "tf32":
        reg = torch.arange(2, device=dev).view(1, 1, 1, -1)
        k = ks * 8 + lane % 4 + 4 * reg                      # b0: k = tig, b1: k = tig + 4
        n, k = torch.broadcast_tensors(n, k)
        frag = wmat[n, k]                                    # (KS, NTL, 32, 2)
        return frag.contiguous().view(torch.int32).reshape(-1)
    reg = torch.arange(2, device=dev).view(1, 1, 1, -1, 1)
    half = torch.arange(2, device=dev).view(1, 1, 1, 1, -1)
    k = ks.unsqueeze(-1) * 16 + 2 * (lane.unsqueeze(-1) % 4) + 8 * reg + half   # lower k in the lower half
    n, k = torch.broadcast_tensors(n.unsqueeze(-1), k)
    frag = wmat[n, k].to(torch.float16)                      # (KS, NTL, 32, 2, 2)
    return frag.contiguous().view(torch.int32).reshape(-1)


def unavailable_reason() -> Optional[str]:
    reason = cc.unavailable_reason()
    if reason:
        return reason
    major = torch.cuda.get_device_capability()[0]
    if major < 8:
        return f"needs compute capability 8.0 or newer for TF32/FP16 mma.sync (this GPU is {major}.x)"
    return None


class TcLayer:
    def __init__(self, weight, bias, H: int, W: int, precision: str, config=None):
        M, C, K, _ = weight.shape
        self.device = weight.device
        info = cc.device_info(self.device)
        self.geom = plan(M, C, H, W, K, precision, config, info.smem_per_block_optin)
        self.bfrag = pack_fragments(weight, self.geom)
        self.bias = bias
        self.kernel = cc.kernel(self.geom.spec(), "conv_tc", self.device)
        self.grid_cap = info.sm_count * max(1, self.kernel.blocks_per_sm(self.geom.nt, self.geom.smem_bytes))

    def __call__(self, x: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
        g = self.geom
        B = x.shape[0]
        y, result = cc.output(out, (B, g.M, g.H - g.K + 1, g.W - g.K + 1), x)
        if y.numel():
            self.kernel((min(B, self.grid_cap),), (g.nt,),
                        (cc.ptr(y), cc.ptr(x), cc.ptr(self.bfrag), cc.ptr(self.bias), cc.i32(B)),
                        shared_mem=g.smem_bytes)
        return cc.finish(y, result)


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, precision: str = "tf32", config=None,
            input_hw=None):
    weight, bias = cc.check_weight(weight, bias)
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    layers: dict = {}

    def layer_for(h: int, w: int) -> TcLayer:
        if (h, w) not in layers:
            layers[(h, w)] = TcLayer(weight, bias, h, w, precision, config)
        return layers[(h, w)]

    if input_hw is not None:
        layer_for(*input_hw)

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = cc.check_input(x, weight)
        return layer_for(x.shape[2], x.shape[3])(x, out)

    run.layer_for = layer_for
    return run
