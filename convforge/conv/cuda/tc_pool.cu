// cuda-tc-fp16, "pool" kernel: conv + bias + activation + 2x2 max pool on FP16 tensor cores, only the pooled map
// stored: the fast path's fused first convs (one channel, 4-50 maps), which the rows and pairs kernels serve only
// unfused (their conv output, 4x the pooled bytes, then goes through a separate pool).
//
// The product is tc_rows.cu's banded one: for channel c and kernel row p, A (16 x k16) holds 16 conv rows' input
// columns w0..w0+15 straight from the staged image, B (k16 x 8) = T[k][n] = w[m][c][p][k-n] one map's banded
// filter row (zero unless 0 <= k-n < K), D = 16 conv rows x 8 conv columns of that map (K/16 of the work useful).
// What is new is the order of the 16 rows: mma row g is conv row 2q and row g+8 conv row 2q+1, q = q0 + g, so a
// lane's four accumulators (c0 c1 = row g, columns 2t and 2t+1; c2 c3 = row g+8, the same columns) are exactly
// the 2x2 window of pooled output (q, w0/2 + 4n + t): max of four, + bias, activation (monotone), one store. No
// shuffle and no shared scratch in the epilogue, and a quarter of the rows kernel's output bytes.
// The same order lets one loaded row serve twice: conv row 2q+1 at kernel row p reads image row 2q+1+p, which is
// what conv row 2q reads at kernel row p+1, so a lane loads K+1 image rows a channel instead of 2K; and a row's
// 8-byte pair at column 8j+2t is a2/a3 of column tile j-1 and a0/a1 of tile j. (K+1)(NC+1) shared loads (and FP16
// conversions) a channel feed K*NC*MT mmas, where the rows kernel loads 4*K*NC for K*NC*MT.
//
// Staging as tc_rows.cu: cp.async copies (16 or 8 bytes where the width allows) of a unit's IB images into rows
// of PITCH floats (CF_PIPE 2: the next unit streams into a second buffer meanwhile); the pitch is 4 or 12 (mod 16)
// floats, so that a half warp's 8-byte loads (lanes g = 0..3 on rows two apart, t = 0..3 on neighbouring pairs)
// hit 32 distinct banks. Columns past W stay zero: the last column tile's banded zeros multiply them. Pooled rows
// past the unit's last read image 0.
// Non-finite inputs (and FP16's overflow past +-65504) spoil whole mma rows through the banded zeros (Inf * 0), as
// in the rows kernel; here a spoilt conv value may also vanish in a window's max, so a block whose probe turned NaN
// recomputes every pooled output of the tiles it computed in exact fp32 (redo_pooled_outputs): NaN and +-Inf
// where torch's conv + activation + max pool put them, after the vote; finite data pay two FFMAs a column tile.
// Measured (H100, B = 10000, tuned launches): the six preset first convs in 0.097-0.498 ms, 1.43-2.37x less than
// cuda-auto's exact fused kernel (benchmarks/2026-11-28-h100-fast-first-conv-tc-pool); with tanhf in the epilogue
// sp19 and fa19 lost (0.94x).
// Floor semantics as F.max_pool2d: conv rows and columns that fill no window are never computed or stored.
// Epilogue activation: tanh.approx (activate_fast), at the FP16 inputs' precision. Small batches: blockIdx.y splits
// a unit's warp tiles over several blocks (Tile), so 10 images still fill the GPU.
// Constants: CF_M CF_C CF_H CF_W CF_K, CF_ACT (activation.cuh), CF_MT (maps per warp tile), CF_NC (8-column conv
// tiles per warp tile), CF_IB (images per unit), CF_NT (threads), CF_PIPE, CF_OUT_HALF (y in FP16, stores.cuh's
// output_element: for a consumer that reads FP16), CF_STREAM_STORES.

#include "async_copy.cuh"
#include "mma.cuh"
#include "activation.cuh"
#include "stores.cuh"
#include "nonfinite.cuh"

#ifndef CF_MT
#define CF_MT 4
#endif
#ifndef CF_NC
#define CF_NC 4
#endif
#ifndef CF_IB
#define CF_IB 1
#endif
#ifndef CF_NT
#define CF_NT 128
#endif
#ifndef CF_PIPE
#define CF_PIPE 1
#endif
#ifndef CF_OUT_HALF
#define CF_OUT_HALF 0
#endif

namespace {

constexpr int M = CF_M, C = CF_C, H = CF_H, W = CF_W, K = CF_K;
constexpr int MT = CF_MT, NC = CF_NC, IB = CF_IB, NT = CF_NT;
constexpr int HO = H - K + 1, WO = W - K + 1;
constexpr int HP = HO / 2, WP = WO / 2;                 // pooled rows and columns (floor)
constexpr int CT = (2 * WP + 7) / 8;                    // 8-column conv tiles per row (4 pooled columns each)
constexpr int CG = (CT + NC - 1) / NC;                  // column groups (a warp tile's width)
constexpr int PROWS = IB * HP;                          // pooled rows of one unit
constexpr int RT = (PROWS + 7) / 8;                     // 16-conv-row (8-pooled-row) tiles per unit
constexpr int MG = (M + MT - 1) / MT;                   // map groups
constexpr int TILES = RT * CG * MG;                     // warp tiles per unit
constexpr int WROW = 24;                                // padded filter row, as tc_rows.cu's
constexpr int NEED = CG * NC * 8 + 8;                   // staged columns read (last tile + 15)
constexpr int PITCH = ((NEED > W ? NEED : W) + 3) / 8 * 8 + 4;   // 4 (mod 8): 4 or 12 (mod 16)
constexpr int IMG_S = C * H * PITCH;                    // staged floats per image
constexpr int XS_ONE = (IB * IMG_S + 3) / 4 * 4;        // one staging buffer
constexpr int XS_FLOATS = (CF_PIPE == 2 ? 2 : 1) * XS_ONE;
constexpr int WS_WORDS = MG * MT * C * K * WROW;
constexpr int NWARPS = NT / 32;
static_assert(K <= 9, "the banded product covers 8 conv columns with 16 input columns: K <= 9");
static_assert(HP >= 1 && WP >= 1, "the layer has no whole 2x2 window");
static_assert(NT % 32 == 0, "CF_NT must be a multiple of 32");
#if CF_OUT_HALF
using out_t = unsigned short;
#else
using out_t = float;
#endif

// one staged row's NC + 1 FP16 pairs at columns 8j + 2t (j = 0 .. NC) of this lane's column group
__device__ __forceinline__ void load_row(unsigned (&r)[NC + 1], const float* row)
{
#pragma unroll
    for (int j = 0; j <= NC; ++j) {
        const float2 v = *reinterpret_cast<const float2*>(row + 8 * j);
        r[j] = half2_bits(v.x, v.y);
    }
}

// The epilogue's activation: tanh.approx.f32 (one MUFU op, at most 2^-10.99 relative error, the FP16 inputs'
// order) for tanh, and sigmoid(v) = (1 + tanh(v / 2)) / 2 through it; relu exact. tanhf took about 20 instructions
// a pooled value, more than the mmas of its window on the tanh layers (fa18 L1: 18 values against 126 mmas a
// warp tile). The exact redo below uses activation.cuh's activate.
__device__ __forceinline__ float tanh_fast(float v)
{
#if defined(__CUDA_ARCH__)
    float r;
    asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
#else
    return tanhf(v);
#endif
}

__device__ __forceinline__ float activate_fast(float v)
{
#if CF_ACT == 1
    return tanh_fast(v);
#elif CF_ACT == 3
    return fmaf(0.5f, tanh_fast(0.5f * v), 0.5f);
#else
    return activate(v);
#endif
}

// The warp tiles a block computes: the block (blockIdx.x, blockIdx.y) takes units blockIdx.x, + gridDim.x, ...
// and of each unit the tiles blockIdx.y, + gridDim.y, ... (several blocks share a unit's tiles where there are
// fewer units than the GPU holds blocks: small batches). A tile = (map group, 8-pooled-row tile, column group).
struct Tile {
    int mg, rt, cg;
    __device__ __forceinline__ explicit Tile(int tile)
        : mg(tile / (RT * CG)), rt((tile - mg * (RT * CG)) / CG), cg(tile - mg * (RT * CG) - rt * CG) {}
};

// After the main loop: if any lane of the block saw a non-finite accumulator, the block recomputes every pooled
// output of the tiles it computed in exact fp32 (x and w from global memory): the four conv values of the window
// (nonfinite.cuh's exact_conv_value), max keeping NaN, + bias, activation. Every output of those
// tiles, not only the non-finite ones, because fmaxf may have dropped a spoilt conv value from a window; and only
// those tiles' outputs, which no other block writes.
__device__ CF_COLD void redo_pooled_outputs(bool seen, out_t* __restrict__ y, const float* __restrict__ x,
                                            const float* __restrict__ w, const float* __restrict__ bias, int B)
{
    constexpr int PER_TILE = MT * 8 * NC * 4;                  // maps x pooled rows x pooled columns
    if (!block_any(seen)) return;
    for (long long b0 = (long long)blockIdx.x * IB; b0 < B; b0 += (long long)gridDim.x * IB) {
        const int prows = (B - b0 < IB ? (int)(B - b0) : IB) * HP;
        for (int tile = blockIdx.y; tile < TILES; tile += gridDim.y) {
            const Tile tl(tile);
            for (int i = threadIdx.x; i < PER_TILE; i += NT) {
                const int m = i / (8 * NC * 4), rem = i - m * (8 * NC * 4), r = rem / (NC * 4);
                const int map = tl.mg * MT + m, pr = tl.rt * 8 + r, pc = tl.cg * NC * 4 + (rem - r * (NC * 4));
                if (map >= M || pr >= prows || pc >= WP) continue;
                const int img = pr / HP, q = pr - img * HP;
                float best = 0.0f;
#pragma unroll 1
                for (int e = 0; e < 4; ++e) {
                    const float v = exact_conv_value<C, H, W, K>(
                        x + ((b0 + img) * C * H + 2 * q + (e >> 1)) * W + 2 * pc + (e & 1), w + map * (C * K * K));
                    best = e ? max_nan(best, v) : v;
                }
                const float bm = bias != nullptr ? __ldg(bias + map) : 0.0f;
                store_out(y + (((b0 + img) * M + map) * HP + q) * WP + pc, output_element(activate(best + bm), out_t()));
            }
        }
    }
}

}  // namespace

// y (B, M, HP, WP) float or FP16 bits; x (B, C, H, W) fp32; wpad [MG*MT][C][K][WROW] FP16 pairs (cuda_tc.pack_rows);
// w (M, C, K, K) fp32 (the exact redo's); bias (M) or null.
extern "C" __global__ void __launch_bounds__(CF_NT)
conv_tc_pool(out_t* __restrict__ y, const float* __restrict__ x, const unsigned* __restrict__ wpad,
             const float* __restrict__ w, const float* __restrict__ bias, int B)
{
    extern __shared__ float4 smem4[];
    float* const xs = reinterpret_cast<float*>(smem4);
    unsigned* const ws = reinterpret_cast<unsigned*>(xs + XS_FLOATS);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;

    require_dynamic_smem(4u * (XS_FLOATS + WS_WORDS));
    for (int i = tid; i < WS_WORDS; i += NT) ws[i] = __ldg(wpad + i);
    constexpr int PAD = PITCH - W, PAD_ROWS = XS_FLOATS / PITCH;   // staging rows of every buffer
    if constexpr (PAD > 0)                                     // only the padding: the copies fill the rest
        for (int i = tid; i < PAD_ROWS * PAD; i += NT) xs[i / PAD * PITCH + W + i % PAD] = 0.0f;
    __syncthreads();                                           // (before a unit's rows are read)

    const int units = (B + IB - 1) / IB;
    const auto images = [&](int unit) { return B - unit * IB < IB ? B - unit * IB : IB; };
    const auto stage = [&](float* dst, int unit) {                // 16/8-byte copies over the whole block
        stage_rows_async_wide<W, PITCH, NT>(dst, x + (long long)(unit * IB) * (C * H * W), images(unit) * C * H, tid);
    };
    stage_first_unit<CF_PIPE>(stage, xs, units);
    int buf = 0;
    float probe = 0.0f;                                        // NaN once an accumulator was not finite
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
        const int b0 = u * IB, nimg = images(u);
        const float* const xcur = xs + buf * XS_ONE;
        stage_unit<CF_PIPE>(stage, xs, XS_ONE, buf, u, units);
        __syncthreads();
        const int prows = nimg * HP;                           // valid pooled rows of this unit

        for (int tile = blockIdx.y + warp * gridDim.y; tile < TILES; tile += NWARPS * gridDim.y) {
            const Tile tl(tile);
            const int mg = tl.mg, rt = tl.rt;
            const int col0 = tl.cg * NC * 8;
            const int pr = rt * 8 + g;                          // this lane's pooled row of the unit
            const bool row_ok = pr < prows;
            const int img = row_ok ? pr / HP : 0, q = row_ok ? pr - img * HP : 0;
            const float* const xa = xcur + img * IMG_S + 2 * q * PITCH + col0 + 2 * t;

            float acc[MT][NC][4];
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int n = 0; n < NC; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.0f;

            const unsigned* const wrow = ws + mg * MT * C * K * WROW + 2 * t - g + 7;
#pragma unroll 1
            for (int c = 0; c < C; ++c) {
                const float* const xc = xa + c * H * PITCH;
                unsigned cur[NC + 1], nxt[NC + 1];             // image rows 2q + p and 2q + p + 1
                load_row(cur, xc);
#pragma unroll
                for (int p = 0; p < K; ++p) {
                    load_row(nxt, xc + (p + 1) * PITCH);
                    unsigned bw[MT][2];
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
                        const unsigned* wr = wrow + ((m * C + c) * K + p) * WROW;
                        bw[m][0] = wr[0];
                        bw[m][1] = wr[8];
                    }
#pragma unroll
                    for (int m = 0; m < MT; ++m)
#pragma unroll
                        for (int n = 0; n < NC; ++n) {
                            const unsigned a[4] = {cur[n], nxt[n], cur[n + 1], nxt[n + 1]};
                            mma<1>(acc[m][n], a, bw[m][0], bw[m][1]);
                        }
#pragma unroll
                    for (int j = 0; j <= NC; ++j) cur[j] = nxt[j];
                }
            }

            // the probe: conv rows 2q and 2q+1 of the first map, in the column tiles that hold stored windows
#pragma unroll
            for (int n = 0; n < NC; ++n)
                if (col0 + n * 8 < 2 * WP) probe = nonfinite_probe(nonfinite_probe(probe, acc[0][n][0]), acc[0][n][2]);

            if (!row_ok) continue;
            out_t* const yrow = y + ((long long)(b0 + img) * M * HP + q) * WP;
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                const int map = mg * MT + m;
                if (map >= M) break;
                const float bm = bias != nullptr ? __ldg(bias + map) : 0.0f;
#pragma unroll
                for (int n = 0; n < NC; ++n) {
                    const int pc = (col0 >> 1) + 4 * n + t;
                    if (pc < WP) {
                        const float best = fmaxf(fmaxf(acc[m][n][0], acc[m][n][1]), fmaxf(acc[m][n][2], acc[m][n][3]));
                        store_out(yrow + (long long)map * HP * WP + pc, output_element(activate_fast(best + bm), out_t()));
                    }
                }
            }
        }
        __syncthreads();                                       // every warp is done with xcur before it refills
        if constexpr (CF_PIPE == 2) buf ^= 1;
    }
    redo_pooled_outputs(probe != 0.0f, y, x, w, bias, B);
}
