"""Unary element-wise functions: neg, abs, square, reciprocal, exp/log and their kin (exp2, expm1, log1p, log2,
log10), sqrt/rsqrt, the trigonometric and hyperbolic functions, erf, sign and rounding (floor, ceil, round, trunc,
frac), and the in-place exp_/sqrt_/neg_/abs_/tanh_/sigmoid_/relu_."""
import math

import ml_dtypes
import numpy as np

from .._array import HALF_DTYPES, dtype_category
from .._backend import array_module
from .._registry import mixin, op
from ..autograd import ops
from ._common import _assign_result, _inplace, _to_float

__all__ = ["UnaryMixin"]


@op("unary", name="neg", aliases=("negative", "__neg__"), function=True, function_aliases=("negative",),
    functions=(ops.Neg,))
def __neg__(self):
    return ops.Neg.apply(self)


@op("unary", aliases=("__pos__",), function=True)
def positive(self):
    """self itself (PyTorch's unary plus); refused for bool tensors."""
    if self._data.dtype == np.bool_:
        raise RuntimeError("The `+` operator, on a bool tensor is not supported.")
    return self


@op("unary", aliases=("__abs__", "absolute"), function=True, function_aliases=("absolute",), functions=(ops.Abs,))
def abs(self):  # noqa: A001
    return ops.Abs.apply(self)


@op("unary", function=True, functions=(ops.PowScalar,))
def square(self):
    return ops.PowScalar.apply(self, 2)


@op("unary", function=True, functions=(ops.Exp,))
def exp(self):
    return ops.Exp.apply(_to_float(self))


@op("unary", function=True)
def exp2(self):
    return 2.0 ** _to_float(self)


@op("unary", function=True, functions=(ops.Log,))
def log(self):
    return ops.Log.apply(_to_float(self))


@op("unary", function=True, functions=(ops.Sqrt,))
def sqrt(self):
    return ops.Sqrt.apply(_to_float(self))


@op("unary", function=True, functions=(ops.Rsqrt,))
def rsqrt(self):
    return ops.Rsqrt.apply(_to_float(self))


@op("unary", function=True, functions=(ops.Tanh,))
def tanh(self):
    return ops.Tanh.apply(_to_float(self))


@op("unary", function=True, functions=(ops.Cos,))
def cos(self):
    return ops.Cos.apply(_to_float(self))


@op("unary", function=True, functions=(ops.Sin,))
def sin(self):
    return ops.Sin.apply(_to_float(self))


@op("unary", function=True, functions=(ops.Erf,))
def erf(self):
    return ops.Erf.apply(_to_float(self))


# -- the functions of ops.Unary -----------------------------------------------------------------------
def _unary(self, name):
    return ops.Unary.apply(_to_float(self), name)


@op("unary", function=True, functions=(ops.Unary,))
def log1p(self):
    return _unary(self, "log1p")


@op("unary", function=True, functions=(ops.Unary,))
def expm1(self):
    return _unary(self, "expm1")


@op("unary", function=True, functions=(ops.Unary,))
def log2(self):
    return _unary(self, "log2")


@op("unary", function=True, functions=(ops.Unary,))
def log10(self):
    return _unary(self, "log10")


@op("unary", function=True, functions=(ops.Unary,))
def tan(self):
    return _unary(self, "tan")


@op("unary", function=True, functions=(ops.Unary,))
def sinh(self):
    return _unary(self, "sinh")


@op("unary", function=True, functions=(ops.Unary,))
def cosh(self):
    return _unary(self, "cosh")


@op("unary", aliases=("arcsin",), function=True, function_aliases=("arcsin",), functions=(ops.Unary,))
def asin(self):
    return _unary(self, "arcsin")


@op("unary", aliases=("arccos",), function=True, function_aliases=("arccos",), functions=(ops.Unary,))
def acos(self):
    return _unary(self, "arccos")


@op("unary", aliases=("arctan",), function=True, function_aliases=("arctan",), functions=(ops.Unary,))
def atan(self):
    return _unary(self, "arctan")


@op("unary", aliases=("arcsinh",), function=True, function_aliases=("arcsinh",), functions=(ops.Unary,))
def asinh(self):
    return _unary(self, "arcsinh")


@op("unary", aliases=("arccosh",), function=True, function_aliases=("arccosh",), functions=(ops.Unary,))
def acosh(self):
    return _unary(self, "arccosh")


@op("unary", aliases=("arctanh",), function=True, function_aliases=("arctanh",), functions=(ops.Unary,))
def atanh(self):
    return _unary(self, "arctanh")


@op("unary", function=True, functions=(ops.Unary,))
def reciprocal(self):
    return _unary(self, "reciprocal")


# -- sign and rounding -------------------------------------------------------------------------------------
@op("unary", aliases=("sgn",), function=True, function_aliases=("sgn",), functions=(ops.Rounding,))
def sign(self):
    if self._data.dtype == np.bool_:
        return self.clone()
    return ops.Rounding.apply(self, "sign", 0)


def _rounding(self, kind, decimals=0):
    category = dtype_category(self._data.dtype)
    if category == 0:
        raise NotImplementedError(f"\"{kind}\" not implemented for 'Bool'")
    if category == 1:
        if decimals:
            raise NotImplementedError(f"round(decimals={decimals}) is not implemented for integer tensors "
                                      f"({self.dtype})")
        return self.clone()  # integers are already integral (PyTorch returns a copy)
    return ops.Rounding.apply(self, kind, decimals)


@op("unary", function=True, functions=(ops.Rounding,))
def floor(self):
    return _rounding(self, "floor")


@op("unary", function=True, functions=(ops.Rounding,))
def ceil(self):
    return _rounding(self, "ceil")


@op("unary", function=True, functions=(ops.Rounding,))
def round(self, *, decimals=0):  # noqa: A001
    return _rounding(self, "round", decimals)


@op("unary", aliases=("fix",), function=True, function_aliases=("fix",), functions=(ops.Rounding,))
def trunc(self):
    return _rounding(self, "trunc")


@op("unary", function=True)
def frac(self):
    if dtype_category(self._data.dtype) != 2:
        raise RuntimeError(f"\"frac_cpu\" not implemented for '{self.dtype}'")
    return self - self.trunc()


# -- angles, sinc, logit, nan_to_num ----------------------------------------------------------------------
@op("unary", function=True)
def deg2rad(self):
    return _to_float(self) * (math.pi / 180)


@op("unary", function=True)
def rad2deg(self):
    return _to_float(self) * (180 / math.pi)


@op("unary", function=True)
def sinc(self):
    """sin(pi x) / (pi x), 1 at 0 (with gradient 0 there)."""
    x = _to_float(self)
    zero = x == 0
    safe = x.masked_fill(zero, 1.0) * math.pi  # no 0/0 in the branch that is not taken (nor in its gradient)
    return (safe.sin() / safe).masked_fill(zero, 1.0)


@op("unary", function=True, functions=(ops.Logit,))
def logit(self, eps=None):
    """log(p / (1 - p)), p = self clamped to [eps, 1 - eps] when eps is given (else -inf at 0, +inf at 1)."""
    return ops.Logit.apply(_to_float(self), None if eps is None else float(eps))


@op("unary", function=True, functions=(ops.NanToNum,))
def nan_to_num(self, nan=0.0, posinf=None, neginf=None):
    """NaN -> ``nan``, +inf -> ``posinf``, -inf -> ``neginf`` (default: the dtype's largest and lowest finite
    numbers); a copy of bool and integer tensors."""
    dt = self._data.dtype
    if dtype_category(dt) != 2:
        return self.clone()
    info = ml_dtypes.finfo(dt)
    cast = lambda v, default: np.asarray(default if v is None else v, dtype=np.float64).astype(np.float32 if
                                                                                                 dt in HALF_DTYPES else dt)
    with np.errstate(over="ignore"):
        return ops.NanToNum.apply(self, cast(nan, 0.0), cast(posinf, float(info.max)), cast(neginf, float(info.min)))


# -- in place (See [Note: In-place ops and autograd] in _common.py) ----------------------------------------
@op("unary")
@_inplace
def exp_(a):
    array_module(a).exp(a, out=a)


@op("unary")
@_inplace
def sqrt_(a):
    array_module(a).sqrt(a, out=a)


@op("unary", aliases=("negative_",))
@_inplace
def neg_(a):
    array_module(a).negative(a, out=a)


@op("unary", aliases=("absolute_",))
@_inplace
def abs_(a):
    array_module(a).absolute(a, out=a)


@op("unary")
@_inplace
def tanh_(a):
    array_module(a).tanh(a, out=a)


@op("unary")
@_inplace
def sigmoid_(a):
    xp = array_module(a)
    xp.negative(a, out=a)
    xp.exp(a, out=a)
    a += 1
    xp.reciprocal(a, out=a)


@op("unary")
@_inplace
def relu_(a):
    array_module(a).maximum(a, 0, out=a)


@op("unary")
def round_(self, *, decimals=0):
    return _assign_result(self, self.round(decimals=decimals), "round_")


@op("unary")
def logit_(self, eps=None):
    return _assign_result(self, self.logit(eps), "logit_")


@op("unary")
def nan_to_num_(self, nan=0.0, posinf=None, neginf=None):
    return _assign_result(self, self.nan_to_num(nan, posinf, neginf), "nan_to_num_")


def _through_out_of_place(name):
    """``<name>_``: self.<name>() written into self, with PyTorch's checks (an integer self refuses a float result)."""
    def f(self):
        return _assign_result(self, getattr(self, name)(), name + "_")

    f.__name__ = f.__qualname__ = name + "_"
    f.__doc__ = f"In-place {name} (not recorded by autograd)."
    return f


for _name, _aliases in (("square", ()), ("sign", ("sgn_",)), ("floor", ()), ("ceil", ()), ("trunc", ("fix_",)),
                        ("frac", ()), ("log", ()), ("log1p", ()), ("log2", ()), ("log10", ()), ("expm1", ()),
                        ("exp2", ()), ("reciprocal", ()), ("rsqrt", ()), ("sin", ()), ("cos", ()), ("tan", ()),
                        ("sinh", ()), ("cosh", ()), ("asin", ("arcsin_",)), ("acos", ("arccos_",)),
                        ("atan", ("arctan_",)), ("asinh", ("arcsinh_",)), ("acosh", ("arccosh_",)),
                        ("atanh", ("arctanh_",)), ("erf", ()), ("deg2rad", ()), ("rad2deg", ()), ("sinc", ()),
                        ("erfc", ()), ("erfinv", ()), ("lgamma", ()), ("digamma", ())):
    op("unary", name=_name + "_", aliases=_aliases)(_through_out_of_place(_name))


from . import special_unary  # noqa: E402,F401  (the family's special functions, registered before its mixin is made)

UnaryMixin = mixin("unary")

