"""Arithmetic family: binary element-wise ops (add, sub, mul, div, pow, maximum, minimum, atan2, hypot, remainder)."""
import numpy as np

from ..._array import shape_of, sum_to
from ..._backend import array_module
from ..function import Op

__all__ = ["Add", "Sub", "Mul", "Div", "Pow", "PowScalar", "RPowScalar", "Maximum", "Minimum", "Atan2", "Hypot",
           "Remainder"]


class Add(Op):
    @staticmethod
    def forward(ctx, a, b):
        ctx.sa, ctx.sb = shape_of(a), shape_of(b)
        return a + b

    @staticmethod
    def backward(ctx, g):
        na, nb = ctx.needs_input_grad
        return (sum_to(g, ctx.sa) if na else None, sum_to(g, ctx.sb) if nb else None)


class Sub(Op):
    @staticmethod
    def forward(ctx, a, b):
        ctx.sa, ctx.sb = shape_of(a), shape_of(b)
        return a - b

    @staticmethod
    def backward(ctx, g):
        na, nb = ctx.needs_input_grad
        return (sum_to(g, ctx.sa) if na else None, sum_to(-g, ctx.sb) if nb else None)


class Mul(Op):
    @staticmethod
    def forward(ctx, a, b):
        ctx.a, ctx.b = a, b
        return a * b

    @staticmethod
    def backward(ctx, g):
        na, nb = ctx.needs_input_grad
        a, b = ctx.a, ctx.b
        return (sum_to(g * b, shape_of(a)) if na else None, sum_to(g * a, shape_of(b)) if nb else None)


class Div(Op):
    @staticmethod
    def forward(ctx, a, b):
        ctx.a, ctx.b = a, b
        return a / b

    @staticmethod
    def backward(ctx, g):
        na, nb = ctx.needs_input_grad
        a, b = ctx.a, ctx.b
        ga = g / b
        gb = sum_to(-ga * a / b, shape_of(b)) if nb else None
        return (sum_to(ga, shape_of(a)) if na else None, gb)


class Pow(Op):
    """a ** b with b a tensor."""

    @staticmethod
    def forward(ctx, a, b):
        out = a ** b
        ctx.a, ctx.b, ctx.out = a, b, out
        return out

    @staticmethod
    def backward(ctx, g):
        na, nb = ctx.needs_input_grad
        a, b, out = ctx.a, ctx.b, ctx.out
        xp = array_module(out)
        ga = sum_to(g * b * a ** (b - 1), shape_of(a)) if na else None
        gb = None
        if nb:
            with np.errstate(divide="ignore", invalid="ignore"):
                la = xp.where(a > 0, xp.log(xp.where(a > 0, a, 1)), xp.where(a == 0, -np.inf, np.nan))
                t = g * out * la
                t = xp.where(out == 0, 0, t).astype(out.dtype)  # PyTorch masks the 0 * inf case
            gb = sum_to(t, shape_of(b))
        return ga, gb


class PowScalar(Op):
    """a ** c with c a Python number."""

    @staticmethod
    def forward(ctx, a, c):
        ctx.a, ctx.c = a, c
        if c == 2:
            return a * a
        if c == 0.5:
            return array_module(a).sqrt(a)
        return a ** c

    @staticmethod
    def backward(ctx, g):
        a, c = ctx.a, ctx.c
        if c == 0:
            return g * 0, None
        if c == 2:
            return g * (a + a), None
        if c == 1:
            return g, None
        return g * (c * a ** (c - 1)), None


class RPowScalar(Op):
    """c ** a with c a Python number."""

    @staticmethod
    def forward(ctx, c, a):
        out = array_module(a).power(a.dtype.type(c), a)
        ctx.c, ctx.out = c, out
        return out

    @staticmethod
    def backward(ctx, g):
        return None, g * ctx.out * np.log(ctx.c).astype(ctx.out.dtype)


class Maximum(Op):
    @staticmethod
    def forward(ctx, a, b):
        ctx.a, ctx.b = a, b
        return array_module(a).maximum(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.a, ctx.b
        # ties share the gradient equally, as PyTorch
        w = (a > b) + 0.5 * (a == b)
        w = w.astype(g.dtype)
        na, nb = ctx.needs_input_grad
        return (sum_to(g * w, shape_of(a)) if na else None, sum_to(g * (1 - w), shape_of(b)) if nb else None)


class Minimum(Op):
    @staticmethod
    def forward(ctx, a, b):
        ctx.a, ctx.b = a, b
        return array_module(a).minimum(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.a, ctx.b
        w = ((a < b) + 0.5 * (a == b)).astype(g.dtype)
        na, nb = ctx.needs_input_grad
        return (sum_to(g * w, shape_of(a)) if na else None, sum_to(g * (1 - w), shape_of(b)) if nb else None)


class Atan2(Op):
    @staticmethod
    def forward(ctx, a, b):
        ctx.a, ctx.b = a, b
        return array_module(a).arctan2(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.a, ctx.b
        na, nb = ctx.needs_input_grad
        with np.errstate(divide="ignore", invalid="ignore"):
            r = g / (a * a + b * b)
        return (sum_to(r * b, a.shape) if na else None), (sum_to(-r * a, b.shape) if nb else None)


class Hypot(Op):
    @staticmethod
    def forward(ctx, a, b):
        out = array_module(a).hypot(a, b)
        ctx.a, ctx.b, ctx.out = a, b, out
        return out

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.a, ctx.b
        na, nb = ctx.needs_input_grad
        with np.errstate(divide="ignore", invalid="ignore"):
            r = g / ctx.out
        return (sum_to(r * a, a.shape) if na else None), (sum_to(r * b, b.shape) if nb else None)


class Remainder(Op):
    """remainder (sign of b, Python's %) or fmod (sign of a); a or b may be a Python scalar.

    d/da = 1, d/db = -floor(a / b) (remainder) or -trunc(a / b) (fmod), as PyTorch's.
    """

    @staticmethod
    def forward(ctx, a, b, kind):
        xp = array_module(b if isinstance(a, (int, float)) else a)
        ctx.a, ctx.b, ctx.kind = a, b, kind
        with np.errstate(divide="ignore", invalid="ignore"):
            return xp.asarray(getattr(xp, kind)(a, b))

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.a, ctx.b
        na, nb, _ = ctx.needs_input_grad
        xp = array_module(g)
        ga = sum_to(g, shape_of(a)) if na else None
        gb = None
        if nb:
            with np.errstate(divide="ignore", invalid="ignore"):
                q = xp.floor(a / b) if ctx.kind == "remainder" else xp.trunc(a / b)
            gb = sum_to(-g * q, shape_of(b))
        return ga, gb, None
