"""The unary family's special functions: erfc, erfinv, lgamma, digamma, polygamma, mvlgamma and i0, with their in-place
forms (erfc_, erfinv_, lgamma_, digamma_ with unary.py's other in-place forms), differentiable (ops.Special, float64 inside; See [Note: Special functions] in hpcfsdp/_special_math.py).
hpcfsdp/_tensor_methods/unary.py loads this module before it makes the family's mixin."""
import math
import operator

from .._registry import op
from ..autograd import ops
from ._common import _assign_result, _tensor_arg, _to_float

__all__ = []


@op("unary", function=True, functions=(ops.Special,))
def erfc(self):
    """1 - erf(self), computed without the cancellation (relative error below 6e-15 in float64)."""
    return ops.Special.apply(_to_float(self), "erfc")


@op("unary", function=True, functions=(ops.Special,))
def erfinv(self):
    """The inverse of erf on [-1, 1] (+-inf at +-1, NaN outside)."""
    return ops.Special.apply(_to_float(self), "erfinv")


@op("unary", function=True, functions=(ops.Special,))
def lgamma(self):
    """log |Gamma(self)|; +inf at 0 and the negative integers."""
    return ops.Special.apply(_to_float(self), "lgamma")


@op("unary", function=True, functions=(ops.Special,))
def digamma(self):
    """The derivative of lgamma; -inf at +0, +inf at -0, NaN at the negative integers (as PyTorch's)."""
    return ops.Special.apply(_to_float(self), "polygamma", 0)


def _order(n):
    n = operator.index(n)
    if n < 0:
        raise RuntimeError("polygamma(n, x) does not support negative n.")
    return n


def _polygamma_function(n, input):  # noqa: A002
    """torch.polygamma(n, input): the n-th derivative of digamma."""
    return _tensor_arg(input, "polygamma").polygamma(n)


_polygamma_function.__name__ = _polygamma_function.__qualname__ = "polygamma"


@op("unary", function=_polygamma_function, functions=(ops.Special,))
def polygamma(self, n):
    """The n-th derivative of digamma at self (n = 0: digamma)."""
    return ops.Special.apply(_to_float(self), "polygamma", _order(n))


@op("unary", function=True, functions=(ops.Special,))
def mvlgamma(self, p):
    """The log of the multivariate gamma function of dimension p: sum_i lgamma(self - i / 2) + p (p - 1) / 4 log pi."""
    p = operator.index(p)
    if p < 1:
        raise RuntimeError("p has to be greater than or equal to 1")
    x = _to_float(self)
    shifts = x.new_tensor([-i / 2 for i in range(p)])  # (p,)
    return (x.unsqueeze(-1) + shifts).lgamma().sum(-1) + p * (p - 1) / 4 * math.log(math.pi)


@op("unary")
def polygamma_(self, n):
    return _assign_result(self, self.polygamma(n), "polygamma_")


@op("unary")
def mvlgamma_(self, p):
    return _assign_result(self, self.mvlgamma(p), "mvlgamma_")


@op("unary", function=True, functions=(ops.Special,))
def i0(self):
    """The modified Bessel function of the first kind of order 0; differentiable (its derivative is i1)."""
    return ops.Special.apply(_to_float(self), "i0")


@op("unary")
def i0_(self):
    return _assign_result(self, i0(self), "i0_")
