// Embedding's row gather with its bounds check on the device: a bad index writes a zero row and records its position
// in flag (atomicMax over positions; -1: all fine), which the op defers to the host's next read (See [Note: Deferred
// device checks] in checks.py). One thread per output element (a grid-stride loop).

template <typename T>
__global__ void embedding_fwd(const long long* idx, const T* w, T* out, long long* flag, long long count,
                              long long dim, long long nrows) {
    GRID_STRIDE(e, count * dim) {
        const long long i = e / dim, c = e - i * dim;
        const long long r = idx[i];
        if (r < 0 || r >= nrows) {
            out[e] = from_acc<T>((typename Acc<T>::type)0);
            if (c == 0) atomicMax(flag, i);  // signed: from -1
        } else {
            out[e] = w[r * dim + c];
        }
    }
}
