"""Arithmetic: the binary operators and their reflected forms, pow, remainder and division, maximum/minimum and
clamp, lerp, the fused multiply-adds addcmul/addcdiv, atan2/hypot, diff, their in-place variants and the
augmented assignments (``+=``)."""
import operator

import numpy as np

from .. import _backend
from .._array import SCALAR_TYPES, dtype_category, promote_types, result_type_scalar, wrap_dim
from .._backend import array_module
from .._registry import mixin, op
from ..autograd import ops
from ..autograd.grad_mode import is_grad_enabled
from ._common import (TensorBase, _as_operand, _assign_result, _binary, _dim_slice, _inplace, _inplace_cast, _opmath,
                      _promote_operands, _raw, _reflected, _same_dtype, _tensor_arg, _to_float, check_inplace)

__all__ = ["ArithmeticMixin"]


def _zero_div_check(a, b):
    """Integer division by zero raises, as PyTorch's ZeroDivisionError (NumPy would warn and return 0)."""
    t = a if isinstance(a, TensorBase) else b
    if dtype_category(t._data.dtype) == 2:
        return
    if bool((b._data == 0).any()) if isinstance(b, TensorBase) else b == 0:
        raise RuntimeError("ZeroDivisionError")


# -- the operators -----------------------------------------------------------------------------------------
@op("arithmetic", aliases=("__add__",), function=True, functions=(ops.Add,))
def add(self, other, *, alpha=1):
    return _binary(ops.Add, self, _as_operand(other * alpha if alpha != 1 else other, self), "add")


@op("arithmetic", functions=(ops.Add,))
def __radd__(self, other):
    return _binary(ops.Add, _as_operand(other, self), self, "add")


@op("arithmetic", aliases=("__sub__", "subtract"), function=True, function_aliases=("subtract",),
    functions=(ops.Sub,))
def sub(self, other, *, alpha=1):
    return _binary(ops.Sub, self, _as_operand(other * alpha if alpha != 1 else other, self), "sub")


@op("arithmetic", functions=(ops.Sub,))
def __rsub__(self, other):
    return _binary(ops.Sub, _as_operand(other, self), self, "sub")


@op("arithmetic", name="mul", aliases=("multiply", "__mul__"), function=True, function_aliases=("multiply",),
    functions=(ops.Mul,))
def __mul__(self, other):
    return _binary(ops.Mul, self, _as_operand(other, self), "mul")


@op("arithmetic", functions=(ops.Mul,))
def __rmul__(self, other):
    return _binary(ops.Mul, _as_operand(other, self), self, "mul")


@op("arithmetic", name="div", aliases=("divide", "true_divide", "__truediv__"), function=True,
    function_aliases=("divide", "true_divide"), functions=(ops.Div,))
def __truediv__(self, other, *, rounding_mode=None):
    if rounding_mode is not None:
        return _rounded_div(self, other, rounding_mode)
    other = _as_operand(other, self)
    a = _to_float(self)
    if isinstance(other, TensorBase):
        other = _to_float(other)
    elif isinstance(other, (int, np.integer)) and not isinstance(other, bool):
        other = float(other)
    return _binary(ops.Div, a, other, "div")


def _rounded_div(self, other, rounding_mode):
    """div(..., rounding_mode="floor" | "trunc"): the quotient rounded, integral for integral operands."""
    if rounding_mode == "floor":
        return self.floor_divide(other)
    if rounding_mode != "trunc":
        raise RuntimeError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
                           f"'{rounding_mode}'")
    q = self.__truediv__(other).trunc()
    o = other._data.dtype if isinstance(other, TensorBase) else None
    integral = dtype_category(self._data.dtype) < 2 and (
        (o is not None and dtype_category(o) < 2) or (o is None and isinstance(other, (int, np.integer))))
    return q.to(self.dtype if o is None else promote_types(self._data.dtype, o)) if integral else q


@op("arithmetic", functions=(ops.Div,))
def __rtruediv__(self, other):
    other = _as_operand(other, self)
    if isinstance(other, TensorBase):
        return other.__truediv__(self)
    return _binary(ops.Div, float(other), _to_float(self), "div")


@op("arithmetic", aliases=("__floordiv__",), function=True)
def floor_divide(self, other):
    a, b = _promote_operands(self, _as_operand(other, self), "floor_divide")
    if dtype_category(a._data.dtype) == 2:
        return (a / b).floor()  # zero gradient, through floor
    _zero_div_check(a, b)
    return a._wrap(a._xp().floor_divide(a._data, b._data if isinstance(b, TensorBase) else b))


@op("arithmetic")
def __rfloordiv__(self, other):
    return _reflected(other, self).floor_divide(self)


def _remainder(self, other, kind):
    a, b = _promote_operands(self, _as_operand(other, self), kind)
    _zero_div_check(a, b)
    low = None
    if not isinstance(b, TensorBase):
        a, b, low = _opmath(a, b)
    try:
        out = ops.Remainder.apply(a, b, kind)
    except ValueError as e:
        raise RuntimeError(f"{kind}: the operands do not broadcast ({e})") from None
    return out if low is None else out.to(low)


def _remainder_like(kind):
    """hp.remainder / hp.fmod: input a Tensor or a number (then other is a Tensor)."""
    def f(input, other):  # noqa: A002
        if isinstance(input, TensorBase):
            return getattr(input, kind)(other)
        other = _tensor_arg(other, kind, "other")
        a, b = _promote_operands(_as_operand(input, other), other, kind)
        _zero_div_check(a, b)
        return ops.Remainder.apply(a, b, kind)

    f.__name__ = kind
    f.__doc__ = f"hp.{kind}(input, other): input a Tensor or a number (then other is a Tensor)."
    return f


# remainder: differentiable, as PyTorch's (d/dx x % y = 1)
@op("arithmetic", aliases=("__mod__",), function=_remainder_like("remainder"), functions=(ops.Remainder,))
def remainder(self, other):
    return _remainder(self, other, "remainder")


@op("arithmetic")
def __rmod__(self, other):
    return _reflected(other, self).remainder(self)


@op("arithmetic", function=_remainder_like("fmod"), functions=(ops.Remainder,))
def fmod(self, other):
    return _remainder(self, other, "fmod")


def pow(input, exponent):  # noqa: A001,A002
    """torch.pow(input, exponent): input a Tensor or a number (then exponent is a Tensor)."""
    if isinstance(input, TensorBase):
        return input ** exponent
    if not isinstance(exponent, TensorBase):
        raise TypeError(f"pow(): expected a Tensor as input or exponent, got {type(input).__name__} and "
                        f"{type(exponent).__name__}")
    return input ** exponent  # Tensor.__rpow__


@op("arithmetic", name="pow", aliases=("__pow__",), function=pow, functions=(ops.Pow, ops.PowScalar))
def __pow__(self, exponent):
    if isinstance(exponent, TensorBase):
        if exponent._data.ndim == 0 and not exponent.requires_grad:
            return self.__pow__(exponent.item())
        return _binary(ops.Pow, self, exponent, "pow")
    if not isinstance(exponent, SCALAR_TYPES):
        raise TypeError(f"unsupported exponent {exponent!r}")
    a = self
    if isinstance(exponent, (float, np.floating)) and dtype_category(a._data.dtype) != 2:
        a = a.to(_backend.default_float_dtype())
    e = exponent.item() if isinstance(exponent, np.generic) else exponent
    a, e, low = _opmath(a, e)
    out = ops.PowScalar.apply(a, e)
    return out if low is None else out.to(low)


@op("arithmetic", functions=(ops.RPowScalar,))
def __rpow__(self, base):
    if isinstance(base, TensorBase):
        return base.__pow__(self)
    a = _to_float(self) if isinstance(base, float) else self
    base, a, low = _opmath(float(base) if dtype_category(a._data.dtype) == 2 else base, a)
    out = ops.RPowScalar.apply(base, a)
    return out if low is None else out.to(low)


# -- maximum, minimum, clamp -------------------------------------------------------------------------------
@op("arithmetic", function=True, functions=(ops.Maximum,))
def maximum(self, other):
    return _binary(ops.Maximum, self, _as_operand(other, self), "maximum")


@op("arithmetic", function=True, functions=(ops.Minimum,))
def minimum(self, other):
    return _binary(ops.Minimum, self, _as_operand(other, self), "minimum")


@op("arithmetic", aliases=("clip",), function=True, function_aliases=("clip",), functions=(ops.Clamp,))
def clamp(self, min=None, max=None):  # noqa: A002
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    lo, hi = min, max
    a = self
    for v in (lo, hi):
        if isinstance(v, (float, np.floating)) and dtype_category(a._data.dtype) != 2:
            a = a.to(_backend.default_float_dtype())
    lo = lo if (lo is None or isinstance(lo, TensorBase)) else a._data.dtype.type(lo)
    hi = hi if (hi is None or isinstance(hi, TensorBase)) else a._data.dtype.type(hi)
    return ops.Clamp.apply(a, lo, hi)


@op("arithmetic", function=True)
def clamp_min(self, min):  # noqa: A002
    return self.clamp(min=min)


@op("arithmetic", function=True)
def clamp_max(self, max):  # noqa: A002
    return self.clamp(max=max)


# -- compositions ------------------------------------------------------------------------------------------
@op("arithmetic", function=True)
def lerp(self, end, weight):
    """self + weight * (end - self); ``weight`` a number or a tensor (broadcast)."""
    _tensor_arg(end, "lerp", "end")
    _same_dtype("lerp", self, end)
    if isinstance(weight, TensorBase):
        _same_dtype("lerp", self, weight)
    elif not isinstance(weight, SCALAR_TYPES):
        raise TypeError(f"lerp(): argument 'weight' must be a Tensor or a number, not {type(weight).__name__}")
    return self + weight * (end - self)


@op("arithmetic", function=True)
def addcmul(self, tensor1, tensor2, *, value=1):
    return self + value * (tensor1 * tensor2) if value != 1 else self + tensor1 * tensor2


@op("arithmetic", function=True)
def addcdiv(self, tensor1, tensor2, *, value=1):
    if dtype_category(tensor1._data.dtype) < 2 and dtype_category(tensor2._data.dtype) < 2:
        raise RuntimeError("Integer division with addcdiv is no longer supported, and in a future release "
                           "addcdiv will perform a true division of tensor1 and tensor2.")
    return self + value * (tensor1 / tensor2) if value != 1 else self + tensor1 / tensor2


def _binary_float(self, other, op, name):
    a, b = _promote_operands(self, _as_operand(other, self), name)
    a = _to_float(a) if isinstance(a, TensorBase) else float(a)
    b = _to_float(b) if isinstance(b, TensorBase) else float(b)
    if not isinstance(b, TensorBase):
        b = a._wrap(a._xp().asarray(b, dtype=a._data.dtype))
    try:
        return op.apply(a, b)
    except ValueError as e:
        raise RuntimeError(f"{name}: the shapes {tuple(a.shape)} and {tuple(b.shape)} do not broadcast ({e})") \
            from None


@op("arithmetic", aliases=("arctan2",), function=True, function_aliases=("arctan2",), functions=(ops.Atan2,))
def atan2(self, other):
    return _binary_float(self, other, ops.Atan2, "atan2")


@op("arithmetic", function=True, functions=(ops.Hypot,))
def hypot(self, other):
    return _binary_float(self, other, ops.Hypot, "hypot")


@op("arithmetic", function=True, functions=(ops.Cat,))
def diff(self, n=1, dim=-1, prepend=None, append=None):
    """The n-th forward difference along ``dim`` (``!=`` for bool), after concatenating prepend and append."""
    if self.ndim == 0:
        raise RuntimeError("diff expects input to be at least one-dimensional")
    if operator.index(n) < 0:
        raise RuntimeError(f"order must be non-negative but got {n}")
    d = wrap_dim(dim, self.ndim)
    parts = [p for p in (prepend, self, append) if p is not None]
    for p in parts:
        _tensor_arg(p, "diff", "prepend/append")
        if p.ndim != self.ndim:
            raise RuntimeError(f"diff expects prepend or append to be the same dimension as input ({self.ndim}), "
                               f"got {p.ndim}")
    _same_dtype("diff", *parts)
    x = ops.Cat.apply(d, *parts) if len(parts) > 1 else self
    for _ in range(n):
        hi, lo = x[_dim_slice(d, slice(1, None))], x[_dim_slice(d, slice(None, -1))]
        x = (hi != lo) if x._data.dtype == np.bool_ else hi - lo
    return x


# -- in place (See [Note: In-place ops and autograd] in _common.py) ----------------------------------------
@op("arithmetic")
@_inplace
def add_(a, other, *, alpha=1):
    o = _raw(other)
    if alpha != 1:
        o = o * alpha
    a += o


@op("arithmetic", aliases=("subtract_",))
@_inplace
def sub_(a, other, *, alpha=1):
    o = _raw(other)
    if alpha != 1:
        o = o * alpha
    a -= o


@op("arithmetic", aliases=("multiply_",))
@_inplace
def mul_(a, other):
    a *= _raw(other)


@op("arithmetic")
@_inplace
def pow_(a, exponent):
    array_module(a).power(a, _raw(exponent), out=a)


@op("arithmetic")
@_inplace
def maximum_(a, other):
    array_module(a).maximum(a, _raw(other), out=a)


@op("arithmetic")
@_inplace
def lerp_(a, end, weight):
    w = _raw(weight)
    a += (_raw(end) - a) * w


@op("arithmetic")
@_inplace
def addcmul_(a, tensor1, tensor2, *, value=1):
    t = _raw(tensor1) * _raw(tensor2)
    if value != 1:
        t *= value
    a += t


@op("arithmetic")
@_inplace
def addcdiv_(a, tensor1, tensor2, *, value=1):
    t = _raw(tensor1) / _raw(tensor2)
    if value != 1:
        t *= value
    a += t


def _needs_graph(self, o):
    """`x += y` on tensors in a graph rebinds x to x + y (the recorded result) instead of writing in place."""
    if not is_grad_enabled():
        return False
    return (self.requires_grad and self.grad_fn is not None) or (isinstance(o, TensorBase) and o.requires_grad)


@op("arithmetic", aliases=("clip_",))
def clamp_(self, min=None, max=None):  # noqa: A002
    """In place clamp (not recorded by autograd); a floating bound on an integer tensor is refused, as PyTorch."""
    check_inplace(self)
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    for b in (min, max):
        if isinstance(b, TensorBase):
            _inplace_cast("clamp_", promote_types(self._data.dtype, b._data.dtype), self._data.dtype)
        elif b is not None:
            _inplace_cast("clamp_", result_type_scalar(self._data.dtype, b), self._data.dtype)
    if not _backend.is_meta_array(self._data):
        a = self._data
        array_module(a).clip(a, _raw(min), _raw(max), out=a)
    return self


@op("arithmetic")
def clamp_min_(self, min):  # noqa: A002
    return self.clamp_(min=min)


@op("arithmetic")
def clamp_max_(self, max):  # noqa: A002
    return self.clamp_(max=max)


# in place through the out-of-place op, with PyTorch's checks of the result's shape and dtype
@op("arithmetic", aliases=("true_divide_", "divide_"))
def div_(self, other, *, rounding_mode=None):
    if rounding_mode is None and dtype_category(self._data.dtype) == 2:  # the fast path of optimizers
        check_inplace(self)
        if not _backend.is_meta_array(self._data):
            self._data /= _raw(other)
        return self
    return _assign_result(self, self.div(other, rounding_mode=rounding_mode), "div_")


@op("arithmetic")
def floor_divide_(self, other):
    return _assign_result(self, self.floor_divide(other), "floor_divide_")


@op("arithmetic")
def remainder_(self, other):
    return _assign_result(self, self.remainder(other), "remainder_")


@op("arithmetic")
def fmod_(self, other):
    return _assign_result(self, self.fmod(other), "fmod_")


@op("arithmetic", aliases=("arctan2_",))
def atan2_(self, other):
    return _assign_result(self, self.atan2(other), "atan2_")


@op("arithmetic")
def hypot_(self, other):
    if dtype_category(self._data.dtype) != 2:
        raise NotImplementedError(f"\"hypot\" not implemented for '{self.dtype}'")
    return _assign_result(self, self.hypot(other), "hypot_")


@op("arithmetic")
def __iadd__(self, o):
    return self.add_(o) if not _needs_graph(self, o) else self + o


@op("arithmetic")
def __isub__(self, o):
    return self.sub_(o) if not _needs_graph(self, o) else self - o


@op("arithmetic")
def __imul__(self, o):
    return self.mul_(o) if not _needs_graph(self, o) else self * o


@op("arithmetic")
def __itruediv__(self, o):
    return self.div_(o) if not _needs_graph(self, o) else self / o


@op("arithmetic")
def __ipow__(self, o):
    return self.pow_(o) if not _needs_graph(self, o) else self ** o


@op("arithmetic")
def __imod__(self, o):
    return self.remainder_(o) if not _needs_graph(self, o) else self % o


@op("arithmetic")
def __ifloordiv__(self, o):
    return self.floor_divide_(o) if not _needs_graph(self, o) else self // o


from . import special  # noqa: E402,F401  (the family's special functions, registered before its mixin is made)

from . import number_functions  # noqa: E402,F401  (gcd, lcm, ldexp, frexp, ...: registered before the mixin)

ArithmeticMixin = mixin("arithmetic")
