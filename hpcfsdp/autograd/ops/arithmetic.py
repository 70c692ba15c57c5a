"""Arithmetic family: binary element-wise ops (add, sub, mul, div, pow, maximum, minimum, atan2, hypot, remainder) and
the special functions of two operands (logaddexp/logaddexp2, xlogy, fmax/fmin, copysign)."""
import numpy as np

from ..._array import shape_of, sum_to
from ..._backend import array_module
from ..function import Op
from ._common import _up

__all__ = ["Add", "Sub", "Mul", "Div", "Pow", "PowScalar", "RPowScalar", "Maximum", "Minimum", "Atan2", "Hypot",
           "Remainder", "LogAddExp", "Xlogy", "FMaxMin", "Copysign", "xlogy_array"]


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


# -- special functions of two operands ---------------------------------------------------------------------
class LogAddExp(Op):
    """log(exp(a) + exp(b)) (base e) or log2(2**a + 2**b) (base 2), computed in float32 for half inputs.

    d/da = 1 / (1 + base**(b - a)), as PyTorch's formula (NaN where a and b are the same infinity)."""

    @staticmethod
    def forward(ctx, a, b, base2):
        xp = array_module(a)
        x, y = _up(a), _up(b)
        with np.errstate(invalid="ignore", over="ignore"):
            out = (xp.logaddexp2 if base2 else xp.logaddexp)(x, y)
        ctx.x, ctx.y, ctx.base2, ctx.dtype = x, y, base2, a.dtype
        return out.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        x, y = ctx.x, ctx.y
        na, nb, _ = ctx.needs_input_grad
        up = _up(g)
        power = xp.exp2 if ctx.base2 else xp.exp
        with np.errstate(invalid="ignore", over="ignore"):
            ga = sum_to((up / (1 + power(y - x))).astype(ctx.dtype, copy=False), x.shape) if na else None
            gb = sum_to((up / (1 + power(x - y))).astype(ctx.dtype, copy=False), y.shape) if nb else None
        return ga, gb, None


def xlogy_array(x, y):
    """x * log(y), 0 where x is 0 (unless y is NaN), as scipy.special.xlogy."""
    xp = array_module(x if hasattr(x, "dtype") else y)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = x * xp.log(y)
    return xp.where((xp.asarray(x) == 0) & ~xp.isnan(y), 0, out).astype(out.dtype, copy=False)


class Xlogy(Op):
    """x * log(y), 0 where x == 0 and y is not NaN; d/dx = log(y) (0 where x == 0 and y <= 0), d/dy = x / y, as
    PyTorch's."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.x, ctx.y = x, y
        return xlogy_array(_up(x), _up(y)).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.x, ctx.y
        nx, ny = ctx.needs_input_grad
        gx = gy = None
        if nx:
            xp = array_module(g)
            gx = sum_to(xp.where((x == 0) & (y <= 0), 0, xlogy_array(g, y)).astype(g.dtype, copy=False), x.shape)
        if ny:
            with np.errstate(divide="ignore", invalid="ignore"):
                gy = sum_to(g * x / y, y.shape)
        return gx, gy


class FMaxMin(Op):
    """fmax / fmin: maximum / minimum that ignore NaN. The gradient goes to a where a wins, ties included, or where
    b is NaN; to b elsewhere (PyTorch's: ties are not shared, unlike maximum's)."""

    @staticmethod
    def forward(ctx, a, b, is_min):
        xp = array_module(a)
        ctx.a, ctx.b, ctx.is_min = a, b, is_min
        return (xp.fmin if is_min else xp.fmax)(a, b)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        a, b = ctx.a, ctx.b
        with np.errstate(invalid="ignore"):
            to_a = ((a <= b) if ctx.is_min else (a >= b)) | xp.isnan(b)
        na, nb, _ = ctx.needs_input_grad
        return (sum_to(g * to_a, a.shape) if na else None), (sum_to(g * ~to_a, b.shape) if nb else None), None


class Copysign(Op):
    """|a| with the sign bit of b; d/da = out / a (0 where a is 0), d/db = 0, as PyTorch's."""

    @staticmethod
    def forward(ctx, a, b):
        out = array_module(a).copysign(a, b)
        ctx.a, ctx.out, ctx.sb = a, out, shape_of(b)
        return out

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        a, out = ctx.a, ctx.out
        na, nb = ctx.needs_input_grad
        with np.errstate(divide="ignore", invalid="ignore"):
            ga = sum_to(xp.where(a == 0, 0, g * (out / a)).astype(g.dtype, copy=False), a.shape) if na else None
        return ga, (xp.zeros(ctx.sb, g.dtype) if nb else None)
