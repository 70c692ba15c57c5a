// Dropout around one draw of the device's generator: r ~ U[0, 1) (CuPy's random_sample, float32, one launch), then
// one kernel keeps x where r >= p, scaled by 1 / (1 - p), and writes the keep mask (one byte per element) that
// the backward kernel multiplies the gradient by: 4 launches forward and 2 backward become 2 and 1.

template <typename T>
__global__ void dropout_fwd(const T* x, const float* r, T* y, unsigned char* keep, long long n, float p,
                            float scale) {
    typedef typename Acc<T>::type A;
    GRID_STRIDE(e, n) {
        const bool k = r[e] >= p;
        keep[e] = k ? 1 : 0;
        y[e] = from_acc<T>(k ? to_acc<T>(x[e]) * (A)scale : (A)0);
    }
}

template <typename T>
__global__ void dropout_bwd(const T* g, const unsigned char* keep, T* dx, long long n, float scale) {
    typedef typename Acc<T>::type A;
    GRID_STRIDE(e, n) dx[e] = from_acc<T>(keep[e] ? to_acc<T>(g[e]) * (A)scale : (A)0);
}
