// cuda-fused-gemm and cuda-fused-layer: implicit GEMM with the unroll fused into a register-tiled
// multiply, every shape a compile-time constant; optionally bias + activation + max pool in the epilogue.
//
// GEMM view: Y (maps x positions) = Wmat (maps x C*K*K) * Xunroll (C*K*K x positions); Xunroll is never
// formed. A thread owns a register tile of CF_TM maps x CF_HT rows x CF_WT consecutive columns
// (CF_TM*CF_HT*CF_WT accumulators). For each (channel c, kernel row p) it loads the CF_HT input row
// segments its outputs need (CF_WT+K-1 values each, 16-byte shared loads) into registers once and reuses
// them across all K horizontal taps q (the sliding window: xv[r][j+q]); for each tap it loads the CF_TM
// weights (16-byte broadcast loads: all lanes of a warp read the same address) and does
// CF_TM*CF_HT*CF_WT FFMAs. Per (c, p): CF_TM*CF_HT*CF_WT*K FFMAs against CF_HT*ceil((CF_WT+K-1)/4) +
// K*CF_TM/4 shared loads: the inner loop is 90-95 % FFMA in the SASS of the preset layers' configs.
//
// Block: a persistent loop over units (one image x a band of CF_BH output rows). Per unit the block
// stages all C channels of the CF_BH+K-1 input rows into shared memory (coalesced row copies, zero
// padding to PITCH columns, read once from device memory; CF_PIPE 1: cp.async, every copy of the band in
// flight at once; CF_PIPE 2 (default): cp.async into a second buffer, the next unit's band loading while
// this one is computed; CF_PIPE 0: plain load + store, one device-memory latency per row copy, which made
// the staging the bottleneck of the few-channel layers), then its CF_NT threads walk the unit's
// ITEMS = map groups x row tiles x column groups work items. The filter bank, transposed on the host
// to [c][p][q][group][GS] (maps fastest; GS = TM rounded up to 4; zero padded), is staged once per block.
// CF_XSMEM=0 / CF_WSMEM=0 read input / weights from global memory instead (shapes too large for
// shared memory); results are identical.
//
// The accumulators start at the bias. Epilogue, CF_POOL == 1: activation CF_ACT, stored row by row
// (16-byte stores when the row length allows: each warp writes a contiguous run). CF_POOL > 1: each
// thread tile covers whole pool x pool windows (CF_HT, CF_WT, CF_BH multiples of CF_POOL); max over the
// window first, then the activation (monotone, so max(act(v)) == act(max(v)) exactly: one tanh per pooled
// output); only the pooled map is written (floor semantics: trailing rows and columns that fill no window
// are never computed).
//
// Map splits, CF_MS > 1 (small batches): the MG map groups are split over CF_MS blocks (blockIdx.y = s
// takes groups s*MGS .. s*MGS+MGS-1, MGS = MG / CF_MS), so B images give CF_MS times the blocks (100 images
// of one band each: 100 blocks on 132 SMs at CF_MS 1). A block stages only its groups' weights
// ([c][p][q][local group][GS]) and its units hold MGS x RT x G items; the input band is staged by each of
// the CF_MS blocks (read CF_MS times, from L2 after the first). CF_MS 1 is the kernel as before.
//
// Constants: CF_M CF_C CF_H CF_W CF_K (layer), CF_TM CF_HT CF_WT CF_NT CF_BH CF_MINB CF_PUNROLL CF_MS
// (launch shape), CF_POOL CF_ACT (0 none, 1 tanh, 2 relu, 3 sigmoid), CF_XSMEM CF_WSMEM.

#include "async_copy.cuh"
#include "activation.cuh"

#ifndef CF_TM
#define CF_TM 8
#endif
#ifndef CF_HT
#define CF_HT 1
#endif
#ifndef CF_WT
#define CF_WT 4
#endif
#ifndef CF_NT
#define CF_NT 256
#endif
#ifndef CF_BH
#define CF_BH CF_HT
#endif
#ifndef CF_MINB
#define CF_MINB 1
#endif
#ifndef CF_PUNROLL
#define CF_PUNROLL 1
#endif
#ifndef CF_POOL
#define CF_POOL 1
#endif
#ifndef CF_XSMEM
#define CF_XSMEM 1
#endif
#ifndef CF_WSMEM
#define CF_WSMEM 1
#endif
#ifndef CF_PIPE
#define CF_PIPE 2
#endif
#ifndef CF_MS
#define CF_MS 1
#endif

namespace {

constexpr int M = CF_M, C = CF_C, H = CF_H, W = CF_W, K = CF_K;
constexpr int TM = CF_TM, HT = CF_HT, WT = CF_WT, NT = CF_NT, BH = CF_BH, POOL = CF_POOL;
constexpr int HO = H - K + 1, WO = W - K + 1;
constexpr int HP = HO / POOL, WP = WO / POOL;                  // output map (pooled when POOL > 1)
constexpr int HE = POOL == 1 ? HO : HP * POOL;                  // conv rows / columns actually needed
constexpr int WE = POOL == 1 ? WO : WP * POOL;
constexpr int MG = (M + TM - 1) / TM;                            // map groups
constexpr int GS = TM >= 4 ? (TM + 3) / 4 * 4 : TM;             // weights per group per tap (16-byte aligned)
constexpr int MP = MG * GS;                                     // weights per tap (packed array)
constexpr int MS = CF_MS;                                       // map splits (blockIdx.y)
constexpr int MGS = MG / MS;                                    // map groups per block
constexpr int MPS = MGS * GS;                                   // weights per tap of one split
constexpr int G = (WE + WT - 1) / WT;                           // column groups per row
constexpr int NB = (HE + BH - 1) / BH;                          // row bands per image
constexpr int RT = BH / HT;                                     // row tiles per band
constexpr int ITEMS = MGS * RT * G;                             // work items per unit
constexpr int XW = WT + K - 1;                                  // input values per row segment
constexpr bool XVEC = (WT % 4 == 0) && CF_XSMEM;                // 16-byte input loads
constexpr int XWL = XVEC ? (XW + 3) / 4 * 4 : XW;
constexpr int PITCH0 = (G - 1) * WT + XWL > W ? (G - 1) * WT + XWL : W;
constexpr int PITCH = XVEC ? (PITCH0 + 3) / 4 * 4 : PITCH0;     // shared row length (zero padded)
constexpr int XR = BH + K - 1;                                  // staged input rows per channel
constexpr int PIPE = CF_XSMEM ? CF_PIPE : 0;                   // 0 plain copy, 1 cp.async, 2 + double buffer
constexpr int XS_ONE = CF_XSMEM ? (C * XR * PITCH + 3) / 4 * 4 : 0;   // floats of one staged band
constexpr int XS_FLOATS = (PIPE == 2 ? 2 : 1) * XS_ONE;
constexpr int WS_FLOATS = CF_WSMEM ? C * K * K * MPS : 0;
constexpr int WSTRIDE = CF_WSMEM ? MPS : MP;                     // weights per tap where they are read
constexpr int NWARPS = NT / 32;
constexpr bool VEC_OUT = POOL == 1 && WT % 4 == 0 && WO % 4 == 0;   // 16-byte stores (host keeps y 16-byte aligned)
constexpr bool VEC2_OUT = POOL == 1 && !VEC_OUT && WT % 2 == 0 && WO % 2 == 0;   // else 8-byte stores
constexpr int PUNROLL = CF_PUNROLL;                             // unroll of the kernel-row loop

static_assert(NT % 32 == 0, "CF_NT must be a multiple of 32");
static_assert(BH % HT == 0, "CF_BH must be a multiple of CF_HT");
static_assert(HT % POOL == 0 && WT % POOL == 0, "a thread tile must cover whole pooling windows");
static_assert(HE >= 1 && WE >= 1, "empty output");
static_assert(PIPE >= 0 && PIPE <= 2, "CF_PIPE is 0, 1 or 2");
static_assert(MS >= 1 && MG % MS == 0, "CF_MS must divide the map groups");

// Issue the copies of unit u's band (all C channels, XR rows, PITCH columns, zero padded) into dst.
__device__ __forceinline__ void stage_async(float* dst, const float* __restrict__ x, long long u, int lane, int warp)
{
    const long long b = u / NB;
    const int row0 = (int)(u - b * NB) * BH;
    const float* const xb = x + b * (long long)(C * H * W);
    for (int rr = warp; rr < C * XR; rr += NWARPS) {
        const int c = rr / XR, r = rr - c * XR, gr = row0 + r;
        const float* src = xb + (c * H + min(gr, H - 1)) * W;
        float* d = dst + rr * PITCH;
#pragma unroll
        for (int k = 0; k < (PITCH + 31) / 32; ++k) {
            const int col = lane + 32 * k;
            if (col < PITCH) copy_async4(d + col, src + min(col, W - 1), gr < H && col < W);
        }
    }
}


// The TM weights of one tap for map group g (maps g*TM ..), as wide as alignment allows (GS % 4 == 0
// when TM >= 4: float4 loads, then a float2 / float for the remainder).
__device__ __forceinline__ void load_weights(float (&wv)[TM], const float* __restrict__ src)
{
    constexpr int V4 = GS % 4 == 0 ? TM / 4 * 4 : 0;
#pragma unroll
    for (int t = 0; t < V4; t += 4) {
        const float4 v = *reinterpret_cast<const float4*>(src + t);
        wv[t] = v.x; wv[t + 1] = v.y; wv[t + 2] = v.z; wv[t + 3] = v.w;
    }
    constexpr int V2 = (GS % 2 == 0) ? V4 + (TM - V4) / 2 * 2 : V4;
#pragma unroll
    for (int t = V4; t < V2; t += 2) {
        const float2 v = *reinterpret_cast<const float2*>(src + t);
        wv[t] = v.x; wv[t + 1] = v.y;
    }
#pragma unroll
    for (int t = V2; t < TM; ++t) wv[t] = src[t];
}

}  // namespace

extern "C" __global__ void __launch_bounds__(CF_NT, CF_MINB)
conv_regtile(float* __restrict__ y, const float* __restrict__ x, const float* __restrict__ wt,
             const float* __restrict__ bias, int B)
{
    extern __shared__ float4 smem4[];
    float* const xs = reinterpret_cast<float*>(smem4);
    float* const ws = xs + XS_FLOATS;
    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;

    require_dynamic_smem(4u * (XS_FLOATS + WS_FLOATS));
    const int g0 = MS > 1 ? (int)blockIdx.y * MGS : 0;          // this block's first map group
    if constexpr (CF_WSMEM) {
        if constexpr (MS == 1) {
            for (int i = tid; i < WS_FLOATS; i += NT) ws[i] = __ldg(wt + i);
        } else {
            for (int i = tid; i < WS_FLOATS; i += NT) {
                const int tap = i / MPS;
                ws[i] = __ldg(wt + tap * MP + g0 * GS + (i - tap * MPS));
            }
        }
        __syncthreads();
    }
    const float* const wsrc = CF_WSMEM ? ws : wt + g0 * GS;

    const long long units = (long long)B * NB;
    if constexpr (PIPE == 2) {                                  // prefetch the first unit's band
        if ((long long)blockIdx.x < units) stage_async(xs, x, blockIdx.x, lane, warp);
        copy_commit();
    }
    int buf = 0;
    for (long long u = blockIdx.x; u < units; u += gridDim.x) {
        const long long b = u / NB;
        const int row0 = (int)(u - b * NB) * BH;               // first conv output row of this band
        const float* const xb = x + b * (long long)(C * H * W);
        const float* const xcur = xs + buf * XS_ONE;            // this unit's staged band

        if constexpr (PIPE == 2) {
            // the next unit's band goes into the other buffer while this one is computed (that buffer was
            // last read in the previous iteration, which ended with a barrier)
            const long long un = u + gridDim.x;
            if (un < units) stage_async(xs + (buf ^ 1) * XS_ONE, x, un, lane, warp);
            copy_commit();
            copy_wait<1>();                                     // this unit's copies (the older group) landed
            __syncthreads();
        } else if constexpr (PIPE == 1) {
            __syncthreads();                                    // the previous unit is done with xs
            stage_async(xs, x, u, lane, warp);
            copy_commit();
            copy_wait<0>();
            __syncthreads();
        } else if constexpr (CF_XSMEM) {
            __syncthreads();                                    // the previous unit is done with xs
            for (int rr = warp; rr < C * XR; rr += NWARPS) {
                const int c = rr / XR, r = rr - c * XR, gr = row0 + r;
                const float* src = xb + (c * H + gr) * W;
                float* dst = xs + rr * PITCH;
                for (int col = lane; col < PITCH; col += 32)
                    dst[col] = (gr < H && col < W) ? __ldg(src + col) : 0.0f;
            }
            __syncthreads();
        }

        for (int item = tid; item < ITEMS; item += NT) {
            const int gl = item / (RT * G);                     // map group within this split
            const int g = g0 + gl;
            const int rem = item - gl * (RT * G);
            const int rt = rem / G, cg = rem - rt * G;
            const int lr0 = rt * HT, ow0 = cg * WT, oh0 = row0 + lr0;

            // accumulators start at the bias (max pooling and the bias commute: both are monotone)
            float acc[HT][WT][TM];
#pragma unroll
            for (int t = 0; t < TM; ++t) {
                const float bm = (bias != nullptr && g * TM + t < M) ? __ldg(bias + g * TM + t) : 0.0f;
#pragma unroll
                for (int r = 0; r < HT; ++r)
#pragma unroll
                    for (int j = 0; j < WT; ++j) acc[r][j][t] = bm;
            }

            const float* wp = wsrc + gl * GS;
#pragma unroll 1
            for (int c = 0; c < C; ++c) {
#pragma unroll PUNROLL
                for (int p = 0; p < K; ++p) {
                    float xv[HT][XWL];
                    if constexpr (CF_XSMEM) {
                        const float* xp = xcur + (c * XR + lr0 + p) * PITCH + ow0;
#pragma unroll
                        for (int r = 0; r < HT; ++r) {
                            if constexpr (XVEC) {
#pragma unroll
                                for (int i = 0; i < XWL; i += 4) {
                                    const float4 v = *reinterpret_cast<const float4*>(xp + r * PITCH + i);
                                    xv[r][i] = v.x; xv[r][i + 1] = v.y; xv[r][i + 2] = v.z; xv[r][i + 3] = v.w;
                                }
                            } else {
#pragma unroll
                                for (int i = 0; i < XWL; ++i) xv[r][i] = xp[r * PITCH + i];
                            }
                        }
                    } else {
                        // global input: clamp rows and columns that only feed discarded outputs
#pragma unroll
                        for (int r = 0; r < HT; ++r) {
                            const int gr = min(oh0 + r + p, H - 1);
                            const float* src = xb + (c * H + gr) * W;
#pragma unroll
                            for (int i = 0; i < XWL; ++i) xv[r][i] = __ldg(src + min(ow0 + i, W - 1));
                        }
                    }
#pragma unroll
                    for (int q = 0; q < K; ++q) {
                        float wv[TM];
                        load_weights(wv, wp + (p * K + q) * WSTRIDE);
#pragma unroll
                        for (int r = 0; r < HT; ++r)
#pragma unroll
                            for (int j = 0; j < WT; ++j)
#pragma unroll
                                for (int t = 0; t < TM; ++t)
                                    acc[r][j][t] = fmaf(wv[t], xv[r][j + q], acc[r][j][t]);
                    }
                }
                wp += K * K * WSTRIDE;
            }

            // ---- epilogue ---- (one 64-bit base per item; maps and rows are compile-time offsets from it)
            const long long mb = b * M + g * TM;                  // first map of this group, flattened with b
#pragma unroll
            for (int t = 0; t < TM; ++t) {
                if (g * TM + t >= M) break;
                if constexpr (POOL == 1) {
                    const long long base = (mb * HO + oh0) * (long long)WO + ow0;   // map g*TM, row oh0
#pragma unroll
                    for (int r = 0; r < HT; ++r) {
                        if (oh0 + r >= HO) break;
                        if constexpr (VEC_OUT) {
                            // indexed as float4: a float pointer cast to float4* was split into 4 stores by NVVM
                            float4* y4 = reinterpret_cast<float4*>(y) + (base >> 2) + (t * HO * WO + r * WO) / 4;
#pragma unroll
                            for (int j = 0; j < WT; j += 4)
                                if (ow0 + j < WO)
                                    y4[j >> 2] = make_float4(activate(acc[r][j][t]), activate(acc[r][j + 1][t]),
                                                             activate(acc[r][j + 2][t]), activate(acc[r][j + 3][t]));
                        } else if constexpr (VEC2_OUT) {
                            float2* y2 = reinterpret_cast<float2*>(y) + (base >> 1) + (t * HO * WO + r * WO) / 2;
#pragma unroll
                            for (int j = 0; j < WT; j += 2)
                                if (ow0 + j < WO)
                                    y2[j >> 1] = make_float2(activate(acc[r][j][t]), activate(acc[r][j + 1][t]));
                        } else {
                            float* yrow = y + base + (t * HO * WO + r * WO);
#pragma unroll
                            for (int j = 0; j < WT; ++j)
                                if (ow0 + j < WO) yrow[j] = activate(acc[r][j][t]);
                        }
                    }
                } else {
                    const long long base = (mb * HP + oh0 / POOL) * (long long)WP + ow0 / POOL;
#pragma unroll
                    for (int i = 0; i < HT / POOL; ++i) {
                        if (oh0 / POOL + i >= HP) break;
                        float* yrow = y + base + (t * HP * WP + i * WP);
#pragma unroll
                        for (int jj = 0; jj < WT / POOL; ++jj) {
                            float v = acc[i * POOL][jj * POOL][t];
#pragma unroll
                            for (int a = 0; a < POOL; ++a)
#pragma unroll
                                for (int e = 0; e < POOL; ++e) v = max_nan(v, acc[i * POOL + a][jj * POOL + e][t]);
                            if (ow0 / POOL + jj < WP) yrow[jj] = activate(v);
                        }
                    }
                }
            }
        }
        if constexpr (PIPE == 2) {
            __syncthreads();                                    // all reads of xcur done before it is refilled
            buf ^= 1;
        }
    }
}
