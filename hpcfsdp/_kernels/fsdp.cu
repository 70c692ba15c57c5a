// FSDP's copies between a group's rank-major flat buffer and its parameters, one launch per group each way
// (PyTorch FSDP2's split_with_sizes_copy and chunk_cat). See [Note: Flat layout] in _fsdp_param.py: parameter i
// holds ``chunk`` elements of every rank's segment of ``total`` elements, at ``offset``; element g of the full
// parameter (``full`` of them, rows first) is rank g / chunk's element g % chunk. meta holds, per parameter in
// offset order, (offset, chunk, full, dst): dst is where the full parameter starts in the copy-out destination.
// One thread per element of the flat buffer (a grid-stride loop), its parameter found by binary search.

__device__ __forceinline__ int fsdp_param_of(const long long* meta, int nparams, long long j) {
    int lo = 0, hi = nparams - 1;  // the last parameter whose offset is <= j
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (meta[4 * mid] <= j) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// all-gather output (world * total) -> every parameter's full data in dst
template <typename T>
__global__ void fsdp_copy_out(const T* src, T* dst, const long long* meta, int nparams, long long total,
                              long long n) {
    GRID_STRIDE(e, n) {
        const long long r = e / total, j = e - r * total;
        const int i = fsdp_param_of(meta, nparams, j);
        const long long k = j - meta[4 * i];
        if (k < 0 || k >= meta[4 * i + 1]) continue;  // group padding between parameters
        const long long g = r * meta[4 * i + 1] + k;
        if (g < meta[4 * i + 2]) dst[meta[4 * i + 3] + g] = src[e];
    }
}

// every parameter's gradient (a table of addresses, T) -> the reduce-scatter input (world * total, D), zero where
// a parameter has no gradient (full 0 in meta) or the rank's piece is padding
template <typename T, typename D>
__device__ __forceinline__ void fsdp_copy_in_body(const long long* grads, D* dst, const long long* meta, int nparams,
                                                  long long total, long long n) {
    GRID_STRIDE(e, n) {
        const long long r = e / total, j = e - r * total;
        const int i = fsdp_param_of(meta, nparams, j);
        const long long k = j - meta[4 * i];
        typename Acc<T>::type v = 0;
        if (k >= 0 && k < meta[4 * i + 1]) {
            const long long g = r * meta[4 * i + 1] + k;
            if (g < meta[4 * i + 2]) v = to_acc<T>(reinterpret_cast<const T*>(grads[i])[g]);
        }
        dst[e] = from_acc<D>(v);
    }
}

template <typename T>
__global__ void fsdp_copy_in(const long long* grads, T* dst, const long long* meta, int nparams, long long total,
                             long long n) {
    fsdp_copy_in_body<T, T>(grads, dst, meta, nparams, total, n);
}

// the same into a float32 input: gradients in T (bfloat16 parameters) reduced in float32
template <typename T>
__global__ void fsdp_copy_in_f32(const long long* grads, float* dst, const long long* meta, int nparams,
                                 long long total, long long n) {
    fsdp_copy_in_body<T, float>(grads, dst, meta, nparams, total, n);
}
