"""triton-tc-fused: conv on FP16 tensor cores (tl.dot, fp32 sums) with bias + activation + max pool in the epilogue.

Technique: two implicit GEMMs, both with FP16 operands (the fp32 input converted in registers, the weights
packed once in prepare as a zero-padded fp16 (K_pad, N) matrix), fp32 accumulation, and the same epilogue:
rows of the accumulator are ordered so that a pool x pool window's members can be reshaped onto their own
axes, a max over those axes, then the bias and the activation once per pooled output (tanh / relu /
sigmoid / none by tl.constexpr; all are monotone, so act(max + bias) = max(act(conv + bias))), and only
the pooled map is stored. Windows follow F.max_pool2d's floor semantics: conv rows and columns past the
last whole window are never computed. ``prepare`` (no fusion) is pool 1 without activation.
- "rows" (the default where it fits: a power-of-two pool dividing 8, 8 x pow2(M) <= 128 dot columns):
  a dot row is one input-row segment of TW = pow2(8 + K - 1) columns for each (c, p) (16 contiguous,
  aligned floats for K <= 9: vector loads, no offset table), times a Toeplitz weight matrix whose column
  (u, m) holds k[m, c, p, t - u]: one dot row gives 8 neighbouring output columns of all maps. Rows are
  (window row i, image / pooled row / column block); the epilogue reshapes (BLOCK_R, 8 x MP) to
  (P, groups, 8 / P, P, MP) and takes the max over the window's columns and rows. Loads: C*K*TW per 8
  outputs against the gather form's C*K*K per output (3.5x fewer for K = 7), for TW / K (16 / 7) times
  the tensor-core work (the Toeplitz zeros).
- "gather" (every other shape): triton-gemm's implicit GEMM (``triton_gemm.reduction_offsets``: an
  offset per reduction index (c, p, q)) with rows ordered (window row, window, window column) and the A
  tile loaded positions-last (neighbouring lanes read neighbouring inputs); a pool that is not a power
  of two repeats its last row and column in the spare rows (same max).
Both run their reduction as unmasked steps plus one masked tail step (padded indices read a valid input
with weight 0, but 0 * inf would be NaN); the rows kernel masks segments past the input row only where
a layer has them (``ROW_MASK``). Non-finite inputs: the gather kernel reads only real taps, so NaN and
+-Inf land where fp32 arithmetic puts them; the rows kernel's Toeplitz zeros also meet inputs outside an
output's window (Inf * 0 = NaN), so it stores a probe per block (the sum of acc * 0: NaN where any sum
is not finite), and a second launch (``_rows_fixup``) recomputes those blocks in fp32 FMAs over the real
taps; the others return at once.
Precision: FP16 inputs and weights (11-bit mantissas), fp32 sums: the reduced tolerance (1e-2).
Inputs or weights past the fp16 range (|v| > 65504) become inf: a kernel for the fast path of networks
with image-scale inputs, not for arbitrary data.
Course step: the tensor-core (FP16) optimisation of milestone 4 combined with its kernel fusion ("fuse
the unrolling, the matrix multiply and the pooling"): cuda-tc-fp16's arithmetic, cuda-fused-layer's output.
Bottleneck: the A operand's path (fp32 load, convert, shared memory, wgmma) rather than the MMAs: on
fa20 L2 (relu + pool 4, H100) 8 columns per segment took 0.476 ms, 4 columns (same MMA work per output,
twice the A loads) 1.03 ms, 16 columns (twice the MMA work, same A loads) 0.68 ms. The gather form is
A-bound outright (C*K*K 4-byte gathers per conv position: 1.3-1.8 ms on fa20 L2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from convforge.conv import triton_common as common
from convforge.conv import triton_gemm

triton, tl = common.triton, common.tl


@dataclass(frozen=True)
class TcConfig:
    """Launch shape: BLOCK_M conv positions (whole windows) x the maps block per program, BLOCK_K
    reduction indices per tl.dot step, warps and software-pipeline depth."""
    block_m: int = 128
    block_k: int = 32
    num_warps: int = 4
    num_stages: int = 3
    rows: int = 0         # > 0: the "rows" (Toeplitz) kernel with this many output columns per row block

    def __post_init__(self):
        for name in ("block_m", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two of at least 16, got {v}")
        if self.block_k > (128 if self.rows else triton_gemm.K_ALIGN):
            raise ValueError(f"block_k must be at most {triton_gemm.K_ALIGN} (the offset table's padding)")

    def launch_options(self) -> dict:
        return dict(num_warps=self.num_warps, num_stages=self.num_stages)


# Gather kernel (any shape): run 2 (H100) on fa20 L2 relu+pool4, 256 x 16, 4 warps, 1 stage: 1.33 ms.
DEFAULT = TcConfig(256, 16, 4, 1)
# Rows kernel (pow2 pools, M <= 32): run 2, fa20 L2 relu+pool4: 128 x 64, 4 warps, 3 stages: 0.476 ms (the
# best of 11 rows configs; 8 columns per row block: 4 gave 1.03 ms, 16 gave 0.68).
DEFAULT_ROWS = TcConfig(128, 64, 4, 3, rows=8)
SWEEP = (TcConfig(256, 16, 4, 1), TcConfig(256, 32, 4, 3),
         TcConfig(128, 64, 4, 4, rows=8), TcConfig(128, 128, 4, 3, rows=8), TcConfig(128, 64, 4, 2, rows=8),
         TcConfig(128, 64, 4, 1, rows=8), TcConfig(256, 64, 4, 3, rows=8), TcConfig(64, 64, 4, 3, rows=8),
         TcConfig(128, 128, 8, 3, rows=8), TcConfig(256, 128, 8, 3, rows=8), TcConfig(128, 32, 4, 4, rows=8),
         TcConfig(256, 64, 8, 4, rows=8))
INTERPRETER_CONFIG = TcConfig(64, 16, 4, 1)
INTERPRETER_ROWS = TcConfig(64, 32, 4, 1, rows=8)


def choose_config(maps: int, channels: int, kernel: int, pool: int) -> TcConfig:
    """The rows kernel where it fits (``rows_fit``), else the gather kernel; the measured defaults
    (``convforge sweep --impl triton-tc-fused --variants`` times SWEEP), small ones under the interpreter.
    A gather block holds at least one whole (padded) window."""
    if rows_fit(maps, kernel, pool, DEFAULT_ROWS.rows):
        return INTERPRETER_ROWS if common.INTERPRET else DEFAULT_ROWS
    cfg = INTERPRETER_CONFIG if common.INTERPRET else DEFAULT
    ppw = window_rows(pool)
    return cfg if cfg.block_m >= ppw else TcConfig(ppw, cfg.block_k, cfg.num_warps, cfg.num_stages)


def window_rows(pool: int) -> int:
    """Rows a pool x pool window takes in a block: pow2(pool)^2 (spare rows repeat the window's last)."""
    return common.pow2_at_least(pool) ** 2


if triton is not None:
    from convforge.conv.triton_fused_layer import _max_nan

    @triton.jit
    def _step(x_ptr, koff_ptr, w_ptr, x_base, n, acc, k0, KRED: tl.constexpr, NPITCH: tl.constexpr,
              BLOCK_K: tl.constexpr, MASKED: tl.constexpr):
        ks = k0 + tl.arange(0, BLOCK_K)
        koff = tl.load(koff_ptr + ks)               # padded with 0: a valid address, weight rows of 0
        # Loaded as (BLOCK_K, BLOCK_M), positions last: Triton's default layout then spreads neighbouring
        # positions (neighbouring input columns) over a warp's lanes, so a warp's load is a few sectors;
        # (BLOCK_M, BLOCK_K) would spread the reduction indices (strided over rows and channels).
        a_ptrs = x_ptr + (koff[:, None] + x_base[None, :])   # int32 sum, one wide address per element
        if MASKED:
            a = tl.load(a_ptrs, mask=(ks < KRED)[:, None], other=0.0)
        else:
            a = tl.load(a_ptrs)
        wt = tl.load(w_ptr + ks[:, None] * NPITCH + n[None, :])
        return tl.dot(tl.trans(a.to(tl.float16)), wt, acc)

    @triton.jit
    def _tc_fused_kernel(x_ptr, koff_ptr, w_ptr, b_ptr, y_ptr, B,
                         C: tl.constexpr, H: tl.constexpr, W: tl.constexpr, K: tl.constexpr, M: tl.constexpr,
                         BN: tl.constexpr, KRED: tl.constexpr, NPITCH: tl.constexpr, P: tl.constexpr,
                         PW: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
        WP: tl.constexpr = (W - K + 1) // P
        HPWP: tl.constexpr = ((H - K + 1) // P) * WP
        BW: tl.constexpr = BLOCK_M // (PW * PW)      # pooled outputs (windows) per program
        FULL: tl.constexpr = KRED // BLOCK_K
        # Row idx = (window row i, window w, window column j), j fastest: for one i, a pooled row's windows
        # are neighbouring conv columns, so neighbouring rows read neighbouring inputs. PW = pow2(P); a
        # pool that is not a power of two repeats its last row and column in the spare ones (same max).
        idx = tl.arange(0, BLOCK_M)
        j = tl.minimum(idx % PW, P - 1)
        i = tl.minimum(idx // (PW * BW), P - 1)
        win = tl.program_id(0) * BW + (idx // PW) % BW
        b = tl.minimum(win // HPWP, B - 1)           # past the end: re-read the last image, store nothing
        r = win % HPWP
        ph = r // WP
        x_base = b * (C * H * W) + (P * ph + i) * W + P * (r - ph * WP) + j
        n = tl.program_id(1) * BN + tl.arange(0, BN)
        acc = tl.zeros([BLOCK_M, BN], dtype=tl.float32)
        for step in range(FULL):
            acc = _step(x_ptr, koff_ptr, w_ptr, x_base, n, acc, step * BLOCK_K, KRED, NPITCH, BLOCK_K, False)
        if KRED % BLOCK_K != 0:
            acc = _step(x_ptr, koff_ptr, w_ptr, x_base, n, acc, FULL * BLOCK_K, KRED, NPITCH, BLOCK_K, True)
        if PW > 1:   # (PW, BW, PW, BN): max over the window's columns, then its rows
            best = tl.reduce(tl.reduce(tl.reshape(acc, [PW, BW, PW, BN]), 2, _max_nan), 0, _max_nan)
        else:
            best = acc
        if HAS_BIAS:
            best += tl.load(b_ptr + n)[None, :]
        best = common.activation(best, ACT)
        opos = tl.program_id(0) * BW + tl.arange(0, BW)
        valid = opos < B * HPWP
        ob = tl.minimum(opos // HPWP, B - 1)
        y_off = ob * (M * HPWP) + opos % HPWP
        tl.store(y_ptr + y_off[:, None] + n[None, :] * HPWP, best, mask=valid[:, None] & (n[None, :] < M))


if triton is not None:

    @triton.jit
    def _rows_step(x_ptr, w_ptr, x_base, w0, acc, k0, K: tl.constexpr, H: tl.constexpr, W: tl.constexpr,
                   TW: tl.constexpr, KRED: tl.constexpr, N: tl.constexpr, BLOCK_K: tl.constexpr,
                   MASKED: tl.constexpr, ROW_MASK: tl.constexpr):
        ks = k0 + tl.arange(0, BLOCK_K)
        t = ks % TW                                  # input column of the row segment
        cp = ks // TW
        koff = (cp // K) * (H * W) + (cp % K) * W + t
        a_ptrs = x_ptr + (x_base[:, None] + koff[None, :])
        if ROW_MASK:   # some segments run past the input row (their weights are 0, but 0 * inf is NaN)
            mask = (w0[:, None] + t[None, :]) < W
            if MASKED:
                mask = mask & (ks < KRED)[None, :]
            a = tl.load(a_ptrs, mask=mask, other=0.0)
        elif MASKED:
            a = tl.load(a_ptrs, mask=(ks < KRED)[None, :], other=0.0)
        else:
            a = tl.load(a_ptrs)
        wt = tl.load(w_ptr + ks[:, None] * N + tl.arange(0, N)[None, :])
        return tl.dot(a.to(tl.float16), wt, acc)

    @triton.jit
    def _rows_place(B, H: tl.constexpr, W: tl.constexpr, C: tl.constexpr, HP: tl.constexpr, NCB: tl.constexpr,
                    UC: tl.constexpr, P: tl.constexpr, BLOCK_R: tl.constexpr):
        """Row idx = (window row i, group g): g = (b, ph, cb) covers conv row P*ph + i, columns cb*UC .. +UC-1.
        Returns each row's input offset and first conv column."""
        BG: tl.constexpr = BLOCK_R // P
        idx = tl.arange(0, BLOCK_R)
        i = idx // BG
        g = tl.program_id(0) * BG + idx % BG
        b = tl.minimum(g // (HP * NCB), B - 1)       # past the end: re-read the last image, store nothing
        rem = g % (HP * NCB)
        ph = rem // NCB
        w0 = (rem % NCB) * UC
        return b * (C * H * W) + (P * ph + i) * W + w0, w0

    @triton.jit
    def _rows_pool(acc, P: tl.constexpr, BG: tl.constexpr, UP: tl.constexpr, MP: tl.constexpr):
        """(i, g, pooled column pu, window column j, map m) -> (g, pu, m): max over j, then over i."""
        best = tl.reshape(acc, [P, BG, UP, P, MP])
        if P > 1:
            best = tl.reduce(tl.reduce(best, 3, _max_nan), 0, _max_nan)
        return tl.reshape(best, [BG, UP, MP])

    @triton.jit
    def _rows_store(best, b_ptr, y_ptr, B, M: tl.constexpr, MP: tl.constexpr, HP: tl.constexpr,
                    WP: tl.constexpr, NCB: tl.constexpr, UP: tl.constexpr, BG: tl.constexpr,
                    HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
        m = tl.arange(0, MP)
        if HAS_BIAS:
            best += tl.load(b_ptr + m)[None, None, :]
        best = common.activation(best, ACT)
        go = tl.program_id(0) * BG + tl.arange(0, BG)
        ob = tl.minimum(go // (HP * NCB), B - 1)
        orem = go % (HP * NCB)
        pw = (orem % NCB) * UP
        y_base = ob * (M * HP * WP) + (orem // NCB) * WP + pw
        u = tl.arange(0, UP)
        ptrs = y_ptr + (y_base[:, None, None] + u[None, :, None] + m[None, None, :] * (HP * WP))
        ok = ((go < B * HP * NCB)[:, None, None] & ((pw[:, None] + u[None, :]) < WP)[:, :, None]
              & (m < M)[None, None, :])
        tl.store(ptrs, best, mask=ok)

    @triton.jit
    def _rows_kernel(x_ptr, w_ptr, b_ptr, y_ptr, probe_ptr, B,
                     C: tl.constexpr, H: tl.constexpr, W: tl.constexpr, K: tl.constexpr, M: tl.constexpr,
                     MP: tl.constexpr, UC: tl.constexpr, TW: tl.constexpr, P: tl.constexpr,
                     HAS_BIAS: tl.constexpr, ACT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                     ROW_MASK: tl.constexpr):
        HP: tl.constexpr = (H - K + 1) // P
        WP: tl.constexpr = (W - K + 1) // P
        NCB: tl.constexpr = (WP * P + UC - 1) // UC  # column blocks of UC conv columns per conv row
        BG: tl.constexpr = BLOCK_R // P              # row groups (image, pooled row, column block) per program
        UP: tl.constexpr = UC // P                   # pooled columns per column block
        N: tl.constexpr = UC * MP                    # dot columns: (output column u, map m), m fastest
        KRED: tl.constexpr = C * K * TW
        FULL: tl.constexpr = KRED // BLOCK_K
        x_base, w0 = _rows_place(B, H, W, C, HP, NCB, UC, P, BLOCK_R)
        acc = tl.zeros([BLOCK_R, N], dtype=tl.float32)
        for step in range(FULL):
            acc = _rows_step(x_ptr, w_ptr, x_base, w0, acc, step * BLOCK_K, K, H, W, TW, KRED, N, BLOCK_K, False,
                             ROW_MASK)
        if KRED % BLOCK_K != 0:
            acc = _rows_step(x_ptr, w_ptr, x_base, w0, acc, FULL * BLOCK_K, K, H, W, TW, KRED, N, BLOCK_K, True,
                             ROW_MASK)
        # The probe for _rows_fixup: the sum of acc * 0 is NaN where any sum is +-Inf or NaN, else +-0. Stored as
        # is and tested on its bits by the fix-up. On an H100 a test of acc's own bits in this kernel (exponent
        # all ones, or abs(acc) < inf) found none of the NaNs that the tensor cores had put there.
        tl.store(probe_ptr + tl.program_id(0), tl.sum(tl.sum(acc * 0.0, 1), 0))
        _rows_store(_rows_pool(acc, P, BG, UP, MP), b_ptr, y_ptr, B, M, MP, HP, WP, NCB, UP, BG, HAS_BIAS, ACT)

    @triton.jit
    def _rows_fixup(x_ptr, w32_ptr, b_ptr, y_ptr, probe_ptr, B,
                    C: tl.constexpr, H: tl.constexpr, W: tl.constexpr, K: tl.constexpr, M: tl.constexpr,
                    MP: tl.constexpr, UC: tl.constexpr, P: tl.constexpr, HAS_BIAS: tl.constexpr,
                    ACT: tl.constexpr, BLOCK_R: tl.constexpr):
        """The blocks _rows_kernel flagged, again in fp32 FMAs over the real taps only: NaN and +-Inf then land
        where fp32 arithmetic (torch) puts them, not on outputs whose segment merely held a non-finite input
        under a Toeplitz zero. A separate launch keeps this cold path out of the hot kernel's registers
        (inside it, the rows kernel took 916 us on fa20 L2 against 474 without); other blocks return at once."""
        if (tl.load(probe_ptr + tl.program_id(0)) & 0x7FFFFFFF) != 0:   # the probe's float bits: NaN, not +-0
            HP: tl.constexpr = (H - K + 1) // P
            WP: tl.constexpr = (W - K + 1) // P
            NCB: tl.constexpr = (WP * P + UC - 1) // UC
            BG: tl.constexpr = BLOCK_R // P
            UP: tl.constexpr = UC // P
            N: tl.constexpr = UC * MP
            x_base, w0 = _rows_place(B, H, W, C, HP, NCB, UC, P, BLOCK_R)
            nn = tl.arange(0, N)
            u = nn // MP
            acc = tl.zeros([BLOCK_R, N], dtype=tl.float32)
            for k in range(C * K * K):
                q = k % K
                cp = k // K
                xv = tl.load(x_ptr + (x_base[:, None] + ((cp // K) * (H * W) + (cp % K) * W + q) + u[None, :]),
                             mask=(w0[:, None] + u[None, :] + q) < W, other=0.0)
                acc += xv * tl.load(w32_ptr + k * MP + nn % MP)[None, :]
            _rows_store(_rows_pool(acc, P, BG, UP, MP), b_ptr, y_ptr, B, M, MP, HP, WP, NCB, UP, BG, HAS_BIAS,
                        ACT)


ROWS_MAX_N = 128   # dot columns (UC x maps) of the rows kernel: at 256 (fa18 L2 and fa19 L2, 24 maps) its fp32
                   # accumulator spills: 30.2 and 22.1 ms against 3.97 and 2.55 with the gather kernel (run 3)


def rows_fit(maps: int, kernel: int, pool: int, uc: int) -> bool:
    """The rows kernel serves pools of a power of two dividing UC and UC x pow2(maps) <= ROWS_MAX_N."""
    return ((pool & (pool - 1)) == 0 and uc % pool == 0 and uc * _maps_pad(maps) <= ROWS_MAX_N
            and kernel + uc - 1 <= 64)


def _maps_pad(maps: int) -> int:
    return max(2, common.pow2_at_least(maps))


def pack_toeplitz(weight: torch.Tensor, uc: int, tw: int, block: int = 64) -> torch.Tensor:
    """(M, C, K, K) -> (C*K*TW padded to ``block``, UC*MP) float16: row (c, p, t), column (u, m) holds
    k[m, c, p, t - u] where 0 <= t - u < K, else 0 (one input row segment times it gives UC outputs)."""
    maps, channels, kernel, _ = weight.shape
    mp = _maps_pad(maps)
    kred = channels * kernel * tw
    packed = torch.zeros((-(-kred // block) * block, uc, mp), dtype=torch.float32, device=weight.device)
    view = packed[:kred].view(channels, kernel, tw, uc, mp)
    wt = weight.detach().to(torch.float32).permute(1, 2, 3, 0)    # (C, K(p), K(q), M)
    for u in range(uc):
        view[:, :, u:u + kernel, u, :maps] = wt
    return packed.reshape(packed.shape[0], uc * mp).to(torch.float16).contiguous()


def unavailable_reason() -> Optional[str]:
    return common.unavailable_reason()


def pack_weights_fp16(weight: torch.Tensor, pitch: int) -> torch.Tensor:
    """(M, C, K, K) -> (K_pad, pitch) float16: row (c, p, q), column m; zero rows past C*K*K (K_pad: the
    offset table's length) and zero columns past M."""
    maps = weight.shape[0]
    kred = weight[0].numel()
    packed = torch.zeros((-(-kred // triton_gemm.K_ALIGN) * triton_gemm.K_ALIGN, pitch), dtype=torch.float16,
                         device=weight.device)
    packed[:kred, :maps] = weight.detach().reshape(maps, kred).t().to(torch.float16)
    return packed


def _open_call(x: torch.Tensor, out: Optional[torch.Tensor], channels: int, kernel: int, maps: int, pool: int):
    """Both kernels' call opening: x checked; the pooled output's height and width, its buffer and the result to
    return (common.output_for)."""
    common.check_input(x, channels, kernel)
    batch, _, height, width = x.shape
    hp, wp = (height - kernel + 1) // pool, (width - kernel + 1) // pool
    return (hp, wp, *common.output_for(out, (batch, maps, hp, wp), x))


def _prepare(weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str], pool: int,
             config: Optional[TcConfig]):
    maps, channels, kernel, kernel_w = weight.shape
    if kernel != kernel_w:
        raise ValueError(f"square kernels only, got {kernel}x{kernel_w}")
    if activation not in common.ACTIVATION_CODES:
        raise ValueError(f"unknown activation {activation!r}; choose tanh, relu, sigmoid or None")
    if pool < 1:
        raise ValueError(f"pool must be at least 1, got {pool}")
    if isinstance(config, dict):
        config = TcConfig(**config)
    cfg = config or choose_config(maps, channels, kernel, pool)
    if cfg.rows and rows_fit(maps, kernel, pool, cfg.rows):
        return _prepare_rows(weight, bias, activation, pool, cfg)
    ppw = window_rows(pool)
    if cfg.block_m < ppw:
        raise ValueError(f"block_m {cfg.block_m} holds no whole {pool}x{pool} window ({ppw} rows)")
    bn = triton_gemm.block_n(maps)
    n_blocks = -(-maps // bn)
    pitch = bn * n_blocks
    packed = pack_weights_fp16(weight, pitch)
    packed_bias = common.pack_bias(bias, pitch, weight)
    launches: dict = {}   # input (H, W) -> (offset table, constants): one dict lookup per call

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        hp, wp, buffer, result = _open_call(x, out, channels, kernel, maps, pool)
        if buffer.numel() == 0:
            return common.finish(buffer, result)
        height, width = x.shape[2:]
        entry = launches.get((height, width))
        if entry is None:
            entry = launches[(height, width)] = (
                triton_gemm.reduction_offsets(channels, height, width, kernel, x.device),
                dict(C=channels, H=height, W=width, K=kernel, M=maps, BN=bn, KRED=channels * kernel * kernel,
                     NPITCH=pitch, P=pool, PW=common.pow2_at_least(pool), HAS_BIAS=bias is not None,
                     ACT=common.ACTIVATION_CODES[activation], BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k,
                     **cfg.launch_options()))
        koff, constants = entry
        x = common.contiguous_input(x)
        windows_per_program = cfg.block_m // ppw
        for xs, ys, n in common.batch_views(x, buffer, max(channels * height * width, maps * hp * wp)):
            grid = (triton.cdiv(n * hp * wp, windows_per_program), n_blocks)
            _tc_fused_kernel[grid](xs, koff, packed, packed_bias, ys, n, **constants)
        return common.finish(buffer, result)

    return run


def _prepare_rows(weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str], pool: int,
                  cfg: TcConfig):
    maps, channels, kernel, _ = weight.shape
    uc = cfg.rows
    tw = common.pow2_at_least(uc + kernel - 1)
    if cfg.block_m % pool:
        raise ValueError(f"block_m {cfg.block_m} is not a multiple of the pool {pool}")
    packed = pack_toeplitz(weight, uc, tw, max(64, cfg.block_k))
    packed_bias = common.pack_bias(bias, _maps_pad(maps), weight)
    exact = common.pack_weights(weight, _maps_pad(maps))    # (C*K*K, MP) fp32 for the non-finite pass
    launches: dict = {}
    probe_buffers: dict = {}

    def run(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        hp, wp, buffer, result = _open_call(x, out, channels, kernel, maps, pool)
        if buffer.numel() == 0:
            return common.finish(buffer, result)
        height, width = x.shape[2:]
        ncb = -(-(wp * pool) // uc)
        entry = launches.get((height, width))
        if entry is None:
            constants = dict(
                C=channels, H=height, W=width, K=kernel, M=maps, MP=_maps_pad(maps), UC=uc, TW=tw, P=pool,
                HAS_BIAS=bias is not None, ACT=common.ACTIVATION_CODES[activation], BLOCK_R=cfg.block_m,
                BLOCK_K=cfg.block_k, ROW_MASK=(ncb - 1) * uc + tw > width, **cfg.launch_options())
            entry = launches[(height, width)] = (constants, fixup_constants(constants))
        constants, fixup = entry
        x = common.contiguous_input(x)
        groups_per_program = cfg.block_m // pool
        for xs, ys, n in common.batch_views(x, buffer, max(channels * height * width, maps * hp * wp)):
            programs = triton.cdiv(n * hp * ncb, groups_per_program)
            # One probe per program, kept per launch size and never freed: a CUDA graph that captured a
            # buffer keeps writing to it on replay (calls on one stream at a time share it).
            probes = probe_buffers.get((x.device, programs))
            if probes is None:
                probes = probe_buffers[(x.device, programs)] = torch.empty(programs, dtype=torch.float32,
                                                                          device=x.device)
            _rows_kernel[(programs,)](xs, packed, packed_bias, ys, probes, n, **constants)
            _rows_fixup[(programs,)](xs, exact, packed_bias, ys, probes.view(torch.int32), n, **fixup)
        return common.finish(buffer, result)

    return run


def fixup_constants(rows: dict) -> dict:
    """_rows_fixup's constants from _rows_kernel's: the same tiling, no tensor-core operands."""
    keep = ("C", "H", "W", "K", "M", "MP", "UC", "P", "HAS_BIAS", "ACT")
    return dict({k: rows[k] for k in keep}, BLOCK_R=rows["BLOCK_R"], num_warps=4, num_stages=1)


def prepare_fused(weight: torch.Tensor, bias: Optional[torch.Tensor], activation: Optional[str], pool: int,
                  config: Optional[TcConfig] = None):
    """activation(conv(x) + bias), max-pooled over pool x pool windows of stride pool: only that is written."""
    return _prepare(weight, bias, activation, int(pool), config)


def prepare(weight: torch.Tensor, bias: Optional[torch.Tensor] = None, config: Optional[TcConfig] = None):
    """The plain convolution (+ bias) through the same kernel: pool 1, no activation."""
    return _prepare(weight, bias, None, 1, config)
