// softmax and log_softmax over the last dim of x viewed as (rows, C), and cross-entropy of (rows, C) logits against
// int64 targets. Row kernels run one block per row (a grid-stride loop over rows), reading the row from global memory
// two or three times, never staging it in shared memory, so any C works. Blocks and grids: softmax.py.

template <typename T>
__global__ void softmax_fwd(const T* x, T* y, long long rows, long long C, int log_) {
    typedef typename Acc<T>::type A;
    __shared__ A sh[32];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * C;
        T* yr = y + r * C;
        A m = k_neg_inf<A>();
        for (long long j = threadIdx.x; j < C; j += blockDim.x) {
            const A v = to_acc<T>(xr[j]);
            m = v > m ? v : m;
        }
        m = block_max<A>(m, sh);
        A s = 0;
        for (long long j = threadIdx.x; j < C; j += blockDim.x) s += k_exp(to_acc<T>(xr[j]) - m);
        s = block_sum<A>(s, sh);
        const A ls = k_log(s);
        for (long long j = threadIdx.x; j < C; j += blockDim.x) {
            const A z = to_acc<T>(xr[j]) - m;
            yr[j] = from_acc<T>(log_ ? z - ls : k_exp(z) / s);
        }
    }
}

// dx = y (g - sum(g y)) for softmax, g - exp(y) sum(g) for log_softmax (y the forward's output)
template <typename T>
__global__ void softmax_bwd(const T* g, const T* y, T* dx, long long rows, long long C, int log_) {
    typedef typename Acc<T>::type A;
    __shared__ A sh[32];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* gr = g + r * C;
        const T* yr = y + r * C;
        T* dr = dx + r * C;
        A s = 0;
        for (long long j = threadIdx.x; j < C; j += blockDim.x)
            s += log_ ? to_acc<T>(gr[j]) : to_acc<T>(gr[j]) * to_acc<T>(yr[j]);
        s = block_sum<A>(s, sh);
        for (long long j = threadIdx.x; j < C; j += blockDim.x) {
            const A gv = to_acc<T>(gr[j]), yv = to_acc<T>(yr[j]);
            dr[j] = from_acc<T>(log_ ? gv - k_exp(yv) * s : yv * (gv - s));
        }
    }
}

// Per row r with target t = tgt[r]: loss[r] = (1 - eps) (lse - z_t) + eps / C (C lse - sum_j z_j) with z = x - max,
// and grad[r, j] = p_j - (1 - eps) [j == t] - eps / C, the gradient of loss[r] (p = softmax(x)); both 0 where t is
// ignore_index or out of [0, C) (ce_reduce reports the latter).
template <typename T>
__global__ void ce_fwd(const T* x, const long long* tgt, typename Acc<T>::type* loss, T* grad, long long rows,
                       long long C, long long ignore_index, double eps) {
    typedef typename Acc<T>::type A;
    __shared__ A sh[32];
    const A e = (A)eps, e_c = (A)(eps / (double)C);
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * C;
        T* gr = grad + r * C;
        const long long t = tgt[r];
        const bool ok = t != ignore_index && t >= 0 && t < C;  // uniform over the block
        if (!ok) {
            for (long long j = threadIdx.x; j < C; j += blockDim.x) gr[j] = from_acc<T>((A)0);
            if (threadIdx.x == 0) loss[r] = 0;
            continue;
        }
        A m = k_neg_inf<A>();
        for (long long j = threadIdx.x; j < C; j += blockDim.x) {
            const A v = to_acc<T>(xr[j]);
            m = v > m ? v : m;
        }
        m = block_max<A>(m, sh);
        A s = 0, zs = 0;
        for (long long j = threadIdx.x; j < C; j += blockDim.x) {
            const A z = to_acc<T>(xr[j]) - m;
            s += k_exp(z);
            zs += z;
        }
        s = block_sum<A>(s, sh);
        if (eps > 0) zs = block_sum<A>(zs, sh);
        const A lse = k_log(s);
        if (threadIdx.x == 0) {
            const A nll = lse - (to_acc<T>(xr[t]) - m);
            loss[r] = eps > 0 ? nll * ((A)1 - e) + (lse * (A)C - zs) * e_c : nll;
        }
        for (long long j = threadIdx.x; j < C; j += blockDim.x) {
            A p = k_exp(to_acc<T>(xr[j]) - m) / s - e_c;
            if (j == t) p -= (A)1 - e;
            gr[j] = from_acc<T>(p);
        }
    }
}

__device__ __forceinline__ long long ce_block_min(long long v, long long* sh) {  // block_sum's pattern, for a min
    for (int o = 16; o > 0; o >>= 1) {
        long long w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w < v ? w : v;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (int)(threadIdx.x & 31) < (int)(blockDim.x >> 5) ? sh[threadIdx.x & 31] : 0x7fffffffffffffffLL;
    for (int o = 16; o > 0; o >>= 1) {
        long long w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w < v ? w : v;
    }
    return v;
}

// One block: out = the losses (mode 0, each rounded to T), their sum (1) or their mean over the non-ignored rows (2);
// den[0] = the count of non-ignored rows; flag[0] = the first row whose target is out of [0, C) and not ignore_index,
// or -1. Every output is written unconditionally: nothing needs zeroing first.
template <typename T>
__global__ void ce_reduce(const long long* tgt, const typename Acc<T>::type* loss, T* out,
                          typename Acc<T>::type* den, long long* flag, long long rows, long long C,
                          long long ignore_index, int mode) {
    typedef typename Acc<T>::type A;
    __shared__ A sh[32];
    __shared__ long long shl[32];
    A s = 0, n = 0;
    long long bad = 0x7fffffffffffffffLL;
    for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
        const long long t = tgt[r];
        const bool valid = t != ignore_index;
        if (valid && (t < 0 || t >= C)) bad = r < bad ? r : bad;
        s += loss[r];
        n += valid ? (A)1 : (A)0;
        if (mode == 0) out[r] = from_acc<T>(loss[r]);
    }
    s = block_sum<A>(s, sh);
    n = block_sum<A>(n, sh);
    bad = ce_block_min(bad, shl);
    if (threadIdx.x == 0) {
        if (mode != 0) out[0] = from_acc<T>(mode == 2 ? s / n : s);
        den[0] = n;
        flag[0] = bad < rows ? bad : -1;
    }
}

// dx = grad * (g[row] (mode 0), g[0] (1) or g[0] / den[0] (2)): the saved gradient rows scaled by the upstream one
template <typename T>
__global__ void ce_bwd(const T* grad, const T* g, const typename Acc<T>::type* den, T* dx, long long n, long long C,
                       int mode) {
    typedef typename Acc<T>::type A;
    GRID_STRIDE(i, n) {
        const A a = mode == 0 ? to_acc<T>(g[i / C]) : (mode == 1 ? to_acc<T>(g[0]) : to_acc<T>(g[0]) / den[0]);
        dx[i] = from_acc<T>(to_acc<T>(grad[i]) * a);
    }
}
