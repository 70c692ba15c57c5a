"""Unary family: element-wise functions of one tensor (exp, log, sqrt, tanh, sigmoid, abs, clamp, trig, erf, round,
the special functions erfc, erfinv, lgamma, digamma and polygamma)."""
import math

import numpy as np

from ... import _special_math
from ..._array import sum_to
from ..._erf import _CDF_CLAMP, _CDF_P, _CDF_Q, _ERF_CLAMP, _ERF_P, _ERF_Q, _INV_SQRT_2PI, _rational_odd  # noqa: F401
from ..._backend import array_module
from ..function import Op
from ._common import _up

__all__ = ["Neg", "Exp", "Log", "Sqrt", "Rsqrt", "Tanh", "Sigmoid", "Abs", "Clamp", "Cos", "Sin", "Erf", "Rounding",
           "Logit", "NanToNum", "Special", "Unary", "UNARY", "erf", "normal_cdf"]


class Neg(Op):
    @staticmethod
    def forward(ctx, a):
        return -a

    @staticmethod
    def backward(ctx, g):
        return -g


class Exp(Op):
    @staticmethod
    def forward(ctx, a):
        out = array_module(a).exp(a)
        ctx.out = out
        return out

    @staticmethod
    def backward(ctx, g):
        return g * ctx.out


class Log(Op):
    @staticmethod
    def forward(ctx, a):
        ctx.a = a
        return array_module(a).log(a)

    @staticmethod
    def backward(ctx, g):
        return g / ctx.a


class Sqrt(Op):
    @staticmethod
    def forward(ctx, a):
        out = array_module(a).sqrt(a)
        ctx.out = out
        return out

    @staticmethod
    def backward(ctx, g):
        return g / (2 * ctx.out)


class Rsqrt(Op):
    @staticmethod
    def forward(ctx, a):
        xp = array_module(a)
        out = xp.reciprocal(xp.sqrt(a))
        ctx.out = out
        return out

    @staticmethod
    def backward(ctx, g):
        out = ctx.out
        return g * (-0.5 * out * out * out)


class Tanh(Op):
    @staticmethod
    def forward(ctx, a):
        out = array_module(a).tanh(a)
        ctx.out = out
        return out

    @staticmethod
    def backward(ctx, g):
        out = ctx.out
        return g * (1 - out * out)


class Sigmoid(Op):
    @staticmethod
    def forward(ctx, a):
        xp = array_module(a)
        # 1 / (1 + exp(-a)) overflows harmlessly to 0 for very negative a
        with np.errstate(over="ignore"):
            out = xp.exp(-a)
            out += 1
            xp.reciprocal(out, out=out)
        ctx.out = out
        return out

    @staticmethod
    def backward(ctx, g):
        out = ctx.out
        return g * (out * (1 - out))


class Abs(Op):
    @staticmethod
    def forward(ctx, a):
        ctx.a = a
        return array_module(a).abs(a)

    @staticmethod
    def backward(ctx, g):
        return g * array_module(g).sign(ctx.a)


class Clamp(Op):
    """clamp(a, min, max); the gradient passes where min <= a <= max, as PyTorch."""

    @staticmethod
    def forward(ctx, a, lo, hi):
        xp = array_module(a)
        out = a
        if lo is not None:
            out = xp.maximum(out, lo)
        if hi is not None:
            out = xp.minimum(out, hi)
        if out is a:
            out = a.copy()
        ctx.a, ctx.lo, ctx.hi = a, lo, hi
        return out

    @staticmethod
    def backward(ctx, g):
        a, lo, hi = ctx.a, ctx.lo, ctx.hi
        ok = None
        if lo is not None:
            ok = a >= lo
        if hi is not None:
            ok = (a <= hi) if ok is None else ok & (a <= hi)
        na, nlo, nhi = ctx.needs_input_grad
        ga = sum_to(g * ok, a.shape) if ok is not None else g
        glo = ghi = None
        if nlo:  # tensor bound: gets the gradient where it was the result
            glo = sum_to(g * (a < lo), lo.shape)
        if nhi:
            ghi = sum_to(g * (a > hi) if lo is None else g * ((a > hi) & (hi >= lo)), hi.shape)
        return (ga if na else None), glo, ghi


class Cos(Op):
    @staticmethod
    def forward(ctx, a):
        ctx.a = a
        return array_module(a).cos(a)

    @staticmethod
    def backward(ctx, g):
        return -g * array_module(g).sin(ctx.a)


class Sin(Op):
    @staticmethod
    def forward(ctx, a):
        ctx.a = a
        return array_module(a).sin(a)

    @staticmethod
    def backward(ctx, g):
        return g * array_module(g).cos(ctx.a)


class Rounding(Op):
    """sign, floor, ceil, round(decimals): piecewise constant, so the gradient is zero (as PyTorch)."""

    @staticmethod
    def forward(ctx, a, kind, decimals=0):
        xp = array_module(a)
        if kind == "round":
            return xp.round(a, decimals)
        return getattr(xp, kind)(a)

    @staticmethod
    def backward(ctx, g):
        return array_module(g).zeros_like(g), None, None


# name -> derivative d(out)/d(a) from (xp, a, out), all in the compute dtype (float32 for half inputs)
UNARY = {
    "log1p": lambda xp, a, out: 1 / (1 + a),
    "expm1": lambda xp, a, out: out + 1,
    "log2": lambda xp, a, out: 1 / (a * a.dtype.type(math.log(2))),
    "log10": lambda xp, a, out: 1 / (a * a.dtype.type(math.log(10))),
    "sinh": lambda xp, a, out: xp.cosh(a),
    "cosh": lambda xp, a, out: xp.sinh(a),
    "tan": lambda xp, a, out: 1 + out * out,
    "arcsin": lambda xp, a, out: 1 / xp.sqrt(1 - a * a),
    "arccos": lambda xp, a, out: -1 / xp.sqrt(1 - a * a),
    "arctan": lambda xp, a, out: 1 / (1 + a * a),
    "reciprocal": lambda xp, a, out: -(out * out),
    "arcsinh": lambda xp, a, out: 1 / xp.sqrt(1 + a * a),
    "arccosh": lambda xp, a, out: 1 / xp.sqrt(a * a - 1),
    "arctanh": lambda xp, a, out: 1 / (1 - a * a),
}


class Unary(Op):
    """out = xp.<name>(a) for a name of UNARY; the gradient is g times the derivative there."""

    @staticmethod
    def forward(ctx, a, name):
        xp = array_module(a)
        x = _up(a)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out = getattr(xp, name)(x)
        ctx.x, ctx.out, ctx.name, ctx.dtype = x, out, name, a.dtype
        return out.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            d = UNARY[ctx.name](xp, ctx.x, ctx.out)
            return (_up(g) * d).astype(ctx.dtype, copy=False), None


class Logit(Op):
    """log(p / (1 - p)) of p = a clamped to [eps, 1 - eps] (eps None: not clamped); d/da = 1 / (p (1 - p)) where
    eps <= a <= 1 - eps and 0 elsewhere, as PyTorch's."""

    @staticmethod
    def forward(ctx, a, eps):
        xp = array_module(a)
        x = _up(a)
        if eps is not None:
            x = xp.clip(x, eps, 1 - eps)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = xp.log(x / (1 - x))
        ctx.a, ctx.x, ctx.eps = a, x, eps
        return out.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, eps = ctx.x, ctx.eps
        with np.errstate(divide="ignore", invalid="ignore"):
            d = _up(g) / (x * (1 - x))
        if eps is not None:
            d = d * ((ctx.a >= eps) & (ctx.a <= 1 - eps))
        return d.astype(g.dtype, copy=False), None


class NanToNum(Op):
    """NaN, +inf and -inf replaced by the given numbers (already of a's dtype); the gradient passes where a is
    finite, as PyTorch's."""

    @staticmethod
    def forward(ctx, a, nan, posinf, neginf):
        xp = array_module(a)
        x = _up(a)
        out = xp.where(xp.isnan(x), nan, x)
        out = xp.where(x == math.inf, posinf, out)
        out = xp.where(x == -math.inf, neginf, out)
        ctx.finite = xp.isfinite(x)
        return out.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.finite, None, None, None


# -- erf (also the kernels of gelu) --------------------------------------------------------------------------
# The rational approximation itself is in hpcfsdp/_erf.py (See [Note: erf]).


_CHUNK = 1 << 15  # elements per block for multi-pass element-wise kernels: keeps temporaries in L2


def _blocked(fn, *arrays):
    """Call fn(*blocks) over matching flat blocks of same-size C-contiguous arrays (NumPy), or once (CuPy).

    Multi-pass element-wise kernels then run on L2-resident blocks instead of streaming every temporary
    through memory.
    """
    first = arrays[0]
    if array_module(first) is not np or first.size <= 2 * _CHUNK:
        fn(*arrays)
        return
    flat = [a.reshape(-1) for a in arrays]
    for i in range(0, first.size, _CHUNK):
        j = i + _CHUNK
        fn(*[a[i:j] for a in flat])


def erf(x):
    """Vectorised erf of a floating array (See [Note: erf])."""
    xp = array_module(x)
    x = xp.ascontiguousarray(x)
    out = xp.empty_like(x)
    _blocked(lambda o, a: _rational_odd(a, o, _ERF_P, _ERF_Q, _ERF_CLAMP, 0.0, xp), out, x)
    return out


def normal_cdf(x):
    """Standard normal CDF, 0.5 * (1 + erf(x / sqrt(2)))."""
    xp = array_module(x)
    x = xp.ascontiguousarray(x)
    out = xp.empty_like(x)
    _blocked(lambda o, a: _rational_odd(a, o, _CDF_P, _CDF_Q, _CDF_CLAMP, 0.5, xp), out, x)
    return out


class Erf(Op):
    """erf(a) by the rational approximation erf() above (See [Note: erf]); d/da = 2/sqrt(pi) exp(-a^2)."""

    @staticmethod
    def forward(ctx, a):
        ctx.a = a
        return erf(_up(a)).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        a = ctx.a
        return g * (array_module(a).exp(-a * a) * a.dtype.type(2.0 / math.sqrt(math.pi)))


# -- special functions (See [Note: Special functions] in hpcfsdp/_special_math.py) ----------------------------------
def _special(name, n, x):
    """The float64 value of special function ``name`` (erfc, erfinv, lgamma, polygamma of order n) at x."""
    if name == "polygamma":
        return _special_math.polygamma(n, x)
    return getattr(_special_math, name)(x)


_SPECIAL_GRAD = {  # name -> d/dx from (x, out, n), all float64
    "erfc": lambda x, out, n: -(2 / math.sqrt(math.pi)) * array_module(x).exp(-x * x),
    "erfinv": lambda x, out, n: (math.sqrt(math.pi) / 2) * array_module(x).exp(out * out),
    "lgamma": lambda x, out, n: _special_math.polygamma(0, x),
    "polygamma": lambda x, out, n: _special_math.polygamma(n + 1, x),
    "i0": lambda x, out, n: _special_math.i1(x),
}


class Special(Op):
    """out = erfc, erfinv, lgamma, i0 or polygamma(n) of a, evaluated in float64 and rounded to a's dtype once."""

    @staticmethod
    def forward(ctx, a, name, n=0):
        x = a.astype(np.float64)
        out = _special(name, n, x)
        ctx.x, ctx.out, ctx.name, ctx.n = x, out, name, n
        return out.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        with np.errstate(over="ignore", invalid="ignore"):
            d = _SPECIAL_GRAD[ctx.name](ctx.x, ctx.out, ctx.n)
        return (g.astype(np.float64) * d).astype(g.dtype, copy=False), None, None
