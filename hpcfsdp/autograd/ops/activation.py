"""Activation family: relu, softmax, log_softmax, gelu and the activations with parameters (leaky_relu, elu, ...)."""
import math

import numpy as np

from ..._array import HALF_DTYPES, sum_to
from ..._backend import array_module
from ..._kernels import CTYPES
from ..._kernels import activation as _fused
from ..._kernels import softmax as _fused_softmax
from ..._kernels import use_fused
from ..function import Op
from ._common import _up
from .unary import _CDF_CLAMP, _CDF_P, _CDF_Q, _INV_SQRT_2PI, _blocked, _rational_odd

# Each backward is PyTorch's formula, including its choice at the kinks: leaky_relu, elu, prelu and the scaled ELU
# take the negative branch at 0, hardtanh passes no gradient at its bounds, hardswish takes the middle branch on
# [-3, 3) only, hardsigmoid passes gradient strictly inside (-3, 3) only, threshold only where x > threshold.
# The ones built from transcendental functions (elu, softplus, mish, the scaled ELU, logsigmoid, gelu) compute
# half-precision inputs in float32 and round back once (See _common._up).

__all__ = ["Relu", "Softmax", "LogSoftmax", "Gelu", "GeluTanh", "LeakyRelu", "Elu", "Softplus", "Mish", "Hardtanh",
           "Prelu", "ScaledElu", "Hardswish", "Hardsigmoid", "Threshold", "LogSigmoid", "softplus_array"]


class Relu(Op):
    @staticmethod
    def forward(ctx, a):
        out = array_module(a).maximum(a, 0)
        ctx.out = out
        return out

    @staticmethod
    def backward(ctx, g):
        return g * (ctx.out > 0)


# -- softmax -------------------------------------------------------------------------------------------------
def _fused_rows(a, dim) -> bool:
    """Whether softmax.cu takes a: a contiguous, non-empty CuPy array of a kernel dtype, over its last dim."""
    return (use_fused(a) and a.dtype in CTYPES and a.ndim > 0 and a.size > 0 and a.flags.c_contiguous
            and dim in (-1, a.ndim - 1))


class Softmax(Op):
    """softmax over ``dim``; on CuPy over the last dim of a contiguous array one fused kernel each way (softmax.cu)."""

    @staticmethod
    def forward(ctx, a, dim):
        ctx.fused = _fused_rows(a, dim)
        if ctx.fused:
            ctx.out = _fused_softmax.softmax_forward(a, log=False)
            return ctx.out
        xp = array_module(a)
        out = a - a.max(axis=dim, keepdims=True)
        xp.exp(out, out=out)
        out /= out.sum(axis=dim, keepdims=True)
        ctx.out, ctx.dim = out, dim
        return out

    @staticmethod
    def backward(ctx, g):
        if ctx.fused:
            return _fused_softmax.softmax_backward(g, ctx.out, log=False), None
        out, dim = ctx.out, ctx.dim
        gx = g * out
        s = gx.sum(axis=dim, keepdims=True)
        gx -= out * s
        return gx, None


class LogSoftmax(Op):
    """log_softmax over ``dim``; fused on CuPy as Softmax."""

    @staticmethod
    def forward(ctx, a, dim):
        ctx.fused = _fused_rows(a, dim)
        if ctx.fused:
            ctx.out = _fused_softmax.softmax_forward(a, log=True)
            return ctx.out
        xp = array_module(a)
        out = a - a.max(axis=dim, keepdims=True)
        e = xp.exp(out)
        out -= xp.log(e.sum(axis=dim, keepdims=True))
        ctx.out, ctx.dim = out, dim
        return out

    @staticmethod
    def backward(ctx, g):
        if ctx.fused:
            return _fused_softmax.softmax_backward(g, ctx.out, log=True), None
        out, dim = ctx.out, ctx.dim
        gx = array_module(g).exp(out)
        gx *= -g.sum(axis=dim, keepdims=True)
        gx += g
        return gx, None


# -- gelu (its erf kernels are unary.py's: See [Note: erf] there) --------------------------------------------
class Gelu(Op):
    """gelu(x) = x * Phi(x) (exact, erf form). Saves x and Phi(x); on CuPy one fused kernel each way, saving x only."""

    @staticmethod
    def forward(ctx, x):
        if use_fused(x):
            ctx.x, ctx.fused = x, True
            return _fused.gelu_forward(x, "none")
        ctx.fused = False
        dt = x.dtype
        xc = x.astype(np.float32) if dt in HALF_DTYPES else x
        xp = array_module(xc)
        xc = xp.ascontiguousarray(xc)
        cdf = xp.empty_like(xc)
        out = xp.empty_like(xc)

        def kernel(ob, cb, xb):
            _rational_odd(xb, cb, _CDF_P, _CDF_Q, _CDF_CLAMP, 0.5, xp)
            xp.multiply(xb, cb, out=ob)

        _blocked(kernel, out, cdf, xc)
        ctx.x, ctx.cdf = xc, cdf
        return out.astype(dt) if dt in HALF_DTYPES else out

    @staticmethod
    def backward(ctx, g):
        if ctx.fused:
            return _fused.gelu_backward(g, ctx.x, "none")
        x, cdf = ctx.x, ctx.cdf
        xp = array_module(x)
        dt = x.dtype.type
        gc = xp.ascontiguousarray(g, dtype=x.dtype)
        out = xp.empty_like(x)

        def kernel(o, gb, xb, cb):
            xp.multiply(xb, xb, out=o)
            o *= dt(-0.5)
            xp.exp(o, out=o)
            o *= xb
            o *= dt(_INV_SQRT_2PI)
            o += cb
            o *= gb

        _blocked(kernel, out, gc, x, cdf)
        return out.astype(g.dtype) if g.dtype != out.dtype else out


class GeluTanh(Op):
    """gelu(x, approximate='tanh') = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); on CuPy one fused kernel each
    way."""

    K = math.sqrt(2.0 / math.pi)

    @staticmethod
    def forward(ctx, x):
        if use_fused(x):
            ctx.x, ctx.fused = x, True
            return _fused.gelu_forward(x, "tanh")
        ctx.fused = False
        dt = x.dtype
        xc = x.astype(np.float32) if dt in HALF_DTYPES else x
        xp = array_module(xc)
        f = xc.dtype.type
        inner = xc * xc
        inner *= f(0.044715)
        inner += f(1.0)
        inner *= xc
        inner *= f(GeluTanh.K)
        th = xp.tanh(inner, out=inner)
        out = th + f(1.0)
        out *= xc
        out *= f(0.5)
        ctx.x, ctx.th = xc, th
        return out.astype(dt) if dt in HALF_DTYPES else out

    @staticmethod
    def backward(ctx, g):
        if ctx.fused:
            return _fused.gelu_backward(g, ctx.x, "tanh")
        x, th = ctx.x, ctx.th
        f = x.dtype.type
        # d/dx = 0.5 (1 + th) + 0.5 x (1 - th^2) K (1 + 3 * 0.044715 x^2)
        d = x * x
        d *= f(3 * 0.044715)
        d += f(1.0)
        d *= f(GeluTanh.K * 0.5)
        d *= x
        d *= 1 - th * th
        d += f(0.5) * (th + f(1.0))
        d *= g
        return d.astype(g.dtype) if g.dtype != d.dtype else d


# -- with parameters -----------------------------------------------------------------------------------------
def softplus_array(z, xp):
    """log(1 + exp(z)) without overflow: max(z, 0) + log1p(exp(-|z|))."""
    return xp.maximum(z, 0) + xp.log1p(xp.exp(-xp.abs(z)))


class LeakyRelu(Op):
    @staticmethod
    def forward(ctx, x, slope):
        xp = array_module(x)
        pos = x > 0
        ctx.pos, ctx.slope = pos, slope
        return xp.where(pos, x, x * x.dtype.type(slope))

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        return xp.where(ctx.pos, g, g * g.dtype.type(ctx.slope)), None


class Elu(Op):
    """alpha * (exp(x) - 1) for x <= 0, x above."""

    @staticmethod
    def forward(ctx, x, alpha):
        xp = array_module(x)
        xc = _up(x)
        pos = xc > 0
        neg = xp.expm1(xp.minimum(xc, 0)) * xc.dtype.type(alpha)
        ctx.pos, ctx.neg, ctx.alpha = pos, neg, alpha
        return xp.where(pos, xc, neg).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        d = ctx.neg + ctx.neg.dtype.type(ctx.alpha)  # alpha * exp(x)
        return xp.where(ctx.pos, g, g * d.astype(g.dtype, copy=False)), None


class Softplus(Op):
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold."""

    @staticmethod
    def forward(ctx, x, beta, threshold):
        xp = array_module(x)
        xc = _up(x)
        z = xc * xc.dtype.type(beta)
        lin = z > threshold
        out = xp.where(lin, xc, softplus_array(z, xp) / xc.dtype.type(beta))
        ctx.z, ctx.lin = z, lin
        return out.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        with np.errstate(over="ignore"):
            sig = 1 / (1 + xp.exp(-ctx.z))
        return xp.where(ctx.lin, g, g * sig.astype(g.dtype, copy=False)), None, None


class Mish(Op):
    """x * tanh(softplus(x))."""

    @staticmethod
    def forward(ctx, x):
        xp = array_module(x)
        xc = _up(x)
        th = xp.tanh(softplus_array(xc, xp))
        ctx.x, ctx.th = xc, th
        return (xc * th).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        x, th = ctx.x, ctx.th
        with np.errstate(over="ignore"):
            sig = 1 / (1 + xp.exp(-x))
        d = th + x * sig * (1 - th * th)
        return g * d.astype(g.dtype, copy=False)


class Hardtanh(Op):
    """clip(x, lo, hi); the gradient passes only strictly inside (lo, hi), as PyTorch."""

    @staticmethod
    def forward(ctx, x, lo, hi):
        xp = array_module(x)
        ctx.inside = (x > lo) & (x < hi)
        return xp.clip(x, x.dtype.type(lo), x.dtype.type(hi))

    @staticmethod
    def backward(ctx, g):
        return g * ctx.inside, None, None


class Prelu(Op):
    """x where x > 0, else w * x; ``w`` arrives already shaped to broadcast against x (channels on dim 1)."""

    @staticmethod
    def forward(ctx, x, w):
        xp = array_module(x)
        wx = w.astype(x.dtype, copy=False)
        pos = x > 0
        ctx.x, ctx.w, ctx.pos, ctx.wdt = x, wx, pos, w.dtype
        return xp.where(pos, x, wx * x)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        nx, nw = ctx.needs_input_grad[:2]
        gx = xp.where(ctx.pos, g, g * ctx.w) if nx else None
        gw = None
        if nw:
            gw = sum_to(xp.where(ctx.pos, g.dtype.type(0), g * ctx.x), ctx.w.shape).astype(ctx.wdt, copy=False)
        return gx, gw


class ScaledElu(Op):
    """scale * x for x > 0, else scale * alpha * (exp(input_scale * x) - 1): ATen's elu(x, alpha, scale,
    input_scale), which gives elu, selu (alpha 1.6733, scale 1.0507) and celu (input_scale 1 / alpha)."""

    @staticmethod
    def forward(ctx, x, alpha, scale, input_scale):
        xp = array_module(x)
        xc = _up(x)
        f = xc.dtype.type
        pos = xc > 0
        neg = xp.expm1(xp.minimum(xc, 0) * f(input_scale)) * f(alpha * scale)
        ctx.pos, ctx.neg, ctx.coef = pos, neg, (alpha * scale, scale, input_scale)
        return xp.where(pos, xc * f(scale), neg).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        neg = ctx.neg
        f = neg.dtype.type
        a_s, scale, in_s = ctx.coef
        d = (neg + f(a_s)) * f(in_s)  # d/dx of the negative branch: alpha * scale * input_scale * exp(input_scale x)
        return xp.where(ctx.pos, g * g.dtype.type(scale), g * d.astype(g.dtype, copy=False)), None, None, None


class Hardswish(Op):
    """x * min(max(x + 3, 0), 6) / 6."""

    @staticmethod
    def forward(ctx, x):
        xp = array_module(x)
        f = x.dtype.type
        ctx.x = x
        return x * xp.clip(x + f(3), f(0), f(6)) / f(6)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        x = ctx.x
        f = g.dtype.type
        mid = g * (x / f(3) + f(0.5))
        return xp.where(x <= f(-3), f(0), xp.where(x < f(3), mid, g))


class Hardsigmoid(Op):
    """min(max(x + 3, 0), 6) / 6."""

    @staticmethod
    def forward(ctx, x):
        xp = array_module(x)
        f = x.dtype.type
        ctx.inside = (x > f(-3)) & (x < f(3))
        return xp.clip(x + f(3), f(0), f(6)) / f(6)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.inside / g.dtype.type(6)


class Threshold(Op):
    """value where x <= threshold, else x (NaN passes through, as PyTorch's comparison order gives)."""

    @staticmethod
    def forward(ctx, x, threshold, value):
        xp = array_module(x)
        low = x <= threshold
        ctx.low = low
        return xp.where(low, xp.asarray(value, dtype=x.dtype), x)

    @staticmethod
    def backward(ctx, g):
        return array_module(g).where(ctx.low, g.dtype.type(0), g), None, None


class LogSigmoid(Op):
    """log(1 / (1 + exp(-x))) = min(x, 0) - log1p(exp(-|x|)), without overflow."""

    @staticmethod
    def forward(ctx, x):
        xp = array_module(x)
        xc = _up(x)
        ctx.x = xc
        return (xp.minimum(xc, 0) - xp.log1p(xp.exp(-xp.abs(xc)))).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        x = ctx.x
        with np.errstate(over="ignore"):
            d = 1 / (1 + xp.exp(x))  # sigmoid(-x)
        return g * d.astype(g.dtype, copy=False)
