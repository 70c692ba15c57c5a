// Around the GEMMs of Linear layers (cuBLAS computes the products): the bias gradient, a column sum over rows, and
// the residual stream's add of a layer's output and bias, each one launch.

#define LIN_COLS 32   // col_sum: columns of a tile (threadIdx.x & 31)
#define LIN_LANES 8   // col_sum: row lanes of a tile (threadIdx.x >> 5): 256 threads (linear.py SUM_BLOCK)

// out[c] = sum_r g[r, c], accumulated in float. A block owns 32 columns at a time: its 8 row lanes each sum every 8th
// row (32 consecutive columns per load), then lane 0 adds the 8 partial sums in a fixed order (deterministic).
template <typename T>
__global__ void col_sum(const T* g, T* out, long long rows, long long C) {
    typedef typename Acc<T>::type A;
    __shared__ A sh[LIN_LANES][LIN_COLS + 1];
    const int cl = threadIdx.x % LIN_COLS, rl = threadIdx.x / LIN_COLS;
    const int lanes = blockDim.x / LIN_COLS;
    for (long long c0 = (long long)blockIdx.x * LIN_COLS; c0 < C; c0 += (long long)gridDim.x * LIN_COLS) {
        const long long c = c0 + cl;
        A a = 0;
        if (c < C)
            for (long long r = rl; r < rows; r += lanes) a += to_acc<T>(g[r * C + c]);
        sh[rl][cl] = a;
        __syncthreads();
        if (rl == 0 && c < C) {
            for (int k = 1; k < lanes; ++k) a += sh[k][cl];
            out[c] = from_acc<T>(a);
        }
        __syncthreads();  // the next tile's writes wait for these reads
    }
}

// out = x + (y + b[col]): each sum rounded to T, as the unfused Linear bias add and residual add round them
template <typename T>
__global__ void bias_residual_fwd(const T* x, const T* y, const T* b, T* out, long long n, long long C) {
    GRID_STRIDE(e, n) {
        const T t = from_acc<T>(to_acc<T>(y[e]) + to_acc<T>(b[e % C]));
        out[e] = from_acc<T>(to_acc<T>(x[e]) + to_acc<T>(t));
    }
}
