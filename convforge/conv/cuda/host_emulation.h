// Host emulation of the CUDA subset the kernels in this folder use, for checking them on a machine
// without a GPU (convforge.conv.cuda_emulate compiles "this header + a kernel source" with g++ -std=c++20).
//
// Not a simulator of performance, only of semantics: every block runs its threads as OS threads, one
// block after another; __syncthreads is a std::barrier over the block (threads that return early drop
// out of it); dynamic shared memory is a zeroed-then-poisoned (NaN) buffer per block; warp-level mma.sync
// is emulated by exchanging fragments through a per-warp buffer between two warp barriers, computing
// with the fragment layouts the kernels document and the accumulation rounded toward zero as the hardware's
// (so it checks the indexing around the layouts, not the layouts themselves: the GPU tests do that).
// Kernel sources must guard inline PTX with __CUDA_ARCH__.
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __constant__
#define __launch_bounds__(...)
#define CF_HOST_EMULATION 1

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    dim3() = default;
    dim3(unsigned a, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }

namespace cf {
struct Block {
    std::barrier<>* bar;
    std::vector<std::unique_ptr<std::barrier<>>>* warp_bars;
    unsigned char* smem;
    // per-warp fragment exchange for the mma emulation: [warp][lane][a0..a3, b0, b1]
    std::vector<unsigned>* frags;
};
inline thread_local dim3 t_idx, b_idx, b_dim, g_dim;
inline thread_local Block* t_block = nullptr;
inline unsigned char* dyn_smem() { return t_block->smem; }
}  // namespace cf

#define threadIdx (cf::t_idx)
#define blockIdx (cf::b_idx)
#define blockDim (cf::b_dim)
#define gridDim (cf::g_dim)

inline void __syncthreads() { cf::t_block->bar->arrive_and_wait(); }
inline void __syncwarp() { (*cf::t_block->warp_bars)[cf::t_idx.x / 32]->arrive_and_wait(); }  // 1-D blocks
[[noreturn]] inline void __trap() { std::abort(); }
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline void __stcs(T* p, T v) { *p = v; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float expf(float v) { return std::exp(v); }
inline float tanhf(float v) { return std::tanh(v); }
inline float fmaf(float a, float b, float c) { return std::fma(a, b, c); }
inline float fmaxf(float a, float b) { return std::fmax(a, b); }

// fp32 -> tf32 bits: round to nearest, ties away (cvt.rna), or leave the low bits for "truncation".
inline unsigned cf_emu_to_tf32(float v, bool round)
{
    unsigned u = __float_as_uint(v);
    if (round && std::isfinite(v)) u += 0x1000u;
    return u;
}
inline float cf_emu_tf32_value(unsigned u) { return __uint_as_float(u & 0xffffe000u); }
inline unsigned cf_emu_pack_half2(float lo, float hi)
{
    _Float16 l = (_Float16)lo, h = (_Float16)hi;
    unsigned short lb, hb;
    std::memcpy(&lb, &l, 2);
    std::memcpy(&hb, &h, 2);
    return (unsigned)lb | ((unsigned)hb << 16);
}
inline float cf_emu_half(unsigned u, int which)
{
    unsigned short b = (unsigned short)(which ? (u >> 16) : (u & 0xffffu));
    _Float16 h;
    std::memcpy(&h, &b, 2);
    return (float)h;
}

// __shfl_xor_sync over a full warp: each lane posts its value in the warp's exchange buffer, and reads its
// partner's between two warp barriers (every lane of the warp must call it, as on the GPU).
inline float __shfl_xor_sync(unsigned, float v, int mask)
{
    cf::Block* blk = cf::t_block;
    const unsigned tid = cf::t_idx.x, warp = tid / 32, lane = tid % 32;
    unsigned* f = blk->frags->data() + warp * 32 * 6;
    auto& wbar = *(*blk->warp_bars)[warp];
    f[lane * 6] = __float_as_uint(v);
    wbar.arrive_and_wait();
    const float other = __uint_as_float(f[(lane ^ (unsigned)mask) * 6]);
    wbar.arrive_and_wait();   // the buffer is reused by the next exchange
    return other;
}

// d (this lane's c0..c3) += A (16 x k) * B (k x 8), fragments in the PTX ISA layouts.
inline void cf_emu_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1, int fp16)
{
    cf::Block* blk = cf::t_block;
    const unsigned tid = cf::t_idx.x + cf::b_dim.x * (cf::t_idx.y + cf::b_dim.y * cf::t_idx.z);
    const unsigned warp = tid / 32, lane = tid % 32;
    unsigned* f = blk->frags->data() + warp * 32 * 6;
    auto& wbar = *(*blk->warp_bars)[warp];
    for (int i = 0; i < 4; ++i) f[lane * 6 + i] = a[i];
    f[lane * 6 + 4] = b0;
    f[lane * 6 + 5] = b1;
    wbar.arrive_and_wait();
    const int kdim = fp16 ? 16 : 8;
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        const unsigned* fl = f + l * 6;
        if (!fp16) {
            A[g][t] = cf_emu_tf32_value(fl[0]);
            A[g + 8][t] = cf_emu_tf32_value(fl[1]);
            A[g][t + 4] = cf_emu_tf32_value(fl[2]);
            A[g + 8][t + 4] = cf_emu_tf32_value(fl[3]);
            B[t][g] = cf_emu_tf32_value(fl[4]);
            B[t + 4][g] = cf_emu_tf32_value(fl[5]);
        } else {
            for (int h = 0; h < 2; ++h) {
                A[g][2 * t + h] = cf_emu_half(fl[0], h);
                A[g + 8][2 * t + h] = cf_emu_half(fl[1], h);
                A[g][2 * t + 8 + h] = cf_emu_half(fl[2], h);
                A[g + 8][2 * t + 8 + h] = cf_emu_half(fl[3], h);
                B[2 * t + h][g] = cf_emu_half(fl[4], h);
                B[2 * t + 8 + h][g] = cf_emu_half(fl[5], h);
            }
        }
    }
    const int g = lane / 4, t = lane % 4;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    // The products are exact (TF32 x TF32 and FP16 x FP16 fit a double); their sum with the accumulator is
    // rounded once, toward zero, as the tensor cores' fp32 accumulation truncates (seen on an H100: 3xTF32 over
    // C*K*K = 131072 lost 7.7e-4 of every output's magnitude, all toward zero, with an unflushed accumulator).
    // CF_EMU_MMA_ROUND=nearest rounds to nearest instead.
    static const bool nearest = [] {
        const char* v = std::getenv("CF_EMU_MMA_ROUND");
        return v && std::strcmp(v, "nearest") == 0;
    }();
    for (int e = 0; e < 4; ++e) {
        double s = d[e];
        for (int k = 0; k < kdim; ++k) s += (double)A[rows[e]][k] * (double)B[k][cols[e]];
        float f = (float)s;
        if (!nearest && std::isfinite(f) && std::fabs((double)f) > std::fabs(s)) f = std::nextafter(f, 0.0f);
        d[e] = f;
    }
    wbar.arrive_and_wait();  // the buffer is reused by the next mma
}

namespace cf {
template <class... A, std::size_t... I>
inline void call(void (*kernel)(A...), void** args, std::index_sequence<I...>)
{
    kernel(*static_cast<std::remove_reference_t<A>*>(args[I])...);
}

template <class... A>
inline int launch(void (*kernel)(A...), dim3 grid, dim3 block, std::size_t smem, void** args)
{
    const unsigned nthreads = block.x * block.y * block.z;
    const unsigned nwarps = (nthreads + 31) / 32;
    std::vector<unsigned char> shared(smem + 16);
    std::vector<unsigned> frags(nwarps * 32 * 6);
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                // poison shared memory: a kernel must not read what it did not write
                float nan = std::nanf("");
                for (std::size_t i = 0; i + 4 <= shared.size(); i += 4) std::memcpy(&shared[i], &nan, 4);
                std::barrier<> bar(nthreads);
                std::vector<std::unique_ptr<std::barrier<>>> warp_bars;
                for (unsigned w = 0; w < nwarps; ++w)
                    warp_bars.emplace_back(new std::barrier<>(std::min(32u, nthreads - 32 * w)));
                Block blk{&bar, &warp_bars, shared.data(), &frags};
                std::vector<std::thread> threads;
                threads.reserve(nthreads);
                for (unsigned tz = 0; tz < block.z; ++tz)
                    for (unsigned ty = 0; ty < block.y; ++ty)
                        for (unsigned tx = 0; tx < block.x; ++tx)
                            threads.emplace_back([&, tx, ty, tz] {
                                t_idx = dim3(tx, ty, tz);
                                b_idx = dim3(bx, by, bz);
                                b_dim = block;
                                g_dim = grid;
                                t_block = &blk;
                                call(kernel, args, std::index_sequence_for<A...>{});
                                bar.arrive_and_drop();
                            });
                for (auto& t : threads) t.join();
            }
    return 0;
}
}  // namespace cf
