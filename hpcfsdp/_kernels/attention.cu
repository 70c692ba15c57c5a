// The element-wise middle of dense attention on the GPU: the score matrix S = q k^T comes from one cuBLAS call
// (tensor cores for bfloat16 and half), then one kernel scales, masks (causal) and soft-maxes each row, and in
// backward one kernel turns dP = g v^T into dS. One block per row of S; a row is read from global memory twice
// (max, then exp-sum-write) or three times, never staged in shared memory, so any row length works.

#define ATTN_THREADS 256  // the launcher's block size (attention.py BLOCK): the reductions below assume it

template <typename A> __device__ __forceinline__ A attn_block_reduce(A v, A* sh, bool is_max) {
    // every thread of the block gets the max (is_max) or the sum of v; sh holds ATTN_THREADS / 32 values
    for (int o = 16; o > 0; o >>= 1) {
        A w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? (w > v ? w : v) : v + w;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // sh may still be read by a previous reduction
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = sh[0];
    for (int i = 1; i < ATTN_THREADS / 32; ++i) v = is_max ? (sh[i] > v ? sh[i] : v) : v + sh[i];
    return v;
}

// p[r, j] = softmax_j(scale * s[r, j]) (s in the accumulation type: float scores of half inputs, from cuBLAS) over the keys row r sees (j <= r % L when causal, as PyTorch's
// is_causal: the lower triangle aligned at the top left), 0 beyond them.
template <typename T>
__global__ void causal_softmax_fwd(const typename Acc<T>::type* s, T* p, long long rows, int L, int S, float scale,
                                   int causal) {
    typedef typename Acc<T>::type A;
    __shared__ A sh[ATTN_THREADS / 32];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const A* sr = s + r * S;
        T* pr = p + r * S;
        const int w = causal ? min(S, (int)(r % L) + 1) : S;
        A m = k_neg_inf<A>();
        for (int j = threadIdx.x; j < w; j += ATTN_THREADS) {
            A v = sr[j] * (A)scale;
            m = v > m ? v : m;
        }
        m = attn_block_reduce<A>(m, sh, true);
        A z = 0;
        for (int j = threadIdx.x; j < w; j += ATTN_THREADS) z += k_exp(sr[j] * (A)scale - m);
        z = attn_block_reduce<A>(z, sh, false);
        const A inv = (A)1 / z;
        for (int j = threadIdx.x; j < S; j += ATTN_THREADS)
            pr[j] = from_acc<T>(j < w ? k_exp(sr[j] * (A)scale - m) * inv : (A)0);
    }
}

// ds[r, j] = scale * p[r, j] * (dp[r, j] - sum_k dp[r, k] p[r, k]): the softmax backward, with the score scale
// (dp in the accumulation type, as the scores)
template <typename T>
__global__ void softmax_bwd_scaled(const T* p, const typename Acc<T>::type* dp, T* ds, long long rows, int S,
                                   float scale) {
    typedef typename Acc<T>::type A;
    __shared__ A sh[ATTN_THREADS / 32];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* pr = p + r * S;
        const A* gr = dp + r * S;
        T* dr = ds + r * S;
        A dot = 0;
        for (int j = threadIdx.x; j < S; j += ATTN_THREADS) dot += gr[j] * to_acc<T>(pr[j]);
        dot = attn_block_reduce<A>(dot, sh, false);
        for (int j = threadIdx.x; j < S; j += ATTN_THREADS)
            dr[j] = from_acc<T>((A)scale * to_acc<T>(pr[j]) * (gr[j] - dot));
    }
}

// Packed heads: x (B, T, 3, H, D), the (B, T, 3C) output of a fused q/k/v projection, <-> q, k, v (B, H, T, D),
// each contiguous (a strided-batched GEMM needs one stride between heads), plus the projection's bias (3 * H * D)
// when has_bias (each sum rounded to T, as the Linear's own bias add). One thread per element of q, which moves that
// element of all three.
template <typename T>
__global__ void heads_split3(const T* x, const T* bias, T* q, T* k, T* v, long long n, int T_len, int H, int D,
                            int has_bias) {
    GRID_STRIDE(e, n) {
        const long long d = e % D, t = (e / D) % T_len, h = (e / ((long long)D * T_len)) % H;
        const long long b = e / ((long long)D * T_len * H);
        const long long src = ((b * T_len + t) * 3 * H + h) * D + d, part = (long long)H * D, col = h * D + d;
        if (has_bias) {
            q[e] = from_acc<T>(to_acc<T>(x[src]) + to_acc<T>(bias[col]));
            k[e] = from_acc<T>(to_acc<T>(x[src + part]) + to_acc<T>(bias[col + part]));
            v[e] = from_acc<T>(to_acc<T>(x[src + 2 * part]) + to_acc<T>(bias[col + 2 * part]));
        } else {
            q[e] = x[src];
            k[e] = x[src + part];
            v[e] = x[src + 2 * part];
        }
    }
}

// its inverse (the gradient of the split): x (B, T, 3, H, D) from q, k, v (B, H, T, D)
template <typename T>
__global__ void heads_merge3(const T* q, const T* k, const T* v, T* x, long long n, int T_len, int H, int D) {
    GRID_STRIDE(e, n) {
        const long long d = e % D, t = (e / D) % T_len, h = (e / ((long long)D * T_len)) % H;
        const long long b = e / ((long long)D * T_len * H);
        const long long dst = ((b * T_len + t) * 3 * H + h) * D + d, part = (long long)H * D;
        x[dst] = q[e];
        x[dst + part] = k[e];
        x[dst + 2 * part] = v[e];
    }
}
