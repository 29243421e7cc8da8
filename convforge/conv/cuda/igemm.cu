// cuda-igemm-3xtf32 / cuda-igemm-tf32: implicit GEMM on the tensor cores for many-channel layers, with
// split-TF32 ("3xTF32") for fp32 accuracy.
//
// GEMM view of the whole batch: D (M maps x N positions) = A (M x KR) * B (KR x N), M = output maps,
// N = B*HO*WO (all images' output positions, image-major), KR = C*KH*KW. A is the weight tensor itself
// ((M, C, KH, KW) is M x KR row-major), packed on the host into TF32 "big" and "small" parts (v = big + small
// + O(2^-21 v); big truncated, so small has v's sign), zero-padded to whole tiles. B is never formed: B[k][n] = x[b][c][ho+p][wo+q] with
// k = (c, p, q) and n = (b, ho, wo), gathered straight from the input by cp.async (4 bytes an element, out-of-
// range k or n zero-filled) and split into big + small as a warp reads its fragments.
// 3xTF32 (CF_SPLIT 3): d += a_small*b_big + a_big*b_small + a_big*b_big on m16n8k8 TF32 mma.sync, fp32
// accumulate (the small*small term, O(2^-22), is dropped). CF_SPLIT 1: d += a*b with both rounded to TF32.
//
// Tiles: a block computes BM maps x BN positions, looping over KR in BK steps through a STAGES-deep cp.async
// ring (stage s+STAGES-1 is loaded while stage s is multiplied); warps own WM x WN sub-tiles of 16x8 mma
// tiles. Shared layouts avoid bank conflicts on the fragment reads:
//   A: packed on the host in fragment order, [mtile][ktile][k step][16-row group][lane][a0..a3], so a tile is
//      one contiguous block (16-byte cp.async, coalesced) and a lane's fragment one 16-byte shared load
//      (consecutive lanes, consecutive 16 bytes: conflict-free).
//   B: [BK][BN+8]: lanes read row t, column g: banks t*(BN+8)+g = 8t+g (BN a multiple of 32), distinct;
//      filled by 4-byte cp.async along rows (consecutive threads, consecutive n: coalesced within an output row).
// Fragments (PTX ISA, m16n8k8 tf32; g = lane/4, t = lane%4): a0 (g, t) a1 (g+8, t) a2 (g, t+4) a3 (g+8, t+4);
// b0 (k t, n g) b1 (k t+4, n g); c0 (g, 2t) c1 (g, 2t+1) c2 (g+8, 2t) c3 (g+8, 2t+1).
// Constants: CF_M CF_C CF_H CF_W CF_KH CF_KW (the layer), CF_BM CF_BN CF_BK CF_WM CF_WN CF_STAGES (tiles),
// CF_SPLIT (3 or 1), CF_FLUSH (3xTF32: 1 adds each k step's partial sum to the accumulator in fp32),
// CF_EPI (1: output staged through shared memory, 0: fragment stores), CF_KORDER (1: k = (p, q, c), channels
// innermost, for C a multiple of BK: a block-uniform gather offset per k tile). The weights are arguments, not constants: one compile serves every layer of that shape.

#include "async_copy.cuh"
#include "mma.cuh"

#ifndef CF_MINB
#define CF_MINB 1
#endif
#ifndef CF_EPI
#define CF_EPI 1
#endif
#ifndef CF_FLUSH
#define CF_FLUSH 1
#endif
#ifndef CF_SPLIT
#define CF_SPLIT 3
#endif
#ifndef CF_KORDER
#define CF_KORDER 0
#endif

namespace {

constexpr int M = CF_M, C = CF_C, H = CF_H, W = CF_W, KH = CF_KH, KW = CF_KW;
constexpr int HO = H - KH + 1, WO = W - KW + 1, P = HO * WO, HW = H * W, KHW = KH * KW, KR = C * KHW;
constexpr long long IMG = (long long)C * HW;
constexpr int BM = CF_BM, BN = CF_BN, BK = CF_BK, WM = CF_WM, WN = CF_WN, STAGES = CF_STAGES, SPLIT = CF_SPLIT;
constexpr bool EPI = CF_EPI;
constexpr bool FLUSH = CF_FLUSH;                        // 3xTF32: each k step's products summed apart, then added
// KORDER 0: k = (c, p, q), c outermost (the weight tensor's own order): each gathered element's (c, p, q) takes
// two divisions by constants. KORDER 1: k = (p, q, c), channels innermost, C a multiple of BK (the host packs
// the weights in that order): a k tile is BK consecutive channels at one tap (p, q), so the tile's source is
// one block-uniform offset (c0*HW + p*W + q) and row r adds the constant r*HW: no per-element index arithmetic.
constexpr bool KORDER = CF_KORDER;
constexpr int CBLKS = C / BK;                           // KORDER 1: k tiles per tap
constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN, NT = 32 * WARPS_M * WARPS_N;
constexpr int MI = WM / 16, NI = WN / 8;                // mma tiles per warp
constexpr int KT = (KR + BK - 1) / BK;                  // k tiles
constexpr int MTILES = (M + BM - 1) / BM;
constexpr int BP = BN + 8;                              // B's shared pitch (floats)
constexpr int CP = BN + 8;                              // the staged epilogue's pitch (floats)
constexpr int A_FLOATS = BM * BK, B_FLOATS = BK * BP;
constexpr int STAGE_FLOATS = (SPLIT == 3 ? 2 : 1) * A_FLOATS + B_FLOATS;
constexpr int SMEM_BYTES = 4 * STAGES * STAGE_FLOATS;
constexpr int B_ROWS = NT / BN;                         // k rows a pass of the B loader covers
constexpr int B_PER_THREAD = BK / B_ROWS;
constexpr int A_PER_THREAD = BM * BK / 4 / NT;          // 16-byte copies per thread per A part

static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 8 == 0, "tile shapes");
static_assert(BK == 16 || BK == 32, "BK must be 16 or 32");
static_assert(BN % 32 == 0 && NT % BN == 0 && BK % B_ROWS == 0, "B loader: whole k rows per pass");
static_assert(BM * BK / 4 % NT == 0, "A loader: whole 16-byte copies per thread");
static_assert(STAGES >= 2, "at least two stages");
static_assert(!CF_EPI || BM * CP <= STAGES * STAGE_FLOATS, "the staged epilogue reuses the ring");
static_assert(SPLIT == 1 || SPLIT == 3, "CF_SPLIT is 1 or 3");
static_assert(!KORDER || C % BK == 0, "CF_KORDER 1: C a multiple of BK");

// v = big + small (TF32 bit patterns); an infinite or NaN v gets a zero small part (Inf - Inf would be NaN).
// (The weights' split, on the host, truncates big so that small has big's sign: an Inf input then meets
// a_big and a_small of one sign, never +Inf - Inf.)
__device__ __forceinline__ void split_tf32(float v, unsigned& big, unsigned& small)
{
    if ((__float_as_uint(v) & 0x7f800000u) == 0u) v = 0.0f;   // a denormal reads as zero, as in every kernel here (-ftz)
    if constexpr (SPLIT == 3)
        tf32_split(v, big, small);
    else
        big = tf32_bits<true>(v) & 0xffffe000u;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(NT, CF_MINB)
conv_igemm(float* __restrict__ y, const float* __restrict__ x, const float* __restrict__ a_big,
           const float* __restrict__ a_small, const float* __restrict__ bias, int B, int kts)
{
    // split-K: block row blockIdx.y reduces k tiles [blockIdx.y * kts, + kts) and writes its partial output to
    // slice blockIdx.y of y (the host's workspace, gridDim.y slices of B*M*P; bias null); conv_igemm_reduce
    // sums the slices. One split: kts = KT, y the output.
    extern __shared__ float4 smem4[];
    float* const smem = reinterpret_cast<float*>(smem4);
    require_dynamic_smem(SMEM_BYTES);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm0 = (warp % WARPS_M) * WM, wn0 = (warp / WARPS_M) * WN;
    const int N = B * P;
    const int mtile = blockIdx.x % MTILES;                 // maps fastest: blocks sharing an input tile run together
    const int m0 = mtile * BM;
    const int n0 = (blockIdx.x / MTILES) * BN;
    const int kb = blockIdx.y * kts, nk = min(KT - kb, kts);   // this block's k tiles: kb .. kb + nk - 1

    // the B loader: this thread's column n and its first k row
    const int bcol = tid % BN, brow = tid / BN;
    const int n_mine = n0 + bcol;
    const bool n_ok = n_mine < N;
    const float* xcol = x;
    if (n_ok) {
        const int b = n_mine / P, p = n_mine - b * P, ho = p / WO, wo = p - ho * WO;
        xcol = x + b * IMG + ho * W + wo;
    }
    if constexpr (KORDER) xcol += brow * HW;             // this thread's first channel row of every k tile

    auto load_stage = [&](int stage, int kt) {
        float* const as = smem + stage * STAGE_FLOATS;
        float* const bs = as + (SPLIT == 3 ? 2 : 1) * A_FLOATS;
#pragma unroll
        for (int i = 0; i < A_PER_THREAD; ++i) {
            const int off = 4 * (tid + i * NT);           // the tile is contiguous in fragment order
            const long long src = ((long long)mtile * KT + kt) * A_FLOATS + off;
            copy_async16(as + off, a_big + src);
            if constexpr (SPLIT == 3) copy_async16(as + A_FLOATS + off, a_small + src);
        }
        if constexpr (KORDER) {
            const int tap = kt / CBLKS, c0 = (kt - tap * CBLKS) * BK, p = tap / KW, q = tap - p * KW;
            const int off = c0 * HW + p * W + q;                        // block-uniform offset
            // Two spellings of the same addresses. 3xTF32 (128 registers at two blocks an SM): the 32-bit
            // offset per element, so nvcc does not hoist eight 64-bit row pointers out of the k loop (it did,
            // and spilled 32 bytes with 6 local loads a k tile; this way 8 bytes and 2). TF32 has registers to
            // spare: the pointer form, 295 instructions a k tile against 312 (nvcc 13.0, sm_90, 128 x 64 tile).
            if constexpr (SPLIT == 3) {
#pragma unroll
                for (int i = 0; i < B_PER_THREAD; ++i)
                    copy_async4(bs + (brow + i * B_ROWS) * BP + bcol, n_ok ? xcol + (off + i * B_ROWS * HW) : x, n_ok);
            } else {
                const float* const src = xcol + off;
#pragma unroll
                for (int i = 0; i < B_PER_THREAD; ++i)
                    copy_async4(bs + (brow + i * B_ROWS) * BP + bcol, n_ok ? src + i * B_ROWS * HW : x, n_ok);
            }
        } else {
#pragma unroll
            for (int i = 0; i < B_PER_THREAD; ++i) {
                const int r = brow + i * B_ROWS, k = kt * BK + r;
                const bool ok = n_ok && k < KR;
                const int c = k / KHW, rem = k - c * KHW, p = rem / KW, q = rem - p * KW;
                copy_async4(bs + r * BP + bcol, ok ? xcol + (c * HW + p * W + q) : x, ok);
            }
        }
    };

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nk) load_stage(s, kb + s);
        copy_commit();
    }

    for (int kt = 0; kt < nk; ++kt) {
        copy_wait<STAGES - 2>();    // this thread's copies of stage kt have landed
        __syncthreads();            // everyone's have; and everyone is done with stage kt-1, reloaded next
        {
            const int next = kt + STAGES - 1;
            if (next < nk) load_stage(next % STAGES, kb + next);
            copy_commit();
        }
        const float* const as = smem + (kt % STAGES) * STAGE_FLOATS;
        const float* const as_small = as + A_FLOATS;
        const float* const bs = as + (SPLIT == 3 ? 2 : 1) * A_FLOATS;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 8) {
            unsigned bb[NI][2], bsm[NI][2];
#pragma unroll
            for (int j = 0; j < NI; ++j) {
                const int n = wn0 + j * 8 + g;
                split_tf32(bs[(kk + t) * BP + n], bb[j][0], bsm[j][0]);
                split_tf32(bs[(kk + t + 4) * BP + n], bb[j][1], bsm[j][1]);
            }
#pragma unroll
            for (int i = 0; i < MI; ++i) {
                // this lane's a0..a3 of 16-row group (wm0/16 + i), k step kk/8: one 16-byte load
                const int o = (((kk / 8) * (BM / 16) + wm0 / 16 + i) * 32 + lane) * 4;
                const float4 vb = *reinterpret_cast<const float4*>(as + o);
                const unsigned ab[4] = {__float_as_uint(vb.x), __float_as_uint(vb.y), __float_as_uint(vb.z),
                                        __float_as_uint(vb.w)};
                if constexpr (SPLIT == 3) {
                    const float4 vs = *reinterpret_cast<const float4*>(as_small + o);
                    const unsigned asm_[4] = {__float_as_uint(vs.x), __float_as_uint(vs.y), __float_as_uint(vs.z),
                                              __float_as_uint(vs.w)};
                    // small terms first; term-major, so NI independent accumulators separate dependent mmas.
                    // FLUSH: the three products of this k step go to a fresh partial sum, added to acc by an
                    // fp32 add (rounded to nearest): the tensor cores' accumulation truncates, and into the
                    // long-lived acc (one sign, growing) that bias added up over C*KH*KW (H100, 3xTF32 without
                    // it: relative error 2.8e-5 at C*KH*KW = 4096, 9.1e-4 at 131072); the partials' truncation
                    // errors have both signs and cancel.
                    float part[NI][4];
#pragma unroll
                    for (int j = 0; j < NI; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e) part[j][e] = FLUSH ? 0.0f : acc[i][j][e];
#pragma unroll
                    for (int j = 0; j < NI; ++j) mma<0>(part[j], asm_, bb[j][0], bb[j][1]);
#pragma unroll
                    for (int j = 0; j < NI; ++j) mma<0>(part[j], ab, bsm[j][0], bsm[j][1]);
#pragma unroll
                    for (int j = 0; j < NI; ++j) mma<0>(part[j], ab, bb[j][0], bb[j][1]);
#pragma unroll
                    for (int j = 0; j < NI; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc[i][j][e] = FLUSH ? acc[i][j][e] + part[j][e] : part[j][e];
                } else {
#pragma unroll
                    for (int j = 0; j < NI; ++j) mma<0>(acc[i][j], ab, bb[j][0], bb[j][1]);
                }
            }
        }
    }
    copy_wait<0>();                 // no copy may still be in flight when the block exits
    y += (long long)blockIdx.y * B * M * P;                    // split-K: this split's workspace slice

    // epilogue: c0 (g, 2t) c1 (g, 2t+1) c2 (g+8, 2t) c3 (g+8, 2t+1) -> y[b][m][p], n = b*P + p
    if constexpr (EPI) {
        // staged: the tile goes to shared memory (float2 stores, pitch BN+8: lanes' 8t+2g words, conflict-free
        // per half warp), then each thread writes one fixed position column down the maps: a warp stores 32
        // consecutive positions of one map (coalesced), where fragment stores write 8 maps x 8 floats.
        __syncthreads();                                        // every warp is done reading the ring
        float* const cs = smem;
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    *reinterpret_cast<float2*>(cs + (wm0 + i * 16 + g + 8 * h) * CP + wn0 + j * 8 + 2 * t) =
                        make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        __syncthreads();
        const int c = tid % BN, n = n0 + c;                    // one column a thread (NT % BN == 0)
        if (n < N) {
            const int b = n / P, p = n - b * P;
            float* const yb = y + (long long)b * M * P + p;
            for (int r = tid / BN; r < BM && m0 + r < M; r += B_ROWS)
                yb[(long long)(m0 + r) * P] = cs[r * CP + c] + (bias ? __ldg(bias + m0 + r) : 0.0f);
        }
    } else {
#pragma unroll
        for (int j = 0; j < NI; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int n = n0 + wn0 + j * 8 + 2 * t + e;
                if (n >= N) continue;
                const int b = n / P, p = n - b * P;
                float* const yb = y + (long long)b * M * P + p;
#pragma unroll
                for (int i = 0; i < MI; ++i) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int m = m0 + wm0 + i * 16 + g + 8 * h;
                        if (m < M) yb[(long long)m * P] = acc[i][j][2 * h + e] + (bias ? __ldg(bias + m) : 0.0f);
                    }
                }
            }
        }
    }
}

// split-K's second pass: y[i] = sum over the splits of ws[s][i], in split order (deterministic), + bias[m];
// i = (b*M + m)*P + p over the whole output (total = B*M*P elements).
extern "C" __global__ void conv_igemm_reduce(float* __restrict__ y, const float* __restrict__ ws,
                                             const float* __restrict__ bias, unsigned long long total, int splits)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (long long)total;
         i += (long long)gridDim.x * blockDim.x) {
        float v = ws[i];
        for (int z = 1; z < splits; ++z) v += ws[(long long)z * total + i];
        y[i] = v + (bias ? __ldg(bias + (i / P) % M) : 0.0f);
    }
}
