"""Comparisons, predicates and logic: eq/ne/lt/le/gt/ge and their operators, the bitwise operators, equal,
allclose, isclose, isnan/isinf/isfinite, logical_not/and/or/xor (and logical_and_). They compute arrays directly
and record no graph: their results are bool (or a Python bool) and have no gradient."""
import numpy as np

from .._array import SCALAR_TYPES, dtype_category
from .. import _backend
from .._backend import array_module
from .._registry import function_op, mixin, op
from ._common import (TensorBase, _as_operand, _inplace, _inplace_cast, _inplace_shape, _promote_operands,
                      _reflected, _same_dtype, _tensor_arg, check_inplace)

__all__ = ["CompareMixin"]


def _elementwise(ufunc_name):
    """A method computing ufunc(self, other) on the arrays (no graph): comparisons and bitwise logic."""
    def f(self, other):
        o = other._data if isinstance(other, TensorBase) else other
        if isinstance(o, (list, tuple)):
            o = self._xp().asarray(o)
        return self._wrap(getattr(self._xp(), ufunc_name)(self._data, o))

    return f


# torch.eq(input, other) and its aliases (torch.greater is torch.gt); input must be a Tensor, other a Tensor or a number
eq = op("compare", name="eq", aliases=("__eq__",), function=True)(_elementwise("equal"))
ne = op("compare", name="ne", aliases=("__ne__", "not_equal"), function=True,
        function_aliases=("not_equal",))(_elementwise("not_equal"))
lt = op("compare", name="lt", aliases=("__lt__", "less"), function=True, function_aliases=("less",))(
    _elementwise("less"))
le = op("compare", name="le", aliases=("__le__", "less_equal"), function=True, function_aliases=("less_equal",))(
    _elementwise("less_equal"))
gt = op("compare", name="gt", aliases=("__gt__", "greater"), function=True, function_aliases=("greater",))(
    _elementwise("greater"))
ge = op("compare", name="ge", aliases=("__ge__", "greater_equal"), function=True,
        function_aliases=("greater_equal",))(_elementwise("greater_equal"))


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


@op("compare", function=True)
def isposinf(self):
    if dtype_category(self._data.dtype) != 2:
        return self._wrap(self._xp().zeros(self._data.shape, dtype=bool))
    return self._wrap(self._xp().isposinf(self._data))


@op("compare", function=True)
def isneginf(self):
    if dtype_category(self._data.dtype) != 2:
        return self._wrap(self._xp().zeros(self._data.shape, dtype=bool))
    return self._wrap(self._xp().isneginf(self._data))


@op("compare", function=True)
def isreal(self):
    """True everywhere: hpcfsdp has no complex dtypes."""
    return self._wrap(self._xp().ones(self._data.shape, dtype=bool))


@op("compare", function=True)
def signbit(self):
    """Whether the sign bit is set (True for -0.0); False for bool and unsigned tensors."""
    a = self._data
    if a.dtype == np.bool_ or a.dtype.kind == "u":
        return self._wrap(self._xp().zeros(a.shape, dtype=bool))
    return self._wrap(self._xp().signbit(a.astype(np.float32) if a.dtype.kind == "f" and a.itemsize == 2 else a))


@op("compare", function=True)
def is_nonzero(self):
    """The truth of a one-element tensor (RuntimeError for any other number of elements, as PyTorch)."""
    n = self._data.size
    if n != 1:
        raise RuntimeError("Boolean value of Tensor with no values is ambiguous" if n == 0 else
                           "Boolean value of Tensor with more than one value is ambiguous")
    return bool(self._data.reshape(()) != 0)


@op("compare", function=True)
def is_same_size(self, other):
    _tensor_arg(other, "is_same_size", "other")
    return self.shape == other.shape


@op("compare", function=True)
def is_signed(self):
    """Whether the dtype holds negative numbers (not bool, not uint8)."""
    return self._data.dtype != np.bool_ and self._data.dtype.kind != "u"


@op("compare", function=True)
def is_complex(self):
    """False: hpcfsdp has no complex dtypes."""
    return False


@function_op("compare")
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    """Whether each of ``elements`` is in ``test_elements`` (either may be a number, not both), as a bool tensor of
    ``elements``' shape; ``invert`` negates it. NaN is in nothing."""
    if not isinstance(elements, TensorBase) and not isinstance(test_elements, TensorBase):
        raise TypeError(f"isin(): expected a Tensor as elements or test_elements, got {type(elements).__name__} "
                        f"and {type(test_elements).__name__}")
    like = elements if isinstance(elements, TensorBase) else test_elements
    for x in (elements, test_elements):
        if not isinstance(x, (TensorBase, *SCALAR_TYPES)):
            raise TypeError(f"isin(): expected a Tensor or a number, got {type(x).__name__}")
        if isinstance(x, TensorBase) and x._data.dtype == np.bool_:
            raise RuntimeError("Unsupported input type encountered for isin(): Bool")
    xp = like._xp()
    e = elements._data if isinstance(elements, TensorBase) else xp.asarray(elements)
    t = test_elements._data if isinstance(test_elements, TensorBase) else xp.asarray(test_elements)
    out = xp.isin(e, t.reshape(-1), assume_unique=assume_unique, invert=invert)
    return like._wrap(out.reshape(e.shape))


@op("compare")
def __contains__(self, element):
    """``element in t``: whether any element of t equals ``element`` (a number or a Tensor), as PyTorch."""
    if isinstance(element, (TensorBase, *SCALAR_TYPES)):
        return bool((self == element).any())
    raise RuntimeError(f"Tensor.__contains__ only supports Tensor or scalar, but you passed in a "
                       f"{type(element)}.")


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


def _logical_inplace(name, ufunc_name, unary=False):
    """In-place logic (``logical_and_``, ``eq_``): the bool result written as 1/0 in self's dtype, as PyTorch."""
    def f(a, *args):
        xp = array_module(a)
        if unary:
            a[...] = xp.logical_not(a)
            return
        (other,) = args
        if name.startswith("logical") and not isinstance(other, TensorBase):
            raise TypeError(f"{name}(): argument 'other' (position 1) must be Tensor, not {type(other).__name__}")
        o = other._data if isinstance(other, TensorBase) else other
        _inplace_shape(name, a, o)
        if name.startswith("logical"):
            a[...] = getattr(xp, ufunc_name)(a != 0, o != 0)
        else:
            a[...] = getattr(xp, ufunc_name)(a, o)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"In-place {name[:-1]}: the result written as 1/0 in self's dtype (not recorded by autograd)."
    return f


for _name, _ufunc in (("logical_and_", "logical_and"), ("logical_or_", "logical_or"),
                      ("logical_xor_", "logical_xor"), ("logical_not_", None)):
    op("compare", name=_name)(_inplace(_logical_inplace(_name, _ufunc, unary=_ufunc is None)))
for _name, _ufunc, _aliases in (("eq_", "equal", ()), ("ne_", "not_equal", ("not_equal_",)),
                                ("lt_", "less", ("less_",)), ("le_", "less_equal", ("less_equal_",)),
                                ("gt_", "greater", ("greater_",)), ("ge_", "greater_equal", ("greater_equal_",))):
    op("compare", name=_name, aliases=_aliases)(_inplace(_logical_inplace(_name, _ufunc)))


# -- bitwise -----------------------------------------------------------------------------------------------
def _bitwise_operands(self, other, name):
    """self and other promoted (other a Tensor or an int/bool), refused for floating dtypes as PyTorch."""
    a, b = _promote_operands(self, _as_operand(other, self), name)
    t = a if isinstance(a, TensorBase) else b
    if dtype_category(t._data.dtype) == 2:
        raise NotImplementedError(f"\"{name}\" not implemented for '{t.dtype}'")
    return a._data if isinstance(a, TensorBase) else a, b._data if isinstance(b, TensorBase) else b


def _shift(xp, a, b, left):
    """a << b / a >> b with PyTorch's result for shifts of the bit width or more (0; -1 for negative a >> b)."""
    bits = np.dtype(a.dtype if hasattr(a, "dtype") else np.int64).itemsize * 8
    big = xp.asarray(b) >= bits
    b = xp.where(big, 0, b).astype(getattr(a, "dtype", np.int64), copy=False)
    if left:
        return xp.where(big, 0, xp.left_shift(a, b))
    return xp.where(big, xp.where(xp.asarray(a) < 0, -1, 0), xp.right_shift(a, b))


_BITWISE = {"bitwise_and": lambda xp, a, b: xp.bitwise_and(a, b), "bitwise_or": lambda xp, a, b: xp.bitwise_or(a, b),
            "bitwise_xor": lambda xp, a, b: xp.bitwise_xor(a, b),
            "bitwise_left_shift": lambda xp, a, b: _shift(xp, a, b, True),
            "bitwise_right_shift": lambda xp, a, b: _shift(xp, a, b, False)}


def _bitwise(name):
    def f(self, other):
        a, b = _bitwise_operands(self, other, name)
        out = _BITWISE[name](self._xp(), a, b)
        return self._wrap(out.astype(np.result_type(a, b), copy=False) if "shift" in name else out)

    def f_(self, other):
        check_inplace(self)
        a, b = _bitwise_operands(self, other, name)
        res = np.result_type(a, b) if isinstance(b, np.ndarray) or hasattr(b, "dtype") else self._data.dtype
        _inplace_cast(name + "_", res, self._data.dtype)
        _inplace_shape(name + "_", self._data, b)
        if not _backend.is_meta_array(self._data):
            self._data[...] = _BITWISE[name](self._xp(), self._data, b)
        return self

    f.__name__ = f.__qualname__ = name
    f_.__name__ = f_.__qualname__ = name + "_"
    return f, f_


def _reflected_bitwise(name):
    def f(self, other):
        return getattr(_reflected(other, self), name)(self)

    f.__name__ = f.__qualname__ = name
    return f


for _name, _dunder, _idunder in (("bitwise_and", "__and__", "__iand__"), ("bitwise_or", "__or__", "__ior__"),
                                 ("bitwise_xor", "__xor__", "__ixor__"),
                                 ("bitwise_left_shift", "__lshift__", "__ilshift__"),
                                 ("bitwise_right_shift", "__rshift__", "__irshift__")):
    _f, _f_ = _bitwise(_name)
    _rdunder = _dunder.replace("__", "__r", 1)
    _commutes = "shift" not in _name  # ``1 & t`` is ``t & 1``: the reflected operator is an alias
    op("compare", name=_name, aliases=(_dunder, _rdunder) if _commutes else (_dunder,), function=True)(_f)
    op("compare", name=_name + "_", aliases=(_idunder,), inplace=True)(_f_)
    if not _commutes:
        op("compare", name=_rdunder)(_reflected_bitwise(_name))


@op("compare", name="bitwise_not", aliases=("__invert__",), function=True)
def bitwise_not(self):
    if dtype_category(self._data.dtype) == 2:
        raise NotImplementedError(f"\"bitwise_not\" not implemented for '{self.dtype}'")
    return self._wrap(~self._data)


@op("compare")
@_inplace
def bitwise_not_(a):
    if dtype_category(a.dtype) == 2:
        raise NotImplementedError(f"\"bitwise_not\" not implemented for '{a.dtype}'")
    array_module(a).invert(a, out=a)


CompareMixin = mixin("compare")
