// Multi-tensor optimizer steps and gradient norms: one launch covers every tensor of a parameter group.
// A table (const long long*) holds the address of each tensor k < n; offsets[0..n] are the prefix sums of their
// element counts (offsets[n] = total). Element i of the group's concatenation is element i - offsets[k] of the
// tensor k with offsets[k] <= i < offsets[k + 1] (found by binary search: the launcher leaves out empty
// tensors, so offsets strictly increase). Each element is read and written by exactly one thread of a
// grid-stride loop; the tables are only read: no two threads touch the same address, no shared state but the
// block reduction of sumsq_partial. Arithmetic rounds every operation (__fadd_rn and kin, never contracted
// into an FMA) in the order the unfused optimizer code applies them, so float32 results equal its own bit for
// bit; half and bfloat16 compute in float and round once per stored value (PyTorch's fused kernels' opmath).

__device__ __forceinline__ float r_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double r_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float r_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double r_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float r_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double r_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float r_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double r_div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float r_sqrt(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double r_sqrt(double a) { return __dsqrt_rn(a); }

__device__ __forceinline__ int tensor_of(const long long* offsets, int n, long long i) {
    int lo = 0, hi = n - 1;  // the last k with offsets[k] <= i
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (offsets[mid] <= i) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// Adam / AdamW (PyTorch's single-tensor formulas; mode 0: no weight decay, 1: L2 into the gradient, 2: decoupled).
// decay = 1 - lr * wd, c1 = 1 - beta1, c2 = 1 - beta2, bc2_sqrt = sqrt(1 - beta2^t), neg_step = -lr / (1 - beta1^t).
template <typename T>
__global__ void adam_multi(const long long* params, const long long* grads, const long long* exp_avgs,
                           const long long* exp_avg_sqs, const long long* offsets, int n, long long total,
                           double decay, double wd, double c1, double beta2, double c2, double bc2_sqrt, double eps,
                           double neg_step, int mode, int maximize) {
    typedef typename Acc<T>::type A;
    GRID_STRIDE(i, total) {
        const int k = tensor_of(offsets, n, i);
        const long long j = i - offsets[k];
        T* p = (T*)params[k];
        T* m = (T*)exp_avgs[k];
        T* v = (T*)exp_avg_sqs[k];
        A g = to_acc<T>(((const T*)grads[k])[j]);
        if (maximize) g = -g;
        A x = to_acc<T>(p[j]);
        if (mode == 2) x = r_mul(x, (A)decay);
        else if (mode == 1) g = r_add(g, r_mul((A)wd, x));
        A mm = to_acc<T>(m[j]);
        mm = r_add(mm, r_mul(r_sub(g, mm), (A)c1));                        // exp_avg.lerp_(g, 1 - beta1)
        A vv = r_add(r_mul(to_acc<T>(v[j]), (A)beta2), r_mul(r_mul(g, g), (A)c2));
        A denom = r_add(r_div(r_sqrt(vv), (A)bc2_sqrt), (A)eps);
        x = r_add(x, r_mul(r_div(mm, denom), (A)neg_step));                 // p.addcdiv_(m, denom, -step_size)
        m[j] = from_acc<T>(mm);
        v[j] = from_acc<T>(vv);
        p[j] = from_acc<T>(x);
    }
}

// SGD without momentum: p -= lr * (g (+ wd * p)).
template <typename T>
__global__ void sgd_multi(const long long* params, const long long* grads, const long long* offsets, int n,
                          long long total, double lr, double wd, int maximize) {
    typedef typename Acc<T>::type A;
    GRID_STRIDE(i, total) {
        const int k = tensor_of(offsets, n, i);
        const long long j = i - offsets[k];
        T* p = (T*)params[k];
        A g = to_acc<T>(((const T*)grads[k])[j]);
        if (maximize) g = -g;
        A x = to_acc<T>(p[j]);
        if (wd != 0.0) g = r_add(g, r_mul((A)wd, x));
        p[j] = from_acc<T>(r_sub(x, r_mul((A)lr, g)));
    }
}

// SGD with momentum: b = g at the first step, else b = momentum * b + (1 - dampening) * g;
// p -= lr * (nesterov ? g + momentum * b : b).
template <typename T>
__global__ void sgd_momentum_multi(const long long* params, const long long* grads, const long long* bufs,
                                   const long long* offsets, int n, long long total, double lr, double wd,
                                   double momentum, double undamped, int first, int nesterov, int maximize) {
    typedef typename Acc<T>::type A;
    GRID_STRIDE(i, total) {
        const int k = tensor_of(offsets, n, i);
        const long long j = i - offsets[k];
        T* p = (T*)params[k];
        T* b = (T*)bufs[k];
        A g = to_acc<T>(((const T*)grads[k])[j]);
        if (maximize) g = -g;
        A x = to_acc<T>(p[j]);
        if (wd != 0.0) g = r_add(g, r_mul((A)wd, x));
        A bb = first ? g : r_add(r_mul(to_acc<T>(b[j]), (A)momentum), r_mul((A)undamped, g));
        bb = to_acc<T>(from_acc<T>(bb));  // the buffer as stored
        A d = nesterov ? r_add(g, r_mul((A)momentum, bb)) : bb;
        b[j] = from_acc<T>(bb);
        p[j] = from_acc<T>(r_sub(x, r_mul((A)lr, d)));
    }
}

// The sum of a double over the block (blockDim.x a multiple of 32, at most 1024); thread 0 gets it.
__device__ __forceinline__ double block_sum(double s) {
    __shared__ double warp_sums[32];
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = s;
    __syncthreads();
    s = threadIdx.x < (blockDim.x >> 5) ? warp_sums[threadIdx.x] : 0.0;
    if (warp == 0)
        for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    return s;
}

// Pass 1 of the squared 2-norm: partials[blockIdx.x] = this block's sum of x * x (in double) over the tables.
template <typename T>
__global__ void sumsq_partial(const long long* grads, const long long* offsets, int n, long long total,
                              double* partials) {
    double s = 0.0;
    GRID_STRIDE(i, total) {
        const int k = tensor_of(offsets, n, i);
        const double x = (double)to_acc<T>(((const T*)grads[k])[i - offsets[k]]);
        s += x * x;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// Pass 2 (one block): sumsq[0] = the sum of the partials, norm[0] = its square root as T.
template <typename T>
__global__ void sumsq_finish(const double* partials, int n_partials, double* sumsq, T* norm) {
    double s = 0.0;
    for (int i = threadIdx.x; i < n_partials; i += blockDim.x) s += partials[i];
    s = block_sum(s);
    if (threadIdx.x == 0) {
        sumsq[0] = s;
        norm[0] = from_acc<T>((typename Acc<T>::type)sqrt(s));
    }
}

// clip_grads_with_norm_: g *= min(1, max_norm / (norm + 1e-6)), each step rounded to T as PyTorch's tensor ops; a
// NaN norm scales to NaN (the comparison keeps it, where fmin would not).
template <typename T>
__global__ void clip_scale(const long long* grads, const long long* offsets, int n, long long total, const T* norm,
                           double max_norm) {
    typedef typename Acc<T>::type A;
    A d = to_acc<T>(from_acc<T>(r_add(to_acc<T>(norm[0]), (A)1e-6)));
    A c = to_acc<T>(from_acc<T>(r_div((A)max_norm, d)));
    c = c > (A)1 ? (A)1 : c;
    GRID_STRIDE(i, total) {
        const int k = tensor_of(offsets, n, i);
        T* g = (T*)grads[k];
        const long long j = i - offsets[k];
        g[j] = from_acc<T>(r_mul(to_acc<T>(g[j]), c));
    }
}
