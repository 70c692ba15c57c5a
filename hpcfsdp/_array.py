"""Pure helpers on NumPy/CuPy arrays and dtypes shared by the tensor core and its autograd ops.

A leaf: imports only NumPy and ``_backend``. Nothing here knows Tensor or Function. The array module of
an array or device is ``_backend.array_module``.
"""
import builtins

import numpy as np

from ._backend import (array_module, bfloat16, default_float_dtype, float16, float32, generator, int64, meta_array,
                       to_dtype)

__all__ = ["HALF_DTYPES", "SCALAR_TYPES", "dtype_category", "promote_types", "result_type_scalar", "wrap_dim",
           "new_array", "random_array", "shape_of", "sum_to", "array_matmul", "index_add"]

HALF_DTYPES = (float16, bfloat16)  # NumPy has no half-precision BLAS or reductions: compute these in float32
SCALAR_TYPES = (builtins.int, builtins.float, builtins.bool, np.number, np.bool_)  # Python/NumPy scalar operands

# -- dtypes ----------------------------------------------------------------------------------------------
_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2}


def dtype_category(dtype):
    """0 for bool, 1 for integer, 2 for floating dtypes (bfloat16 included): PyTorch's promotion categories."""
    return 2 if dtype == bfloat16 else _CATEGORY[dtype.kind]


def promote_types(dtype_a, dtype_b, a_scalar_like=False, b_scalar_like=False):
    """PyTorch's promotion for two tensors; a 0-d tensor does not raise the dtype within its category."""
    if dtype_a == dtype_b:
        return dtype_a
    category_a, category_b = dtype_category(dtype_a), dtype_category(dtype_b)
    if category_a != category_b:
        return dtype_a if category_a > category_b else dtype_b
    if a_scalar_like != b_scalar_like:
        return dtype_b if a_scalar_like else dtype_a
    if category_a == 2:
        if {dtype_a, dtype_b} == {float16, bfloat16}:
            return float32
        return dtype_a if dtype_a.itemsize >= dtype_b.itemsize else dtype_b
    return np.result_type(dtype_a, dtype_b)


def result_type_scalar(dtype, scalar):
    """Dtype of (tensor of ``dtype``) op (Python scalar ``scalar``), as PyTorch."""
    if isinstance(scalar, (builtins.bool, np.bool_)):
        return dtype
    if isinstance(scalar, (builtins.int, np.integer)):
        return int64 if dtype.kind == "b" else dtype
    if isinstance(scalar, (builtins.float, np.floating)):
        return dtype if dtype_category(dtype) == 2 else default_float_dtype()
    raise TypeError(f"unsupported scalar {scalar!r} of type {type(scalar).__name__}; expected bool, int or float")


# -- shapes ----------------------------------------------------------------------------------------------
def wrap_dim(dim, ndim):
    """``dim`` as an index in [0, ndim) (negative dims count from the end); a 0-d array has dims 0 and -1."""
    if not isinstance(dim, (builtins.int, np.integer)):
        raise TypeError(f"dim must be an int, got {dim!r}")
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return builtins.int(dim) % n


def shape_of(a):
    """The shape of an array; () for a Python scalar."""
    return a.shape if hasattr(a, "shape") else ()


def sum_to(grad, shape):
    """Reduce a broadcast gradient back to ``shape`` (sum over broadcast dims)."""
    if grad.shape == shape:
        return grad
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, s in enumerate(shape) if s == 1 and grad.shape[i + lead] != 1)
    if axes:
        grad = grad.sum(axis=axes)
    return grad.reshape(shape)


# -- new arrays ------------------------------------------------------------------------------------------
def new_array(device, shape, dtype, kind):
    """A fresh array on ``device``: kind is 'empty', 'zeros' or 'ones' (meta: no memory)."""
    dtype = to_dtype(dtype)
    if device.type == "meta":
        return meta_array(shape, dtype)
    xp = array_module(device)
    if xp is np:
        return getattr(np, kind)(shape, dtype=dtype)
    with xp.cuda.Device(device.index):
        return getattr(xp, kind)(shape, dtype=dtype)


def random_array(kind, shape, dtype, device, low=0, high=None, gen=None):
    """Random values from ``gen`` or the device's generator (NumPy Generator or CuPy RandomState).

    kind: 'randn' (standard normal), 'rand' (uniform on [0, 1)) or 'randint' (integers in [low, high)).
    """
    if device.type == "meta":
        return meta_array(shape, dtype)
    device_generator = generator(device) if gen is None else gen
    float_dtype = np.float64 if dtype == np.float64 else np.float32
    if kind == "randint":
        if isinstance(device_generator, np.random.Generator):
            return device_generator.integers(low, high, size=shape, dtype=np.int64).astype(dtype, copy=False)
        return device_generator.randint(low, high, size=shape, dtype=np.int64).astype(dtype, copy=False)
    if kind == "randn":
        a = device_generator.standard_normal(shape, dtype=float_dtype)
    elif isinstance(device_generator, np.random.Generator):
        a = device_generator.random(shape, dtype=float_dtype)
    else:
        a = device_generator.random_sample(shape, dtype=float_dtype)
    return a.astype(dtype, copy=False)


# -- kernels ---------------------------------------------------------------------------------------------
def array_matmul(a, b):
    """a @ b; half precision on NumPy is computed in float32 and rounded (NumPy has no half BLAS)."""
    if a.dtype in HALF_DTYPES and isinstance(a, np.ndarray):
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
    return array_module(a).matmul(a, b)


# cupyx.scatter_add (CUDA's atomicAdd) takes only these dtypes (cupy/_core/_routines_indexing.pyx, _scatter_op).
_CUPY_SCATTER_ADD = frozenset(np.dtype(t) for t in (np.int32, np.float16, np.float32, np.float64, np.uint32,
                                                    np.uint64))


def index_add(out, index, values):
    """out[index] += values with repeated indices accumulating (np.add.at / cupyx.scatter_add).

    On CuPy a dtype its scatter_add lacks (bfloat16, int64, ...) accumulates in float32 (float64 for integers) and is
    rounded back once, as PyTorch's CUDA embedding backward accumulates bfloat16 in float.
    """
    if isinstance(out, np.ndarray):
        np.add.at(out, index, values)
        return
    import cupyx  # noqa: PLC0415  (only with CuPy arrays, which imply CuPy is installed)

    if out.dtype in _CUPY_SCATTER_ADD:
        cupyx.scatter_add(out, index, values)
        return
    work = np.float32 if out.dtype.kind == "f" or out.dtype in HALF_DTYPES else np.float64
    acc = out.astype(work)
    cupyx.scatter_add(acc, index, values.astype(work))
    out[...] = acc.astype(out.dtype)
