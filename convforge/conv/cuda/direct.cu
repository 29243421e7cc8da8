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
// per thread, one channel only: each input row is loaded once for the K tiles that read it, and the next
// tile's rows are in flight during this tile's FFMAs), CF_POOL, CF_ACT, CF_INSTANCE.

#include "activation.cuh"
#include "async_copy.cuh"

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
#ifndef CF_STREAM_STORES
#define CF_STREAM_STORES 0
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

// One input row's SPAN values from column x0; Shared: the row is in the block's staged copy (plain loads, as
// __ldg is for global memory only).
template <bool Shared = false>
__device__ __forceinline__ float load1(const float* p) { if constexpr (Shared) return *p; else return __ldg(p); }

template <bool Shared = false>
__device__ __forceinline__ void load_row(float (&v)[NL * VL], const float* __restrict__ row, int x0)
{
    if constexpr (VL == 4) {
#pragma unroll
        for (int l = 0; l < NL; ++l) {
            const float4* const a = reinterpret_cast<const float4*>(row + x0) + l;
            const float4 t = Shared ? *a : __ldg(a);
            v[4 * l] = t.x; v[4 * l + 1] = t.y; v[4 * l + 2] = t.z; v[4 * l + 3] = t.w;
        }
    } else if constexpr (VL == 2) {
#pragma unroll
        for (int l = 0; l < NL; ++l) {
            const float2* const a = reinterpret_cast<const float2*>(row + x0) + l;
            const float2 t = Shared ? *a : __ldg(a);
            v[2 * l] = t.x; v[2 * l + 1] = t.y;
        }
    } else {
#pragma unroll
        for (int e = 0; e < SPAN; ++e)   // a partial strip re-reads the row's last value (never stored)
            v[e] = load1<Shared>(row + (TAIL ? min(x0 + e, W - 1) : x0 + e));
    }
}

// load_row for a prefetch: on the GPU the loads are volatile asm with a memory clobber, so the compiler
// keeps them where they are written (ahead of the FFMAs they are meant to overlap) instead of sinking
// them down to their first use.
__device__ __forceinline__ void prefetch_row(float (&v)[NL * VL], const float* __restrict__ row, int x0)
{
#if defined(__CUDA_ARCH__)
    if constexpr (VL == 4) {
#pragma unroll
        for (int l = 0; l < NL; ++l)
            asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];"
                         : "=f"(v[4 * l]), "=f"(v[4 * l + 1]), "=f"(v[4 * l + 2]), "=f"(v[4 * l + 3])
                         : "l"(row + x0 + 4 * l) : "memory");
        return;
    } else if constexpr (VL == 2) {
#pragma unroll
        for (int l = 0; l < NL; ++l)
            asm volatile("ld.global.nc.v2.f32 {%0, %1}, [%2];"
                         : "=f"(v[2 * l]), "=f"(v[2 * l + 1]) : "l"(row + x0 + 2 * l) : "memory");
        return;
    }
#endif
    load_row(v, row, x0);
}

// Output stores; CF_STREAM_STORES marks them evict-first (st.global.cs): the output is not read again here.
template <class T>
__device__ __forceinline__ void store(T* p, T v)
{
#if CF_STREAM_STORES
    __stcs(p, v);
#else
    *p = v;
#endif
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
__device__ __forceinline__ void store_tile(float* __restrict__ y, const float (&acc)[RT][R][GM], int b, int ty,
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
                    if (r + jj > 0) best = fmaxf(best, acc[rp * P + r][jp * P + jj][m]);
            out[jp] = activate(best);
        }
        float* __restrict__ dst = y + (((long long)b * M + m0 + G * MG + m) * HP + ty * RTP + rp) * WP + strip * RP;
        if constexpr (VS == 4) {
#pragma unroll
            for (int s = 0; s < RP / 4; ++s)
                store(reinterpret_cast<float4*>(dst) + s,
                      make_float4(out[4 * s], out[4 * s + 1], out[4 * s + 2], out[4 * s + 3]));
        } else if constexpr (VS == 2) {
#pragma unroll
            for (int s = 0; s < RP / 2; ++s)
                store(reinterpret_cast<float2*>(dst) + s, make_float2(out[2 * s], out[2 * s + 1]));
        } else {
#pragma unroll
            for (int jp = 0; jp < RP; ++jp)
                if (!TAIL || strip * RP + jp < WP) store(dst + jp, out[jp]);
        }
    }
}

// One map group's work item: maps G*MG .. G*MG+GM-1 of this piece, row tiles ty0 .. ty0+CH-1 of image b;
// xb is the item's first input row (channel 0) in global memory or, Shared, in the block's staged copy
// (one channel: rows W floats apart).
template <int G, bool Shared>
__device__ __forceinline__ void tile(float* __restrict__ y, const float* __restrict__ xb, int b, int ty0,
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
                load_row<Shared>(v, xb + (c * H + i) * W, x0);
                row_taps<G>(acc, v, c, i);
            }
        }
        store_tile<G>(y, acc, b, ty0, strip, M, m0);
    } else {
        // One channel, CH row tiles down the strip in a rolled loop: a window of the RT + K - 1 input rows
        // the current tile reads stays in registers and slides by RT rows per tile, so each input row is
        // loaded once; the rows the next tile adds are loaded before this tile's FFMAs, so their latency
        // hides behind them (the loop is not unrolled, which keeps the compiler from hoisting every load).
        float rows[RT + K - 1][NL * VL];
#pragma unroll
        for (int i = 0; i < RT + K - 1; ++i) load_row(rows[i], xb + i * W, x0);
#pragma unroll 1
        for (int k = 0; k < CH; ++k) {
            float next[RT][NL * VL];
#pragma unroll
            for (int i = 0; i < RT; ++i) {
                if (k + 1 < CH) {
                    prefetch_row(next[i], xb + ((k + 1) * RT + K - 1 + i) * W, x0);
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
                for (int e = 0; e < NL * VL; ++e) rows[i][e] = i + RT < RT + K - 1 ? rows[i + RT][e] : next[i + RT - (RT + K - 1)][e];
        }
    }
}

// group g -> tile<G>: a chain of uniform branches, one compile-time code path per group.
template <int G, bool Shared>
struct Groups {
    static __device__ __forceinline__ void run(int g, float* __restrict__ y, const float* __restrict__ xb, int b,
                                               int ty, int strip, int M, int m0)
    {
        if (g == G) tile<G, Shared>(y, xb, b, ty, strip, M, m0);
        else Groups<G - 1, Shared>::run(g, y, xb, b, ty, strip, M, m0);
    }
};

template <bool Shared>
struct Groups<-1, Shared> {
    static __device__ __forceinline__ void run(int, float*, const float*, int, int, int, int, int) {}
};

// CF_STAGE: the block's NT consecutive items read input rows that form one contiguous run of the
// (one-channel) input, at most SROWS rows: their row tiles span DT + 1 tiles, crossing at most DT / NY + 1
// image boundaries, each of which skips the H - NY * RT rows no tile starts in.
constexpr int DT = (CF_NT - 1) / NX + 1;
constexpr int SROWS_NEEDED = DT * RT + (DT / NY + 1) * (H - NY * RT) + RT + K - 1;
#ifndef CF_SROWS
#define CF_SROWS SROWS_NEEDED
#endif
constexpr int SFLOATS = (CF_SROWS * W + 3) / 4 * 4;   // one staging buffer, 16-byte multiple
constexpr int CW = (CF_VEC >= 4 && W % 4 == 0) ? 4 : 1;   // copy width: 16-byte copies need aligned rows

// Flat input row (image * H + row) of tile t's first item.
__device__ __forceinline__ long long first_row(int t)
{
    const int T = t * CF_NT / NX;   // row tile index over the whole batch
    return (long long)(T / NY) * H + (T % NY) * RT;
}

// Issue the copies of tile t's input run into dst (rows past the batch's last are not copied; no item
// reads them).
__device__ __forceinline__ void stage_rows(float* dst, const float* __restrict__ x, int t, int B)
{
    const long long f0 = first_row(t);
    const long long left = (long long)B * H - f0;
    const int n = (int)(left < CF_SROWS ? left : CF_SROWS) * W;
    const float* const src = x + f0 * W;
    if constexpr (CW == 4) {
        for (int i = 4 * threadIdx.x; i < n; i += 4 * CF_NT) copy_async16(dst + i, src + i);
    } else {
        for (int i = threadIdx.x; i < n; i += CF_NT) copy_async4(dst + i, src + i, true);
    }
}

}  // namespace

#ifndef CF_STAGE
#define CF_STAGE 0
#endif
static_assert(!CF_STAGE || (C == 1 && CH == 1), "CF_STAGE needs one channel and no chunk");
static_assert(!CF_STAGE || CF_SROWS >= SROWS_NEEDED, "CF_SROWS is below what a tile's items read");

// y: (B, M, HP, WP) (HP, WP = HO, WO when CF_POOL == 1); x: (B, C, H, W). B * NY * NX < 2^31 (the host
// splits larger batches).
// CF_STAGE 0: one item per thread; grid x = ceil(B * NY * NX / CF_NT), y = map groups of this piece.
// CF_STAGE 1: persistent blocks (grid x = resident blocks, y = 1) walk units (map group, tile of CF_NT
// consecutive items), group-major, so the blocks running at one time share one group's code; the next
// unit's input rows are copied into the other shared buffer (cp.async) while this one's are computed.
// Dynamic shared memory: 2 * SFLOATS floats.
extern "C" __global__ void CF_BOUNDS
conv_direct(float* __restrict__ y, const float* __restrict__ x, int B, int M, int m0)
{
#if CF_STAGE
    extern __shared__ float4 stage4[];
    float* const st = reinterpret_cast<float*>(stage4);
#if defined(__CUDA_ARCH__)
    if (threadIdx.x == 0) {   // the host computes the same size; a mismatch would read past shared memory
        unsigned dyn;
        asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < 8u * SFLOATS) __trap();
    }
#endif
    const int items = B * NY * NX;
    const int tiles = (items + CF_NT - 1) / CF_NT;
    const int units = tiles * NG;
    int u = blockIdx.x;
    if (u < units) stage_rows(st, x, u % tiles, B);
    copy_commit();
    int buf = 0;
    for (; u < units; u += gridDim.x) {
        const int un = u + gridDim.x;
        if (un < units) stage_rows(st + (buf ^ 1) * SFLOATS, x, un % tiles, B);
        copy_commit();
        copy_wait<1>();                 // this unit's copies (the older group) landed
        __syncthreads();                // ... everyone's
        const int t = u % tiles, item = t * CF_NT + threadIdx.x;
        if (item < items) {
            const int strip = item % NX, T = item / NX, b = T / NY, ty = T % NY;
            const float* const xb = st + buf * SFLOATS + ((long long)b * H + ty * RT - first_row(t)) * W;
            Groups<NG - 1, true>::run(u / tiles, y, xb, b, ty, strip, M, m0);
        }
        __syncthreads();                // every thread is done with this buffer before it refills
        buf ^= 1;
    }
#else
    const int item = blockIdx.x * CF_NT + threadIdx.x;
    if (item >= B * NY * NX) return;
    const int strip = item % NX;
    const int rest = item / NX;
    const int b = rest / NY, ty0 = (rest % NY) * CH;
    Groups<NG - 1, false>::run(blockIdx.y, y, x + (long long)b * (C * H * W) + (ty0 * RT) * W, b, ty0, strip, M, m0);
#endif
}
