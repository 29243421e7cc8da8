// The fused epilogues' activation, chosen at compile time by CF_ACT (0 none, 1 tanh, 2 relu, 3 sigmoid):
// no branch in the kernel. All are monotone, so a max pool may take the window maximum first.
#pragma once

#ifndef CF_ACT
#define CF_ACT 0
#endif

__device__ __forceinline__ float activate(float v)
{
#if CF_ACT == 1
    return tanhf(v);
#elif CF_ACT == 2
    return fmaxf(v, 0.0f);
#elif CF_ACT == 3
    return 1.0f / (1.0f + expf(-v));
#else
    return v;
#endif
}
