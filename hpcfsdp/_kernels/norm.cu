// LayerNorm (rms = 0) and RMSNorm (rms = 1) over the last dim of x viewed as (rows, C), with optional weight and bias
// of length C in x's storage type. Forward: one block per row (a grid-stride loop over rows), the row read from global
// memory two or three times (mean, variance, write), never staged in shared memory, so any C works; it saves mean
// (0 for RMSNorm) and rstd per row in the accumulation type. Backward: norm_bwd_dx per row from the saved statistics;
// norm_bwd_wb reduces the weight and bias gradients over rows, one 32-column tile per block. Blocks: norm.py.

#define NORM_WB_COLS 32   // norm_bwd_wb: columns of a tile (threadIdx.x & 31)
#define NORM_WB_LANES 8   // norm_bwd_wb: row lanes of a tile (threadIdx.x >> 5): at most 256 threads (norm.py: 256)

// One row of norm_fwd: y = (x - mean) * rstd * w + b (RMSNorm: mean 0, no b); every thread of the block calls it.
template <typename T>
__device__ __forceinline__ void norm_row(const T* xr, const T* w, const T* b, T* yr, typename Acc<T>::type* mean,
                                         typename Acc<T>::type* rstd, long long C, double eps, int has_w, int has_b,
                                         int rms, typename Acc<T>::type* sh) {
    typedef typename Acc<T>::type A;
    const A inv_c = (A)(1.0 / (double)C);
    A m = 0;
    if (!rms) {
        A s = 0;
        for (long long j = threadIdx.x; j < C; j += blockDim.x) s += to_acc<T>(xr[j]);
        m = block_sum<A>(s, sh) * inv_c;
    }
    A q = 0;
    for (long long j = threadIdx.x; j < C; j += blockDim.x) {
        const A d = to_acc<T>(xr[j]) - m;
        q += d * d;
    }
    const A rs = (A)1 / sqrt(block_sum<A>(q, sh) * inv_c + (A)eps);
    if (threadIdx.x == 0) {
        *mean = m;
        *rstd = rs;
    }
    for (long long j = threadIdx.x; j < C; j += blockDim.x) {
        A h = (to_acc<T>(xr[j]) - m) * rs;
        if (rms) {  // F.rms_norm: (x * rstd) rounded to T, then times the weight
            h = to_acc<T>(from_acc<T>(h));
            if (has_w) h *= to_acc<T>(w[j]);
        } else {
            if (has_w) h *= to_acc<T>(w[j]);
            if (has_b) h += to_acc<T>(b[j]);
        }
        yr[j] = from_acc<T>(h);
    }
}

template <typename T>
__global__ void norm_fwd(const T* x, const T* w, const T* b, T* y, typename Acc<T>::type* mean,
                         typename Acc<T>::type* rstd, long long rows, long long C, double eps, int has_w, int has_b,
                         int rms) {
    __shared__ typename Acc<T>::type sh[32];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x)
        norm_row<T>(x + r * C, w, b, y + r * C, mean + r, rstd + r, C, eps, has_w, has_b, rms, sh);
}

// The residual stream and the norm after it: s = x + (y + yb) (yb broadcast over rows, each sum rounded to T as the
// unfused adds round it; without has_yb s = x + y), then norm_fwd of s. Each thread re-reads only the s elements it
// wrote (norm_row walks a row's columns with the same stride), so no barrier is needed before the norm.
template <typename T>
__global__ void add_norm_fwd(const T* x, const T* y, const T* yb, const T* w, const T* b, T* s, T* out,
                             typename Acc<T>::type* mean, typename Acc<T>::type* rstd, long long rows, long long C,
                             double eps, int has_yb, int has_w, int has_b, int rms) {
    __shared__ typename Acc<T>::type sh[32];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        T* sr = s + r * C;
        for (long long j = threadIdx.x; j < C; j += blockDim.x) {
            const T t = has_yb ? from_acc<T>(to_acc<T>(y[r * C + j]) + to_acc<T>(yb[j])) : y[r * C + j];
            sr[j] = from_acc<T>(to_acc<T>(x[r * C + j]) + to_acc<T>(t));
        }
        norm_row<T>(sr, w, b, out + r * C, mean + r, rstd + r, C, eps, has_w, has_b, rms, sh);
    }
}

// dx = rstd * (g w - mean(g w) - xhat * mean(g w xhat)), without the mean(g w) term for RMSNorm, plus gres (the
// gradient the residual stream brings to x, added before the one rounding) when has_res
template <typename T>
__global__ void norm_bwd_dx(const T* g, const T* x, const T* w, const typename Acc<T>::type* mean,
                            const typename Acc<T>::type* rstd, const T* gres, T* dx, long long rows, long long C,
                            int has_w, int has_res, int rms) {
    typedef typename Acc<T>::type A;
    __shared__ A sh[32];
    const A inv_c = (A)(1.0 / (double)C);
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* gr = g + r * C;
        const T* xr = x + r * C;
        T* dr = dx + r * C;
        const A m = mean[r], rs = rstd[r];
        A s1 = 0, s2 = 0;
        for (long long j = threadIdx.x; j < C; j += blockDim.x) {
            const A gw = has_w ? to_acc<T>(gr[j]) * to_acc<T>(w[j]) : to_acc<T>(gr[j]);
            s1 += gw;
            s2 += gw * ((to_acc<T>(xr[j]) - m) * rs);
        }
        const A m1 = rms ? (A)0 : block_sum<A>(s1, sh) * inv_c;
        const A m2 = block_sum<A>(s2, sh) * inv_c;
        for (long long j = threadIdx.x; j < C; j += blockDim.x) {
            const A gw = has_w ? to_acc<T>(gr[j]) * to_acc<T>(w[j]) : to_acc<T>(gr[j]);
            const A d = (gw - m1 - (to_acc<T>(xr[j]) - m) * rs * m2) * rs;
            dr[j] = from_acc<T>(has_res ? d + to_acc<T>(gres[r * C + j]) : d);
        }
    }
}

// dw[c] = sum_r g[r, c] * xhat[r, c] (xhat rounded to T for RMSNorm, as its unfused y), db[c] = sum_r g[r, c], and,
// when has_e, de[c] = sum_r e[r, c] (the bias gradient of the op whose output this norm read: add_norm_fwd's).
// A block owns 32 columns at a time: its 8 row lanes each sum every 8th row (32 consecutive columns per load, one
// segment of memory), then lane 0 adds the 8 partial sums of its column in a fixed order (deterministic).
template <typename T>
__global__ void norm_bwd_wb(const T* g, const T* x, const typename Acc<T>::type* mean,
                            const typename Acc<T>::type* rstd, const T* e, T* dw, T* db, T* de, long long rows,
                            long long C, int rms, int has_e) {
    typedef typename Acc<T>::type A;
    __shared__ A sw[NORM_WB_LANES][NORM_WB_COLS + 1];
    __shared__ A sb[NORM_WB_LANES][NORM_WB_COLS + 1];
    __shared__ A se[NORM_WB_LANES][NORM_WB_COLS + 1];
    const int cl = threadIdx.x % NORM_WB_COLS, rl = threadIdx.x / NORM_WB_COLS;
    const int lanes = blockDim.x / NORM_WB_COLS;  // blockDim.x a multiple of 32, at most 32 * NORM_WB_LANES
    for (long long c0 = (long long)blockIdx.x * NORM_WB_COLS; c0 < C; c0 += (long long)gridDim.x * NORM_WB_COLS) {
        const long long c = c0 + cl;
        A aw = 0, ab = 0, ae = 0;
        if (c < C) {
            for (long long r = rl; r < rows; r += lanes) {
                const A gv = to_acc<T>(g[r * C + c]);
                A h = (to_acc<T>(x[r * C + c]) - mean[r]) * rstd[r];
                if (rms) h = to_acc<T>(from_acc<T>(h));
                aw += gv * h;
                ab += gv;
                if (has_e) ae += to_acc<T>(e[r * C + c]);
            }
        }
        sw[rl][cl] = aw;
        sb[rl][cl] = ab;
        se[rl][cl] = ae;
        __syncthreads();
        if (rl == 0 && c < C) {
            for (int k = 1; k < lanes; ++k) {
                aw += sw[k][cl];
                ab += sb[k][cl];
                ae += se[k][cl];
            }
            dw[c] = from_acc<T>(aw);
            db[c] = from_acc<T>(ab);
            if (has_e) de[c] = from_acc<T>(ae);
        }
        __syncthreads();  // the next tile's writes wait for these reads
    }
}
