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

}  // namespace
