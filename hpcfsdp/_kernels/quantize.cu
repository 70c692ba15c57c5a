// Block quantization of a flat array into one payload, and back (See [Note: Quantized payloads] in quantize.py):
// one CUDA block per quantization block (a grid-stride loop over them), so a bucket is one launch each way. A
// launch takes `rows` arrays of n elements each (row r at x + r * n) to `rows` payloads laid end to end (row r at
// out + r * (cb + 4 * nb)): the pieces of a collective are one launch, not one per rank. The
// arithmetic is the NumPy path's, in float32 (x * (1 / scale), rint, round-to-nearest-even e4m3), so the codes and
// scales agree bit for bit. The scales follow the codes at byte offset cb, which need not be 4-aligned: they are
// stored and loaded byte by byte. kind: 0 int8, 1 int4 (two codes per byte, low nibble first, +8), 2 fp8 e4m3.
#include <cuda_fp8.h>

#define Q_THREADS 256  // the launcher's block size (quantize.py BLOCK): q_block_reduce assumes it

__device__ __forceinline__ float q_block_reduce(float v, float* sh, bool is_max) {
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = sh[0];
    for (int i = 1; i < Q_THREADS / 32; ++i) v = is_max ? fmaxf(v, sh[i]) : v + sh[i];
    return v;
}

__device__ __forceinline__ float q_qmax(int kind) { return kind == 0 ? 127.0f : (kind == 1 ? 7.0f : 448.0f); }

__device__ __forceinline__ float q_e4m3_value(unsigned char c) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3)));
}

template <typename T>
__device__ void q_quantize(const T* x0, unsigned char* out0, float* residual0, long long n, long long rows, int block,
                           int kind) {
    __shared__ float sh[Q_THREADS / 32];
    const long long nb = (n + block - 1) / block;
    const long long cb = kind == 1 ? (n + 1) / 2 : n;
    const long long pb = cb + 4 * nb;  // one row's payload bytes
    const float qmax = q_qmax(kind);
    for (long long rb = blockIdx.x; rb < rows * nb; rb += gridDim.x) {
        const long long row = rb / nb, b = rb - row * nb;
        const T* x = x0 + row * n;
        unsigned char* out = out0 + row * pb;
        float* residual = residual0 ? residual0 + row * n : nullptr;
        const long long e0 = b * block;
        float amax = 0.0f, bad = 0.0f;
        for (int j = threadIdx.x; j < block; j += Q_THREADS) {
            const long long e = e0 + j;
            const float v = e < n ? (float)to_acc<T>(x[e]) : 0.0f;
            if (!isfinite(v)) bad = 1.0f;
            amax = fmaxf(amax, fabsf(v));
        }
        amax = q_block_reduce(amax, sh, true);
        const bool finite = q_block_reduce(bad, sh, true) == 0.0f;
        const float scale = finite ? amax / qmax : __int_as_float(0x7fc00000);  // NaN carries a non-finite block
        const float inv = (finite && scale > 0.0f) ? 1.0f / scale : 1.0f;
        const float back = finite ? scale : 0.0f;
        if (kind == 1) {  // pairs (2i, 2i + 1) of one block share a byte (block is even)
            for (int j = 2 * threadIdx.x; j < block; j += 2 * Q_THREADS) {
                const long long e = e0 + j;
                if (e >= n) break;
                float y0 = finite ? (float)to_acc<T>(x[e]) * inv : 0.0f;
                float y1 = (finite && e + 1 < n) ? (float)to_acc<T>(x[e + 1]) * inv : 0.0f;
                const float q0 = rintf(y0), q1 = rintf(y1);
                out[e / 2] = (unsigned char)((int)(q0 + 8.0f) | ((int)(q1 + 8.0f) << 4));
                if (residual) {
                    residual[e] = (y0 - q0) * back;
                    if (e + 1 < n) residual[e + 1] = (y1 - q1) * back;
                }
            }
        } else {
            for (int j = threadIdx.x; j < block; j += Q_THREADS) {
                const long long e = e0 + j;
                if (e >= n) break;
                const float y = finite ? (float)to_acc<T>(x[e]) * inv : 0.0f;
                float r;
                if (kind == 0) {
                    const float q = rintf(y);
                    out[e] = (unsigned char)(signed char)(int)q;
                    r = y - q;
                } else {
                    const unsigned char c = (unsigned char)__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);
                    out[e] = c;
                    r = y - q_e4m3_value(c);
                }
                if (residual) residual[e] = r * back;
            }
        }
        if (threadIdx.x == 0) {
            const unsigned int u = __float_as_uint(scale);
            unsigned char* s = out + cb + 4 * b;
            s[0] = u & 255u; s[1] = (u >> 8) & 255u; s[2] = (u >> 16) & 255u; s[3] = u >> 24;
        }
    }
}

template <typename T>
__global__ void quantize_blocks(const T* x, unsigned char* out, long long n, long long rows, int block, int kind) {
    q_quantize<T>(x, out, nullptr, n, rows, block, kind);
}

// the same, also writing what the rounding lost (x minus its dequantized value; 0 in a non-finite block)
template <typename T>
__global__ void quantize_blocks_ef(const T* x, unsigned char* out, float* residual, long long n, long long rows,
                                   int block, int kind) {
    q_quantize<T>(x, out, residual, n, rows, block, kind);
}

__device__ __forceinline__ float q_value(const unsigned char* p, long long cb, long long e, int block, int kind) {
    const unsigned char* s = p + cb + 4 * (e / block);
    const float scale = __uint_as_float((unsigned int)s[0] | ((unsigned int)s[1] << 8) |
                                        ((unsigned int)s[2] << 16) | ((unsigned int)s[3] << 24));
    float v;
    if (kind == 0) v = (float)(signed char)p[e];
    else if (kind == 1) v = (float)((e & 1) ? (p[e / 2] >> 4) : (p[e / 2] & 15)) - 8.0f;
    else v = q_e4m3_value(p[e]);
    return __fmul_rn(v, scale);
}

template <typename T>
__global__ void dequantize_blocks(const unsigned char* payload, T* y, long long n, long long rows, int block, int kind) {
    const long long cb = kind == 1 ? (n + 1) / 2 : n;
    const long long pb = cb + 4 * ((n + block - 1) / block);
    GRID_STRIDE(t, rows * n) {
        const long long row = t / n;
        y[t] = from_acc<T>((typename Acc<T>::type)q_value(payload + row * pb, cb, t - row * n, block, kind));
    }
}

// the float32 sum over the rows of their values, row 0 first, rounded at each add as the NumPy path's (no fma)
template <typename T>
__global__ void dequantize_sum(const unsigned char* payload, T* y, long long n, long long rows, int block, int kind) {
    const long long cb = kind == 1 ? (n + 1) / 2 : n;
    const long long pb = cb + 4 * ((n + block - 1) / block);
    GRID_STRIDE(e, n) {
        float acc = q_value(payload, cb, e, block, kind);
        for (long long row = 1; row < rows; ++row) acc = __fadd_rn(acc, q_value(payload + row * pb, cb, e, block, kind));
        y[e] = from_acc<T>((typename Acc<T>::type)acc);
    }
}
