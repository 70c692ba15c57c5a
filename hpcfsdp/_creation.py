"""Constructors from shapes and data (tensor, asarray, zeros, randn, arange, logspace, eye, tril_indices, from_numpy,
the signal windows, ...): not ops on tensors, so not in the op registry. The ops that make tensors from tensors (zeros_like, cat, where, ...) are in
hpcfsdp/_tensor_methods/."""
import builtins

import numpy as np

from . import _backend
from ._array import new_array
from ._backend import int64
from ._tensor import Tensor
from ._tensor_base import as_array, parse_shape
from ._tensor_methods._common import _random

__all__ = [
    "tensor", "as_tensor", "zeros", "ones", "empty", "full", "randn", "rand", "randint", "arange", "linspace",
    "from_numpy", "from_dlpack", "eye", "is_tensor", "numel", "randperm", "tril_indices", "triu_indices", "asarray",
    "scalar_tensor", "logspace", "hann_window", "hamming_window", "blackman_window", "bartlett_window",
]


def tensor(data, *, dtype=None, device=None, requires_grad=False, pin_memory=False):
    """A new tensor copying data (Python numbers/lists, NumPy/CuPy arrays, Tensors)."""
    return Tensor._wrap(as_array(data, dtype, device, copy=True), requires_grad)


def as_tensor(data, dtype=None, device=None):
    if isinstance(data, Tensor) and dtype is None and device is None:
        return data
    return Tensor._wrap(as_array(data, dtype, device, copy=False))


def _fresh(size, dtype, device, requires_grad, kind):
    shape = parse_shape(size)
    dt = _backend.to_dtype(dtype) if dtype is not None else _backend.default_float_dtype()
    return Tensor._wrap(new_array(_backend.to_device(device), shape, dt, kind), requires_grad)


def zeros(*size, dtype=None, device=None, requires_grad=False):
    return _fresh(size, dtype, device, requires_grad, "zeros")


def ones(*size, dtype=None, device=None, requires_grad=False):
    return _fresh(size, dtype, device, requires_grad, "ones")


def empty(*size, dtype=None, device=None, requires_grad=False, pin_memory=False):
    shape = parse_shape(size)
    dt = _backend.to_dtype(dtype) if dtype is not None else _backend.default_float_dtype()
    dev = _backend.to_device(device)
    if pin_memory and dev.type == "cpu":
        return Tensor._wrap(_backend.pinned_empty(shape, dt), requires_grad)
    return Tensor._wrap(new_array(dev, shape, dt, "empty"), requires_grad)


def full(size, fill_value, *, dtype=None, device=None, requires_grad=False):
    if dtype is None:
        dtype = (_backend.bool if isinstance(fill_value, bool) else
                 int64 if isinstance(fill_value, (int, np.integer)) else _backend.default_float_dtype())
    t = _fresh((size,) if not isinstance(size, (tuple, list)) else (tuple(size),), dtype, device, False, "empty")
    if not t.is_meta:
        t._data.fill(fill_value)
    return t.requires_grad_(requires_grad) if requires_grad else t


def randn(*size, dtype=None, device=None, requires_grad=False, generator=None):
    dt = _backend.to_dtype(dtype) if dtype is not None else _backend.default_float_dtype()
    return Tensor._wrap(_random("randn", parse_shape(size), dt, _backend.to_device(device), generator), requires_grad)


def rand(*size, dtype=None, device=None, requires_grad=False, generator=None):
    dt = _backend.to_dtype(dtype) if dtype is not None else _backend.default_float_dtype()
    return Tensor._wrap(_random("rand", parse_shape(size), dt, _backend.to_device(device), generator), requires_grad)


def randint(low, high=None, size=None, *, dtype=None, device=None, requires_grad=False, generator=None):
    """randint(high, size) or randint(low, high, size)."""
    if size is None:
        if high is None or not isinstance(high, (tuple, list)):
            raise TypeError("randint() missing the required argument 'size'")
        low, high, size = 0, low, high
    if not low < high:
        raise ValueError(f"randint: expected low < high, got low={low} and high={high}")
    dt = _backend.to_dtype(dtype) if dtype is not None else int64
    return Tensor._wrap(_random("randint", parse_shape((size,)), dt, _backend.to_device(device), generator, low, high),
                        requires_grad)


def randperm(n, *, generator=None, dtype=None, device=None):
    dev = _backend.to_device(device)
    gen = _backend.generator_for(generator, dev)
    p = gen.permutation(n)
    return Tensor._wrap(p.astype(_backend.to_dtype(dtype) if dtype else int64))


def arange(start, end=None, step=1, *, dtype=None, device=None, requires_grad=False):
    if end is None:
        start, end = 0, start
    vals = [v.item() if isinstance(v, Tensor) else v for v in (start, end, step)]
    if vals[2] == 0:
        raise ValueError(f"arange: step must be nonzero, got step={vals[2]!r}")
    if dtype is None:
        dtype = _backend.default_float_dtype() if builtins.any(isinstance(v, float) for v in vals) else int64
    dt = _backend.to_dtype(dtype)
    dev = _backend.to_device(device)
    if dev.type == "cuda" and dt.kind in "iu" and builtins.all(isinstance(v, int) for v in vals):
        # integers are exact on the device: a kernel, not an upload that waits for the host (positions in a step)
        xp = _backend.array_module(dev)
        return Tensor._wrap(xp.arange(*vals, dtype=np.int64).astype(dt, copy=False), requires_grad)
    a = np.arange(*vals, dtype=np.float64 if dt.kind == "f" else np.int64)
    if dev.type == "meta":
        return Tensor._wrap(_backend.meta_array(a.shape, dt))
    a = a.astype(dt)
    if dev.type == "cuda":
        a = _backend.array_module(dev).asarray(a)
    return Tensor._wrap(a, requires_grad)


def linspace(start, end, steps, *, dtype=None, device=None, requires_grad=False):
    dt = _backend.to_dtype(dtype) if dtype is not None else _backend.default_float_dtype()
    a = np.linspace(start, end, steps).astype(dt)
    return Tensor._wrap(as_array(a, dt, device, copy=False), requires_grad)


def eye(n, m=None, *, dtype=None, device=None, requires_grad=False):
    dt = _backend.to_dtype(dtype) if dtype is not None else _backend.default_float_dtype()
    return Tensor._wrap(as_array(np.eye(n, m, dtype=dt), dt, device, copy=False), requires_grad)


def from_numpy(a):
    """A cpu tensor sharing memory with ndarray ``a``."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(a).__name__})")
    if a.dtype not in _backend._SUPPORTED:
        raise TypeError(f"can't convert np.ndarray of type {a.dtype}; supported: "
                        f"{sorted(str(d) for d in _backend._SUPPORTED)}")
    return Tensor._wrap(a)


def from_dlpack(x):
    """A tensor sharing memory with any DLPack producer (NumPy, CuPy, PyTorch, JAX arrays)."""
    if isinstance(x, Tensor):
        return Tensor._wrap(x._data)
    dev_type, dev_id = x.__dlpack_device__()
    if int(dev_type) == 1:  # kDLCPU
        return Tensor._wrap(np.from_dlpack(x))
    if int(dev_type) in (2, 3, 13):  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
        cp = _backend.array_module(_backend.device("cuda", int(dev_id)))
        return Tensor._wrap(cp.from_dlpack(x))
    raise RuntimeError(f"from_dlpack: unsupported DLPack device type {dev_type}")


def is_tensor(obj):
    return isinstance(obj, Tensor)


def numel(t):
    return t.numel()


def _indices(kind, row, col, offset, dtype, device):
    r, c = getattr(np, f"{kind}_indices")(row, offset, col)
    t = Tensor._wrap(np.stack([r, c]).astype(_backend.to_dtype(dtype)))
    return t if device is None else t.to(device)


def tril_indices(row, col, offset=0, *, dtype=_backend.int64, device=None, layout=None):
    """The (2, N) row and column indices of the lower triangle of a row x col matrix, row by row."""
    return _indices("tril", row, col, offset, dtype, device)


def triu_indices(row, col, offset=0, *, dtype=_backend.int64, device=None, layout=None):
    """The (2, N) row and column indices of the upper triangle of a row x col matrix, row by row."""
    return _indices("triu", row, col, offset, dtype, device)


def asarray(obj, *, dtype=None, device=None, copy=None, requires_grad=False):
    """A tensor of ``obj`` (a Tensor, a NumPy/CuPy array, DLPack producer, Python numbers or sequences), sharing
    its memory where it can: ``copy=None`` copies only where the dtype or device must change, ``copy=True``
    always, ``copy=False`` never (a ValueError where it would have to)."""
    dt = _backend.to_dtype(dtype) if dtype is not None else None
    dev = _backend.to_device(device) if device is not None else None
    if isinstance(obj, Tensor):
        same = (dt is None or dt == obj.dtype) and (dev is None or dev == obj.device)
        if same and not copy:
            out = obj
        elif not same and copy is False:
            raise ValueError(f"can't alias tensor with dtype {obj.dtype} on {obj.device} into dtype {dt or obj.dtype}"
                             f" on {dev or obj.device}")
        else:
            out = Tensor._wrap(as_array(obj._data, dt, dev, copy=True))
    else:
        arr = obj._data if isinstance(obj, Tensor) else obj
        if not isinstance(arr, np.ndarray) and not _backend.is_cupy_array(arr) and hasattr(arr, "__dlpack__"):
            arr = from_dlpack(arr)._data
        if copy is False:
            if not (isinstance(arr, np.ndarray) or _backend.is_cupy_array(arr)) or (dt is not None and
                                                                                  dt != arr.dtype):
                raise ValueError(f"can't alias {type(obj).__name__} data into dtype {dt} without a copy")
        out = Tensor._wrap(as_array(arr, dt, device, copy=bool(copy)))
    if requires_grad:
        if not out.is_floating_point():
            raise RuntimeError("Only Tensors of floating point and complex dtype can require gradients")
        if out is obj:
            out = out.detach()
        out.requires_grad_(True)
    return out


def scalar_tensor(s, *, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=None):
    """A 0-d tensor of the number ``s``, of the default float dtype unless ``dtype`` is given (also for ints and
    bools, as PyTorch)."""
    if isinstance(s, Tensor):
        s = s.item()
    dt = _backend.to_dtype(dtype) if dtype is not None else _backend.default_float_dtype()
    return Tensor._wrap(as_array(s, dt, device, copy=True), requires_grad)


def logspace(start, end, steps, base=10.0, *, dtype=None, device=None, requires_grad=False):
    """``steps`` values ``base ** linspace(start, end, steps)`` (computed in float64, then cast to ``dtype``)."""
    dt = _backend.to_dtype(dtype) if dtype is not None else _backend.default_float_dtype()
    if steps < 0:
        raise RuntimeError("number of steps must be non-negative")
    a = np.power(float(base), np.linspace(float(start), float(end), int(steps)))
    if dt.kind in "iu":
        a = np.trunc(a)
    return Tensor._wrap(as_array(a.astype(dt), dt, device, copy=False), requires_grad)


# -- windows (signal processing): the periodic form is the symmetric one of length + 1, its last value dropped -----
def _window(name, window_length, periodic, dtype, device, requires_grad, fn):
    dt = _backend.to_dtype(dtype) if dtype is not None else _backend.default_float_dtype()
    if not _backend.is_floating_dtype(dt):
        raise RuntimeError(f"{name} expects floating point dtypes, got: {dt}")
    if window_length < 0:
        raise RuntimeError(f"{name} requires non-negative window_length, got window_length={window_length}")
    if window_length <= 1:
        a = np.ones((window_length,))
    else:
        n = window_length + 1 if periodic else window_length
        a = fn(np.arange(n, dtype=np.float64), n - 1)[:window_length]
    return Tensor._wrap(as_array(a.astype(dt), dt, device, copy=False), requires_grad)


def hann_window(window_length, periodic=True, *, dtype=None, device=None, requires_grad=False, layout=None):
    """The Hann window 0.5 - 0.5 cos(2 pi n / N) (N = window_length, or window_length - 1 with periodic=False)."""
    return _window("hann_window", window_length, periodic, dtype, device, requires_grad,
                   lambda k, m: 0.5 - 0.5 * np.cos(2 * np.pi * k / m))


def hamming_window(window_length, periodic=True, alpha=0.54, beta=0.46, *, dtype=None, device=None,
                   requires_grad=False, layout=None):
    """The Hamming window alpha - beta cos(2 pi n / N)."""
    return _window("hamming_window", window_length, periodic, dtype, device, requires_grad,
                   lambda k, m: alpha - beta * np.cos(2 * np.pi * k / m))


def blackman_window(window_length, periodic=True, *, dtype=None, device=None, requires_grad=False, layout=None):
    """The Blackman window 0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N)."""
    return _window("blackman_window", window_length, periodic, dtype, device, requires_grad,
                   lambda k, m: 0.42 - 0.5 * np.cos(2 * np.pi * k / m) + 0.08 * np.cos(4 * np.pi * k / m))


def bartlett_window(window_length, periodic=True, *, dtype=None, device=None, requires_grad=False, layout=None):
    """The Bartlett (triangular) window 1 - |2 n / N - 1|."""
    return _window("bartlett_window", window_length, periodic, dtype, device, requires_grad,
                   lambda k, m: 1 - np.abs(2 * k / m - 1))
