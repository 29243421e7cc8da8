// Warp-level tensor-core helpers shared by the tensor-core kernels (tc.cu, tc_rows.cu, tc_pairs.cu, igemm.cu):
// fp32 -> TF32 bits, its 3xTF32 split, two floats -> one half2 word, one mma.sync (m16n8k8 TF32 or m16n8k16
// FP16, fp32 accumulate) in the PTX ISA's fragment layouts, and an in-place TF32 rounding of staged rows. The
// host emulation (host_emulation.h) gives each the same semantics on a CPU.
// Included textually by cuda_common.load_source; nvcc finds it beside the kernel.

namespace {

// fp32 -> tf32 bits: cvt.rna (round to nearest, ties away) when ROUND, else the fp32 bits as they are
// (the tensor core then ignores the low 13 mantissa bits: truncation).
template <bool ROUND>
__device__ __forceinline__ unsigned tf32_bits(float v)
{
#if defined(__CUDA_ARCH__)
    if (!ROUND) return __float_as_uint(v);
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
#elif defined(CF_HOST_EMULATION)
    return cf_emu_to_tf32(v, ROUND);
#else
    return 0u;
#endif
}

// 3xTF32's parts of an fp32 value (TF32 bit patterns): big = v rounded to TF32, small = the rest rounded, so
// |v - big - small| <= 2^-22 |v|; a non-finite v gets a zero small part (Inf - Inf would be NaN).
__device__ __forceinline__ void tf32_split(float v, unsigned& big, unsigned& small)
{
    big = tf32_bits<true>(v) & 0xffffe000u;
    const bool finite = (big & 0x7f800000u) != 0x7f800000u;
    small = tf32_bits<true>(finite ? v - __uint_as_float(big) : 0.0f);
}

// (lo, hi) -> one word, lo in the lower half (the lower k index of an FP16 fragment register)
__device__ __forceinline__ unsigned half2_bits(float lo, float hi)
{
#if defined(__CUDA_ARCH__)
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));   // first source -> upper half
    return r;
#elif defined(CF_HOST_EMULATION)
    return cf_emu_pack_half2(lo, hi);
#else
    return 0u;
#endif
}

// d += A * B; FP16 = 0: m16n8k8 TF32, 1: m16n8k16 FP16
template <int FP16>
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1)
{
#if defined(__CUDA_ARCH__)
    if constexpr (FP16 == 0) {
        asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
#elif defined(CF_HOST_EMULATION)
    cf_emu_mma(d, a, b0, b1, FP16);
#endif
}

// Round in place, to TF32, the elements this thread staged (async_copy.cuh's stage_rows_async), once its
// copies have landed: other threads read them only after the caller's barrier.
template <int W, int PITCH, int NT>
__device__ __forceinline__ void round_rows_tf32(float* dst, int rows, int lane, int warp)
{
    for (int row = warp; row < rows; row += NT / 32)
        for (int col = lane; col < W; col += 32) {
            float* const v = dst + row * PITCH + col;
            *v = __uint_as_float(tf32_bits<true>(*v));
        }
}

}  // namespace
