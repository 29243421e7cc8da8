// cuda-tiled: the input tile plus its halo in shared memory (the course's tiled convolution).
//
// A block of CF_TILE x CF_TILE threads computes a CF_TILE x CF_TILE tile of one output map of one
// image. For each input channel it loads the (CF_TILE+K-1)^2 input patch the tile needs into shared
// memory (cooperatively, zero-filling outside the image), synchronises, and every thread sums its K x K
// window from shared memory, with weights read from global memory (read-only cache). Input reuse: each
// loaded element serves up to K*K outputs instead of one; the patch is still reloaded once per map
// (blockIdx.y), as in the course.
// Grid: x = images x tiles (image-major), y = maps. Dynamic shared memory: (CF_TILE+K-1)^2 floats.

#ifndef CF_TILE
#define CF_TILE 16
#endif

extern "C" __global__ void __launch_bounds__(CF_TILE * CF_TILE)
conv_tiled(float* __restrict__ y, const float* __restrict__ x, const float* __restrict__ k,
           const float* __restrict__ bias, int B, int M, int C, int H, int W, int K, int tiles_w,
           int tiles_h, int b0)
{
    extern __shared__ float patch[];
    const int S = CF_TILE + K - 1;
    const int Ho = H - K + 1, Wo = W - K + 1;
    const int tiles = tiles_w * tiles_h;
    const int tile = blockIdx.x % tiles;
    const long long b = b0 + blockIdx.x / tiles;
    const int m = blockIdx.y;
    const int h0 = (tile / tiles_w) * CF_TILE, w0 = (tile % tiles_w) * CF_TILE;
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * CF_TILE + tx;
    if (b >= B) return;

    float acc = 0.0f;
    for (int c = 0; c < C; ++c) {
        const float* xc = x + ((b * C + c) * H) * (long long)W;
        for (int i = tid; i < S * S; i += CF_TILE * CF_TILE) {
            const int r = i / S, s = i - r * S;
            const int hh = h0 + r, ww = w0 + s;
            patch[i] = (hh < H && ww < W) ? xc[hh * W + ww] : 0.0f;
        }
        __syncthreads();
        const float* kc = k + ((m * C + c) * K) * K;
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q)
                acc = fmaf(patch[(ty + p) * S + tx + q], __ldg(&kc[p * K + q]), acc);
        __syncthreads();
    }
    const int oh = h0 + ty, ow = w0 + tx;
    if (oh < Ho && ow < Wo)
        y[((b * M + m) * Ho + oh) * (long long)Wo + ow] = acc + (bias ? bias[m] : 0.0f);
}
