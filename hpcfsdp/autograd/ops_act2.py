"""Element-wise activations of the second batch: prelu, the scaled ELU (selu, celu), hardswish, hardsigmoid,
threshold and logsigmoid.

Each backward is PyTorch's formula, including its choice at the kinks: prelu and the scaled ELU take the
negative branch at 0, hardswish the middle branch on [-3, 3) only, hardsigmoid passes gradient strictly inside
(-3, 3) only, threshold only where x > threshold. Half-precision inputs on NumPy compute in float32.
"""
import numpy as np

from .._array import sum_to
from .._backend import array_module
from .function import Op
from .ops_act import _up

__all__ = ["Prelu", "ScaledElu", "Hardswish", "Hardsigmoid", "Threshold", "LogSigmoid"]


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
