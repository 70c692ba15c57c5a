"""Helpers the op families share: the half-precision upcast, reduction dims and shapes, kernel taps, per-dim matmuls."""
import itertools

import numpy as np

from ..._array import HALF_DTYPES, array_matmul, wrap_dim
from ..._kernels import linear as _linear
from ..._kernels import use_fused


def _up(a):
    """a in float32 if it is half precision (float16 or bfloat16), else a itself: on NumPy and CuPy alike.

    The ops that accumulate (reductions, scans, norms) or chain several transcendental steps compute half-precision
    inputs in float32 and round the result back once, as PyTorch's CPU and CUDA kernels do (their accumulation type
    for half is float). On NumPy half-precision ufuncs are also slow; on CuPy a float16 sum of squares overflows at
    65504 and bfloat16 rounds to 8 significant bits after every step.
    """
    return a.astype(np.float32) if a.dtype in HALF_DTYPES else a


def bias_grad(g):
    """The gradient of a bias broadcast over the rows of ``g`` (..., C): its column sums, in g's dtype, accumulated in
    float32 (float64 for float64); one launch on the GPU (hpcfsdp/_kernels/linear.cu)."""
    if use_fused(g):
        return _linear.col_sum(g)
    return g.reshape(-1, g.shape[-1]).sum(axis=0, dtype=np.float64 if g.dtype == np.float64 else np.float32) \
        .astype(g.dtype, copy=False)


def _axes(dim, ndim):
    """Reduction dims as a sorted tuple of non-negative dims; None (all dims) for dim None, () or a 0-d array.

    As PyTorch: a 0-d array has dims 0 and -1 (reducing over them reduces nothing away), a dim out of range raises
    IndexError and a dim given twice RuntimeError.
    """
    if dim is None:
        return None
    dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
    wrapped = [wrap_dim(d, ndim) for d in dims]
    for i, d in enumerate(wrapped):
        if d in wrapped[:i]:
            raise RuntimeError(f"dim {d} appears multiple times in the list of dims {list(dims)}")
    return tuple(sorted(wrapped)) if wrapped and ndim else None


def _reduced_shape(shape, axes, keepdim):
    """The shape of a reduction over ``axes`` (None: all dims)."""
    if axes is None:
        return (1,) * len(shape) if keepdim else ()
    if keepdim:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def _taps(ks):
    """Every kernel tap (i1, i2, ...) of a kernel of sizes ``ks``, in C order."""
    return itertools.product(*(range(k) for k in ks))


def _apply_along(y, mats, transpose):
    """Multiply spatial dim 2 + i of y by mats[i] (or its transpose) for each i; None leaves a dim alone."""
    for i, m in enumerate(mats):
        if m is None:
            continue
        ax = 2 + i
        y = array_matmul(y.swapaxes(ax, -1), m if transpose else m.T).swapaxes(ax, -1)
    return y
