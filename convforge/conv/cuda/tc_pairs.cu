// cuda-tc-tf32 / cuda-tc-fp16, "pairs" kernel for few-channel layers with K <= 7: one mma row computes two
// adjacent output columns, so the 8 columns of B are 4 maps x 2 column shifts and almost no tensor-core
// work is wasted.
//
// The implicit GEMM's rows are output position pairs (o, 2j) and (o, 2j + 1). One kernel row p of both
// reads the K + 1 <= 8 input columns 2j .. 2j + K of input row o + p, which is exactly one mma k step of 8:
//   D[(o, j)][(map, s)] += sum_k X[c][o + p][2j + k] * Bw[k][(map, s)],  Bw[k][(map, s)] = w[map][c][p][k - s]
// (zero unless 0 <= k - s < K), s = 0, 1 the column shift. A rows are plain 8-column runs of the staged
// image (no gather table), B is a function of (c, p) alone and is held in registers for the whole kernel.
// Useful work is K/8 of every mma (88 % at K = 7), where the rows kernel (one map's 8 columns per mma,
// 16 k columns for K <= 9) gets K/16: half the mmas for the same output.
// TF32 (m16n8k8): one k step per (c, p); lane (g, t)'s two k values are mapped to the adjacent columns 2t,
// 2t + 1 (the order of k within an mma is free as long as A and B agree), so each A register pair is one
// 8-byte shared load. FP16 (m16n8k16): one k step covers kernel rows p and p + 1 (k 0..7 and 8..15), so
// K rows take (K + 1) / 2 steps; each A register is a converted pair (cvt.rn.f16x2).
// Fragments (PTX ISA; g = lane / 4, t = lane % 4): A rows g and g + 8 are the lane's two positions; B column
// n = g is (map 4j + g / 2, shift g % 2); D columns 2t, 2t + 1 are map 4j + t at shifts 0, 1, i.e. the two
// columns of one output pair, stored as one 8-byte store when WO is even.
// Staging: cp.async copies of a unit's CF_IB images into shared rows of PITCH floats, padded with zeros (the
// last pair of a row may read up to column 2 * NPR + 5, past W; its B taps are zero there, so the values
// must be finite); TF32 inputs are rounded to nearest in place once (CF_TF32_ROUND), weights as each lane
// builds its B fragments. Positions past the unit's end read position 0 and are not stored.
// Non-finite inputs, as in the rows kernel: a non-finite input (FP16: or one beyond +-65504) spoils every map
// and both columns of the pairs whose 8-column runs read it; each lane tests map tile 0 of its two positions
// per tile, and a block that saw one replaces its non-finite outputs by exact fp32 values at the end.
// Constants: CF_M CF_C CF_H CF_W CF_K, CF_PREC (0 tf32, 1 fp16), CF_IB (images per unit), CF_NT (threads),
// CF_RT (16-position tiles per warp step), CF_TF32_ROUND, CF_STREAM_STORES.

#include "async_copy.cuh"
#include "mma.cuh"
#include "stores.cuh"
#include "nonfinite.cuh"

#ifndef CF_PREC
#define CF_PREC 0
#endif
#ifndef CF_IB
#define CF_IB 1
#endif
#ifndef CF_NT
#define CF_NT 128
#endif
#ifndef CF_RT
#define CF_RT 2
#endif
#ifndef CF_TF32_ROUND
#define CF_TF32_ROUND 1
#endif

namespace {

constexpr int M = CF_M, C = CF_C, H = CF_H, W = CF_W, K = CF_K;
constexpr int IB = CF_IB, NT = CF_NT, RT = CF_RT, NWARPS = NT / 32;
constexpr int HO = H - K + 1, WO = W - K + 1;
constexpr int NPR = (WO + 1) / 2;                       // output pairs per row (the last may be half)
constexpr int POS = HO * NPR;                           // pairs per image
constexpr int NTL = (M + 3) / 4;                        // 8-column B tiles: 4 maps x 2 shifts each
constexpr int KS = CF_PREC ? (K + 1) / 2 : K;           // k steps per channel
constexpr int NEED = 2 * NPR + 6;                       // staged columns read: 0 .. last pair's start + 7
// 8-byte loads at row * PITCH + 2 (j + t): PITCH % 16 == 8 keeps two rows of one half warp apart
constexpr int PITCH = ((NEED > W ? NEED : W) + 7) / 16 * 16 + 8;
constexpr int IMG_S = C * H * PITCH;                    // staged floats per image
constexpr int XS_FLOATS = (IB * IMG_S + 3) / 4 * 4;
static_assert(K <= 7, "a pair's K + 1 input columns must fit one 8-wide k step: K <= 7");
static_assert(NT % 32 == 0, "CF_NT must be a multiple of 32");
static_assert(NTL * C * KS * 2 <= 96, "B fragments are held in registers: too many maps x channels x rows");

__device__ __forceinline__ float weight_or_zero(const float* __restrict__ w, int map, int c, int p, int q)
{
    return (map < M && p < K && q >= 0 && q < K) ? __ldg(w + ((map * C + c) * K + p) * K + q) : 0.0f;
}

}  // namespace

// y (B, M, HO, WO) fp32; x (B, C, H, W) fp32; w (M, C, K, K) fp32; bias (M) or null.
extern "C" __global__ void __launch_bounds__(CF_NT)
conv_tc_pairs(float* __restrict__ y, const float* __restrict__ x, const float* __restrict__ w,
              const float* __restrict__ bias, int B)
{
    extern __shared__ float4 smem4[];
    float* const xs = reinterpret_cast<float*>(smem4);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;

    require_dynamic_smem(4u * XS_FLOATS);
    // this lane's B fragments for every (tile, channel, k step): column n = g is map 4j + g/2, shift g%2
    unsigned bw[NTL][C][KS][2];
    {
        const int sh = g & 1;
#pragma unroll
        for (int j = 0; j < NTL; ++j) {
            const int map = 4 * j + (g >> 1);
#pragma unroll
            for (int c = 0; c < C; ++c)
#pragma unroll
                for (int s = 0; s < KS; ++s) {
                    if constexpr (CF_PREC == 0) {     // k = t -> column 2t, k = t + 4 -> column 2t + 1
                        bw[j][c][s][0] = tf32_bits<true>(weight_or_zero(w, map, c, s, 2 * t - sh));
                        bw[j][c][s][1] = tf32_bits<true>(weight_or_zero(w, map, c, s, 2 * t + 1 - sh));
                    } else {                          // rows 2s (k 0..7) and 2s + 1 (k 8..15)
                        bw[j][c][s][0] = half2_bits(weight_or_zero(w, map, c, 2 * s, 2 * t - sh),
                                                    weight_or_zero(w, map, c, 2 * s, 2 * t + 1 - sh));
                        bw[j][c][s][1] = half2_bits(weight_or_zero(w, map, c, 2 * s + 1, 2 * t - sh),
                                                    weight_or_zero(w, map, c, 2 * s + 1, 2 * t + 1 - sh));
                    }
                }
        }
    }
    for (int i = tid; i < XS_FLOATS; i += NT) xs[i] = 0.0f;    // the padding columns stay zero
    __syncthreads();                                           // zeros before any copy lands

    float probe = 0.0f;                                        // NaN once an accumulator was not finite
    const int units = (B + IB - 1) / IB;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
        const int b0 = u * IB, nimg = B - b0 < IB ? B - b0 : IB;
        stage_rows_async<W, PITCH, NT>(xs, x + (long long)b0 * (C * H * W), nimg * C * H, lane, warp);
        copy_commit();
        copy_wait<0>();
        if constexpr (CF_PREC == 0 && CF_TF32_ROUND) round_rows_tf32<W, PITCH, NT>(xs, nimg * C * H, lane, warp);
        __syncthreads();
        const int npos = nimg * POS;                           // valid pairs of this unit
        const int tiles = (npos + 15) / 16;

        for (int tile0 = warp * RT; tile0 < tiles; tile0 += NWARPS * RT) {
            int off[RT][2], img[RT][2], o[RT][2], jj[RT][2];   // this lane's two positions per tile
#pragma unroll
            for (int r = 0; r < RT; ++r)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    int pos = (tile0 + r) * 16 + g + 8 * h;
                    if (pos >= npos) pos = -1;
                    const int q = pos < 0 ? 0 : pos;
                    img[r][h] = q / POS;
                    const int rem = q - img[r][h] * POS;
                    o[r][h] = rem / NPR;
                    jj[r][h] = pos < 0 ? -1 : rem - o[r][h] * NPR;
                    off[r][h] = img[r][h] * IMG_S + o[r][h] * PITCH + 2 * (rem - o[r][h] * NPR) + 2 * t;
                }
            float acc[RT][NTL][4];
#pragma unroll
            for (int r = 0; r < RT; ++r)
#pragma unroll
                for (int j = 0; j < NTL; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[r][j][e] = 0.0f;

#pragma unroll
            for (int c = 0; c < C; ++c)
#pragma unroll
                for (int s = 0; s < KS; ++s) {
                    unsigned a[RT][4];
#pragma unroll
                    for (int r = 0; r < RT; ++r) {
                        if constexpr (CF_PREC == 0) {          // a0 a2 = row g, columns 2t, 2t+1; a1 a3 = row g+8
                            const float2 v0 = *reinterpret_cast<const float2*>(xs + off[r][0] + (c * H + s) * PITCH);
                            const float2 v1 = *reinterpret_cast<const float2*>(xs + off[r][1] + (c * H + s) * PITCH);
                            a[r][0] = __float_as_uint(v0.x);
                            a[r][2] = __float_as_uint(v0.y);
                            a[r][1] = __float_as_uint(v1.x);
                            a[r][3] = __float_as_uint(v1.y);
                        } else {                               // a0 a1: kernel row 2s; a2 a3: row 2s + 1
                            const int base = (c * H + 2 * s) * PITCH;
                            const float2 v0 = *reinterpret_cast<const float2*>(xs + off[r][0] + base);
                            const float2 v1 = *reinterpret_cast<const float2*>(xs + off[r][1] + base);
                            a[r][0] = half2_bits(v0.x, v0.y);
                            a[r][1] = half2_bits(v1.x, v1.y);
                            if (2 * s + 1 < K) {
                                const float2 v2 = *reinterpret_cast<const float2*>(xs + off[r][0] + base + PITCH);
                                const float2 v3 = *reinterpret_cast<const float2*>(xs + off[r][1] + base + PITCH);
                                a[r][2] = half2_bits(v2.x, v2.y);
                                a[r][3] = half2_bits(v3.x, v3.y);
                            } else {
                                a[r][2] = a[r][3] = 0u;        // the missing row K: zero weights, zero inputs
                            }
                        }
                    }
                    // tiles innermost: consecutive mmas update different accumulators
#pragma unroll
                    for (int j = 0; j < NTL; ++j)
#pragma unroll
                        for (int r = 0; r < RT; ++r)
                            if (tile0 + r < tiles) mma<CF_PREC>(acc[r][j], a[r], bw[j][c][s][0], bw[j][c][s][1]);
                }

            // a non-finite input read by one of this lane's positions (nonfinite.cuh)
#pragma unroll
            for (int r = 0; r < RT; ++r) probe = nonfinite_probe(nonfinite_probe(probe, acc[r][0][0]), acc[r][0][2]);

            // epilogue (+ bias): c0 c1 = map 4j + t, the pair (o, 2jj), (o, 2jj + 1) of position g; c2 c3 of g + 8
#pragma unroll
            for (int j = 0; j < NTL; ++j) {
                const int map = 4 * j + t;
                if (map >= M) continue;
                const float bm = bias != nullptr ? __ldg(bias + map) : 0.0f;
#pragma unroll
                for (int r = 0; r < RT; ++r)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        if (jj[r][h] < 0) continue;
                        const int col = 2 * jj[r][h];
                        float* const yp = y + (((long long)(b0 + img[r][h]) * M + map) * HO + o[r][h]) * WO + col;
                        const float v0 = acc[r][j][2 * h] + bm, v1 = acc[r][j][2 * h + 1] + bm;
                        if constexpr (WO % 2 == 0) {
                            store_out(reinterpret_cast<float2*>(yp), make_float2(v0, v1));
                        } else {
                            store_out(yp, v0);
                            if (col + 1 < WO) store_out(yp + 1, v1);
                        }
                    }
            }
        }
        __syncthreads();                                       // every warp is done with xs before it refills
    }
    redo_nonfinite_outputs<C, H, W, K, M, NT, IB>(probe != 0.0f, y, x, w, bias, B);
}
