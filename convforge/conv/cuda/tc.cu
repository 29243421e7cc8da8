// cuda-tc-tf32 / cuda-tc-fp16: implicit GEMM on the tensor cores (warp-level mma.sync), fp32 accumulate.
//
// GEMM per image: D (positions x maps) = A (positions x C*K*K) * B (C*K*K x maps). Output positions are
// the GEMM's M dimension (16-row mma tiles), maps its N (8-column tiles; M padded to 8), the reduction
// C*K*K is padded to the instruction's k (8 for TF32: m16n8k8; 16 for FP16: m16n8k16) with zero weights.
// A is never formed: each lane gathers its fragment elements straight from the image (staged in shared
// memory): element (pos, k) = x[rowbase(pos) + koff(k)], rowbase = h*W + w, koff = c*H*W + p*W + q
// (a per-block table in shared memory). B is packed on the host in fragment order (lane-major, so a
// lane's two registers are one 8-byte load) and staged once per block. Fragments follow the PTX ISA
// layouts (groupID = lane/4, tig = lane%4):
//   m16n8k8 tf32: a0 (g, t) a1 (g+8, t) a2 (g, t+4) a3 (g+8, t+4); b0 (k t, n g) b1 (k t+4, n g)
//   m16n8k16 f16: a0 (g, 2t..2t+1) a1 (g+8, 2t..) a2 (g, 2t+8..) a3 (g+8, 2t+8..); b0 (k 2t.., n g)
//                 b1 (k 2t+8.., n g); each register two halves, the lower k in the lower half
//   c0 (g, 2t) c1 (g, 2t+1) c2 (g+8, 2t) c3 (g+8, 2t+1)
// A warp owns CF_RM 16-row tiles x all map tiles; blocks loop over images (persistent grid). Small batches:
// blockIdx.y splits an image's tiles over gridDim.y blocks, each staging the image (at 10 images one block
// an image left most SMs idle). A block that saw a non-finite value redoes its images' non-finite outputs,
// whichever block's tiles they are: each output ends as its tensor-core value or its exact one.
// Inline PTX only, no headers: NVRTC needs no CUDA include path. Declared reduced precision: TF32 keeps
// 10 mantissa bits (weights rounded to nearest on staging; inputs too with CF_TF32_ROUND=1, else the
// hardware truncates them),
// FP16 11; products are exact and accumulate in fp32.
// CF_PREC 2, 3xTF32 (fp32-accurate, held to the exact tolerance): each operand as big + small TF32 parts, the
// weights split on the host (B fragments of four registers: big b0 b1, small b0 b1), each gathered input split
// in registers (tf32_split); a k step's three products a_small*b_big + a_big*b_small + a_big*b_big go to a fresh
// sum that an fp32 add folds into the accumulator: the tensor cores' accumulation truncates, and in one
// long-lived accumulator that bias adds up over C*K*K (cuda_igemm's FLUSH_NOTE).
// Non-finite inputs: a padded k re-reads the window's first element with a zero weight (Inf * 0 = NaN there,
// where torch gives +-Inf), and FP16 turns |v| > 65504 into infinity; any such input makes every map of the
// positions that read it non-finite. Each lane tests map tile 0 of its positions after the k loop; a block that
// saw one replaces its non-finite outputs by exact fp32 values after its last image (nonfinite.cuh).
// Constants: CF_M CF_C CF_H CF_W CF_K, CF_PREC (0 tf32, 1 fp16, 2 3xtf32), CF_RM, CF_NT, CF_XSMEM, CF_BSMEM,
// CF_TF32_ROUND, CF_STREAM_STORES (evict-first output stores), CF_OUT_HALF (1: y in FP16, for a consumer that
// reads FP16: half the output bytes; the caller bounds the values), CF_IN_HALF (1: x in FP16 bits, from a producer
// that writes FP16, e.g. cuda-direct's CF_OUT_HALF: half the input bytes read; staged into shared memory as the
// kernel stages an fp32 image, so CF_XSMEM; the exact pass for non-finite outputs reads the FP16 values), CF_XHALF
// (below).
// CF_XHALF (FP16, W even): the image is staged once as FP16 in two copies, the second shifted by one element, and
// the reduction runs over kernel rows padded to an even number of taps KE (a zero-weight tap past an odd K). A
// register's two k (2t, 2t+1: taps q, q+1 of one kernel row, q even) are then two neighbouring inputs, which sit
// in one aligned 32-bit word of the copy matching the position's column parity: one shared load per register,
// where the fp32 image takes two loads, two address adds and a conversion.

#include "async_copy.cuh"
#include "mma.cuh"
#include "stores.cuh"
#include "nonfinite.cuh"

#ifndef CF_PREC
#define CF_PREC 0
#endif
#ifndef CF_RM
#define CF_RM 2
#endif
#ifndef CF_NT
#define CF_NT 256
#endif
#ifndef CF_XSMEM
#define CF_XSMEM 1
#endif
#ifndef CF_BSMEM
#define CF_BSMEM 1
#endif
#ifndef CF_TF32_ROUND
#define CF_TF32_ROUND 1
#endif
#ifndef CF_OUT_HALF
#define CF_OUT_HALF 0
#endif
#ifndef CF_XHALF
#define CF_XHALF 0
#endif
#ifndef CF_IN_HALF
#define CF_IN_HALF 0
#endif

namespace {

constexpr int M = CF_M, C = CF_C, H = CF_H, W = CF_W, K = CF_K, RM = CF_RM, NT = CF_NT;
constexpr int HO = H - K + 1, WO = W - K + 1, P = HO * WO;
constexpr int KE = CF_XHALF ? K + (K & 1) : K;         // taps per kernel row in the reduction (CF_XHALF: even)
constexpr int KR = C * K * KE;                         // reduction length
constexpr int KSTEP = CF_PREC == 1 ? 16 : 8;           // the instruction's k
constexpr bool SPLIT3 = CF_PREC == 2;                  // 3xTF32
constexpr int KS = (KR + KSTEP - 1) / KSTEP;           // k steps
constexpr int KP = KS * KSTEP;                         // padded reduction length
constexpr int NTL = (M + 7) / 8;                       // 8-map tiles
constexpr int IMG = C * H * W;
constexpr int XW = IMG / 2 + 1;                        // CF_XHALF: 32-bit words per FP16 copy (one of padding)
constexpr int XS_FLOATS = CF_XHALF ? 2 * XW : CF_XSMEM ? (IMG + 3) / 4 * 4 : 0;
constexpr int BW = SPLIT3 ? 4 : 2;                     // B registers per lane per (k step, map tile)
constexpr int BS_WORDS = CF_BSMEM ? KS * NTL * 32 * BW : 0;
constexpr int PT = (P + 16 * RM - 1) / (16 * RM);      // position tiles per image
constexpr int NWARPS = NT / 32;
static_assert(NT % 32 == 0, "CF_NT must be a multiple of 32");
static_assert(!CF_XHALF || (CF_PREC == 1 && CF_XSMEM && W % 2 == 0), "CF_XHALF needs FP16, CF_XSMEM and an even W");
static_assert(!CF_IN_HALF || CF_XSMEM, "CF_IN_HALF needs CF_XSMEM (the image is read from shared memory)");
static_assert(!SPLIT3 || (!CF_IN_HALF && !CF_OUT_HALF), "3xTF32 reads and writes fp32");
#if CF_IN_HALF
typedef unsigned short in_t;                           // FP16 bits
#else
typedef float in_t;
#endif
#if CF_OUT_HALF
typedef unsigned short out_t;                          // FP16 bits (stores.cuh's output_element)
#else
typedef float out_t;
#endif

// the byte offset `off` from `base` (offsets are kept in bytes so a gather is one add and one load)
__device__ __forceinline__ float at(const float* base, int off)
{
    return *reinterpret_cast<const float*>(reinterpret_cast<const char*>(base) + off);
}

// the 32-bit word (two FP16 inputs) at byte offset `off` from `base` (CF_XHALF)
__device__ __forceinline__ unsigned word_at(const float* base, int off)
{
    return *reinterpret_cast<const unsigned*>(reinterpret_cast<const char*>(base) + off);
}

// CF_XHALF: the byte offset of input element e's pair (e, e + 1) in the copy matching e's parity
__device__ __forceinline__ int pair_offset(int e)
{
    return (e & 1) * (4 * XW) + (e >> 1) * 4;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(CF_NT)
conv_tc(out_t* __restrict__ y, const in_t* __restrict__ x, const unsigned* __restrict__ bfrag,
        const float* __restrict__ w, const float* __restrict__ bias, int B)
{
    extern __shared__ float4 smem4[];
    float* const xs = reinterpret_cast<float*>(smem4);
    unsigned* const bs = reinterpret_cast<unsigned*>(xs + XS_FLOATS);
    int* const koff = reinterpret_cast<int*>(bs + BS_WORDS);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;

    require_dynamic_smem(4u * (XS_FLOATS + BS_WORDS + KP));
    // per block, once: the k -> input byte offset table (padded k points at element 0; its weight is zero).
    // CF_XHALF: offsets within a copy, of even elements (q even, W even), read for even k only.
    for (int k = tid; k < KP; k += NT) {
        const int c = k / (K * KE), r = k - c * (K * KE), p = r / KE, q = r - p * KE;
        koff[k] = k < KR ? (CF_XHALF ? 2 : 4) * ((c * H + p) * W + q) : 0;     // bytes
    }
    if constexpr (CF_BSMEM) {
        for (int i = tid; i < BS_WORDS; i += NT) {
            const unsigned v = __ldg(bfrag + i);
            bs[i] = CF_PREC ? v : tf32_bits<true>(__uint_as_float(v));   // (3xTF32: split on the host)
        }
    }
    __syncthreads();

    float probe = 0.0f;                                        // NaN once an accumulator was not finite
    for (long long b = blockIdx.x; b < B; b += gridDim.x) {
        const in_t* const xb = x + b * (long long)IMG;
        if constexpr (CF_XSMEM) {
            __syncthreads();                                   // the previous image is done with xs
            if constexpr (CF_XHALF && CF_IN_HALF) {   // the FP16 image's words as they are (IMG even: W even)
                unsigned* const xw = reinterpret_cast<unsigned*>(xs);
                const unsigned* const src = reinterpret_cast<const unsigned*>(xb);   // 4-byte aligned: IMG even
                for (int j = tid; j < XW; j += NT) {
                    const unsigned w0 = j < IMG / 2 ? __ldg(src + j) : 0u;
                    const unsigned w1 = j + 1 < IMG / 2 ? __ldg(src + j + 1) : 0u;
                    xw[j] = w0;
                    xw[XW + j] = (w0 >> 16) | (w1 << 16);
                }
            } else if constexpr (CF_XHALF) {   // word j: (x[2j], x[2j+1]) in the first copy, (x[2j+1], x[2j+2]) in the second
                unsigned* const xw = reinterpret_cast<unsigned*>(xs);
                for (int j = tid; j < XW; j += NT) {
                    const float v0 = 2 * j < IMG ? __ldg(xb + 2 * j) : 0.0f;
                    const float v1 = 2 * j + 1 < IMG ? __ldg(xb + 2 * j + 1) : 0.0f;
                    const float v2 = 2 * j + 2 < IMG ? __ldg(xb + 2 * j + 2) : 0.0f;
                    xw[j] = half2_bits(v0, v1);
                    xw[XW + j] = half2_bits(v1, v2);
                }
            } else if constexpr (CF_IN_HALF && IMG % 4 == 0) {   // widened to fp32 (exact), 4 halves per 8-byte load
                const uint2* src = reinterpret_cast<const uint2*>(xb);   // 8-byte aligned: IMG % 4 == 0
                for (int i = tid; i < IMG / 4; i += NT) {
                    const uint2 v = __ldg(src + i);
                    smem4[i] = make_float4(output_as_float((unsigned short)(v.x & 0xffffu)),
                                           output_as_float((unsigned short)(v.x >> 16)),
                                           output_as_float((unsigned short)(v.y & 0xffffu)),
                                           output_as_float((unsigned short)(v.y >> 16)));
                }
            } else if constexpr (CF_IN_HALF) {
                for (int i = tid; i < IMG; i += NT) xs[i] = output_as_float(__ldg(xb + i));
            } else if constexpr (IMG % 4 == 0) {
                const float4* src = reinterpret_cast<const float4*>(xb);   // 16-byte aligned: IMG % 4 == 0
                for (int i = tid; i < IMG / 4; i += NT) smem4[i] = __ldg(src + i);
            } else {
                for (int i = tid; i < IMG; i += NT) xs[i] = __ldg(xb + i);
            }
            __syncthreads();
        }
        const float* const src = CF_XSMEM ? xs : reinterpret_cast<const float*>(xb);   // (CF_IN_HALF: xs)

        for (int tile = blockIdx.y * NWARPS + warp; tile < PT; tile += NWARPS * gridDim.y) {
            int rb0[RM], rb1[RM];                               // row bases (bytes) of this lane's rows g, g+8
#pragma unroll
            for (int i = 0; i < RM; ++i) {
                const int p0 = (tile * RM + i) * 16 + gid, p1 = p0 + 8;
                const int e0 = p0 < P ? (p0 / WO) * W + p0 % WO : 0, e1 = p1 < P ? (p1 / WO) * W + p1 % WO : 0;
                rb0[i] = CF_XHALF ? pair_offset(e0) : 4 * e0;   // bytes
                rb1[i] = CF_XHALF ? pair_offset(e1) : 4 * e1;
            }
            float acc[RM][NTL][4];
#pragma unroll
            for (int i = 0; i < RM; ++i)
#pragma unroll
                for (int n = 0; n < NTL; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[i][n][e] = 0.0f;

#pragma unroll 2
            for (int ks = 0; ks < KS; ++ks) {
                unsigned a[RM][4];
#if CF_PREC == 2
                unsigned as[RM][4];                            // the inputs' small parts
                const int k0 = koff[ks * 8 + tig], k1 = koff[ks * 8 + tig + 4];
#pragma unroll
                for (int i = 0; i < RM; ++i) {
                    tf32_split(at(src, rb0[i] + k0), a[i][0], as[i][0]);
                    tf32_split(at(src, rb1[i] + k0), a[i][1], as[i][1]);
                    tf32_split(at(src, rb0[i] + k1), a[i][2], as[i][2]);
                    tf32_split(at(src, rb1[i] + k1), a[i][3], as[i][3]);
                }
#elif CF_PREC == 0
                const int k0 = koff[ks * 8 + tig], k1 = koff[ks * 8 + tig + 4];
#pragma unroll
                for (int i = 0; i < RM; ++i) {
                    a[i][0] = tf32_bits<CF_TF32_ROUND>(at(src, rb0[i] + k0));
                    a[i][1] = tf32_bits<CF_TF32_ROUND>(at(src, rb1[i] + k0));
                    a[i][2] = tf32_bits<CF_TF32_ROUND>(at(src, rb0[i] + k1));
                    a[i][3] = tf32_bits<CF_TF32_ROUND>(at(src, rb1[i] + k1));
                }
#elif CF_XHALF
                const int k0 = koff[ks * 16 + 2 * tig], k2 = koff[ks * 16 + 2 * tig + 8];
#pragma unroll
                for (int i = 0; i < RM; ++i) {
                    a[i][0] = word_at(src, rb0[i] + k0);
                    a[i][1] = word_at(src, rb1[i] + k0);
                    a[i][2] = word_at(src, rb0[i] + k2);
                    a[i][3] = word_at(src, rb1[i] + k2);
                }
#else
                const int k0 = koff[ks * 16 + 2 * tig], k1 = koff[ks * 16 + 2 * tig + 1];
                const int k2 = koff[ks * 16 + 2 * tig + 8], k3 = koff[ks * 16 + 2 * tig + 9];
#pragma unroll
                for (int i = 0; i < RM; ++i) {
                    a[i][0] = half2_bits(at(src, rb0[i] + k0), at(src, rb0[i] + k1));
                    a[i][1] = half2_bits(at(src, rb1[i] + k0), at(src, rb1[i] + k1));
                    a[i][2] = half2_bits(at(src, rb0[i] + k2), at(src, rb0[i] + k3));
                    a[i][3] = half2_bits(at(src, rb1[i] + k2), at(src, rb1[i] + k3));
                }
#endif
#if CF_PREC == 2
#pragma unroll
                for (int n = 0; n < NTL; ++n) {
                    const int idx = ((ks * NTL + n) * 32 + lane) * BW;
                    const uint4 b = CF_BSMEM ? *reinterpret_cast<const uint4*>(bs + idx)
                                             : __ldg(reinterpret_cast<const uint4*>(bfrag + idx));
#pragma unroll
                    for (int i = 0; i < RM; ++i) {
                        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};       // this k step's fresh sum
                        mma<0>(part, as[i], b.x, b.y);
                        mma<0>(part, a[i], b.z, b.w);
                        mma<0>(part, a[i], b.x, b.y);
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc[i][n][e] += part[e];
                    }
                }
#else
#pragma unroll
                for (int n = 0; n < NTL; ++n) {
                    unsigned b0, b1;
                    const int idx = ((ks * NTL + n) * 32 + lane) * BW;
                    if constexpr (CF_BSMEM) {
                        const uint2 v = *reinterpret_cast<const uint2*>(bs + idx);
                        b0 = v.x; b1 = v.y;
                    } else {
                        const uint2 v = __ldg(reinterpret_cast<const uint2*>(bfrag + idx));
                        b0 = CF_PREC ? v.x : tf32_bits<true>(__uint_as_float(v.x));
                        b1 = CF_PREC ? v.y : tf32_bits<true>(__uint_as_float(v.y));
                    }
#pragma unroll
                    for (int i = 0; i < RM; ++i) mma<CF_PREC>(acc[i][n], a[i], b0, b1);
                }
#endif
            }

            // a non-finite input read by one of this lane's rows (nonfinite.cuh)
#pragma unroll
            for (int i = 0; i < RM; ++i) probe = nonfinite_probe(nonfinite_probe(probe, acc[i][0][0]), acc[i][0][2]);

            // epilogue: c0 (g, 2t) c1 (g, 2t+1) c2 (g+8, 2t) c3 (g+8, 2t+1), + bias
#pragma unroll
            for (int i = 0; i < RM; ++i) {
                const int p0 = (tile * RM + i) * 16 + gid, p1 = p0 + 8;
#pragma unroll
                for (int n = 0; n < NTL; ++n) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int m = n * 8 + 2 * tig + e;
                        if (m < M) {
                            const float bm = bias ? __ldg(bias + m) : 0.0f;
                            out_t* ym = y + (b * M + m) * (long long)P;
                            if (p0 < P) store_out(ym + p0, output_element(acc[i][n][e] + bm, out_t()));
                            if (p1 < P) store_out(ym + p1, output_element(acc[i][n][2 + e] + bm, out_t()));
                        }
                    }
                }
            }
        }
    }
    // a call, not inlined: inlined, the pass made nvcc 13.0 unroll the image staging loop above by 4 instead of
    // 16 (fa19 L2 FP16 5.8 % slower on an H100); forcing 16 spilled
    redo_nonfinite_outputs_call<C, H, W, K, M, NT, 1>(probe != 0.0f, y, x, w, bias, B);
}
