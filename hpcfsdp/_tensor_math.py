"""TensorMathMixin: Tensor's arithmetic, reductions, comparisons and logic."""
import builtins

import numpy as np

from . import _backend
from ._array import SCALAR_TYPES, dtype_category, promote_types, result_type_scalar, wrap_dim
from ._tensor_base import TensorBase
from .autograd import ops
from ._autocast import FP32, LOWER, autocast_op

__all__ = ["TensorMathMixin"]



def _reflected(other, like):
    """The left operand of a reflected operator (``2 % t``) as a tensor on ``like``'s device."""
    other = _as_operand(other, like)
    return other if isinstance(other, TensorBase) else like._wrap(like._xp().asarray(other))

class _MinMax(tuple):
    """(values, indices) result of max(dim)/min(dim), as torch.return_types."""

    __slots__ = ()

    def __new__(cls, values, indices):
        return super().__new__(cls, (values, indices))

    values = property(lambda self: self[0])
    indices = property(lambda self: self[1])


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
    return t if dtype_category(t._data.dtype) == 2 else t.to(_backend.float32)


def _wrap_dims(dim, ndim):
    if dim is None:
        return None
    if isinstance(dim, (list, tuple)):
        return tuple(wrap_dim(d, ndim) for d in dim)
    return wrap_dim(dim, ndim)


def _max_or_min(self, dim, keepdim, other, is_min):
    if isinstance(dim, TensorBase):
        other = dim
    if other is not None:
        return self.minimum(other) if is_min else self.maximum(other)
    if dim is None:
        return ops.Amax.apply(self, None, False, is_min)
    vals, idx = ops.MaxDim.apply(self, wrap_dim(dim, self.ndim), keepdim, is_min)
    return _MinMax(vals, idx)


def _elementwise(ufunc_name):
    """A method computing ufunc(self, other) on the arrays (no graph): comparisons and bitwise logic."""
    def f(self, other):
        o = other._data if isinstance(other, TensorBase) else other
        if isinstance(o, (list, tuple)):
            o = self._xp().asarray(o)
        return self._wrap(getattr(self._xp(), ufunc_name)(self._data, o))

    return f


class TensorMathMixin:
    """Math methods of Tensor: differentiable ones apply an op of autograd/ops.py, comparisons and logic
    compute arrays directly (no graph)."""

    # -- arithmetic ------------------------------------------------------------------------------------
    def __add__(self, other):
        return _binary(ops.Add, self, _as_operand(other, self), "add")

    def __radd__(self, other):
        return _binary(ops.Add, _as_operand(other, self), self, "add")

    def __sub__(self, other):
        return _binary(ops.Sub, self, _as_operand(other, self), "sub")

    def __rsub__(self, other):
        return _binary(ops.Sub, _as_operand(other, self), self, "sub")

    def __mul__(self, other):
        return _binary(ops.Mul, self, _as_operand(other, self), "mul")

    def __rmul__(self, other):
        return _binary(ops.Mul, _as_operand(other, self), self, "mul")

    def __truediv__(self, other):
        other = _as_operand(other, self)
        a = _to_float(self)
        if isinstance(other, TensorBase):
            other = _to_float(other)
        elif isinstance(other, (int, np.integer)) and not isinstance(other, bool):
            other = float(other)
        return _binary(ops.Div, a, other, "div")

    def __rtruediv__(self, other):
        other = _as_operand(other, self)
        if isinstance(other, TensorBase):
            return other.__truediv__(self)
        return _binary(ops.Div, float(other), _to_float(self), "div")

    def __floordiv__(self, other):
        return self.floor_divide(other)

    def __rfloordiv__(self, other):
        return _reflected(other, self).floor_divide(self)

    def __mod__(self, other):  # remainder: differentiable, as PyTorch's (d/dx x % y = 1)
        return self.remainder(other)

    def __rmod__(self, other):
        return _reflected(other, self).remainder(self)

    def __pow__(self, exponent):
        if isinstance(exponent, TensorBase):
            if exponent._data.ndim == 0 and not exponent.requires_grad:
                return self.__pow__(exponent.item())
            return _binary(ops.Pow, self, exponent, "pow")
        if not isinstance(exponent, SCALAR_TYPES):
            raise TypeError(f"unsupported exponent {exponent!r}")
        a = self
        if isinstance(exponent, (float, np.floating)) and dtype_category(a._data.dtype) != 2:
            a = a.to(_backend.float32)
        e = exponent.item() if isinstance(exponent, np.generic) else exponent
        a, e, low = _opmath(a, e)
        out = ops.PowScalar.apply(a, e)
        return out if low is None else out.to(low)

    def __rpow__(self, base):
        if isinstance(base, TensorBase):
            return base.__pow__(self)
        a = _to_float(self) if isinstance(base, float) else self
        base, a, low = _opmath(float(base) if dtype_category(a._data.dtype) == 2 else base, a)
        out = ops.RPowScalar.apply(base, a)
        return out if low is None else out.to(low)

    def __neg__(self):
        return ops.Neg.apply(self)

    def __pos__(self):
        return self

    @autocast_op(cpu=LOWER, cuda=LOWER)
    def __matmul__(self, other):
        if not isinstance(other, TensorBase):
            other = _as_operand(other, self)
        a, b = _promote_operands(self, other, "matmul")
        return ops.Matmul.apply(a, b)

    def __rmatmul__(self, other):
        return _as_operand(other, self).__matmul__(self)

    matmul = __matmul__

    def add(self, other, *, alpha=1):
        return self + (other * alpha if alpha != 1 else other)

    def sub(self, other, *, alpha=1):
        return self - (other * alpha if alpha != 1 else other)

    mul = multiply = __mul__
    div = divide = true_divide = __truediv__
    neg = negative = __neg__
    pow = __pow__

    def exp(self):
        return ops.Exp.apply(_to_float(self))

    def log(self):
        return ops.Log.apply(_to_float(self))

    def sqrt(self):
        return ops.Sqrt.apply(_to_float(self))

    def rsqrt(self):
        return ops.Rsqrt.apply(_to_float(self))

    def tanh(self):
        return ops.Tanh.apply(_to_float(self))

    def sigmoid(self):
        return ops.Sigmoid.apply(_to_float(self))

    def abs(self):
        return ops.Abs.apply(self)

    __abs__ = abs

    def relu(self):
        return ops.Relu.apply(self)

    def square(self):
        return ops.PowScalar.apply(self, 2)

    def clamp(self, min=None, max=None):  # noqa: A002
        if min is None and max is None:
            raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
        lo, hi = min, max
        a = self
        for v in (lo, hi):
            if isinstance(v, (float, np.floating)) and dtype_category(a._data.dtype) != 2:
                a = a.to(_backend.float32)
        lo = lo if (lo is None or isinstance(lo, TensorBase)) else a._data.dtype.type(lo)
        hi = hi if (hi is None or isinstance(hi, TensorBase)) else a._data.dtype.type(hi)
        return ops.Clamp.apply(a, lo, hi)

    clip = clamp

    def maximum(self, other):
        return _binary(ops.Maximum, self, _as_operand(other, self), "maximum")

    def minimum(self, other):
        return _binary(ops.Minimum, self, _as_operand(other, self), "minimum")

    # -- reductions ------------------------------------------------------------------------------------
    def sum(self, dim=None, keepdim=False, *, dtype=None):
        return ops.Sum.apply(self, _wrap_dims(dim, self.ndim), keepdim, None if dtype is None else _backend.to_dtype(dtype))

    def mean(self, dim=None, keepdim=False, *, dtype=None):
        a = self if dtype is None else self.to(dtype)
        if dtype_category(a._data.dtype) != 2:
            raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a floating "
                               f"point or complex dtype. Got: {a.dtype}")
        return ops.Mean.apply(a, _wrap_dims(dim, a.ndim), keepdim)

    def amax(self, dim=(), keepdim=False):
        d = _wrap_dims(dim, self.ndim)
        return ops.Amax.apply(self, None if d == () else d, keepdim, False)  # () reduces all dims; 0 is a dim

    def amin(self, dim=(), keepdim=False):
        d = _wrap_dims(dim, self.ndim)
        return ops.Amax.apply(self, None if d == () else d, keepdim, True)

    def max(self, dim=None, keepdim=False, *, other=None):
        return _max_or_min(self, dim, keepdim, other, False)

    def min(self, dim=None, keepdim=False, *, other=None):
        return _max_or_min(self, dim, keepdim, other, True)

    def argmax(self, dim=None, keepdim=False):
        a = self._data
        if dim is None:
            r = a.reshape(-1).argmax()
            return self._wrap(r.reshape((1,) * a.ndim if keepdim else ()).astype(np.int64))
        return self._wrap(a.argmax(axis=wrap_dim(dim, a.ndim), keepdims=keepdim).astype(np.int64))

    def argmin(self, dim=None, keepdim=False):
        a = self._data
        if dim is None:
            r = a.reshape(-1).argmin()
            return self._wrap(r.reshape((1,) * a.ndim if keepdim else ()).astype(np.int64))
        return self._wrap(a.argmin(axis=wrap_dim(dim, a.ndim), keepdims=keepdim).astype(np.int64))

    def var(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
        if isinstance(dim, bool):  # var(unbiased) positional form
            dim, unbiased = None, dim
        if correction is None:
            correction = 0 if unbiased is False else 1
        return ops.Var.apply(_to_float(self), _wrap_dims(dim, self.ndim), correction, keepdim)

    def std(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
        return self.var(dim, unbiased, keepdim, correction=correction).sqrt()

    @autocast_op(cuda=FP32)
    def softmax(self, dim, dtype=None):
        a = self.to(dtype) if dtype is not None else _to_float(self)
        return ops.Softmax.apply(a, wrap_dim(dim, a.ndim))

    @autocast_op(cuda=FP32)
    def log_softmax(self, dim, dtype=None):
        a = self.to(dtype) if dtype is not None else _to_float(self)
        return ops.LogSoftmax.apply(a, wrap_dim(dim, a.ndim))

    def all(self, dim=None, keepdim=False):
        return self._wrap(self._xp().asarray(self._data.all(axis=_wrap_dims(dim, self.ndim), keepdims=keepdim)))

    def any(self, dim=None, keepdim=False):
        return self._wrap(self._xp().asarray(self._data.any(axis=_wrap_dims(dim, self.ndim), keepdims=keepdim)))

    def masked_fill(self, mask, value):
        m = mask._data if isinstance(mask, TensorBase) else mask
        if m.dtype != np.bool_:
            raise RuntimeError(f"masked_fill only supports boolean masks, but got mask with dtype {m.dtype}")
        try:
            np.broadcast_shapes(tuple(m.shape), tuple(self.shape))
        except ValueError:
            raise RuntimeError(f"masked_fill: the mask of shape {tuple(m.shape)} does not broadcast to the tensor's "
                               f"shape {tuple(self.shape)}") from None
        if isinstance(value, TensorBase):
            if value.ndim != 0:
                raise RuntimeError(f"masked_fill only supports a 0-dimensional value tensor, but got one with "
                                   f"{value.ndim} dimension(s)")
            value = value.item()
        return ops.MaskedFill.apply(self, m, value)

    # -- comparisons and logic (no graph) --------------------------------------------------------------
    __eq__ = eq = _elementwise("equal")
    __ne__ = ne = _elementwise("not_equal")
    __lt__ = lt = _elementwise("less")
    __le__ = le = _elementwise("less_equal")
    __gt__ = gt = _elementwise("greater")
    __ge__ = ge = _elementwise("greater_equal")
    __and__ = __rand__ = _elementwise("bitwise_and")
    __or__ = __ror__ = _elementwise("bitwise_or")
    __xor__ = __rxor__ = _elementwise("bitwise_xor")

    def __hash__(self):  # defining __eq__ would otherwise make tensors unhashable
        return id(self)

    def __invert__(self):
        return self._wrap(~self._data)

    def logical_not(self):
        return self._wrap(self._xp().logical_not(self._data))

    def isfinite(self):
        return self._wrap(self._xp().isfinite(self._data))

    def isnan(self):
        return self._wrap(self._xp().isnan(self._data))

    def equal(self, other):
        return self.shape == other.shape and builtins.bool((self._data == other._data).all())

    def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        return builtins.bool(self._xp().allclose(self._data, other._data, rtol=rtol, atol=atol, equal_nan=equal_nan))
