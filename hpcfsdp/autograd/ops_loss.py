"""Element-wise loss terms: binary cross entropy (of probabilities and of logits), smooth L1 / Huber, KL divergence.

Each returns the unreduced loss; weighting and reduction are Tensor ops in nn.functional. Gradients
follow PyTorch's formulas (binary_cross_entropy clamps its logs at -100 and its gradient's denominator at
1e-12).
"""
import numpy as np

from .._backend import array_module
from .function import Op
from .ops_act import softplus_array

__all__ = ["BinaryCrossEntropy", "BinaryCrossEntropyWithLogits", "SmoothL1", "KlDiv"]


class BinaryCrossEntropy(Op):
    """-(t log x + (1 - t) log(1 - x)) with both logs clamped at -100."""

    @staticmethod
    def forward(ctx, x, t):
        xp = array_module(x)
        f = x.dtype.type
        with np.errstate(divide="ignore"):
            logx = xp.maximum(xp.log(x), f(-100))
            log1mx = xp.maximum(xp.log(1 - x), f(-100))
        ctx.x, ctx.t, ctx.logx, ctx.log1mx = x, t, logx, log1mx
        return -(t * logx + (1 - t) * log1mx)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        x, t = ctx.x, ctx.t
        nx, nt = ctx.needs_input_grad
        gx = g * (x - t) / xp.maximum(x * (1 - x), x.dtype.type(1e-12)) if nx else None
        gt = g * (ctx.log1mx - ctx.logx) if nt else None
        return gx, gt


class BinaryCrossEntropyWithLogits(Op):
    """(1 - t) x + (1 + (pw - 1) t) softplus(-x): -[pw t log sigmoid(x) + (1 - t) log(1 - sigmoid(x))], stably.

    ``pw`` (pos_weight, an array broadcasting against x, or None) receives no gradient.
    """

    @staticmethod
    def forward(ctx, x, t, pw):
        xp = array_module(x)
        sp = softplus_array(-x, xp)  # -log sigmoid(x)
        lw = 1 + (pw - 1) * t if pw is not None else None
        ctx.x, ctx.t, ctx.pw, ctx.sp, ctx.lw = x, t, pw, sp, lw
        return (1 - t) * x + (lw * sp if lw is not None else sp)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        x, t, pw, lw = ctx.x, ctx.t, ctx.pw, ctx.lw
        nx, nt = ctx.needs_input_grad[:2]
        gx = gt = None
        if nx:
            with np.errstate(over="ignore"):
                sig = 1 / (1 + xp.exp(-x))
            gx = g * (sig * lw - pw * t if lw is not None else sig - t)
        if nt:
            gt = g * (-x + (pw - 1) * ctx.sp if pw is not None else -x)
        return gx, gt, None


class SmoothL1(Op):
    """Of the difference d: smooth L1 (0.5 d^2 / beta where |d| < beta, else |d| - beta / 2) or, with
    ``huber``, the Huber loss (0.5 d^2 where |d| < beta, else beta (|d| - beta / 2))."""

    @staticmethod
    def forward(ctx, d, beta, huber):
        xp = array_module(d)
        f = d.dtype.type
        a = xp.abs(d)
        ctx.d, ctx.beta, ctx.huber = d, beta, huber
        if huber:
            return xp.where(a < beta, f(0.5) * d * d, f(beta) * (a - f(0.5 * beta)))
        if beta == 0:
            return a
        return xp.where(a < beta, f(0.5 / beta) * d * d, a - f(0.5 * beta))

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        d, beta = ctx.d, ctx.beta
        f = d.dtype.type
        if ctx.huber:
            return g * xp.clip(d, f(-beta), f(beta)), None, None
        if beta == 0:
            return g * xp.sign(d), None, None
        return g * xp.clip(d * f(1.0 / beta), f(-1), f(1)), None, None


class KlDiv(Op):
    """t (log t - x) (0 where t = 0), or exp(t) (t - x) with ``log_target``: x holds log-probabilities."""

    @staticmethod
    def forward(ctx, x, t, log_target):
        xp = array_module(x)
        ctx.x, ctx.t, ctx.log_target = x, t, log_target
        if log_target:
            et = xp.exp(t)
            ctx.et = et
            return et * (t - x)
        with np.errstate(divide="ignore", invalid="ignore"):
            tlogt = xp.where(t == 0, t.dtype.type(0), t * xp.log(t))
        return tlogt - t * x

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        x, t = ctx.x, ctx.t
        nx, nt = ctx.needs_input_grad[:2]
        gx = gt = None
        if ctx.log_target:
            et = ctx.et
            gx = -g * et if nx else None
            gt = g * et * (t - x + 1) if nt else None
        else:
            gx = -g * t if nx else None
            if nt:
                with np.errstate(divide="ignore", invalid="ignore"):
                    gt = g * (xp.log(t) + 1 - x)
        return gx, gt, None
