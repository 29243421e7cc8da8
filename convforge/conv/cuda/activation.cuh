// The fused epilogues' activation, chosen at compile time by CF_ACT (0 none, 1 tanh, 2 relu, 3 sigmoid):
// no branch in the kernel. All are monotone, so a max pool may take the window maximum first.
#pragma once

#ifndef CF_ACT
#define CF_ACT 0
#endif

// max that keeps NaN, as torch's max pool and relu do (fmaxf returns the other operand). Found by
// tests/test_fuzz.py on an H200. sm_80+ has it as one instruction (PTX max.NaN); the compare-and-select
// form cost the fused pools 5-10 % on the H200 (2026-11-25 bench). Elsewhere (host emulation): if a is NaN
// the first test holds; if b is NaN neither holds and b is taken.
__device__ __forceinline__ float max_nan(float a, float b)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
#else
    return (a > b || a != a) ? a : b;
#endif
}

__device__ __forceinline__ float activate(float v)
{
#if CF_ACT == 1
    return tanhf(v);
#elif CF_ACT == 2
    return max_nan(v, 0.0f);
#elif CF_ACT == 3
    return 1.0f / (1.0f + expf(-v));
#else
    return v;
#endif
}
