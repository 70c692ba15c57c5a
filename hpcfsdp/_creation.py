"""Creation functions (tensor, zeros, randn, arange, ...) and cat/stack/where."""
import builtins

import numpy as np

from . import _backend
from ._array import new_array, promote_types, random_array, result_type_scalar, wrap_dim
from ._backend import float32, int64
from ._tensor import Tensor
from ._tensor_base import as_array, parse_shape
from .autograd import ops

__all__ = [
    "tensor", "as_tensor", "zeros", "ones", "empty", "full", "randn", "rand", "randint", "arange", "linspace",
    "zeros_like", "ones_like", "empty_like", "full_like", "randn_like", "rand_like", "from_numpy",
    "from_dlpack", "cat", "concat", "concatenate", "stack", "where", "tril", "triu", "eye", "is_tensor",
    "numel", "randperm",
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
    dt = _backend.to_dtype(dtype) if dtype is not None else float32
    return Tensor._wrap(new_array(_backend.to_device(device), shape, dt, kind), requires_grad)


def zeros(*size, dtype=None, device=None, requires_grad=False):
    return _fresh(size, dtype, device, requires_grad, "zeros")


def ones(*size, dtype=None, device=None, requires_grad=False):
    return _fresh(size, dtype, device, requires_grad, "ones")


def empty(*size, dtype=None, device=None, requires_grad=False, pin_memory=False):
    shape = parse_shape(size)
    dt = _backend.to_dtype(dtype) if dtype is not None else float32
    dev = _backend.to_device(device)
    if pin_memory and dev.type == "cpu":
        return Tensor._wrap(_backend.pinned_empty(shape, dt), requires_grad)
    return Tensor._wrap(new_array(dev, shape, dt, "empty"), requires_grad)


def full(size, fill_value, *, dtype=None, device=None, requires_grad=False):
    if dtype is None:
        dtype = (_backend.bool if isinstance(fill_value, bool) else
                 int64 if isinstance(fill_value, (int, np.integer)) else float32)
    t = _fresh((size,) if not isinstance(size, (tuple, list)) else (tuple(size),), dtype, device, False, "empty")
    if not t.is_meta:
        t._data.fill(fill_value)
    return t.requires_grad_(requires_grad) if requires_grad else t


def _random(kind, shape, dtype, device, generator, low=0, high=None):
    """random_array drawing from ``generator`` (an hp.Generator) when given."""
    gen = None if generator is None else _backend.generator_for(generator, device)
    return random_array(kind, shape, dtype, device, low, high, gen=gen)


def randn(*size, dtype=None, device=None, requires_grad=False, generator=None):
    dt = _backend.to_dtype(dtype) if dtype is not None else float32
    return Tensor._wrap(_random("randn", parse_shape(size), dt, _backend.to_device(device), generator), requires_grad)


def rand(*size, dtype=None, device=None, requires_grad=False, generator=None):
    dt = _backend.to_dtype(dtype) if dtype is not None else float32
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
        dtype = float32 if builtins.any(isinstance(v, float) for v in vals) else int64
    dt = _backend.to_dtype(dtype)
    dev = _backend.to_device(device)
    a = np.arange(*vals, dtype=np.float64 if dt.kind == "f" else np.int64)
    if dev.type == "meta":
        return Tensor._wrap(_backend.meta_array(a.shape, dt))
    a = a.astype(dt)
    if dev.type == "cuda":
        a = _backend.array_module(dev).asarray(a)
    return Tensor._wrap(a, requires_grad)


def linspace(start, end, steps, *, dtype=None, device=None, requires_grad=False):
    dt = _backend.to_dtype(dtype) if dtype is not None else float32
    a = np.linspace(start, end, steps).astype(dt)
    return Tensor._wrap(as_array(a, dt, device, copy=False), requires_grad)


def eye(n, m=None, *, dtype=None, device=None, requires_grad=False):
    dt = _backend.to_dtype(dtype) if dtype is not None else float32
    return Tensor._wrap(as_array(np.eye(n, m, dtype=dt), dt, device, copy=False), requires_grad)


def _like(t, dtype, device):
    return (_backend.to_dtype(dtype) if dtype is not None else t.dtype,
            _backend.to_device(device) if device is not None else t.device)


def _filled_like(input, dtype, device, requires_grad, how):
    dt, dev = _like(input, dtype, device)
    like = getattr(input, "__hp_like__", None)
    if like is not None:  # a DTensor: the same layout, each rank filling its local piece (PyTorch's result)
        return like(new_array(dev, input._data.shape, dt, how), requires_grad)
    return Tensor._wrap(new_array(dev, input.shape, dt, how), requires_grad)


def zeros_like(input, *, dtype=None, device=None, requires_grad=False):  # noqa: A002
    return _filled_like(input, dtype, device, requires_grad, "zeros")


def ones_like(input, *, dtype=None, device=None, requires_grad=False):  # noqa: A002
    return _filled_like(input, dtype, device, requires_grad, "ones")


def empty_like(input, *, dtype=None, device=None, requires_grad=False):  # noqa: A002
    return _filled_like(input, dtype, device, requires_grad, "empty")


def full_like(input, fill_value, *, dtype=None, device=None, requires_grad=False):  # noqa: A002
    t = empty_like(input, dtype=dtype, device=device)
    if not t.is_meta:
        t._data.fill(fill_value)
    return t.requires_grad_(requires_grad) if requires_grad else t


def randn_like(input, *, generator=None, dtype=None, device=None, requires_grad=False):  # noqa: A002
    dt, dev = _like(input, dtype, device)
    return Tensor._wrap(_random("randn", tuple(input.shape), dt, dev, generator), requires_grad)


def rand_like(input, *, generator=None, dtype=None, device=None, requires_grad=False):  # noqa: A002
    dt, dev = _like(input, dtype, device)
    return Tensor._wrap(_random("rand", tuple(input.shape), dt, dev, generator), requires_grad)


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


def _common(tensors, name):
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError(f"{name}(): expected a non-empty list of Tensors")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}(): expected a sequence of Tensors, but element {i} is {type(t).__name__}")
    dt = tensors[0].dtype
    for t in tensors[1:]:
        dt = promote_types(dt, t.dtype)
    return [t if t.dtype == dt else t.to(dt) for t in tensors]


def cat(tensors, dim=0):
    tensors = _common(tensors, "cat")
    tensors = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or tensors[:1]
    d = wrap_dim(dim, tensors[0].ndim)
    ref = tensors[0].shape
    for t in tensors[1:]:
        if t.ndim != len(ref) or any(a != b for i, (a, b) in enumerate(zip(t.shape, ref)) if i != d):
            raise RuntimeError(f"Sizes of tensors must match except in dimension {d}. Expected {tuple(ref)} "
                               f"but got {tuple(t.shape)}")
    return ops.Cat.apply(d, *tensors)


concat = concatenate = cat


def stack(tensors, dim=0):
    tensors = _common(tensors, "stack")
    ref = tensors[0].shape
    for t in tensors[1:]:
        if t.shape != ref:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got {tuple(ref)} and {tuple(t.shape)}")
    d = wrap_dim(dim, tensors[0].ndim + 1)
    return ops.Stack.apply(d, *tensors)


def where(condition, input=None, other=None):  # noqa: A002
    """where(cond, x, y) element-wise select (broadcasting); where(cond) -> tuple of index tensors."""
    c = condition._data if isinstance(condition, Tensor) else np.asarray(condition)
    if input is None and other is None:
        return tuple(Tensor._wrap(i.astype(np.int64)) for i in c.nonzero())
    if c.dtype != np.bool_:
        raise RuntimeError(f"where expected condition to be a boolean tensor, but got a tensor with dtype {c.dtype}")
    a, b = input, other
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        dt = promote_types(a.dtype, b.dtype, a.ndim == 0, b.ndim == 0)
        a, b = a.to(dt), b.to(dt)
    elif isinstance(a, Tensor):
        a = a.to(result_type_scalar(a.dtype, b))
        b = a._data.dtype.type(b)
    elif isinstance(b, Tensor):
        b = b.to(result_type_scalar(b.dtype, a))
        a = b._data.dtype.type(a)
    else:
        dt = float32 if builtins.any(isinstance(v, float) for v in (a, b)) else int64
        a, b = dt.type(a), dt.type(b)
    return ops.Where.apply(c, a, b)


def tril(input, diagonal=0):  # noqa: A002
    xp = input._xp()
    return input.masked_fill(Tensor._wrap(~xp.tril(xp.ones(input.shape[-2:], dtype=bool), diagonal)), 0)


def triu(input, diagonal=0):  # noqa: A002
    xp = input._xp()
    return input.masked_fill(Tensor._wrap(~xp.triu(xp.ones(input.shape[-2:], dtype=bool), diagonal)), 0)

