"""Element-wise activations with parameters (leaky_relu, elu, softplus, mish, hardtanh) and the p-norm.

Each backward is PyTorch's formula, including its choice at the kinks (leaky_relu and elu take the
negative branch at 0, hardtanh passes no gradient at its bounds).
"""
import numpy as np

from .._array import HALF_DTYPES
from .._backend import array_module
from .function import Op

__all__ = ["LeakyRelu", "Elu", "Softplus", "Mish", "Hardtanh", "VectorNorm", "softplus_array"]


def _up(x):
    """x in float32 when it is half precision on NumPy (ufuncs are slow and lossy there), else x."""
    return x.astype(np.float32) if x.dtype in HALF_DTYPES and array_module(x) is np else x


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


class VectorNorm(Op):
    """The p-norm of x over ``dims`` (keepdim); the gradient at a zero norm is 0, as PyTorch."""

    @staticmethod
    def forward(ctx, x, p, dims):
        xp = array_module(x)
        xc = _up(x)
        a = xp.abs(xc)
        if p == float("inf"):
            norm = a.max(axis=dims, keepdims=True)
        elif p == 2:
            norm = xp.sqrt((xc * xc).sum(axis=dims, keepdims=True))
        elif p == 1:
            norm = a.sum(axis=dims, keepdims=True)
        elif p == 0:
            norm = (xc != 0).sum(axis=dims, keepdims=True).astype(xc.dtype)
        else:
            norm = (a ** xc.dtype.type(p)).sum(axis=dims, keepdims=True) ** xc.dtype.type(1.0 / p)
        ctx.x, ctx.norm, ctx.p, ctx.dims, ctx.dt = xc, norm, p, dims, x.dtype
        return norm.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        x, norm, p = ctx.x, ctx.norm, ctx.p
        g = g.astype(x.dtype, copy=False)
        f = x.dtype.type
        if p == 0:
            return xp.zeros(x.shape, dtype=ctx.dt), None, None
        if p == float("inf"):
            mask = (xp.abs(x) == norm).astype(x.dtype)
            d = xp.sign(x) * mask / mask.sum(axis=ctx.dims, keepdims=True)
        elif p == 1:
            d = xp.sign(x)
        else:
            safe = xp.where(norm == 0, f(1), norm)
            if p == 2:
                d = x / safe
            else:
                d = xp.sign(x) * xp.abs(x) ** f(p - 1) / safe ** f(p - 1)
            d = xp.where(norm == 0, f(0), d)
        return (g * d).astype(ctx.dt, copy=False), None, None
