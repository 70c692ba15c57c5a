"""Comparisons, predicates and logic: eq/ne/lt/le/gt/ge and their operators, the bitwise operators, equal,
allclose, isclose, isnan/isinf/isfinite, logical_not/and/or/xor (and logical_and_). They compute arrays directly
and record no graph: their results are bool (or a Python bool) and have no gradient."""
import numpy as np

from .._array import dtype_category
from .._backend import array_module
from .._registry import mixin, op
from ._common import TensorBase, _inplace, _same_dtype, _tensor_arg

__all__ = ["CompareMixin"]


def _elementwise(ufunc_name):
    """A method computing ufunc(self, other) on the arrays (no graph): comparisons and bitwise logic."""
    def f(self, other):
        o = other._data if isinstance(other, TensorBase) else other
        if isinstance(o, (list, tuple)):
            o = self._xp().asarray(o)
        return self._wrap(getattr(self._xp(), ufunc_name)(self._data, o))

    return f


eq = op("compare", name="eq", aliases=("__eq__",))(_elementwise("equal"))
ne = op("compare", name="ne", aliases=("__ne__",))(_elementwise("not_equal"))
lt = op("compare", name="lt", aliases=("__lt__",))(_elementwise("less"))
le = op("compare", name="le", aliases=("__le__",))(_elementwise("less_equal"))
gt = op("compare", name="gt", aliases=("__gt__",))(_elementwise("greater"))
ge = op("compare", name="ge", aliases=("__ge__",))(_elementwise("greater_equal"))
op("compare", name="__and__", aliases=("__rand__",))(_elementwise("bitwise_and"))
op("compare", name="__or__", aliases=("__ror__",))(_elementwise("bitwise_or"))
op("compare", name="__xor__", aliases=("__rxor__",))(_elementwise("bitwise_xor"))


@op("compare")
def __invert__(self):
    return self._wrap(~self._data)


@op("compare", function=True)
def equal(self, other):
    return self.shape == other.shape and bool((self._data == other._data).all())


@op("compare", function=True)
def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    return bool(self._xp().allclose(self._data, other._data, rtol=rtol, atol=atol, equal_nan=equal_nan))


@op("compare", function=True)
def isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    _tensor_arg(other, "isclose", "other")
    _same_dtype("isclose", self, other)
    return self._wrap(self._xp().isclose(self._data, other._data, rtol=rtol, atol=atol, equal_nan=equal_nan))


# -- predicates --------------------------------------------------------------------------------------------
@op("compare", function=True)
def isnan(self):
    return self._wrap(self._xp().isnan(self._data))


@op("compare", function=True)
def isinf(self):
    if dtype_category(self._data.dtype) != 2:
        return self._wrap(self._xp().zeros(self._data.shape, dtype=bool))
    return self._wrap(self._xp().isinf(self._data))


@op("compare", function=True)
def isfinite(self):
    return self._wrap(self._xp().isfinite(self._data))


# -- logic -------------------------------------------------------------------------------------------------
@op("compare", function=True)
def logical_not(self):
    return self._wrap(self._xp().logical_not(self._data))


@op("compare", function=True)
def logical_and(self, other):
    return self._wrap(self._xp().logical_and(self._data, _tensor_arg(other, "logical_and", "other")._data))


@op("compare", function=True)
def logical_or(self, other):
    return self._wrap(self._xp().logical_or(self._data, _tensor_arg(other, "logical_or", "other")._data))


@op("compare", function=True)
def logical_xor(self, other):
    return self._wrap(self._xp().logical_xor(self._data, _tensor_arg(other, "logical_xor", "other")._data))


@op("compare")
@_inplace
def logical_and_(a, other):
    """self = self AND other elementwise (nonzero is True), written as 1/0 in self's dtype, as PyTorch."""
    if not isinstance(other, TensorBase):
        raise TypeError(f"logical_and_(): argument 'other' must be Tensor, not {type(other).__name__}")
    o = other._data
    if np.broadcast_shapes(o.shape, a.shape) != a.shape:
        raise RuntimeError(f"logical_and_: output with shape {list(a.shape)} doesn't match the broadcast shape "
                           f"{list(np.broadcast_shapes(o.shape, a.shape))}")
    a[...] = array_module(a).logical_and(a != 0, o != 0)


CompareMixin = mixin("compare")
