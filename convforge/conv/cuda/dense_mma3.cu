// Dense layer for 1-64 rows on the tensor cores, fp32-accurate: split-K partial products in split TF32 (3xTF32)
// with mma.sync, the batch's rows in one block.
//
// At 10 images the exact dense head is bound by reading the weights (fa18's 17496 x 160 as two TF32 parts: 22 MB).
// This form reads each slab of them once per block of 32 outputs, with the rows of the whole batch, and ran the
// head 1.06-1.14x faster than the engine's best form for fa17, fa18 and fa19 at 10 rows on an H200 (it lost at
// 64-1000 rows to the Triton tc3 forms in every launch shape tried: benchmarks/2026-11-29-h200-dense-mma3-small-batch).
// Block (n, s) computes WARP_RT x 16 rows x 32 outputs of the s-th slice of the reduction. Each 64-column slab of
// the slice, x's rows and the weights' two TF32 parts (split once on the host, conv.split_tf32), is staged in
// shared memory by cp.async, one slab in flight while one is used, and each of the 4 warps takes 16 of its
// columns: two 8-column mma steps. The reduction's order within them is the sum's to choose as long as x and w
// agree: step h takes columns 4t + 2h (as mma column t) and 4t + 2h + 1 (as t + 4), so a lane's four columns of a
// row are one 16-byte read. x is split in registers as gpu_dense_tc's Triton kernel splits it (big truncated,
// small the plain rest). Each 16 x 8 tile's six products of the two steps (x small * w big, x big * w small,
// x big * w big) go to a fresh sum added in fp32, because the tensor cores' accumulation truncates (the products
// straight into the running sum: SUMS 1, the tests' known-wrong fixture), issued across the warp's 4 output tiles
// in turn so that no mma waits on the one just before it. At the end the 4 warps' sums are added in warp order
// through shared memory, and part[s][row][n] gets the slice's partial: dense_gemv.cu's dense_gemv_sum or
// dense_head_sum adds the slices in a fixed order (deterministic). Staged rows are 80 floats apart (16 mod 32), so
// a quarter warp's 16-byte reads hit distinct banks. Needs M <= 16 WARP_RT, x contiguous, K % 4 == 0, x and the
// weights 16-byte aligned (the caller checks); any N, slice_len a multiple of 4.
#include "async_copy.cuh"
#include "mma.cuh"

#ifndef WARP_RT
#define WARP_RT 4         // 16-row mma tiles: the block's (every warp's) rows; 1, 2 or 4
#endif
#ifndef SUMS
#define SUMS 0            // 1: the three products go straight into the running sum, a known-wrong fixture (tests)
#endif
#define ROWS (WARP_RT * 16)
#define OUTS 32           // outputs a block: 4 mma tiles of 8
#define WARPS 4
#define THREADS (WARPS * 32)
#define STAGES 2
#define SLAB (WARPS * 16)
#define PITCH (SLAB + 16)
#define VECS (SLAB / 4)                 // 16-byte vectors a staged row
#define COPY_ROWS (THREADS / VECS)      // rows one pass of the block's copies covers
#define X_COPIES (ROWS / COPY_ROWS)     // 16-byte copies of x a thread makes a slab
#define W_COPIES (2 * OUTS / COPY_ROWS) // ... of the weights' two parts
#define X_FLOATS (ROWS * PITCH)
#define W_FLOATS (OUTS * PITCH)
#define STAGE_FLOATS (X_FLOATS + 2 * W_FLOATS)
#define SUM_PITCH (OUTS + 8)   // floats a row of the closing reduction (float2 stores spread over banks)
#define SMEM_BYTES (4 * (STAGES * STAGE_FLOATS > WARPS * ROWS * SUM_PITCH ? STAGES * STAGE_FLOATS \
                                                                         : WARPS * ROWS * SUM_PITCH))

// B fragment register r (0: mma column t, 1: t + 4) of step h from a lane's four staged columns
__device__ __forceinline__ unsigned b_bits(const float4& v, int h, int r)
{
    return __float_as_uint(h == 0 ? (r == 0 ? v.x : v.y) : (r == 0 ? v.z : v.w));
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) dense_mma3_part(
    const float* __restrict__ x, const float* __restrict__ w_big, const float* __restrict__ w_small,
    float* __restrict__ part, int M, int K, int N, int slice_len)
{
    require_dynamic_smem(SMEM_BYTES);
    extern __shared__ float4 smem4[];
    float* const smem = reinterpret_cast<float*>(smem4);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const int n0 = blockIdx.x * OUTS, slice = blockIdx.y;
    const int k_begin = slice * slice_len, k_end = min(K, k_begin + slice_len);
    const int slabs = (k_end - k_begin + SLAB - 1) / SLAB;
    // Thread tid copies 16-byte vector tid % VECS of rows tid / VECS + COPY_ROWS i of a slab: x's rows, then
    // w_big's, then w_small's. Its rows are fixed, so their validity and start are worked out once.
    const int copy_row = tid / VECS, copy_col = (tid % VECS) * 4;
    const float* const x_row = x + (size_t)copy_row * K + k_begin + copy_col;
    const size_t w_offset = (size_t)(n0 + copy_row) * K + k_begin + copy_col;
    unsigned x_valid = 0, w_valid = 0;   // bit i: this thread's row COPY_ROWS i is in
#pragma unroll
    for (int i = 0; i < X_COPIES; ++i) x_valid |= (copy_row + COPY_ROWS * i < M ? 1u : 0u) << i;
#pragma unroll
    for (int i = 0; i < W_COPIES / 2; ++i) w_valid |= (n0 + copy_row + COPY_ROWS * i < N ? 1u : 0u) << i;
    auto load = [&](int s) {
        float* dst = smem + (s % STAGES) * STAGE_FLOATS + copy_row * PITCH + copy_col;
        const int k = s * SLAB;   // from the slice's start
        const bool k_in = k_begin + k + copy_col < k_end;   // k, k_end multiples of 4: all in or all out
#pragma unroll
        for (int i = 0; i < X_COPIES; ++i) {
            const bool valid = k_in && (x_valid >> i & 1u);
            copy_async16_zfill(dst + COPY_ROWS * i * PITCH, valid ? x_row + (size_t)COPY_ROWS * i * K + k : x, valid);
        }
#pragma unroll
        for (int i = 0; i < W_COPIES; ++i) {
            const int r = i % (W_COPIES / 2);
            const bool valid = k_in && (w_valid >> r & 1u);
            const float* src = (i < W_COPIES / 2 ? w_big : w_small) + w_offset + (size_t)COPY_ROWS * r * K + k;
            copy_async16_zfill(dst + X_FLOATS + COPY_ROWS * i * PITCH, valid ? src : x, valid);
        }
    };
    float acc[WARP_RT][4][4];
#pragma unroll
    for (int i = 0; i < WARP_RT; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;

    if (slabs > 0) load(0);
    copy_commit();
    const int col = warp * 16 + 4 * t;
    const int live_tiles = (M + 15) / 16;   // row tiles with a row of the batch
    for (int s = 0; s < slabs; ++s) {
        copy_wait<0>();    // slab s has landed (this thread's copies) ...
        __syncthreads();   // ... everyone's, and slab s - 1's stage is free to refill
        if (s + 1 < slabs) load(s + 1);
        copy_commit();
        const float* xs = smem + (s % STAGES) * STAGE_FLOATS;
        const float* wb = xs + X_FLOATS;
        const float* ws = wb + W_FLOATS;
        float4 b_big[4], b_small[4];   // row 8j + g's four columns
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            b_big[j] = *reinterpret_cast<const float4*>(wb + (8 * j + g) * PITCH + col);
            b_small[j] = *reinterpret_cast<const float4*>(ws + (8 * j + g) * PITCH + col);
        }
#pragma unroll
        for (int i = 0; i < WARP_RT; ++i) {
            if (i >= live_tiles) break;   // block-uniform
            const float4 top = *reinterpret_cast<const float4*>(xs + (16 * i + g) * PITCH + col);
            const float4 low = *reinterpret_cast<const float4*>(xs + (16 * i + g + 8) * PITCH + col);
            // A fragments of the two steps: (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)
            const float a[2][4] = {{top.x, low.x, top.y, low.y}, {top.z, low.z, top.w, low.w}};
            unsigned a_big[2][4], a_small[2][4];
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    a_big[h][q] = __float_as_uint(a[h][q]) & 0xffffe000u;
                    a_small[h][q] = __float_as_uint(a[h][q] - __uint_as_float(a_big[h][q]));
                }
#if SUMS == 1
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    mma<0>(acc[i][j], a_small[h], b_bits(b_big[j], h, 0), b_bits(b_big[j], h, 1));
                    mma<0>(acc[i][j], a_big[h], b_bits(b_small[j], h, 0), b_bits(b_small[j], h, 1));
                    mma<0>(acc[i][j], a_big[h], b_bits(b_big[j], h, 0), b_bits(b_big[j], h, 1));
                }
#else
            float step[4][4] = {};
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    mma<0>(step[j], a_small[h], b_bits(b_big[j], h, 0), b_bits(b_big[j], h, 1));
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    mma<0>(step[j], a_big[h], b_bits(b_small[j], h, 0), b_bits(b_small[j], h, 1));
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    mma<0>(step[j], a_big[h], b_bits(b_big[j], h, 0), b_bits(b_big[j], h, 1));
            }
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int q = 0; q < 4; ++q) acc[i][j][q] += step[j][q];
#endif
        }
    }
    copy_wait<0>();   // no copy outlives the block (the trailing group is empty)
    __syncthreads();  // every warp is done with the stages: they become the warps' sums
    float* const mine = smem + warp * ROWS * SUM_PITCH;
#pragma unroll
    for (int i = 0; i < WARP_RT; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {   // accumulator: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)
            float* const o = mine + (16 * i + g) * SUM_PITCH + 8 * j + 2 * t;
            *reinterpret_cast<float2*>(o) = make_float2(acc[i][j][0], acc[i][j][1]);
            *reinterpret_cast<float2*>(o + 8 * SUM_PITCH) = make_float2(acc[i][j][2], acc[i][j][3]);
        }
    __syncthreads();
    for (int e = tid; e < ROWS * OUTS; e += THREADS) {
        const int r = e / OUTS, n = e % OUTS;
        if (r >= M || n0 + n >= N) continue;
        float v = smem[r * SUM_PITCH + n];
#pragma unroll
        for (int w = 1; w < WARPS; ++w) v += smem[(w * ROWS + r) * SUM_PITCH + n];
        part[((size_t)slice * M + r) * N + n0 + n] = v;
    }
}
