// cuda-direct: direct convolution; each thread keeps a register tile of output columns x maps, and the
// filter bank sits in the constant bank, so no thread ever loads a weight into a vector register.
//
// A thread owns CF_RT output rows (CF_POOL unless set) x CF_R consecutive output columns x GM maps (one
// map group; groups are blockIdx.y, so the choice is uniform per block and each group is its own
// compile-time code path).
// For each channel and input row it loads the CF_R+K-1 input values it needs straight from global
// memory (through L1: neighbouring threads share them; 16- or 8-byte loads where the row and the tile are
// aligned), then does every tap that row feeds: up to CF_RT x K x CF_R x GM FFMAs. Channel, tap and map are
// compile-time indices once unrolled, so each weight is a fixed constant-bank address: in sm_90 SASS
// ptxas loads them with ULDC.64 into uniform registers (the uniform datapath, one load per two weights
// per warp) that the FFMAs read directly. The fa17 L1 kernel: 5000 FFMA, 657 ULDC, 30 LDG, 53 STG in
// ~5.8k instructions. No shared memory, no barriers: occupancy is set by the registers (the
// accumulators plus one input row).
//
// Consecutive threads take consecutive column strips of one output row, so each map's stores from a warp
// form one contiguous run (16-byte stores where alignment allows). CF_POOL > 1: the tile covers whole
// pool windows; max over the window, then the activation (monotone), one store per pooled value;
// conv rows and columns that fill no window are never computed (floor semantics, as F.max_pool2d).
//
// Each launch serves one piece of at most CF_MP maps (maps m0 .. m0+CF_MP-1 of M), whose weights plus
// bias fit the 64 KB bank: cf_bank = weights [c][p][q][map] (maps fastest), then the CF_MP biases. Each
// prepared layer has its own module instance (CF_INSTANCE), hence its own bank (see cuda_constmem.py).
// With CF_UNROLL_C == 0 the channel loop stays a loop (the channel offset is then a register, and the
// weights come through LDC loads): used where unrolling C would make the code too large.
//
// Constants: CF_C CF_H CF_W CF_K (layer), CF_MP (maps of this piece), CF_MG (maps per thread), CF_R
// (output columns per thread, a multiple of CF_POOL), CF_RT (output rows per thread, a multiple of CF_POOL
// whose stored rows divide the stored height; more rows share each weight and input row), CF_NT (threads
// per block), CF_VEC (largest vector width in floats the pointers allow: 4, 2 or 1), CF_UNROLL_C,
// CF_STREAM_STORES, CF_MINB (minimum blocks per SM for __launch_bounds__, 0 for none), CF_CHUNK (row tiles
// per thread, one channel only: each input row is loaded once for the tiles that read it), CF_POOL, CF_ACT,
// CF_INSTANCE, CF_OUT_HALF (1: y in FP16, stores.cuh's output_element, for a consumer that reads FP16: half the
// bytes written; the caller bounds the values, as a tanh or sigmoid epilogue does).

#include "activation.cuh"
#include "stores.cuh"

#ifndef CF_INSTANCE
#define CF_INSTANCE 0
#endif
#ifndef CF_CONST_FLOATS
#define CF_CONST_FLOATS 16384
#endif
#ifndef CF_POOL
#define CF_POOL 1
#endif
#ifndef CF_NT
#define CF_NT 256
#endif
#ifndef CF_VEC
#define CF_VEC 4
#endif
#ifndef CF_UNROLL_C
#define CF_UNROLL_C 1
#endif
#ifndef CF_MINB
#define CF_MINB 0
#endif
#ifndef CF_CHUNK
#define CF_CHUNK 1      // row tiles per thread, computed one after another
#endif
#ifndef CF_RT
#define CF_RT CF_POOL   // conv rows per thread: one window row by default
#endif
#ifndef CF_OUT_HALF
#define CF_OUT_HALF 0
#endif
#if CF_MINB > 0   // ask ptxas for CF_MINB resident blocks per SM (caps the registers; may spill)
#define CF_BOUNDS __launch_bounds__(CF_NT, CF_MINB)
#else
#define CF_BOUNDS __launch_bounds__(CF_NT)
#endif

__constant__ float cf_bank[CF_CONST_FLOATS];

namespace {

constexpr int C = CF_C, H = CF_H, W = CF_W, K = CF_K, MP = CF_MP, MG = CF_MG, R = CF_R, P = CF_POOL, RT = CF_RT;
constexpr int HO = H - K + 1, WO = W - K + 1;
constexpr int HP = HO / P, WP = WO / P;            // stored rows and columns (P == 1: the conv output)
constexpr int RP = R / P;                           // stored values per map and thread
constexpr int RTP = RT / P;                         // stored rows per thread
constexpr int CH = CF_CHUNK;                        // row tiles per work item (one after another)
constexpr int NY = HP / RTP / CH;                   // work items down an image
constexpr int NX = (WP + RP - 1) / RP;              // column strips per stored row
constexpr bool TAIL = WP % RP != 0;                 // the last strip is partial
constexpr int SPAN = R + K - 1;                     // input columns one thread reads per row
constexpr int vec_width(int n, int m) { return (CF_VEC >= 4 && n % 4 == 0 && m % 4 == 0) ? 4
                                              : (CF_VEC >= 2 && n % 2 == 0 && m % 2 == 0) ? 2 : 1; }
constexpr int VL = TAIL ? 1 : vec_width(W, R);      // load width (rows and strips aligned to it)
constexpr int NL = (SPAN + VL - 1) / VL;            // loads per row; never past the row when !TAIL
constexpr int VS = TAIL ? 1 : vec_width(WP, RP);    // store width
constexpr int NG = (MP + MG - 1) / MG;              // map groups (blockIdx.y)
constexpr int BIAS = C * K * K * MP;                // offset of the biases in cf_bank
constexpr int UNROLL_C = CF_UNROLL_C ? C : 1;
static_assert(R % P == 0, "CF_R must be a multiple of CF_POOL");
static_assert(RT % P == 0 && HP % RTP == 0, "CF_RT must be a multiple of CF_POOL whose stored rows divide HP");
static_assert(CH == 1 || (C == 1 && (HP / RTP) % CH == 0), "CF_CHUNK > 1 needs one channel and must divide the row tiles");
static_assert(BIAS + MP <= CF_CONST_FLOATS, "weights and bias must fit the constant bank");
#if CF_OUT_HALF
typedef unsigned short out_t;                       // FP16 bits (stores.cuh's output_element)
#else
typedef float out_t;
#endif

// two FP16 values as one 32-bit word, the first in the lower half (its lower address)
__device__ __forceinline__ unsigned half_pair(float a, float b)
{
    return (unsigned)output_element(a, out_t()) | ((unsigned)output_element(b, out_t()) << 16);
}

__device__ __forceinline__ void load_row(float (&v)[NL * VL], const float* __restrict__ row, int x0)
{
    if constexpr (VL == 4) {
#pragma unroll
        for (int l = 0; l < NL; ++l) {
            const float4 t = __ldg(reinterpret_cast<const float4*>(row + x0) + l);
            v[4 * l] = t.x; v[4 * l + 1] = t.y; v[4 * l + 2] = t.z; v[4 * l + 3] = t.w;
        }
    } else if constexpr (VL == 2) {
#pragma unroll
        for (int l = 0; l < NL; ++l) {
            const float2 t = __ldg(reinterpret_cast<const float2*>(row + x0) + l);
            v[2 * l] = t.x; v[2 * l + 1] = t.y;
        }
    } else {
#pragma unroll
        for (int e = 0; e < SPAN; ++e)   // a partial strip re-reads the row's last value (never stored)
            v[e] = __ldg(row + (TAIL ? min(x0 + e, W - 1) : x0 + e));
    }
}

// Accumulators of one tile of map group G: acc[conv row][column][map], started at the biases.
template <int G, int GM>
__device__ __forceinline__ void init_tile(float (&acc)[RT][R][GM])
{
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int j = 0; j < R; ++j)
#pragma unroll
            for (int m = 0; m < GM; ++m)
                acc[r][j][m] = cf_bank[BIAS + G * MG + m];
}

// Every tap that input row i (of channel c, counted from the tile's first row) feeds: it meets output row
// r through kernel row p = i - r.
template <int G, int GM>
__device__ __forceinline__ void row_taps(float (&acc)[RT][R][GM], const float (&v)[NL * VL], int c, int i)
{
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        const int p = i - r;
        if (p < 0 || p >= K) continue;
#pragma unroll
        for (int q = 0; q < K; ++q)
#pragma unroll
            for (int j = 0; j < R; ++j)
#pragma unroll
                for (int m = 0; m < GM; ++m)
                    acc[r][j][m] = fmaf(v[j + q], cf_bank[((c * K + p) * K + q) * MP + G * MG + m], acc[r][j][m]);
    }
}

// Epilogue: pool (P > 1) and activate, then RP values per map at column strip * RP of each of the
// tile's stored rows ty * RTP + rp.
template <int G, int GM>
__device__ __forceinline__ void store_tile(out_t* __restrict__ y, const float (&acc)[RT][R][GM], int b, int ty,
                                           int strip, int M, int m0)
{
#pragma unroll
    for (int rp = 0; rp < RTP; ++rp)
#pragma unroll
    for (int m = 0; m < GM; ++m) {
        float out[RP];
#pragma unroll
        for (int jp = 0; jp < RP; ++jp) {
            float best = acc[rp * P][jp * P][m];
#pragma unroll
            for (int r = 0; r < P; ++r)
#pragma unroll
                for (int jj = 0; jj < P; ++jj)
                    if (r + jj > 0) best = max_nan(best, acc[rp * P + r][jp * P + jj][m]);
            out[jp] = activate(best);
        }
        out_t* __restrict__ dst = y + (((long long)b * M + m0 + G * MG + m) * HP + ty * RTP + rp) * WP + strip * RP;
        if constexpr (CF_OUT_HALF && VS == 4) {     // 4 halves: one 8-byte store (dst is 8-byte aligned)
#pragma unroll
            for (int s = 0; s < RP / 4; ++s) {
                uint2 v;
                v.x = half_pair(out[4 * s], out[4 * s + 1]);
                v.y = half_pair(out[4 * s + 2], out[4 * s + 3]);
                store_out(reinterpret_cast<uint2*>(dst) + s, v);
            }
        } else if constexpr (CF_OUT_HALF && VS == 2) {
#pragma unroll
            for (int s = 0; s < RP / 2; ++s)
                store_out(reinterpret_cast<unsigned*>(dst) + s, half_pair(out[2 * s], out[2 * s + 1]));
        } else if constexpr (VS == 4) {
#pragma unroll
            for (int s = 0; s < RP / 4; ++s)
                store_out(reinterpret_cast<float4*>(dst) + s,
                      make_float4(out[4 * s], out[4 * s + 1], out[4 * s + 2], out[4 * s + 3]));
        } else if constexpr (VS == 2) {
#pragma unroll
            for (int s = 0; s < RP / 2; ++s)
                store_out(reinterpret_cast<float2*>(dst) + s, make_float2(out[2 * s], out[2 * s + 1]));
        } else {
#pragma unroll
            for (int jp = 0; jp < RP; ++jp)
                if (!TAIL || strip * RP + jp < WP) store_out(dst + jp, output_element(out[jp], out_t()));
        }
    }
}

// One map group's work item: maps G*MG .. G*MG+GM-1 of this piece, row tiles ty0 .. ty0+CH-1 of image b;
// xb is the item's first input row (channel 0).
template <int G>
__device__ __forceinline__ void tile(out_t* __restrict__ y, const float* __restrict__ xb, int b, int ty0,
                                     int strip, int M, int m0)
{
    constexpr int GM = (MP - G * MG < MG) ? MP - G * MG : MG;
    const int x0 = strip * R;
    if constexpr (CH == 1) {
        float acc[RT][R][GM];
        init_tile<G>(acc);
#pragma unroll UNROLL_C
        for (int c = 0; c < C; ++c) {
#pragma unroll
            for (int i = 0; i < RT + K - 1; ++i) {
                float v[NL * VL];
                load_row(v, xb + (c * H + i) * W, x0);
                row_taps<G>(acc, v, c, i);
            }
        }
        store_tile<G>(y, acc, b, ty0, strip, M, m0);
    } else {
        // One channel, CH row tiles down the strip in a rolled loop: a window of the RT + K - 1 input rows
        // the current tile reads stays in registers and slides by RT rows per tile, so each input row is
        // loaded once instead of once per tile that reads it (K + RT - 1 loads per RT rows become RT). The
        // next tile's rows are written before this tile's FFMAs, but ptxas schedules them where it likes (a
        // volatile-asm version still had them after the FFMAs in sm_90 SASS, nvcc 13.0): the measured gain
        // (fa17 L1 pooled) is the load reuse, not hidden latency.
        float rows[RT + K - 1][NL * VL];
#pragma unroll
        for (int i = 0; i < RT + K - 1; ++i) load_row(rows[i], xb + i * W, x0);
#pragma unroll 1
        for (int k = 0; k < CH; ++k) {
            float next[RT][NL * VL];
#pragma unroll
            for (int i = 0; i < RT; ++i) {
                if (k + 1 < CH) {
                    load_row(next[i], xb + ((k + 1) * RT + K - 1 + i) * W, x0);
                } else {
#pragma unroll
                    for (int e = 0; e < NL * VL; ++e) next[i][e] = 0.0f;   // past the chunk: never read
                }
            }
            float acc[RT][R][GM];
            init_tile<G>(acc);
#pragma unroll
            for (int i = 0; i < RT + K - 1; ++i) row_taps<G>(acc, rows[i], 0, i);
            store_tile<G>(y, acc, b, ty0 + k, strip, M, m0);
#pragma unroll
            for (int i = 0; i < RT + K - 1; ++i)
#pragma unroll
                for (int e = 0; e < NL * VL; ++e)   // slide the window by RT rows
                    rows[i][e] = i + RT < RT + K - 1 ? rows[i + RT][e] : next[i + RT - (RT + K - 1)][e];
        }
    }
}

// blockIdx.y -> tile<G>: a chain of uniform branches, one compile-time code path per group.
template <int G>
struct Groups {
    static __device__ __forceinline__ void run(int g, out_t* __restrict__ y, const float* __restrict__ xb, int b,
                                               int ty, int strip, int M, int m0)
    {
        if (g == G) tile<G>(y, xb, b, ty, strip, M, m0);
        else Groups<G - 1>::run(g, y, xb, b, ty, strip, M, m0);
    }
};

template <>
struct Groups<-1> {
    static __device__ __forceinline__ void run(int, out_t*, const float*, int, int, int, int, int) {}
};

}  // namespace

// y: (B, M, HP, WP) (HP, WP = HO, WO when CF_POOL == 1), float or FP16 bits (CF_OUT_HALF); x: (B, C, H, W). B * NY * NX < 2^31 (the host
// splits larger batches). Grid: x = ceil(B * NY * NX / CF_NT), y = map groups of this piece.
extern "C" __global__ void CF_BOUNDS
conv_direct(out_t* __restrict__ y, const float* __restrict__ x, int B, int M, int m0)
{
    const int item = blockIdx.x * CF_NT + threadIdx.x;
    if (item >= B * NY * NX) return;
    const int strip = item % NX;
    const int rest = item / NX;
    const int b = rest / NY, ty0 = (rest % NY) * CH;
    Groups<NG - 1>::run(blockIdx.y, y, x + (long long)b * (C * H * W) + (ty0 * RT) * W, b, ty0, strip, M, m0);
}
