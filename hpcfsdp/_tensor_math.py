"""Tensor methods for math, shape and in-place ops, attached to Tensor (kept out of _tensor.py)."""
import builtins

import numpy as np

from . import _backend
from ._tensor import _SCALARS, Tensor, _category, _MinMax, _wrap_dim, promote_types, result_type_scalar
from .autograd import ops

__all__ = []


def _method(fn):
    """Attach fn to Tensor; the module-level name is left unbound (no shadowing of max, sum, abs...)."""
    setattr(Tensor, fn.__name__, fn)


# -- operands -----------------------------------------------------------------------------------------
def _as_operand(x, like):
    """A Tensor for tensors and arrays; Python/NumPy scalars pass through as they are."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, _SCALARS):
        return x
    if isinstance(x, (list, tuple)) or hasattr(x, "__array__") or _backend.is_cupy_array(x):
        xp = like._xp()
        return Tensor._wrap(xp.asarray(x))
    raise TypeError(f"unsupported operand of type {type(x).__name__}; expected a Tensor or a number")


def _promote2(a, b, op_name):
    """Cast a and b (Tensors or scalars, at least one a Tensor) to their PyTorch result dtype."""
    if isinstance(a, Tensor) and isinstance(b, Tensor):
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
    t, s = (a, b) if isinstance(a, Tensor) else (b, a)
    rd = result_type_scalar(t._data.dtype, s)
    if rd != t._data.dtype:
        t = t.to(rd)
    s = s.item() if isinstance(s, (np.generic,)) else s
    return (t, s) if isinstance(a, Tensor) else (s, t)


def _binary(op, a, b, name):
    a, b = _promote2(a, b, name)
    try:
        return op.apply(a, b)
    except ValueError as e:
        sa, sb = (tuple(getattr(x, "shape", ())) for x in (a, b))
        raise RuntimeError(f"{name}: the shapes of the operands {sa} and {sb} do not broadcast ({e})") from None


def _to_float(t):
    return t if _category(t._data.dtype) == 2 else t.to(_backend.float32)


# -- arithmetic -----------------------------------------------------------------------------------------
@_method
def __add__(self, other):
    return _binary(ops.Add, self, _as_operand(other, self), "add")


@_method
def __radd__(self, other):
    return _binary(ops.Add, _as_operand(other, self), self, "add")


@_method
def __sub__(self, other):
    return _binary(ops.Sub, self, _as_operand(other, self), "sub")


@_method
def __rsub__(self, other):
    return _binary(ops.Sub, _as_operand(other, self), self, "sub")


@_method
def __mul__(self, other):
    return _binary(ops.Mul, self, _as_operand(other, self), "mul")


@_method
def __rmul__(self, other):
    return _binary(ops.Mul, _as_operand(other, self), self, "mul")


@_method
def __truediv__(self, other):
    other = _as_operand(other, self)
    a = _to_float(self)
    if isinstance(other, Tensor):
        other = _to_float(other)
    elif isinstance(other, (int, np.integer)) and not isinstance(other, bool):
        other = float(other)
    return _binary(ops.Div, a, other, "div")


@_method
def __rtruediv__(self, other):
    other = _as_operand(other, self)
    if isinstance(other, Tensor):
        return other.__truediv__(self)
    return _binary(ops.Div, float(other), _to_float(self), "div")


@_method
def __floordiv__(self, other):
    other = other._data if isinstance(other, Tensor) else other
    return Tensor._wrap(self._data // other)


@_method
def __mod__(self, other):
    other = other._data if isinstance(other, Tensor) else other
    return Tensor._wrap(self._data % other)


@_method
def __pow__(self, exponent):
    if isinstance(exponent, Tensor):
        if exponent._data.ndim == 0 and not exponent.requires_grad:
            return self.__pow__(exponent.item())
        return _binary(ops.Pow, self, exponent, "pow")
    if not isinstance(exponent, _SCALARS):
        raise TypeError(f"unsupported exponent {exponent!r}")
    a = self
    if isinstance(exponent, (float, np.floating)) and _category(a._data.dtype) != 2:
        a = a.to(_backend.float32)
    e = exponent.item() if isinstance(exponent, np.generic) else exponent
    return ops.PowScalar.apply(a, e)


@_method
def __rpow__(self, base):
    if isinstance(base, Tensor):
        return base.__pow__(self)
    a = _to_float(self) if isinstance(base, float) else self
    return ops.RPowScalar.apply(float(base) if _category(a._data.dtype) == 2 else base, a)


@_method
def __neg__(self):
    return ops.Neg.apply(self)


@_method
def __pos__(self):
    return self


@_method
def __matmul__(self, other):
    if not isinstance(other, Tensor):
        other = _as_operand(other, self)
    a, b = _promote2(self, other, "matmul")
    return ops.Matmul.apply(a, b)


@_method
def __rmatmul__(self, other):
    return _as_operand(other, self).__matmul__(self)


Tensor.matmul = Tensor.__matmul__


@_method
def add(self, other, *, alpha=1):
    return self + (other * alpha if alpha != 1 else other)


@_method
def sub(self, other, *, alpha=1):
    return self - (other * alpha if alpha != 1 else other)


Tensor.mul = Tensor.__mul__
Tensor.multiply = Tensor.__mul__
Tensor.div = Tensor.__truediv__
Tensor.divide = Tensor.__truediv__
Tensor.neg = Tensor.__neg__
Tensor.negative = Tensor.__neg__
Tensor.pow = Tensor.__pow__
Tensor.true_divide = Tensor.__truediv__


def _unary(op):
    def f(self):
        return op.apply(_to_float(self))

    return f


for _name, _op in [("exp", ops.Exp), ("log", ops.Log), ("sqrt", ops.Sqrt), ("rsqrt", ops.Rsqrt),
                   ("tanh", ops.Tanh), ("sigmoid", ops.Sigmoid)]:
    f = _unary(_op)
    f.__name__ = _name
    setattr(Tensor, _name, f)


@_method
def abs(self):
    return ops.Abs.apply(self)


Tensor.__abs__ = Tensor.abs


@_method
def relu(self):
    return ops.Relu.apply(self)


@_method
def square(self):
    return ops.PowScalar.apply(self, 2)


@_method
def clamp(self, min=None, max=None):  # noqa: A002
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    lo, hi = min, max
    a = self
    for v in (lo, hi):
        if isinstance(v, (float, np.floating)) and _category(a._data.dtype) != 2:
            a = a.to(_backend.float32)
    lo = lo if (lo is None or isinstance(lo, Tensor)) else a._data.dtype.type(lo)
    hi = hi if (hi is None or isinstance(hi, Tensor)) else a._data.dtype.type(hi)
    return ops.Clamp.apply(a, lo, hi)


Tensor.clip = Tensor.clamp


@_method
def maximum(self, other):
    return _binary(ops.Maximum, self, _as_operand(other, self), "maximum")


@_method
def minimum(self, other):
    return _binary(ops.Minimum, self, _as_operand(other, self), "minimum")


# -- reductions --------------------------------------------------------------------------------------
def _dims(dim, ndim):
    if dim is None:
        return None
    if isinstance(dim, (list, tuple)):
        return tuple(_wrap_dim(d, ndim) for d in dim)
    return _wrap_dim(dim, ndim)


@_method
def sum(self, dim=None, keepdim=False, *, dtype=None):
    return ops.Sum.apply(self, _dims(dim, self.ndim), keepdim, None if dtype is None else _backend.to_dtype(dtype))


@_method
def mean(self, dim=None, keepdim=False, *, dtype=None):
    a = self if dtype is None else self.to(dtype)
    if _category(a._data.dtype) != 2:
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a floating "
                           f"point or complex dtype. Got: {a.dtype}")
    return ops.Mean.apply(a, _dims(dim, a.ndim), keepdim)


@_method
def amax(self, dim=(), keepdim=False):
    return ops.Amax.apply(self, _dims(dim, self.ndim) or None, keepdim, False)


@_method
def amin(self, dim=(), keepdim=False):
    return ops.Amax.apply(self, _dims(dim, self.ndim) or None, keepdim, True)


def _maxmin(self, dim, keepdim, other, is_min):
    if isinstance(dim, Tensor):
        other = dim
    if other is not None:
        return self.minimum(other) if is_min else self.maximum(other)
    if dim is None:
        return ops.Amax.apply(self, None, False, is_min)
    vals, idx = ops.MaxDim.apply(self, _wrap_dim(dim, self.ndim), keepdim, is_min)
    return _MinMax(vals, idx)


@_method
def max(self, dim=None, keepdim=False, *, other=None):
    return _maxmin(self, dim, keepdim, other, False)


@_method
def min(self, dim=None, keepdim=False, *, other=None):
    return _maxmin(self, dim, keepdim, other, True)


@_method
def argmax(self, dim=None, keepdim=False):
    a = self._data
    if dim is None:
        r = a.reshape(-1).argmax()
        return Tensor._wrap(r.reshape((1,) * a.ndim if keepdim else ()).astype(np.int64))
    return Tensor._wrap(a.argmax(axis=_wrap_dim(dim, a.ndim), keepdims=keepdim).astype(np.int64))


@_method
def argmin(self, dim=None, keepdim=False):
    a = self._data
    if dim is None:
        r = a.reshape(-1).argmin()
        return Tensor._wrap(r.reshape((1,) * a.ndim if keepdim else ()).astype(np.int64))
    return Tensor._wrap(a.argmin(axis=_wrap_dim(dim, a.ndim), keepdims=keepdim).astype(np.int64))


@_method
def var(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):  # var(unbiased) positional form
        dim, unbiased = None, dim
    if correction is None:
        correction = 0 if unbiased is False else 1
    return ops.Var.apply(_to_float(self), _dims(dim, self.ndim), correction, keepdim)


@_method
def std(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return self.var(dim, unbiased, keepdim, correction=correction).sqrt()


@_method
def softmax(self, dim, dtype=None):
    a = self.to(dtype) if dtype is not None else _to_float(self)
    return ops.Softmax.apply(a, _wrap_dim(dim, a.ndim))


@_method
def log_softmax(self, dim, dtype=None):
    a = self.to(dtype) if dtype is not None else _to_float(self)
    return ops.LogSoftmax.apply(a, _wrap_dim(dim, a.ndim))


@_method
def all(self, dim=None, keepdim=False):
    return Tensor._wrap(self._xp().asarray(self._data.all(axis=_dims(dim, self.ndim), keepdims=keepdim)))


@_method
def any(self, dim=None, keepdim=False):
    return Tensor._wrap(self._xp().asarray(self._data.any(axis=_dims(dim, self.ndim), keepdims=keepdim)))


@_method
def masked_fill(self, mask, value):
    m = mask._data if isinstance(mask, Tensor) else mask
    if m.dtype != np.bool_:
        raise RuntimeError(f"masked_fill only supports boolean masks, but got mask with dtype {m.dtype}")
    try:
        np.broadcast_shapes(tuple(m.shape), tuple(self.shape))
    except ValueError:
        raise RuntimeError(f"masked_fill: the mask of shape {tuple(m.shape)} does not broadcast to the tensor's "
                           f"shape {tuple(self.shape)}") from None
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise RuntimeError(f"masked_fill only supports a 0-dimensional value tensor, but got one with "
                               f"{value.ndim} dimension(s)")
        value = value.item()
    return ops.MaskedFill.apply(self, m, value)


# -- comparisons and logic (no graph) ---------------------------------------------------------------------
def _cmp(ufunc_name):
    def f(self, other):
        o = other._data if isinstance(other, Tensor) else other
        if isinstance(o, (list, tuple)):
            o = self._xp().asarray(o)
        return Tensor._wrap(getattr(self._xp(), ufunc_name)(self._data, o))

    return f


for _names, _uf in [(("__eq__", "eq"), "equal"), (("__ne__", "ne"), "not_equal"), (("__lt__", "lt"), "less"),
                    (("__le__", "le"), "less_equal"), (("__gt__", "gt"), "greater"),
                    (("__ge__", "ge"), "greater_equal"), (("__and__", "logical_and_", "__rand__"), "bitwise_and"),
                    (("__or__", "__ror__"), "bitwise_or"), (("__xor__", "__rxor__"), "bitwise_xor")]:
    for _n in _names:
        setattr(Tensor, _n, _cmp(_uf))
Tensor.__hash__ = lambda self: id(self)


@_method
def __invert__(self):
    return Tensor._wrap(~self._data)


@_method
def logical_not(self):
    return Tensor._wrap(self._xp().logical_not(self._data))


@_method
def isfinite(self):
    return Tensor._wrap(self._xp().isfinite(self._data))


@_method
def isnan(self):
    return Tensor._wrap(self._xp().isnan(self._data))


@_method
def equal(self, other):
    return self.shape == other.shape and builtins.bool((self._data == other._data).all())


@_method
def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    return builtins.bool(self._xp().allclose(self._data, other._data, rtol=rtol, atol=atol, equal_nan=equal_nan))


# Shape/indexing and in-place methods live in sibling modules (file size).
from . import _tensor_inplace, _tensor_shape  # noqa: E402,F401
