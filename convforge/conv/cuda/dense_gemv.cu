// Small-batch dense layer, y = x W^T + b for a few rows (10-100 images): split-K GEMV in two launches.
//
// cuBLAS runs a 10 x 7200 x 500 product (fa17's first dense layer at 10 images) on a handful of blocks:
// 24-27 us for 14.4 MB of weights that the copy rate reads in under 5 us. Here the weights are read once,
// by every SM: block (bx, s) takes CF_WARPS * CF_OUTS outputs and the s-th slice of CF_KS reduction
// columns; the slice of x (rows x CF_KS) is staged in shared memory; each warp reads CF_OUTS weight rows with
// 16-byte loads (lane = column quad) and keeps CF_ROWS x CF_OUTS sums per lane (grid z: groups of CF_ROWS
// rows, each reading the weights again, mostly from L2); a reduce-scatter of shuffles
// (62 for 64 sums, not 320) leaves each sum on one lane, which writes it to part[s][row][n].
// dense_gemv_sum adds the slices in a fixed order plus the bias: deterministic, so a CUDA graph replays bit-equal.
// Needs K % 4 == 0 and 16-byte aligned x and W (the caller checks). CF_ROWS: 4, 8 or 16 (a power of two).
#ifndef CF_ROWS
#define CF_ROWS 16
#endif
#define CF_WARPS 8
#define CF_OUTS 4
#define CF_KS 512
#define CF_SUMS (CF_OUTS * CF_ROWS)

extern "C" __global__ void __launch_bounds__(CF_WARPS * 32) dense_gemv_part(
    const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ part, int all_rows, int K, int N)
{
    __shared__ float4 xs[CF_ROWS * (CF_KS / 4)];
    const int slice = blockIdx.y, k0 = slice * CF_KS;
    const int r0 = blockIdx.z * CF_ROWS, rows = min(CF_ROWS, all_rows - r0);   // this block's rows: r0 + r
    x += (size_t)r0 * K;
    const int quads = min(CF_KS, K - k0) / 4;   // column quads in this slice
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int n0 = (blockIdx.x * CF_WARPS + warp) * CF_OUTS;
    // This warp's weights first: all CF_KS / 128 x CF_OUTS 16-byte loads in flight at once, their DRAM
    // latency overlapping the staging of x below (loaded one round at a time, a block took ~5 latencies).
    float4 wv[CF_KS / 128][CF_OUTS];
#pragma unroll
    for (int j = 0; j < CF_KS / 128; ++j) {
        const int c = j * 32 + lane;
#pragma unroll
        for (int o = 0; o < CF_OUTS; ++o) {
            wv[j][o] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (c < quads && n0 + o < N)
                wv[j][o] = __ldg(reinterpret_cast<const float4*>(w + (size_t)(n0 + o) * K + k0) + c);
        }
    }
    // x's slice: every load issued before the first store (a rolled load-store loop waited one L2 latency per
    // trip, 8 trips a block: the kernel ran at 730 GB/s on an H100)
    constexpr int STAGE = CF_ROWS * (CF_KS / 4) / (CF_WARPS * 32);
    float4 staged[STAGE];
#pragma unroll
    for (int t = 0; t < STAGE; ++t) {
        const int i = tid + t * CF_WARPS * 32, r = i / (CF_KS / 4), c = i % (CF_KS / 4);
        staged[t] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < rows && c < quads) staged[t] = __ldg(reinterpret_cast<const float4*>(x + (size_t)r * K + k0) + c);
    }
#pragma unroll
    for (int t = 0; t < STAGE; ++t) xs[tid + t * CF_WARPS * 32] = staged[t];
    __syncthreads();
    float acc[CF_SUMS];   // acc[o * CF_ROWS + r]
#pragma unroll
    for (int i = 0; i < CF_SUMS; ++i) acc[i] = 0.f;
#pragma unroll
    for (int j = 0; j < CF_KS / 128; ++j) {
        const int c = j * 32 + lane;
        if (c < quads) {
#pragma unroll
            for (int r = 0; r < CF_ROWS; ++r) {
                const float4 xv = xs[r * (CF_KS / 4) + c];
#pragma unroll
                for (int o = 0; o < CF_OUTS; ++o) {
                    float a = acc[o * CF_ROWS + r];
                    a = fmaf(wv[j][o].x, xv.x, a);
                    a = fmaf(wv[j][o].y, xv.y, a);
                    a = fmaf(wv[j][o].z, xv.z, a);
                    acc[o * CF_ROWS + r] = fmaf(wv[j][o].w, xv.w, a);
                }
            }
        }
    }
    // Reduce-scatter over the warp: at mask m the lanes with bit m set keep the upper half of their sums and
    // send the lower half (the others the reverse), so the count halves at each step until one is left.
    int base = 0;          // the index of acc[0] among the CF_SUMS sums, on this lane
    bool owner = true;     // whether this lane writes (duplicates after the count reached one)
    int count = CF_SUMS;
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) {
        const bool upper = (lane & m) != 0;
        if (count >= 2) {
            const int half = count / 2;
#pragma unroll
            for (int i = 0; i < CF_SUMS / 2; ++i) {
                if (i < half) {
                    const float send = upper ? acc[i] : acc[i + half];
                    const float keep = upper ? acc[i + half] : acc[i];
                    acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, m);
                }
            }
            base += upper ? half : 0;
            count = half;
        } else {
            acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], m);
            owner = owner && !upper;
        }
    }
    if (!owner) return;
#pragma unroll
    for (int i = 0; i < CF_SUMS / 32 + 1; ++i) {
        if (i < count) {
            const int o = (base + i) / CF_ROWS, r = (base + i) % CF_ROWS;
            if (r < rows && n0 + o < N) part[((size_t)slice * all_rows + r0 + r) * N + n0 + o] = acc[i];
        }
    }
}

// y[r][n] = act(bias[n] + the slices' partial sums); act: 0 none, 1 tanh, 2 relu, 3 sigmoid (the layer's activation
// fused here saves a launch: at 10 images fa18's whole forward is ~50 us, 7 kernels). A block takes SUM_OUTPUTS
// outputs; its SUM_GROUPS warps add every SUM_GROUPS-th slice each (a thread per output summing 35-70 slices in
// turn waited on one L2 read after another: 4-6 us), then warp 0 adds the groups' sums in order. The order is
// fixed, so the result is deterministic and a CUDA graph replays bit-equal.
#define SUM_OUTPUTS 32
#define SUM_GROUPS 8
__device__ __forceinline__ float dense_activate(float s, int act)
{
    if (act == 1) return tanhf(s);
    if (act == 2) return (s > 0.f || s != s) ? s : 0.f;   // relu keeps NaN, as torch's does
    if (act == 3) return 1.f / (1.f + expf(-s));
    return s;
}

extern "C" __global__ void __launch_bounds__(SUM_OUTPUTS * SUM_GROUPS) dense_gemv_sum(
    const float* __restrict__ part, const float* __restrict__ bias, float* __restrict__ y, int rows, int N,
    int slices, int has_bias, int act)
{
    __shared__ float sums[SUM_GROUPS][SUM_OUTPUTS];
    const int lane = threadIdx.x % SUM_OUTPUTS, group = threadIdx.x / SUM_OUTPUTS;
    const int i = blockIdx.x * SUM_OUTPUTS + lane;
    const bool valid = i < rows * N;
    float s = 0.f;
    if (valid) {   // unrolled so that several loads are in flight (the sum's order is the loop's)
#pragma unroll 4
        for (int sl = group; sl < slices; sl += SUM_GROUPS) s += part[(size_t)sl * rows * N + i];
    }
    sums[group][lane] = s;
    __syncthreads();
    if (group != 0 || !valid) return;
    s = sums[0][lane];
#pragma unroll
    for (int g = 1; g < SUM_GROUPS; ++g) s += sums[g][lane];
    if (has_bias) s += bias[i % N];
    y[i] = dense_activate(s, act);
}

// The network's head after a split-K dense layer (gpu_dense.DenseHead): the sum above and the next dense layer
// in one launch, a CUDA graph node less. Block r takes row r: its threads add the row's slices for N outputs,
// `split` threads an output where the block has them (thread q of an output adds slices q, q + split, ...,
// HEAD_CHAINS running sums each, so that many loads are in flight; then its partial and the others' are added in
// q order), + bias, activation, into shared memory; then each warp takes outputs j of the second layer (N2 x N
// weights w2): lanes stride over the N values, a shuffle tree adds them, + bias2, act2. Fixed orders:
// deterministic. N <= HEAD_MAX_N. With one thread an output and 256 threads a block, a row's 46-61 slices
// (fa18's first layer at 10-100 rows) were 6-8 rounds of dependent loads, and the kernel took 6-8 us.
#define HEAD_THREADS 1024
#define HEAD_MAX_N 2048
#define HEAD_CHAINS 8
extern "C" __global__ void __launch_bounds__(HEAD_THREADS) dense_head_sum(
    const float* __restrict__ part, const float* __restrict__ bias, const float* __restrict__ w2,
    const float* __restrict__ bias2, float* __restrict__ y, int rows, int N, int slices, int has_bias, int act,
    int N2, int has_bias2, int act2)
{
    __shared__ float h[HEAD_MAX_N];
    __shared__ float partial[HEAD_THREADS];
    const int r = blockIdx.x;
    const size_t stride = (size_t)rows * N;
    const int split = N >= HEAD_THREADS ? 1 : max(1, min(slices, HEAD_THREADS / N));   // threads an output
    for (int u = threadIdx.x; u < split * N; u += HEAD_THREADS) {
        const int n = u % N, q = u / N;
        const float* p = part + (size_t)r * N + n;
        float s[HEAD_CHAINS];
#pragma unroll
        for (int c = 0; c < HEAD_CHAINS; ++c) s[c] = 0.f;
        // HEAD_CHAINS predicated loads a round, all issued before their adds, the remainder included
        for (int sl = q; sl < slices; sl += split * HEAD_CHAINS) {
#pragma unroll
            for (int c = 0; c < HEAD_CHAINS; ++c)
                if (sl + split * c < slices) s[c] += p[(size_t)(sl + split * c) * stride];
        }
#pragma unroll
        for (int c = 1; c < HEAD_CHAINS; ++c) s[0] += s[c];
        if (split > 1) {
            partial[u] = s[0];
        } else {
            if (has_bias) s[0] += bias[n];
            h[n] = dense_activate(s[0], act);
        }
    }
    if (split > 1) {
        __syncthreads();
        for (int n = threadIdx.x; n < N; n += HEAD_THREADS) {
            float s = partial[n];
            for (int q = 1; q < split; ++q) s += partial[q * N + n];
            if (has_bias) s += bias[n];
            h[n] = dense_activate(s, act);
        }
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int j = warp; j < N2; j += HEAD_THREADS / 32) {
        const float* wj = w2 + (size_t)j * N;
        float s = 0.f;
        for (int n0 = lane; n0 < N; n0 += 32 * HEAD_CHAINS) {   // as above: HEAD_CHAINS loads a round, one chain
#pragma unroll
            for (int c = 0; c < HEAD_CHAINS; ++c)
                if (n0 + 32 * c < N) s = fmaf(wj[n0 + 32 * c], h[n0 + 32 * c], s);
        }
#pragma unroll
        for (int m = 16; m >= 1; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
        if (lane == 0) y[(size_t)r * N2 + j] = dense_activate(has_bias2 ? s + bias2[j] : s, act2);
    }
}
