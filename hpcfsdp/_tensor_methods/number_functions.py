"""The arithmetic family's integer and floating-point-representation functions: gcd, lcm, ldexp, frexp, nextafter,
and rsub (with the in-place forms gcd_, lcm_, ldexp_, nextafter_). ldexp and rsub are differentiable; gcd, lcm,
frexp and nextafter are not, as in PyTorch.
hpcfsdp/_tensor_methods/arithmetic.py loads this module before it makes the family's mixin."""
import collections

import numpy as np

from .. import _backend
from .._array import dtype_category, promote_types
from .._registry import op
from ._common import TensorBase, _assign_result, _tensor_arg, _to_float

__all__ = ["Frexp"]

Frexp = collections.namedtuple("frexp", ["mantissa", "exponent"])  # torch.return_types.frexp


def _dtype_name(t):
    return {"int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool",
            "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16"}[
        str(t.dtype).replace("hp.", "")]


def _integer_pair(self, other, name):
    _tensor_arg(other, name, "other")
    dt = promote_types(self._data.dtype, other._data.dtype, self.ndim == 0, other.ndim == 0)
    if dtype_category(dt) != 1:
        bad = self if dtype_category(self._data.dtype) != 1 else other
        raise NotImplementedError(f"\"{name}_cpu\" not implemented for '{_dtype_name(bad)}'")
    xp = self._xp()
    return xp, self._data.astype(dt, copy=False), other._data.astype(dt, copy=False)


@op("arithmetic", function=True)
def gcd(self, other):
    """The greatest common divisor of integer tensors, element-wise (non-negative; gcd(0, 0) = 0)."""
    xp, a, b = _integer_pair(self, other, "gcd")
    return self._wrap(xp.gcd(a, b))


@op("arithmetic")
def gcd_(self, other):
    return _assign_result(self, gcd(self, other), "gcd_")


@op("arithmetic", function=True)
def lcm(self, other):
    """The least common multiple of integer tensors, element-wise (non-negative; 0 where either is 0)."""
    xp, a, b = _integer_pair(self, other, "lcm")
    return self._wrap(xp.lcm(a, b))


@op("arithmetic")
def lcm_(self, other):
    return _assign_result(self, lcm(self, other), "lcm_")


@op("arithmetic", function=True)
def ldexp(self, other):
    """self * 2 ** other, in a floating dtype (the default one for integer inputs); differentiable."""
    _tensor_arg(other, "ldexp", "other")
    return _to_float(self) * (2.0 ** _to_float(other))


@op("arithmetic")
def ldexp_(self, other):
    return _assign_result(self, ldexp(self, other), "ldexp_")


@op("arithmetic", function=True)
def frexp(self):
    """(mantissa, exponent) with self = mantissa * 2 ** exponent, |mantissa| in [0.5, 1) (0 for 0), exponent int32;
    floating inputs only."""
    if dtype_category(self._data.dtype) != 2:
        raise RuntimeError("torch.frexp() only supports floating-point dtypes")
    xp = self._xp()
    a = self._data
    work = a.astype(np.float32) if a.dtype == _backend.bfloat16 else a
    m, e = xp.frexp(work)
    return Frexp(self._wrap(m.astype(a.dtype, copy=False)), self._wrap(e.astype(np.int32)))


@op("arithmetic", function=True)
def nextafter(self, other):
    """The next floating-point value after self towards other, element-wise (both of one floating dtype)."""
    _tensor_arg(other, "nextafter", "other")
    if self.dtype != other.dtype:
        raise RuntimeError(f"expected scalar type {_dtype_name(self)} but found {_dtype_name(other)}")
    if dtype_category(self._data.dtype) != 2 or self._data.dtype == _backend.bfloat16:
        raise NotImplementedError(f"\"nextafter_cpu\" not implemented for '{_dtype_name(self)}'")
    xp = self._xp()
    a, b = np.broadcast_arrays(self._data, other._data) if xp is np else xp.broadcast_arrays(self._data, other._data)
    return self._wrap(xp.nextafter(a, b))


@op("arithmetic")
def nextafter_(self, other):
    return _assign_result(self, nextafter(self, other), "nextafter_")


@op("arithmetic", function=True)
def rsub(self, other, alpha=1):
    """other - alpha * self (other a tensor or a number); differentiable."""
    scaled = self if alpha == 1 else self * alpha
    if isinstance(other, TensorBase):
        return other - scaled
    return scaled.__rsub__(other)
