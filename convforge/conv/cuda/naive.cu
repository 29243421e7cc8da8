// cuda-naive (milestone 3): one thread per output element, global memory only.
//
// y[b][m][h][w] = sum_{c,p,q} x[b][c][h+p][w+q] * k[m][c][p][q] (+ bias[m]), NCHW float32, stride 1,
// no padding. Every operand is read from global memory on every use (no __restrict__, no read-only
// path, no shared memory): the starting point the later kernels are measured against. A grid-stride
// loop over the flattened output (64-bit indices) covers any batch size.
// Compiled by NVRTC at run time (convforge.conv.cuda_common); no headers needed.

#define X4(b, c, h, w) x[(((long long)(b) * C + (c)) * H + (h)) * W + (w)]
#define K4(m, c, p, q) k[(((m) * C + (c)) * K + (p)) * K + (q)]

extern "C" __global__ void conv_naive(float* y, const float* x, const float* k, const float* bias,
                                      int B, int M, int C, int H, int W, int K)
{
    const int Ho = H - K + 1, Wo = W - K + 1;
    const long long total = (long long)B * M * Ho * Wo;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int w = (int)(i % Wo);
        long long t = i / Wo;
        const int h = (int)(t % Ho);
        t /= Ho;
        const int m = (int)(t % M);
        const long long b = t / M;
        float acc = 0.0f;
        for (int c = 0; c < C; ++c)
            for (int p = 0; p < K; ++p)
                for (int q = 0; q < K; ++q)
                    acc += X4(b, c, h + p, w + q) * K4(m, c, p, q);
        if (bias) acc += bias[m];
        y[i] = acc;
    }
}
