// Non-finite inputs in the tensor-core kernels (tc.cu, tc_rows.cu, tc_pairs.cu): the test of the accumulators and
// the exact fp32 pass over the outputs a non-finite input reached. Included after stores.cuh (store_out) by
// cuda_common.load_source; nvcc finds it beside the kernel.
//
// A tensor-core product reads more inputs than the convolution's window (the rows and pairs kernels' banded B
// has zero taps; the gather kernel's padded k re-reads the window's first element with a zero weight; FP16 turns
// |v| > 65504 into infinity), and Inf * 0 = NaN, so one non-finite input makes every output of the mma rows that
// read it NaN or +-Inf, in every column (with finite weights), while an output whose tensor-core value is finite
// read only finite inputs and is right. So:
// - after its k loop each lane folds one accumulator per mma row it holds into a probe (nonfinite_probe);
// - after the kernel's main loop, a block in which some lane saw a non-finite row (one block vote, once per
//   block) walks the outputs of the units it computed and replaces every non-finite one by its exact fp32
//   value (an FMA loop over x and w in global memory, + bias): NaN and +-Inf where fp32 arithmetic, and so
//   torch's conv, puts them.
// Finite data pay one FFMA per tested value and the vote; no extra pass, no host synchronisation. The pass sits
// outside the main loop on purpose: nvcc 13.0 spilled inside the pairs kernel's mma loop with it inlined after
// each tile's epilogue, and with a (non-inlined) call there too. Its FMA loop is one flat loop over C*K*K: the
// triple loop moved ptxas's register allocation of the whole kernel (166 -> 128 registers and a spill).

#if defined(__CUDA_ARCH__)
#define CF_COLD __noinline__
#else
#define CF_COLD
#endif

namespace {

// |v| < Inf: false for +-Inf and NaN (one compare)
__device__ __forceinline__ bool finite_value(float v)
{
    return fabsf(v) < __uint_as_float(0x7f800000u);
}

// probe + v * 0: the probe stays +-0 while every v is finite and is NaN from the first non-finite one on (Inf * 0
// and NaN * 0 are NaN). One FFMA a value and no predicate to carry, where compares ORed into a bool took a compare,
// a select and a byte permute per tile (pairs kernel SASS; that version ran fa18 L1 TF32 1.6 % slower than main's
// kernels on an H100; the probe's own cost was not measured on a GPU).
__device__ __forceinline__ float nonfinite_probe(float probe, float v)
{
    return fmaf(v, 0.0f, probe);
}

// Whether any thread of the block passed true (every thread must call it: it is a barrier).
__device__ __forceinline__ bool block_any(bool v)
{
#if defined(__CUDA_ARCH__)
    return __syncthreads_or(v) != 0;
#else   // the host emulation: a counter per process (its blocks run one after another)
    static int count = 0;
    __syncthreads();
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    if (v) __atomic_fetch_add(&count, 1, __ATOMIC_RELAXED);
    __syncthreads();
    const bool any = __atomic_load_n(&count, __ATOMIC_RELAXED) != 0;
    __syncthreads();
    return any;
#endif
}

// The exact fp32 convolution value whose window starts at xp (channel 0, the window's top-left input) with the
// filter wp (one map's C*K*K weights): one flat FMA loop over C*K*K, x's values as floats (FP16 bits widened).
template <int C, int H, int W, int K, class X>
__device__ __forceinline__ float exact_conv_value(const X* __restrict__ xp, const float* __restrict__ wp)
{
    float acc = 0.0f;
#pragma unroll 1
    for (int k = 0; k < C * K * K; ++k) {
        const int c = k / (K * K), r = k - c * (K * K), p = r / K, q = r - p * K;
        acc = fmaf(output_as_float(__ldg(xp + (c * H + p) * W + q)), __ldg(wp + k), acc);
    }
    return acc;
}

// After the main loop of a kernel that computed units of IB images (unit u = images u*IB .. , units blockIdx.x,
// blockIdx.x + gridDim.x, ...): if any thread of the block saw a non-finite accumulator (seen: its probe is not
// 0), the block stores the
// exact fp32 value over every non-finite output of its units (y (B, M, HO, WO), x (B, C, H, W), w (M, C, K, K)),
// in y's element type (stores.cuh's output_element), from x's values (float, or FP16 bits widened exactly).
template <int C, int H, int W, int K, int M, int NT, int IB, class T, class X>
__device__ __forceinline__ void redo_nonfinite_outputs(bool seen, T* __restrict__ y, const X* __restrict__ x,
                                                       const float* __restrict__ w, const float* __restrict__ bias,
                                                       int B)
{
    constexpr int HO = H - K + 1, WO = W - K + 1, PER_IMAGE = M * HO * WO;
    if (!block_any(seen)) return;
    for (long long b0 = (long long)blockIdx.x * IB; b0 < B; b0 += (long long)gridDim.x * IB) {
        const int nimg = B - b0 < IB ? (int)(B - b0) : IB;
        for (int i = threadIdx.x; i < nimg * PER_IMAGE; i += NT) {
            T* const yp = y + b0 * PER_IMAGE + i;              // written by this block before the vote's barrier
            if (finite_value(output_as_float(*yp))) continue;
            const int img = i / PER_IMAGE, rem = i - img * PER_IMAGE, map = rem / (HO * WO);
            const int pos = rem - map * (HO * WO), o = pos / WO, col = pos - o * WO;
            const float acc = exact_conv_value<C, H, W, K>(x + ((b0 + img) * C * H + o) * W + col, w + map * (C * K * K));
            store_out(yp, output_element(bias != nullptr ? acc + __ldg(bias + map) : acc, T()));
        }
    }
}

// The same as a call (not inlined), for a kernel whose other loops the inlined pass disturbs (tc.cu).
template <int C, int H, int W, int K, int M, int NT, int IB, class T, class X>
__device__ CF_COLD void redo_nonfinite_outputs_call(bool seen, T* __restrict__ y, const X* __restrict__ x,
                                                    const float* __restrict__ w, const float* __restrict__ bias, int B)
{
    redo_nonfinite_outputs<C, H, W, K, M, NT, IB>(seen, y, x, w, bias, B);
}

}  // namespace
