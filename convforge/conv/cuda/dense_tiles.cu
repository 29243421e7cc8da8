// Dense layer for 17-2048 rows, y = x W^T + b: a register-tiled SGEMM split over the reduction (split-K).
//
// At 100 images fa18's first dense layer is 100 x 17496 x 160: cuBLAS ran it in 33-59 us (its tiles for a
// 100 x 160 output make a few dozen blocks that each walk all 17496 columns), gemv (dense_gemv.cu) re-reads
// the weights once per group of 16 rows. Here block (bn, s, bm) computes a TILE_M x TILE_N tile of the output
// over the s-th slice of the reduction (the host picks slices so the grid fills the GPU several times over).
// x's and W's TILE_K-column slabs are copied to shared memory as they lie (rows of TILE_K floats, padded to
// 20) by cp.async, STAGES - 1 slabs in flight while one is used (the first version staged one slab through
// registers, transposed: fa18's layer at 100 rows 37.7 against 35.2 us on an H200, sums included; k-major slabs
// of 32 columns needed more registers and were slower). Thread (tm, tn) owns rows tm + 16 i (i < THREAD_M) and
// outputs tn + 8 j (j < 4): per 4 columns it reads THREAD_M + 4 16-byte vectors of shared memory into
// 16 THREAD_M fused multiply-adds, and the strided ownership puts a warp's 4 row vectors and 8 weight vectors
// in distinct banks (row stride 5 vectors). The partial sums go to part[s][row][n]; dense_gemv.cu's
// dense_gemv_sum adds the slices in a fixed order, with the bias and activation: deterministic, as gemv's. Each
// sum is a chain of fmaf over its slice's columns in order. Needs K % 4 == 0 and 16-byte aligned x and W (the
// caller checks); any M, N.
#include "async_copy.cuh"

#ifndef TILE_M
#define TILE_M 64         // 64 or 128 rows a block (128: 8 rows a thread, fewer loads per FMA)
#endif
#define THREAD_M (TILE_M / 16)
#define TILE_N 32
#define TILE_K 16
#define STAGES (TILE_M == 64 ? 4 : 3)   // 128 rows: 4 stages would pass the 48 KB of static shared memory
#define THREADS 128
#ifndef TILES_MIN_BLOCKS   // blocks an SM holds, as shared memory allows: caps the registers
#define TILES_MIN_BLOCKS (TILE_M == 64 ? 6 : 4)   // 64 rows: 80 (96 unbounded: 5 blocks; 8 blocks spill); 128: 128
#endif
#define ROW 20            // floats per staged row: TILE_K + 4 (a stride of 5 vectors spreads rows over the banks)
#define STAGE_FLOATS ((TILE_M + TILE_N) * ROW)

extern "C" __global__ void __launch_bounds__(THREADS, TILES_MIN_BLOCKS) dense_tiles_part(
    const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ part,
    int M, int K, int N, int slice_len)
{
    __shared__ float4 stage4[STAGES * STAGE_FLOATS / 4];   // float4: 16-byte aligned for cp.async and reads
    float* const stage = reinterpret_cast<float*>(stage4);
    const int tid = threadIdx.x;
    const int n0 = blockIdx.x * TILE_N, slice = blockIdx.y, m0 = blockIdx.z * TILE_M;
    const int k_begin = slice * slice_len, k_end = min(K, k_begin + slice_len);
    const int slabs = (k_end - k_begin + TILE_K - 1) / TILE_K;
    // a slab: (TILE_M + TILE_N) rows x 4 vectors; chunk c = tid + THREADS t is vector c % 4 of slab row c / 4
    // (x's rows first, then W's); consecutive threads read 64 contiguous bytes of one row
    auto load = [&](int s) {
        float* dst = stage + (s % STAGES) * STAGE_FLOATS;
        const int k0 = k_begin + s * TILE_K;
#pragma unroll
        for (int t = 0; t < (TILE_M + TILE_N) * 4 / THREADS; ++t) {
            const int c = tid + t * THREADS, r = c / 4, k = k0 + (c % 4) * 4;
            const bool is_x = r < TILE_M;
            const int g = is_x ? m0 + r : n0 + r - TILE_M;   // row of x or of W
            const bool valid = k < k_end && g < (is_x ? M : N);   // k, k_end multiples of 4: all in or all out
            const float* src = valid ? (is_x ? x : w) + (size_t)g * K + k : x;
            copy_async16_zfill(dst + r * ROW + (c % 4) * 4, src, valid);
        }
    };
    const int tn = tid % 8, tm = tid / 8;
    float acc[THREAD_M][4];
#pragma unroll
    for (int i = 0; i < THREAD_M; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < slabs) load(s);
        copy_commit();   // empty groups too: the wait below counts groups
    }
    for (int s = 0; s < slabs; ++s) {
        copy_wait<STAGES - 2>();   // slab s has landed (this thread's copies) ...
        __syncthreads();           // ... everyone's, and slab s - 1's stage is free to refill
        if (s + STAGES - 1 < slabs) load(s + STAGES - 1);
        copy_commit();
        const float* xs = stage + (s % STAGES) * STAGE_FLOATS;
        const float* ws = xs + TILE_M * ROW;
#pragma unroll
        for (int q = 0; q < TILE_K / 4; ++q) {
            float4 b[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = *reinterpret_cast<const float4*>(ws + (tn + 8 * j) * ROW + q * 4);
#pragma unroll
            for (int i = 0; i < THREAD_M; ++i) {
                const float4 a = *reinterpret_cast<const float4*>(xs + (tm + 16 * i) * ROW + q * 4);
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    float v = acc[i][j];
                    v = fmaf(a.x, b[j].x, v);
                    v = fmaf(a.y, b[j].y, v);
                    v = fmaf(a.z, b[j].z, v);
                    acc[i][j] = fmaf(a.w, b[j].w, v);
                }
            }
        }
    }
    copy_wait<0>();   // no copy outlives the block (the trailing groups are empty)
#pragma unroll
    for (int i = 0; i < THREAD_M; ++i) {
        const int m = m0 + tm + 16 * i;
        if (m >= M) break;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = n0 + tn + 8 * j;
            if (n < N) part[((size_t)slice * M + m) * N + n] = acc[i][j];
        }
    }
}
