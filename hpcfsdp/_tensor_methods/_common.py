"""What the family files of hpcfsdp/_tensor_methods/ share: operand promotion (_as_operand, _promote_operands,
_binary, _opmath, _reflected), argument checks, dims and sort helpers, the in-place method wrapper and the
autocast decorator the methods use. One copy of each: a family file imports it from here."""
import numpy as np

from .. import _backend, _registry
from .._array import HALF_DTYPES, SCALAR_TYPES, dtype_category, promote_types, random_array, result_type_scalar
from .._autocast import FP32, LOWER, autocast_op
from .._tensor_base import TensorBase
from ..autograd.function import DTENSOR
from ..autograd.grad_mode import is_grad_enabled

__all__ = ["FP32", "LOWER", "autocast_op", "TensorBase", "check_inplace"]


def _wrap_array(array, requires_grad=False):
    """A plain Tensor over ``array`` (``Tensor._wrap``), for functions with no tensor at hand to make it from."""
    return _registry.tensor_class()._wrap(array, requires_grad)


def _tensor_arg(x, fn, name="input"):
    if not isinstance(x, TensorBase):
        raise TypeError(f"{fn}(): argument '{name}' must be Tensor, not {type(x).__name__}")
    return x


# -- operands of binary ops --------------------------------------------------------------------------------
def _as_operand(x, like):
    """A Tensor for tensors and arrays; Python/NumPy scalars pass through as they are."""
    if isinstance(x, TensorBase):
        return x
    if isinstance(x, SCALAR_TYPES):
        return x
    if isinstance(x, (list, tuple)) or hasattr(x, "__array__") or _backend.is_cupy_array(x):
        xp = like._xp()
        return like._wrap(xp.asarray(x))
    raise TypeError(f"unsupported operand of type {type(x).__name__}; expected a Tensor or a number")


def _reflected(other, like):
    """The left operand of a reflected operator (``2 % t``) as a tensor on ``like``'s device."""
    other = _as_operand(other, like)
    return other if isinstance(other, TensorBase) else like._wrap(like._xp().asarray(other))


def _promote_operands(a, b, op_name):
    """Cast a and b (Tensors or scalars, at least one a Tensor) to their PyTorch result dtype."""
    if isinstance(a, TensorBase) and isinstance(b, TensorBase):
        da, db = a._data.dtype, b._data.dtype
        if da != db:
            rd = promote_types(da, db, a._data.ndim == 0, b._data.ndim == 0)
            if da != rd:
                a = a.to(rd)
            if db != rd:
                b = b.to(rd)
        if a.device != b.device and not (a._data.ndim == 0 and a.device.type == "cpu"):
            if not (b._data.ndim == 0 and b.device.type == "cpu"):
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                                   f"devices, {a.device} and {b.device}! (in {op_name})")
        return a, b
    t, s = (a, b) if isinstance(a, TensorBase) else (b, a)
    rd = result_type_scalar(t._data.dtype, s)
    if rd != t._data.dtype:
        t = t.to(rd)
    s = s.item() if isinstance(s, (np.generic,)) else s
    return (t, s) if isinstance(a, TensorBase) else (s, t)


def _binary(op, a, b, name):
    if type(b) is DTENSOR[0] and type(a) is not DTENSOR[0]:
        # a plain tensor's method with a DTensor operand (``hp.tensor(2.).add(dt)``): the operand's sharding
        # rule computes it, as ``hp.add(hp.tensor(2.), dt)`` (See [Note: Function dispatch])
        return _registry._FUNCTION_DISPATCH(_registry.lookup(name), (a, b), {})
    a, b = _promote_operands(a, b, name)
    low = None
    if not (isinstance(a, TensorBase) and isinstance(b, TensorBase)):
        a, b, low = _opmath(a, b)
    try:
        out = op.apply(a, b)
    except ValueError as e:
        sa, sb = (tuple(getattr(x, "shape", ())) for x in (a, b))
        raise RuntimeError(f"{name}: the shapes of the operands {sa} and {sb} do not broadcast ({e})") from None
    return out if low is None else out.to(low)


def _opmath(a, b):
    """A bfloat16 tensor and a scalar compute in float32, rounded back afterwards (the dtype to round to is
    returned, None when there is nothing to do), as PyTorch's opmath: NumPy's promotion of ml_dtypes' bfloat16
    with a Python float differs between ml_dtypes versions (float32 in 0.6, bfloat16 with the scalar rounded
    first in 0.7)."""
    t = a if isinstance(a, TensorBase) else b
    if t._data.dtype != _backend.bfloat16:
        return a, b, None
    return (t.float(), b, t._data.dtype) if t is a else (a, t.float(), t._data.dtype)


def _to_float(t):
    return t if dtype_category(t._data.dtype) == 2 else t.to(_backend.default_float_dtype())


def _float_only(t, name):
    if dtype_category(t._data.dtype) != 2:
        raise RuntimeError(f"{name}(): expected a floating-point input, got {t.dtype}")
    return t


def _same_dtype(name, *tensors):
    for t in tensors[1:]:
        if t.dtype != tensors[0].dtype:
            raise RuntimeError(f"{name}(): expected all tensors to have the same dtype, got {tensors[0].dtype} and "
                               f"{t.dtype}")


def _integral_to_int64(t, dtype):
    """The input of sum-like ops: cast to ``dtype`` if given, else bool and integer tensors to int64 (as PyTorch)."""
    if dtype is not None:
        return t.to(dtype)
    return t.to(_backend.int64) if dtype_category(t._data.dtype) < 2 else t


# -- dims --------------------------------------------------------------------------------------------------
def _dim_slice(dim, s):
    """The index tuple taking slice ``s`` along ``dim`` (everything along the other dims)."""
    return (slice(None),) * dim + (s,)


# -- sorting (sort, topk, order statistics, sampling without replacement) ---------------------------------
def _key(a):
    return a.astype(np.float32) if a.dtype in HALF_DTYPES else a


def _argsort(a, dim, descending):
    """Stable argsort along ``dim`` as int64; descending keeps equal elements in order; NaN sorts as the largest."""
    xp = _backend.array_module(a)
    key = _key(a)
    stable = {"kind": "stable"} if xp is np else {}  # CuPy's sorts are always stable
    if not descending:
        return xp.argsort(key, axis=dim, **stable).astype(np.int64, copy=False)
    r = xp.argsort(xp.flip(key, dim), axis=dim, **stable)  # ascending over the reversed order
    return (key.shape[dim] - 1) - xp.flip(r, dim).astype(np.int64, copy=False)


def _topk_indices(a, k, dim, largest):
    """Indices of the k largest (smallest) along ``dim``, in sorted order: a partition, then a sort of k."""
    xp = _backend.array_module(a)
    key = _key(a)
    n = key.shape[dim]
    if not 0 < k < n:
        return _argsort(key, dim, largest)[_dim_slice(dim, slice(0, k))]
    part = xp.argpartition(key, n - k if largest else k - 1, axis=dim)
    sel = part[_dim_slice(dim, slice(n - k, None) if largest else slice(0, k))]
    order = _argsort(xp.take_along_axis(key, sel, axis=dim), dim, largest)
    return xp.take_along_axis(sel, order, axis=dim).astype(np.int64, copy=False)


def _random(kind, shape, dtype, device, generator, low=0, high=None):
    """random_array drawing from ``generator`` (an hp.Generator) when given."""
    gen = None if generator is None else _backend.generator_for(generator, device)
    return random_array(kind, shape, dtype, device, low, high, gen=gen)


# -- in-place methods --------------------------------------------------------------------------------------
# [Note: In-place ops and autograd]
# In-place methods write into ``_data`` and record nothing: they are for optimizers, initialisation and
# buffers, under hp.no_grad(). There are no version counters, so, unlike PyTorch, writing in place
# into an array that a recorded op saved for backward (an op's input or output) is not detected and
# gives wrong gradients. What PyTorch rejects is rejected here too: an in-place op on a leaf that
# requires grad while grad mode is on. On a non-leaf in grad mode the methods refuse as well, and the
# augmented operators (``y += x``) rebind ``y`` to the recorded out-of-place result instead.
def check_inplace(t):
    """In-place writes are not recorded; refuse them where autograd would be silently wrong."""
    if is_grad_enabled() and t._requires_grad:
        if t.grad_fn is None:
            raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
        raise RuntimeError("in-place operation on a tensor that is part of an autograd graph is not supported "
                           "by hpcfsdp; use the out-of-place operation or run it under hp.no_grad()")


def _inplace_shape(name, a, other):
    """An in-place op's output is ``a`` itself: ``other`` must broadcast to its shape (PyTorch's check)."""
    shape = getattr(other, "shape", ())
    full = np.broadcast_shapes(tuple(shape), a.shape)
    if full != a.shape:
        raise RuntimeError(f"{name}: output with shape {list(a.shape)} doesn't match the broadcast shape {list(full)}")


def _inplace_cast(name, result, out):
    """An in-place op writes its result of dtype ``result`` into ``out``'s dtype: only within or down a category
    (float to int, int to bool refused, as PyTorch's "result type Float can't be cast to the desired output type")."""
    if dtype_category(result) > dtype_category(out):
        raise RuntimeError(f"{name}: result type {np.dtype(result).name} can't be cast to the desired output type "
                           f"{np.dtype(out).name}")


def _assign_result(self, out, name):
    """An in-place method computed out of place: ``out`` written into self (after check_inplace and PyTorch's shape
    and dtype checks), self returned."""
    check_inplace(self)
    _inplace_cast(name, out._data.dtype, self._data.dtype)
    _inplace_shape(name, self._data, out._data)
    if not _backend.is_meta_array(self._data):
        self._data[...] = out._data
    return self


def _raw(x):
    return x._data if isinstance(x, TensorBase) else x


def _inplace(array_fn):
    """The method for ``array_fn(array, *args)``: checks, writes into ``self._data`` (nothing on meta tensors) and
    returns self. See [Note: In-place ops and autograd]."""
    def method(self, *args, **kwargs):
        check_inplace(self)
        if _backend.is_meta_array(self._data):
            return self
        array_fn(self._data, *args, **kwargs)
        return self

    method.__name__ = method.__qualname__ = array_fn.__name__
    method.__doc__ = array_fn.__doc__ or f"In-place {array_fn.__name__[:-1]} (not recorded by autograd)."
    return method
