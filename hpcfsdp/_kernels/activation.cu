// GELU, exact (x * Phi(x)) and tanh-approximated, with and without a bias added first (bias of the last dim,
// length c, broadcast over the rows of x: the Linear before the activation). Each forward reads x once and
// writes y once; each backward recomputes what it needs from x (nothing but x is saved).

template <typename A> __device__ __forceinline__ A gelu_of(A x, int approx, A* slope) {
    const A k = (A)0.7978845608028654;  // sqrt(2 / pi)
    const A c = (A)0.044715;
    if (approx) {
        A th = k_tanh(k * (x + c * x * x * x));
        *slope = (A)0.5 * ((A)1 + th) + (A)0.5 * x * ((A)1 - th * th) * k * ((A)1 + (A)3 * c * x * x);
        return (A)0.5 * x * ((A)1 + th);
    }
    A cdf = k_ncdf(x);
    *slope = cdf + x * (A)0.3989422804014327 * k_exp((A)-0.5 * x * x);  // Phi(x) + x phi(x)
    return x * cdf;
}

template <typename T>
__global__ void gelu_fwd(const T* x, T* y, long long n, int approx) {
    typedef typename Acc<T>::type A;
    GRID_STRIDE(i, n) {
        A s;
        y[i] = from_acc<T>(gelu_of<A>(to_acc<T>(x[i]), approx, &s));
    }
}

template <typename T>
__global__ void gelu_bwd(const T* g, const T* x, T* dx, long long n, int approx) {
    typedef typename Acc<T>::type A;
    GRID_STRIDE(i, n) {
        A s;
        gelu_of<A>(to_acc<T>(x[i]), approx, &s);
        dx[i] = from_acc<T>(to_acc<T>(g[i]) * s);
    }
}

template <typename T>
__global__ void bias_gelu_fwd(const T* x, const T* b, T* y, long long n, long long c, int approx) {
    typedef typename Acc<T>::type A;
    GRID_STRIDE(i, n) {
        A s;
        A v = to_acc<T>(from_acc<T>(to_acc<T>(x[i]) + to_acc<T>(b[i % c])));  // x + b rounded as T, as unfused
        y[i] = from_acc<T>(gelu_of<A>(v, approx, &s));
    }
}

template <typename T>
__global__ void bias_gelu_bwd(const T* g, const T* x, const T* b, T* dx, long long n, long long c, int approx) {
    typedef typename Acc<T>::type A;
    GRID_STRIDE(i, n) {
        A s;
        A v = to_acc<T>(from_acc<T>(to_acc<T>(x[i]) + to_acc<T>(b[i % c])));
        gelu_of<A>(v, approx, &s);
        dx[i] = from_acc<T>(to_acc<T>(g[i]) * s);
    }
}
