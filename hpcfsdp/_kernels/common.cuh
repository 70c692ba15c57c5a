// Shared by every family: storage types, the accumulation type, loads and stores, the grid-stride loop.
// See [Note: Fused kernels] in _registry.py. This text is prepended to each family's source.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

template <typename T> struct Acc { typedef float type; };   // half, bfloat16 and float compute in float
template <> struct Acc<double> { typedef double type; };    // double in double

template <typename T> __device__ __forceinline__ typename Acc<T>::type to_acc(T v);
template <> __device__ __forceinline__ float to_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ double to_acc<double>(double v) { return v; }
template <> __device__ __forceinline__ float to_acc<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_acc<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_acc(typename Acc<T>::type v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ double from_acc<double>(double v) { return v; }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// float and double overloads of the transcendental functions the kernels use
__device__ __forceinline__ float k_exp(float x) { return expf(x); }
__device__ __forceinline__ double k_exp(double x) { return exp(x); }
__device__ __forceinline__ float k_log(float x) { return logf(x); }
__device__ __forceinline__ double k_log(double x) { return log(x); }
__device__ __forceinline__ float k_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double k_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float k_ncdf(float x) { return normcdff(x); }
__device__ __forceinline__ double k_ncdf(double x) { return normcdf(x); }
__device__ __forceinline__ float k_rsqrt(float x) { return rsqrtf(x); }
__device__ __forceinline__ double k_rsqrt(double x) { return rsqrt(x); }

template <typename A> __device__ __forceinline__ A k_neg_inf();  // -infinity (NVRTC has no INFINITY macro)
template <> __device__ __forceinline__ float k_neg_inf<float>() { return -__int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double k_neg_inf<double>() {
    return -__longlong_as_double(0x7ff0000000000000LL);
}

// for (i = this thread's first element; i < n; i += every thread of the grid)
#define GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (long long)blockDim.x * gridDim.x)

// Block-wide reductions for the row kernels (norm.cu, softmax.cu): every thread of the block gets the sum or the max
// of v over the block. blockDim.x must be a multiple of 32, at most 1024 (the launchers assert it), and every thread
// of the block must call it (it holds two barriers). sh is __shared__ A[32]; a kernel may reuse one sh for successive
// reductions: the first barrier keeps a write from overtaking the previous reduction's reads. Every warp reduces the
// same 32 partials in the same order, so all threads get bit-identical results.
template <typename A> __device__ __forceinline__ A warp_sum(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename A> __device__ __forceinline__ A warp_max(A v) {
    for (int o = 16; o > 0; o >>= 1) {
        A w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}
template <typename A> __device__ __forceinline__ A block_sum(A v, A* sh) {
    v = warp_sum<A>(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (int)(threadIdx.x & 31) < (int)(blockDim.x >> 5) ? sh[threadIdx.x & 31] : (A)0;
    return warp_sum<A>(v);
}
template <typename A> __device__ __forceinline__ A block_max(A v, A* sh) {
    v = warp_max<A>(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (int)(threadIdx.x & 31) < (int)(blockDim.x >> 5) ? sh[threadIdx.x & 31] : k_neg_inf<A>();
    return warp_max<A>(v);
}
