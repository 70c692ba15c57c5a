"""Residual family: a transformer block's elementwise steps around its GEMMs fused on the GPU (each one launch): a
Linear's bias with the residual add, with the norm that follows it, or with GELU.

These take a Linear's output without its bias (the bias rides in the fused kernel), so only a caller that computes
the Linear itself uses them: GPT's fused block (hpcfsdp/models/_gpt_fused.py). On NumPy they compute the same
sums in the unfused order (the CPU path never calls them in the product; the tests compare the two).
"""
import types

from ..._backend import array_module
from ..._kernels import activation as _act
from ..._kernels import linear as _lin
from ..._kernels import norm as _norm
from ..._kernels import use_fused
from ..function import Op
from ._common import bias_grad
from .nn import LayerNorm

__all__ = ["BiasResidual", "AddNorm", "NormBranch", "BiasGelu"]


def _round(a, dt):
    return a.astype(dt, copy=False)


def _norm_and_stream_backward(ctx, s, g_out, g_s, need_wb, need_yb):
    """(ds, dw, db, dyb) for the norm of ``s`` read by a branch (gradient ``g_out``) and ``s`` carried on by the
    residual stream (gradient ``g_s``): one launch for ds on the GPU (two with the column sums), the saved
    LayerNorm's backward plus the stream's gradient elsewhere. ``dyb``: ds's column sums (the bias before s)."""
    if use_fused(s):
        return _norm.add_norm_backward(g_out, g_s, s, s.shape[-1], ctx.w, ctx.mean, ctx.rstd, False, need_wb,
                                       need_yb)
    ctx.ln.needs_input_grad = (True, False, need_wb, need_wb, False)
    gs, _, dw, db, _ = LayerNorm.backward(ctx.ln, g_out)
    ds = g_s + gs
    return ds, dw, db, bias_grad(ds) if need_yb else None


class BiasResidual(Op):
    """x + (y + b): the residual add of a Linear's output y and its bias b (C,), each sum rounded as unfused."""

    @staticmethod
    def forward(ctx, x, y, b):
        if use_fused(x):
            return _lin.bias_residual(x, y, b)
        return x + (y + b)

    @staticmethod
    def backward(ctx, g):
        nx, ny, nb = ctx.needs_input_grad
        return g if nx else None, g if ny else None, bias_grad(g) if nb else None


class AddNorm(Op):
    """(s, layer_norm(s)) for s = x + (y + yb): the residual stream after a Linear (output y, bias yb or None) and the
    LayerNorm (weight w, bias b) that reads it, in one launch each way (two for the parameter gradients)."""

    @staticmethod
    def forward(ctx, x, y, yb, w, b, eps):
        c = x.shape[-1]
        if use_fused(x):
            s, out, ctx.mean, ctx.rstd = _norm.add_norm_forward(x, y, yb, c, w, b, float(eps), False)
            ctx.s, ctx.w = s, w
            return s, out
        s = x + (y if yb is None else y + yb)
        ctx.s, ctx.ln = s, types.SimpleNamespace()
        return s, LayerNorm.forward(ctx.ln, s, 1, w, b, eps)

    @staticmethod
    def backward(ctx, g_s, g_out):
        s = ctx.s
        xp = array_module(s)
        nx, ny, nyb, nw, nb = ctx.needs_input_grad[:5]
        if g_s is None:
            g_s = xp.zeros_like(s)
        if g_out is None:
            ds, dw, db, dyb = g_s, None, None, bias_grad(g_s) if nyb else None
        else:
            ds, dw, db, dyb = _norm_and_stream_backward(ctx, s, g_out, g_s, nw or nb, nyb)
        return (ds if nx else None, ds if ny else None, dyb, dw if nw else None, db if nb else None, None)


class NormBranch(Op):
    """(x, layer_norm(x)): the residual stream and the norm of a branch that reads it, whose gradients meet in the
    norm's backward launch (dx = g_x + the norm's gradient) instead of in an add of their own."""

    @staticmethod
    def forward(ctx, x, w, b, eps):
        c = x.shape[-1]
        ctx.x = x
        if use_fused(x):
            out, ctx.mean, ctx.rstd, ctx.x = _norm.norm_forward(x, c, w, b, float(eps), False)
            ctx.w = w
            return ctx.x, out
        ctx.ln = types.SimpleNamespace()
        return x, LayerNorm.forward(ctx.ln, x, 1, w, b, eps)

    @staticmethod
    def backward(ctx, g_x, g_out):
        x = ctx.x
        xp = array_module(x)
        nx, nw, nb = ctx.needs_input_grad[:3]
        if g_out is None:
            return g_x, None, None, None
        if g_x is None:
            g_x = xp.zeros_like(x)
        dx, dw, db, _ = _norm_and_stream_backward(ctx, x, g_out, g_x, nw or nb, False)
        return dx if nx else None, dw if nw else None, db if nb else None, None


class BiasGelu(Op):
    """gelu(x + b) (exact, or the tanh approximation) with b (C,) broadcast: a Linear's bias and its activation."""

    @staticmethod
    def forward(ctx, x, b, approximate):
        ctx.x, ctx.b, ctx.approx = x, b, approximate
        if use_fused(x):
            return _act.bias_gelu_forward(x, b, approximate)
        y, _ = _act._gelu_and_slope(_act._biased(x, b, x.dtype), approximate == "tanh")
        return _round(y, x.dtype)

    @staticmethod
    def backward(ctx, g):
        x, b = ctx.x, ctx.b
        if use_fused(x):
            dx = _act.bias_gelu_backward(g, x, b, ctx.approx)
        else:
            _, slope = _act._gelu_and_slope(_act._biased(x, b, x.dtype), ctx.approx == "tanh")
            dx = _round(_act._acc(g, x.dtype) * slope, x.dtype)
        nx, nb = ctx.needs_input_grad[:2]
        return dx if nx else None, bias_grad(dx) if nb else None, None
