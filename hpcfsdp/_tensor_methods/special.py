"""Arithmetic's special functions of two operands, of the same family: logaddexp/logaddexp2, xlogy(_), fmax/fmin,
float_power(_), copysign(_) and heaviside(_). hpcfsdp/_tensor_methods/arithmetic.py loads this module before it makes
the family's mixin."""
from .. import _backend
from .._array import SCALAR_TYPES, dtype_category
from .._registry import op
from ..autograd import ops
from ._common import TensorBase, _as_operand, _assign_result, _promote_operands, _tensor_arg, _to_float

__all__ = []


def _float_operands(a, b, name):
    """a and b (Tensors or numbers, at least one a Tensor) promoted, then to a floating dtype; numbers become 0-d
    arrays of it, so the op's Function gets two arrays."""
    a, b = _promote_operands(a, b, name)
    t = a if isinstance(a, TensorBase) else b
    t = _to_float(t)
    as_t = lambda x: _to_float(x) if isinstance(x, TensorBase) else t._wrap(t._xp().asarray(x, dtype=t._data.dtype))
    return as_t(a), as_t(b)


def _tensor_operands(self, other, name, param="other"):
    _tensor_arg(other, name, param)
    return _promote_operands(self, other, name)


# -- log-sum-exp of two ------------------------------------------------------------------------------------
def _logaddexp(self, other, base2):
    name = "logaddexp2" if base2 else "logaddexp"
    a, b = _tensor_operands(self, other, name)
    if dtype_category(a._data.dtype) != 2:
        raise NotImplementedError(f"\"{name}\" not implemented for '{a.dtype}'")
    return ops.LogAddExp.apply(a, b, base2)


@op("arithmetic", function=True, functions=(ops.LogAddExp,))
def logaddexp(self, other):
    """log(exp(self) + exp(other)), without overflow; floating tensors only."""
    return _logaddexp(self, other, False)


@op("arithmetic", function=True, functions=(ops.LogAddExp,))
def logaddexp2(self, other):
    """log2(2**self + 2**other), without overflow; floating tensors only."""
    return _logaddexp(self, other, True)


# -- xlogy -------------------------------------------------------------------------------------------------
def _xlogy_function(input, other):  # noqa: A002
    """torch.xlogy(input, other): either may be a number (not both); integers compute in the default float dtype."""
    if not isinstance(input, TensorBase) and not isinstance(other, TensorBase):
        raise TypeError(f"xlogy(): expected a Tensor as input or other, got {type(input).__name__} and "
                        f"{type(other).__name__}")
    like = input if isinstance(input, TensorBase) else other
    return ops.Xlogy.apply(*_float_operands(_as_operand(input, like), _as_operand(other, like), "xlogy"))


_xlogy_function.__name__ = _xlogy_function.__qualname__ = "xlogy"


@op("arithmetic", function=_xlogy_function, functions=(ops.Xlogy,))
def xlogy(self, other):
    """self * log(other), 0 where self is 0 (and other is not NaN)."""
    return _xlogy_function(self, other)


@op("arithmetic")
def xlogy_(self, other):
    return _assign_result(self, _xlogy_function(self, other), "xlogy_")


# -- fmax, fmin --------------------------------------------------------------------------------------------
@op("arithmetic", function=True, functions=(ops.FMaxMin,))
def fmax(self, other):
    """The element-wise maximum where a NaN loses to a number (NaN only where both are)."""
    return ops.FMaxMin.apply(*_tensor_operands(self, other, "fmax"), False)


@op("arithmetic", function=True, functions=(ops.FMaxMin,))
def fmin(self, other):
    """The element-wise minimum where a NaN loses to a number (NaN only where both are)."""
    return ops.FMaxMin.apply(*_tensor_operands(self, other, "fmin"), True)


# -- float_power -------------------------------------------------------------------------------------------
def _float_power_function(input, exponent):  # noqa: A002
    """torch.float_power(input, exponent): pow in float64 whatever the dtypes; either may be a number (not both)."""
    if not isinstance(input, TensorBase) and not isinstance(exponent, TensorBase):
        raise TypeError(f"float_power(): expected a Tensor as input or exponent, got {type(input).__name__} and "
                        f"{type(exponent).__name__}")
    f64 = _backend.float64
    base = input.to(f64) if isinstance(input, TensorBase) else float(input)
    if isinstance(exponent, TensorBase):
        return base ** exponent.to(f64)
    if not isinstance(exponent, SCALAR_TYPES):
        raise TypeError(f"float_power(): argument 'exponent' must be a Tensor or a number, not "
                        f"{type(exponent).__name__}")
    return base ** float(exponent)


_float_power_function.__name__ = _float_power_function.__qualname__ = "float_power"


@op("arithmetic", function=_float_power_function, functions=(ops.Pow, ops.PowScalar, ops.RPowScalar))
def float_power(self, exponent):
    return _float_power_function(self, exponent)


@op("arithmetic")
def float_power_(self, exponent):
    if self._data.dtype != _backend.float64:
        raise RuntimeError(f"the base given to float_power_ has dtype {self.dtype} but the operation's result "
                           f"requires dtype float64")
    return _assign_result(self, _float_power_function(self, exponent), "float_power_")


# -- signs -------------------------------------------------------------------------------------------------
@op("arithmetic", function=True, functions=(ops.Copysign,))
def copysign(self, other):
    """|self| with the sign of other (a Tensor or a number; -0.0 counts as negative); floating result."""
    return ops.Copysign.apply(*_float_operands(self, _as_operand(other, self), "copysign"))


@op("arithmetic")
def copysign_(self, other):
    return _assign_result(self, self.copysign(other), "copysign_")


@op("arithmetic", function=True)
def heaviside(self, values):
    """0 where self < 0, 1 where self > 0, ``values`` where self == 0 (same dtype as self); not differentiable."""
    _tensor_arg(values, "heaviside", "values")
    if values.dtype != self.dtype:
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")
    xp = self._xp()
    a, v = self._data, values._data
    return self._wrap(xp.where(a == 0, v, (a > 0).astype(a.dtype)).astype(a.dtype, copy=False))


@op("arithmetic")
def heaviside_(self, values):
    return _assign_result(self, self.heaviside(values), "heaviside_")
