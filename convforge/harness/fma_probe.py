"""The GPU's fp32 FMA peak, measured rather than taken from a data sheet: a Triton kernel whose lanes run
CHAINS independent multiply-add chains held in registers (enough to hide the FMA latency), DEPTH deep per
loop trip, so it is bound by FMA issue alone. ``probes.gpu_fma_peak_gflops`` times it; this module imports
Triton, so it is imported only there, on a GPU."""

import triton
import triton.language as tl

CHAINS = 8
DEPTH = 16
BLOCK = 1024          # elements per program; 4 warps: 8 elements x 8 chains = 64 independent FMAs a thread
PROGRAMS_PER_SM = 16  # 64 warps per SM: full occupancy


@triton.jit
def fma_chains(out_ptr, a, b, trips, BLOCK: tl.constexpr, DEPTH: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    s0 = offsets.to(tl.float32) * 1e-9  # distinct starting values, so no chain is folded into another
    s1 = s0 + 0.125
    s2 = s0 + 0.25
    s3 = s0 + 0.375
    s4 = s0 + 0.5
    s5 = s0 + 0.625
    s6 = s0 + 0.75
    s7 = s0 + 0.875
    for _ in range(trips):
        for _ in tl.static_range(DEPTH):
            s0 = s0 * a + b
            s1 = s1 * a + b
            s2 = s2 * a + b
            s3 = s3 * a + b
            s4 = s4 * a + b
            s5 = s5 * a + b
            s6 = s6 * a + b
            s7 = s7 * a + b
    tl.store(out_ptr + offsets, ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)))


def launcher(out, sms: int, trips: int):
    """A call running ``fma_chains`` on ``out`` (sms * PROGRAMS_PER_SM * BLOCK floats) and its FLOP count."""
    grid = (sms * PROGRAMS_PER_SM,)
    flops = 2 * grid[0] * BLOCK * CHAINS * DEPTH * trips

    def run(_):
        fma_chains[grid](out, 0.999, 1e-3, trips, BLOCK=BLOCK, DEPTH=DEPTH, num_warps=4)
    return run, flops
