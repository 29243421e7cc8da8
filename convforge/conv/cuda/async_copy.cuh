// Shared-memory staging helpers: asynchronous 4-byte global -> shared copies (cp.async, sm_80+), row
// staging, and the dynamic shared-memory size check. Used by the kernels that stage their input: a staging loop issues every copy of a tile without waiting on any (a plain load + store
// serialises one device-memory latency per element or row); out-of-range elements are zero-filled
// (src-size 0). The host emulation copies synchronously. Included textually by cuda_common.load_source
// (so NVRTC needs no include path and its cache key covers this file); nvcc finds it beside the kernel.

namespace {

__device__ __forceinline__ void copy_async4(float* dst, const float* src, bool valid)
{
#if defined(__CUDA_ARCH__)
    unsigned d;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(d) : "l"(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(d), "l"(src), "r"(valid ? 4 : 0) : "memory");
#else
    *dst = valid ? *src : 0.0f;
#endif
}

// 16 bytes, both addresses 16-byte aligned, always valid (cp.async.cg: cached in L2 only, as a tile that is
// read once per block from shared memory wants)
__device__ __forceinline__ void copy_async16(void* dst, const void* src)
{
#if defined(__CUDA_ARCH__)
    unsigned d;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(d) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(d), "l"(src) : "memory");
#else
    *static_cast<float4*>(dst) = *static_cast<const float4*>(src);
#endif
}

// 16 bytes as copy_async16, zero-filled when !valid (src-size 0: nothing is read, src need only be a valid address)
__device__ __forceinline__ void copy_async16_zfill(void* dst, const void* src, bool valid)
{
#if defined(__CUDA_ARCH__)
    unsigned d;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(d) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
#else
    *static_cast<float4*>(dst) = valid ? *static_cast<const float4*>(src) : make_float4(0.f, 0.f, 0.f, 0.f);
#endif
}

// 8 bytes, both addresses 8-byte aligned (cp.async.ca: .cg takes 16 bytes only)
__device__ __forceinline__ void copy_async8(void* dst, const void* src)
{
#if defined(__CUDA_ARCH__)
    unsigned d;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(d) : "l"(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"(d), "l"(src) : "memory");
#else
    *static_cast<float2*>(dst) = *static_cast<const float2*>(src);
#endif
}

__device__ __forceinline__ void copy_commit()
{
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void copy_wait()
{
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
#endif
}

// The kernels that stage into dynamic shared memory compute its size from their -D constants, and the host
// from the same constants in Python: thread 0 of each block traps if the launch gave less than `bytes`
// (a mismatch would otherwise read and write past the allocation).
__device__ __forceinline__ void require_dynamic_smem(unsigned bytes)
{
#if defined(__CUDA_ARCH__)
    if (threadIdx.x == 0) {
        unsigned dyn;
        asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < bytes) __trap();
    }
#endif
}

// Stage `rows` image rows of W floats (rows of consecutive images, back to back in global memory) into
// shared rows of PITCH floats with cp.async: one warp per row, lanes over columns. The caller commits.
template <int W, int PITCH, int NT>
__device__ __forceinline__ void stage_rows_async(float* dst, const float* __restrict__ src, int rows, int lane,
                                                 int warp)
{
    for (int row = warp; row < rows; row += NT / 32)
        for (int col = lane; col < W; col += 32) copy_async4(dst + row * PITCH + col, src + row * W + col, true);
}

// The same staging with the widest copies the rows allow, spread over all NT threads: 16 bytes where W % 4 == 0,
// 8 where W % 2 == 0, else 4. Needs src 16-byte aligned (cuda_common.check_input's x; rows of consecutive images
// then start at multiples of W floats) and PITCH % 4 == 0, dst 16-byte aligned. A 72-float row is 18 copies instead
// of 72; the kernels that split a unit over several blocks (tc_pool.cu) stage it once per block.
template <int W, int PITCH, int NT>
__device__ __forceinline__ void stage_rows_async_wide(float* dst, const float* __restrict__ src, int rows, int tid)
{
    static_assert(PITCH % 4 == 0, "16-byte aligned shared rows");
    constexpr int V = W % 4 == 0 ? 4 : W % 2 == 0 ? 2 : 1;
    constexpr int PER_ROW = W / V;
    for (int i = tid; i < rows * PER_ROW; i += NT) {
        const int row = i / PER_ROW, col = (i - row * PER_ROW) * V;
        if constexpr (V == 4) copy_async16(dst + row * PITCH + col, src + row * W + col);
        else if constexpr (V == 2) copy_async8(dst + row * PITCH + col, src + row * W + col);
        else copy_async4(dst + row * PITCH + col, src + row * W + col, true);
    }
}

// The unit loop of the kernels whose blocks walk units of images (blockIdx.x, + gridDim.x, ...: tc_rows.cu, tc_pool.cu),
// staging through stage(dst, unit) (it issues the unit's copies). PIPE 1: one buffer, this unit's copies issued and
// waited for (the barrier ending the previous unit freed it; the SM's other blocks compute meanwhile). PIPE 2: two
// buffers of xs_one floats; stage_first_unit issues the block's first unit before the loop, and each step issues
// the next unit's copies into the other buffer and then waits for this unit's, the older group.
template <int PIPE, class Stage>
__device__ __forceinline__ void stage_first_unit(Stage stage, float* xs, int units)
{
    if constexpr (PIPE == 2) {
        if ((int)blockIdx.x < units) stage(xs, (int)blockIdx.x);
        copy_commit();
    }
}

template <int PIPE, class Stage>
__device__ __forceinline__ void stage_unit(Stage stage, float* xs, int xs_one, int buf, int unit, int units)
{
    if constexpr (PIPE == 2) {
        const int next = unit + (int)gridDim.x;
        if (next < units) stage(xs + (buf ^ 1) * xs_one, next);
        copy_commit();
        copy_wait<1>();
    } else {
        stage(xs, unit);
        copy_commit();
        copy_wait<0>();
    }
}

}  // namespace
