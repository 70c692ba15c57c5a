// Rotary position embedding, Hugging Face's convention: y = x * cos + rotate_half(x) * sin, rotate_half(x) =
// (-x2, x1) over the two halves of the head dim D, cos/sin of shape (T, D). x is traversed in its memory order,
// element e of head-dim index j = e % D at position t = (e / tdiv) % T (tdiv = D for (..., T, D) contiguous, H * D
// for a (B, H, T, D) view of a contiguous (B, T, H, D) projection). One thread per element; computed in float,
// rounded once.

template <typename T>
__global__ void rotary_fwd(const T* x, const T* cs, const T* sn, T* y, long long n, int D, int T_len, long long tdiv) {
    typedef typename Acc<T>::type A;
    const int h = D / 2;
    GRID_STRIDE(e, n) {
        const int j = (int)(e % D);
        const long long t = (e / tdiv) % T_len;
        const A partner = j < h ? -to_acc<T>(x[e + h]) : to_acc<T>(x[e - h]);
        y[e] = from_acc<T>(to_acc<T>(x[e]) * to_acc<T>(cs[t * D + j]) + partner * to_acc<T>(sn[t * D + j]));
    }
}

// its gradient: dx_i = g_i cos_i + (i < D/2 ? g_{i+D/2} sin_{i+D/2} : -g_{i-D/2} sin_{i-D/2})
template <typename T>
__global__ void rotary_bwd(const T* g, const T* cs, const T* sn, T* dx, long long n, int D, int T_len,
                           long long tdiv) {
    typedef typename Acc<T>::type A;
    const int h = D / 2;
    GRID_STRIDE(e, n) {
        const int j = (int)(e % D);
        const long long t = (e / tdiv) % T_len;
        const A other = j < h ? to_acc<T>(g[e + h]) * to_acc<T>(sn[t * D + j + h])
                              : -to_acc<T>(g[e - h]) * to_acc<T>(sn[t * D + j - h]);
        dx[e] = from_acc<T>(to_acc<T>(g[e]) * to_acc<T>(cs[t * D + j]) + other);
    }
}
