// cuda-tc-tf32 / cuda-tc-fp16, "rows" kernel for few-channel layers: each kernel row of the filter is a
// banded (Toeplitz) matrix, so an image row times it is a tensor-core product with no gather.
//
// For channel c and kernel row p, output row o of map m gets  sum_k X[c][o+p][w0+k] * T[k][n],
// T[k][n] = weight[m][c][p][k-n] (zero unless 0 <= k-n < K): n walks 8 output columns w0..w0+7 and k the
// 16 input columns w0..w0+15 that feed them (K <= 9). As an mma: A (16 x k) = 16 output rows' input
// columns, straight from the staged image (row-major, one shared load per register, no address table),
// B (k x 8) = T for one map, D (16 x 8) = 16 rows x 8 columns of that map. The 16 A rows are any 16
// (image, output row) pairs: a unit stages CF_IB images and numbers their output rows 0 .. IB*HO-1, so
// layers whose HO is not a multiple of 16 waste no rows (fa17: HO 24, two images = three full tiles).
// One A fragment feeds every map of the warp's map group (MT mmas); B comes from a zero-padded row of
// the filter in shared memory, at a lane-dependent offset: for TF32 (m16n8k8, two k steps) lane (g, t)
// holds T[t][g] = wpad[t - g], T[t+4][g] = wpad[t + 4 - g], and +8 / +12 for the second step; for FP16
// (m16n8k16, one step) the pairs (T[2t][g], T[2t+1][g]) = (wpad[2t-g], wpad[2t+1-g]) come from a table
// of adjacent pairs, one 32-bit load. Only K of each 16 k-columns are non-zero (K/16 of the tensor
// core's work is useful: 44 % at K = 7), which the tensor cores can afford on these layers: the A loads,
// not the mma, set the instruction count, and each feeds MT * 2 (TF32) or MT (FP16) mmas.
//
// Staging: cp.async copies of a unit's images (CF_PIPE 1: one buffer, the other blocks on the SM computing
// meanwhile; CF_PIPE 2: two buffers, the next unit streaming in while this one is computed, at twice the
// shared memory and so fewer resident blocks). TF32 inputs are then rounded to nearest in place, each thread
// rounding the elements it copied (CF_TF32_ROUND); weights are rounded on the host.
// FP16 converts each A pair with one cvt.rn.f16x2 after an 8-byte shared load. Accumulation is fp32.
// Non-finite inputs: the zero taps of each banded B multiply all 16 columns an mma reads, so a non-finite
// input (or, in FP16, one beyond +-65504, which converts to infinity) turns the 16-row x 8-column tiles that
// read it non-finite in every map, where a convolution spoils only the K columns whose window holds it. After
// the k loop each lane folds the first map's accumulator of its rows r0, r1 in each stored column tile into a
// probe (2 * NC FFMAs); a block whose probe turned NaN replaces its non-finite outputs by exact fp32 values after
// its last unit (nonfinite.cuh), so NaN and +-Inf land where torch's fp32 convolution puts them and every other
// output keeps its tensor-core value.
// Fragment layouts (PTX ISA, g = lane / 4, t = lane % 4) as in tc.cu. Epilogue (+ bias), CF_EPI 0: 8-byte
// stores straight from the fragments (each group of 4 lanes writes one 32-byte run of a row, so a warp's
// store touches 8 rows, one sector each); CF_EPI 1: each map's 16 x NC*8 tile goes through a per-warp
// shared scratch and leaves as rows, NC*2 lanes per row with 16-byte stores (4 rows of 128 bytes per
// store at NC = 4): fewer, fuller L2 write requests. ncu put L2 as the busiest unit of the epi 0 kernel on
// fa20 L1 FP16 (L2 86 %, DRAM 51 %, SM 40 %); epi 1 took it from 0.558 to 0.528 ms (not profiled).
// Constants: CF_M CF_C CF_H CF_W CF_K, CF_PREC (0 tf32, 1 fp16), CF_MT (maps per warp tile), CF_NC
// (8-column tiles per warp tile), CF_IB (images per unit), CF_NT (threads), CF_TF32_ROUND, CF_PIPE, CF_EPI,
// CF_STREAM_STORES (evict-first output stores).
// Tried and dropped (session 7, benchmarks/2026-11-21-h200-tc-pairs-fused-layer/tc_sweep_kp.txt): TF32 with each lane's
// two k values mapped to adjacent columns (8-byte A and B loads, as FP16's) was 4-12 % slower on all five
// one-channel layers (fa20 L1 0.645 against 0.575 ms); tc_pairs.cu uses that mapping to better effect.

#include "async_copy.cuh"
#include "mma.cuh"
#include "stores.cuh"
#include "nonfinite.cuh"

#ifndef CF_PREC
#define CF_PREC 0
#endif
#ifndef CF_MT
#define CF_MT 4
#endif
#ifndef CF_NC
#define CF_NC 2
#endif
#ifndef CF_IB
#define CF_IB 1
#endif
#ifndef CF_NT
#define CF_NT 128
#endif
#ifndef CF_TF32_ROUND
#define CF_TF32_ROUND 1
#endif
#ifndef CF_PIPE
#define CF_PIPE 1
#endif
#ifndef CF_EPI
#define CF_EPI 0
#endif

namespace {

constexpr int M = CF_M, C = CF_C, H = CF_H, W = CF_W, K = CF_K;
constexpr int MT = CF_MT, NC = CF_NC, IB = CF_IB, NT = CF_NT;
constexpr int HO = H - K + 1, WO = W - K + 1;
constexpr int CT = (WO + 7) / 8;                        // 8-column output tiles per row
constexpr int CG = (CT + NC - 1) / NC;                  // column groups (a warp tile's width)
constexpr int ROWS = IB * HO;                           // output rows of one unit
constexpr int RT = (ROWS + 15) / 16;                    // 16-row tiles per unit
constexpr int MG = (M + MT - 1) / MT;                   // map groups
constexpr int TILES = RT * CG * MG;                     // warp tiles per unit
constexpr int WROW = 24;                                // padded filter row: 7 zeros, K taps, zeros
constexpr int NEED = CG * NC * 8 + 8;                   // staged columns read (last tile + 15)
// pitch: TF32 loads 4-byte words at g*PITCH + t (conflict-free when PITCH % 8 == 4); FP16 loads 8-byte
// pairs at g*PITCH + 2t (conflict-free per half warp when PITCH % 16 == 8)
constexpr int PITCH = CF_PREC ? ((NEED > W ? NEED : W) + 7) / 16 * 16 + 8
                              : ((NEED > W ? NEED : W) + 3) / 8 * 8 + 4;
constexpr int IMG_S = C * H * PITCH;                    // staged floats per image
constexpr int XS_ONE = (IB * IMG_S + 3) / 4 * 4;          // one staging buffer
constexpr int PIPE = CF_PIPE;                            // 1: one buffer; 2: two, the next unit prefetched
constexpr int XS_FLOATS = (PIPE == 2 ? 2 : 1) * XS_ONE;
constexpr int WS_WORDS = MG * MT * C * K * WROW;
constexpr int NWARPS = NT / 32;
// staged epilogue: a warp's 16 x NC*8 tile of one map; a pitch of 8 or 24 (mod 32) words keeps the
// fragment writes (8-byte, lane g*EPITCH + 2t) conflict-free, and the 16-byte row reads too at NC = 1, 3, 4
// and 5 (at NC = 2 and 6 two rows of a quarter warp share banks: 2-way)
constexpr int EPITCH = (NC * 8) % 16 == 8 ? NC * 8 : NC * 8 + 8;
constexpr int EPI_FLOATS = CF_EPI ? NWARPS * 16 * EPITCH : 0;
static_assert(K <= 9, "the rows kernel covers 8 output columns with 16 input columns: K <= 9");
static_assert(NT % 32 == 0, "CF_NT must be a multiple of 32");

// Issue the copies of the images b0 .. b0+nimg-1 into dst; TF32: round them once they landed.
__device__ __forceinline__ void stage_async(float* dst, const float* __restrict__ x, int b0, int nimg, int lane,
                                            int warp)
{
    stage_rows_async<W, PITCH, NT>(dst, x + (long long)b0 * (C * H * W), nimg * C * H, lane, warp);
}

__device__ __forceinline__ void round_staged(float* dst, int nimg, int lane, int warp)
{
    if constexpr (CF_PREC == 0 && CF_TF32_ROUND) round_rows_tf32<W, PITCH, NT>(dst, nimg * C * H, lane, warp);
}

}  // namespace

// y (B, M, HO, WO) fp32; x (B, C, H, W) fp32; wpad [MG*MT][C][K][WROW] words (TF32: tf32-rounded floats,
// tap q at 7 + q; FP16: half pairs (w[j], w[j+1]) of the same padded row); w (M, C, K, K) fp32 (the exact
// path's); bias (M) or null.
extern "C" __global__ void __launch_bounds__(CF_NT)
conv_tc_rows(float* __restrict__ y, const float* __restrict__ x, const unsigned* __restrict__ wpad,
             const float* __restrict__ w, const float* __restrict__ bias, int B)
{
    extern __shared__ float4 smem4[];
    float* const xs = reinterpret_cast<float*>(smem4);
    unsigned* const ws = reinterpret_cast<unsigned*>(xs + XS_FLOATS);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;

    require_dynamic_smem(4u * (XS_FLOATS + WS_WORDS + EPI_FLOATS));
    // once per block: the filter rows, and zeros in the staging buffers' padding (columns W .. PITCH-1 are
    // read by the last column tile; they must hold finite values because the zero taps of B multiply them;
    // tile rows past a unit's last output row read image 0, row 0, and are not stored)
    for (int i = tid; i < WS_WORDS; i += NT) ws[i] = __ldg(wpad + i);
    for (int i = tid; i < XS_FLOATS; i += NT) xs[i] = 0.0f;
    __syncthreads();                                           // zeros before any copy lands

    const int units = (B + IB - 1) / IB;
    const auto images = [&](int unit) { return B - unit * IB < IB ? B - unit * IB : IB; };
    const auto stage = [&](float* dst, int unit) { stage_async(dst, x, unit * IB, images(unit), lane, warp); };
    stage_first_unit<PIPE>(stage, xs, units);
    int buf = 0;
    float probe = 0.0f;                                        // NaN once an accumulator was not finite
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
        const int b0 = u * IB, nimg = images(u);
        float* const xcur = xs + buf * XS_ONE;
        stage_unit<PIPE>(stage, xs, XS_ONE, buf, u, units);    // this unit landed (PIPE 2: the next one streams in)
        round_staged(xcur, nimg, lane, warp);
        __syncthreads();
        const int rows = nimg * HO;                            // valid output rows of this unit

        for (int tile = warp; tile < TILES; tile += NWARPS) {
            const int mg = tile / (RT * CG);
            const int rem = tile - mg * (RT * CG);
            const int rt = rem / CG, cg = rem - rt * CG;
            const int col0 = cg * NC * 8;
            // this lane's two A rows (output rows r0 = rt*16 + g and r0 + 8 of the unit)
            const int r0 = rt * 16 + g, r1 = r0 + 8;
            const int i0 = r0 < rows ? r0 / HO : 0, o0 = r0 < rows ? r0 - i0 * HO : 0;
            const int i1 = r1 < rows ? r1 / HO : 0, o1 = r1 < rows ? r1 - i1 * HO : 0;
            const float* const xa0 = xcur + i0 * IMG_S + o0 * PITCH + col0 + (CF_PREC ? 2 * t : t);
            const float* const xa1 = xcur + i1 * IMG_S + o1 * PITCH + col0 + (CF_PREC ? 2 * t : t);

            float acc[MT][NC][4];
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int n = 0; n < NC; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.0f;

            const unsigned* wrow = ws + mg * MT * C * K * WROW + (CF_PREC ? 2 * t : t) - g + 7;
#pragma unroll 1
            for (int c = 0; c < C; ++c) {
#pragma unroll
                for (int p = 0; p < K; ++p) {
                    const int xo = (c * H + p) * PITCH;        // rows o + p of channel c
#if CF_PREC == 0
                    unsigned a[NC][2][4];                      // [column tile][k step][register]
                    unsigned bw[MT][4];                        // [map][k step * 2 + register]
#pragma unroll
                    for (int n = 0; n < NC; ++n)
#pragma unroll
                        for (int s = 0; s < 2; ++s) {
                            const int co = xo + n * 8 + s * 8;
                            a[n][s][0] = __float_as_uint(xa0[co]);
                            a[n][s][1] = __float_as_uint(xa1[co]);
                            a[n][s][2] = __float_as_uint(xa0[co + 4]);
                            a[n][s][3] = __float_as_uint(xa1[co + 4]);
                        }
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
                        const unsigned* wr = wrow + ((m * C + c) * K + p) * WROW;
#pragma unroll
                        for (int r = 0; r < 4; ++r) bw[m][r] = wr[4 * r];
                    }
                    // k step outermost: consecutive mmas update different accumulators (an mma's result is
                    // not ready for the next one on the same accumulator for tens of cycles)
#pragma unroll
                    for (int s = 0; s < 2; ++s)
#pragma unroll
                        for (int m = 0; m < MT; ++m)
#pragma unroll
                            for (int n = 0; n < NC; ++n) mma<CF_PREC>(acc[m][n], a[n][s], bw[m][2 * s], bw[m][2 * s + 1]);
#else
                    unsigned a[NC][4];
#pragma unroll
                    for (int n = 0; n < NC; ++n) {
                        const int co = xo + n * 8;
                        const float2 v0 = *reinterpret_cast<const float2*>(xa0 + co);
                        const float2 v1 = *reinterpret_cast<const float2*>(xa1 + co);
                        const float2 v2 = *reinterpret_cast<const float2*>(xa0 + co + 8);
                        const float2 v3 = *reinterpret_cast<const float2*>(xa1 + co + 8);
                        a[n][0] = half2_bits(v0.x, v0.y);
                        a[n][1] = half2_bits(v1.x, v1.y);
                        a[n][2] = half2_bits(v2.x, v2.y);
                        a[n][3] = half2_bits(v3.x, v3.y);
                    }
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
                        const unsigned* wr = wrow + ((m * C + c) * K + p) * WROW;
                        const unsigned bb0 = wr[0], bb1 = wr[8];
#pragma unroll
                        for (int n = 0; n < NC; ++n) mma<CF_PREC>(acc[m][n], a[n], bb0, bb1);
                    }
#endif
                }
            }

            // a non-finite input read by one of this lane's rows (nonfinite.cuh), in the column tiles that are
            // stored (testing the others would keep their mmas, which the compiler drops as dead)
#pragma unroll
            for (int n = 0; n < NC; ++n)
                if (col0 + n * 8 < WO) probe = nonfinite_probe(nonfinite_probe(probe, acc[0][n][0]), acc[0][n][2]);

            // epilogue (+ bias), one map at a time
#if CF_EPI
            float* const es = reinterpret_cast<float*>(ws + WS_WORDS) + warp * (16 * EPITCH);
#endif
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                const int map = mg * MT + m;
                if (map >= M) break;
                const float bm = bias != nullptr ? __ldg(bias + map) : 0.0f;
#if CF_EPI
                // through the warp's scratch: fragments in (c0 c1 = row g, columns 2t, 2t+1 of each 8-column
                // tile; c2 c3 = row g + 8), rows out, 4 columns per lane
#pragma unroll
                for (int n = 0; n < NC; ++n) {
                    *reinterpret_cast<float2*>(es + g * EPITCH + n * 8 + 2 * t) = make_float2(acc[m][n][0], acc[m][n][1]);
                    *reinterpret_cast<float2*>(es + (g + 8) * EPITCH + n * 8 + 2 * t) = make_float2(acc[m][n][2], acc[m][n][3]);
                }
                __syncwarp();
#pragma unroll
                for (int it = 0; it < NC; ++it) {              // 16 rows x 2*NC quads = 32 * NC lanes' worth
                    const int idx = it * 32 + lane, rr = idx / (2 * NC), q = idx - rr * (2 * NC);
                    const int r = rt * 16 + rr, col = col0 + 4 * q;
                    if (r < rows && col < WO) {
                        const int img = r / HO, o = r - img * HO;
                        float4 v = *reinterpret_cast<const float4*>(es + rr * EPITCH + 4 * q);
                        v.x += bm; v.y += bm; v.z += bm; v.w += bm;
                        float* const yc = y + (((long long)(b0 + img) * M + map) * HO + o) * WO + col;
                        if constexpr (WO % 4 == 0) {          // every row starts 16-byte aligned; col + 3 < WO
                            store_out(reinterpret_cast<float4*>(yc), v);
                        } else if constexpr (WO % 2 == 0) {
                            store_out(reinterpret_cast<float2*>(yc), make_float2(v.x, v.y));
                            if (col + 2 < WO) store_out(reinterpret_cast<float2*>(yc + 2), make_float2(v.z, v.w));
                        } else {
                            store_out(yc, v.x);
                            if (col + 1 < WO) store_out(yc + 1, v.y);
                            if (col + 2 < WO) store_out(yc + 2, v.z);
                            if (col + 3 < WO) store_out(yc + 3, v.w);
                        }
                    }
                }
                __syncwarp();                                  // the scratch is free for the next map
#else
                // straight from the fragments: c0 c1 = row r0, columns 2t, 2t+1 of the tile; c2 c3 = row r1
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int r = half ? r1 : r0;
                    if (r >= rows) continue;
                    const int img = half ? i1 : i0, o = half ? o1 : o0;
                    float* const yr = y + (((long long)(b0 + img) * M + map) * HO + o) * WO;
#pragma unroll
                    for (int n = 0; n < NC; ++n) {
                        const int col = col0 + n * 8 + 2 * t;
                        const float v0 = acc[m][n][2 * half] + bm, v1 = acc[m][n][2 * half + 1] + bm;
                        if constexpr (WO % 2 == 0) {           // even rows: every pair is 8-byte aligned
                            if (col < WO) store_out(reinterpret_cast<float2*>(yr + col), make_float2(v0, v1));
                        } else {
                            if (col < WO) store_out(yr + col, v0);
                            if (col + 1 < WO) store_out(yr + col + 1, v1);
                        }
                    }
                }
#endif
            }
        }
        __syncthreads();                                       // every warp is done with xcur before it refills
        if constexpr (PIPE == 2) buf ^= 1;
    }
    redo_nonfinite_outputs<C, H, W, K, M, NT, IB>(probe != 0.0f, y, x, w, bias, B);
}
