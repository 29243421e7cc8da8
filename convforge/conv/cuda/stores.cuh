// Output stores shared by the kernels whose outputs are written once and not read again: CF_STREAM_STORES=1
// marks them evict-first (st.global.cs), so they do not push the input rows and filters out of L2.
// Included textually by cuda_common.load_source (nvcc finds it beside the kernel).

#ifndef CF_STREAM_STORES
#define CF_STREAM_STORES 0
#endif

namespace {

template <class T>
__device__ __forceinline__ void store_out(T* p, T v)
{
#if CF_STREAM_STORES
    __stcs(p, v);
#else
    *p = v;
#endif
}

// Output elements: float, or FP16 bits (unsigned short) where a kernel writes its output in FP16 for a consumer
// that reads FP16 (tc.cu's CF_OUT_HALF): half the bytes written and read back. Round to nearest even;
// |v| > 65504 becomes +-Inf, so callers use it only where the values are known to be bounded.
__device__ __forceinline__ float output_element(float v, float) { return v; }
__device__ __forceinline__ unsigned short output_element(float v, unsigned short)
{
#if defined(__CUDA_ARCH__)
    unsigned short r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
#elif defined(CF_HOST_EMULATION)
    const _Float16 h = (_Float16)v;
    unsigned short r;
    std::memcpy(&r, &h, 2);
    return r;
#else
    return 0;
#endif
}
__device__ __forceinline__ float output_as_float(float v) { return v; }
__device__ __forceinline__ float output_as_float(unsigned short u)
{
#if defined(__CUDA_ARCH__)
    float r;
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(u));
    return r;
#elif defined(CF_HOST_EMULATION)
    _Float16 h;
    std::memcpy(&h, &u, 2);
    return (float)h;
#else
    return 0.0f;
#endif
}

}  // namespace
