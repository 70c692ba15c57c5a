"""Reduce family: sum, mean, amax/amin, max/min over a dim, var, prod, logsumexp, and the scans cumsum, cumprod and
logcumsumexp."""
import numpy as np

from ..._backend import array_module
from ..function import Op
from ._common import _axes, _reduced_shape, _up

__all__ = ["Sum", "Mean", "Amax", "MaxDim", "Var", "Prod", "Logsumexp", "Cumsum", "Cumprod", "Logcumsumexp",
           "logcumsumexp_array"]


class Sum(Op):
    @staticmethod
    def forward(ctx, a, dim=None, keepdim=False, dtype=None):
        axes = _axes(dim, a.ndim)
        ctx.shape, ctx.axes = a.shape, axes
        if dtype is None and a.dtype.kind in "biu":
            dtype = np.int64
        return a.sum(axis=axes, keepdims=keepdim, dtype=dtype)

    @staticmethod
    def backward(ctx, g):
        g = g.reshape(_reduced_shape(ctx.shape, ctx.axes, True))
        return array_module(g).broadcast_to(g, ctx.shape), None, None, None


class Mean(Op):
    @staticmethod
    def forward(ctx, a, dim=None, keepdim=False):
        axes = _axes(dim, a.ndim)
        ctx.shape, ctx.axes = a.shape, axes
        n = a.size if axes is None else int(np.prod([a.shape[i] for i in axes]))
        ctx.n = n
        return a.mean(axis=axes, keepdims=keepdim)

    @staticmethod
    def backward(ctx, g):
        g = g.reshape(_reduced_shape(ctx.shape, ctx.axes, True)) * (1.0 / ctx.n)
        return array_module(g).broadcast_to(g, ctx.shape), None, None


class Amax(Op):
    """amax/amin over dims; ties share the gradient evenly, as PyTorch."""

    @staticmethod
    def forward(ctx, a, dim=None, keepdim=False, is_min=False):
        axes = _axes(dim, a.ndim)
        out = a.min(axis=axes, keepdims=True) if is_min else a.max(axis=axes, keepdims=True)
        ctx.a, ctx.outk, ctx.axes = a, out, axes
        return out if keepdim else out.reshape(tuple(s for i, s in enumerate(a.shape)
                                                     if axes is not None and i not in axes))

    @staticmethod
    def backward(ctx, g):
        a, outk = ctx.a, ctx.outk
        mask = a == outk
        cnt = mask.sum(axis=ctx.axes, keepdims=True)
        return (g.reshape(outk.shape) / cnt).astype(g.dtype) * mask, None, None, None


class MaxDim(Op):
    """max(dim)/min(dim) -> (values, indices); the gradient goes to the returned index."""

    @staticmethod
    def forward(ctx, a, dim, keepdim=False, is_min=False):
        xp = array_module(a)
        d = dim % max(a.ndim, 1)
        if a.ndim == 0:
            return a.copy(), xp.zeros((), dtype=np.int64)
        idx = (a.argmin if is_min else a.argmax)(axis=d, keepdims=True)
        vals = xp.take_along_axis(a, idx, axis=d)
        ctx.shape, ctx.d, ctx.idx = a.shape, d, idx
        if not keepdim:
            vals, idx = vals.squeeze(d), idx.squeeze(d)
        return vals, idx.astype(np.int64, copy=False)

    @staticmethod
    def backward(ctx, g, _gi):
        if g is None:
            return None, None, None, None
        xp = array_module(g)
        if ctx.__dict__.get("shape") is None:
            return g, None, None, None
        d, shape = ctx.d, ctx.shape
        pos = xp.arange(shape[d]).reshape((-1,) + (1,) * (len(shape) - d - 1))
        onehot = pos == ctx.idx  # (..., n, ...) True only at the selected index
        return xp.where(onehot, g.reshape(ctx.idx.shape), g.dtype.type(0)), None, None, None


class Var(Op):
    @staticmethod
    def forward(ctx, a, dim=None, correction=1, keepdim=False):
        axes = _axes(dim, a.ndim)
        n = a.size if axes is None else int(np.prod([a.shape[i] for i in axes]))
        xc = a - a.mean(axis=axes, keepdims=True)
        denom = max(n - correction, 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = (xc * xc).sum(axis=axes, keepdims=keepdim) / a.dtype.type(denom)
        ctx.xc, ctx.axes, ctx.denom = xc, axes, denom
        return out.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        xc = ctx.xc
        g = g.reshape(_reduced_shape(xc.shape, ctx.axes, True))
        with np.errstate(divide="ignore", invalid="ignore"):
            return (g * (2.0 / ctx.denom if ctx.denom else np.inf)).astype(xc.dtype) * xc, None, None, None


class Logsumexp(Op):
    @staticmethod
    def forward(ctx, a, axes, keepdim):
        xp = array_module(a)
        x = _up(a)
        if x.size:
            m = x.max(axis=axes, keepdims=True)
            m = xp.where(xp.isfinite(m), m, x.dtype.type(0))  # all -inf (or an inf) stays -inf (inf)
        else:
            m = xp.zeros(_reduced_shape(x.shape, axes, True), dtype=x.dtype)
        with np.errstate(divide="ignore"):
            outk = xp.log(xp.exp(x - m).sum(axis=axes, keepdims=True)) + m
        ctx.x, ctx.outk, ctx.dtype = x, outk, a.dtype
        return outk.reshape(_reduced_shape(x.shape, axes, keepdim)).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, outk = ctx.x, ctx.outk
        gk = _up(g).reshape(outk.shape)
        return (gk * array_module(x).exp(x - outk)).astype(ctx.dtype, copy=False), None, None


def _along(ndim, dim, s):
    """An index tuple selecting slice or index ``s`` along ``dim`` and everything along the other dims."""
    return (slice(None),) * dim + (s,) + (slice(None),) * (ndim - dim - 1)


class Prod(Op):
    """prod over one dim (or all, dim=None); the gradient is the product of the other elements, exact with zeros."""

    @staticmethod
    def forward(ctx, a, dim, keepdim):
        ctx.a, ctx.dim, ctx.keepdim = a, dim, keepdim
        out = _up(a).prod(axis=dim, keepdims=keepdim)
        return array_module(a).asarray(out).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        a, dim = ctx.a, ctx.dim
        xp = array_module(g)
        x = _up(a).reshape(-1) if dim is None else _up(a)
        d = 0 if dim is None else dim
        n = x.shape[d]
        if n == 0:
            return xp.zeros(a.shape, dtype=a.dtype), None, None
        one = xp.ones(x.shape[:d] + (1,) + x.shape[d + 1:], dtype=x.dtype)
        # exclusive products from the left and from the right of each element
        left = xp.concatenate([one, xp.cumprod(x[_along(x.ndim, d, slice(0, n - 1))], axis=d)], axis=d)
        right = xp.flip(xp.cumprod(xp.flip(x[_along(x.ndim, d, slice(1, n))], d), axis=d), d)
        right = xp.concatenate([right, one], axis=d)
        gk = g.reshape(()) if dim is None else (g if ctx.keepdim else xp.expand_dims(g, d))
        return (left * right * gk).reshape(a.shape).astype(a.dtype, copy=False), None, None


# -- scans ---------------------------------------------------------------------------------------------------
class Cumsum(Op):
    @staticmethod
    def forward(ctx, a, dim):
        ctx.dim = dim
        if a.ndim == 0:
            return a.copy()
        return _up(a).cumsum(axis=dim).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        if g.ndim == 0:
            return g, None
        xp, d = array_module(g), ctx.dim
        return xp.flip(_up(xp.flip(g, d)).cumsum(axis=d), d).astype(g.dtype, copy=False), None


def _scan_forward(ctx, a, dim, scan):
    """A cumulative op's forward in the accumulation dtype (``scan(x, dim)``; a 0-d input is its own result), with
    the input, the output and the dim saved for the backward."""
    x = _up(a)
    out = scan(x, dim) if a.ndim else x.copy()
    ctx.x, ctx.out, ctx.dim, ctx.dtype = x, out, dim, a.dtype
    return out.astype(a.dtype, copy=False)


def _scan_saved(ctx, g):
    """What _scan_forward saved (input, output, dim), the array module and ``g`` in the accumulation dtype."""
    return ctx.x, ctx.out, ctx.dim, array_module(g), _up(g)


class Cumprod(Op):
    """cumprod along ``dim``. The gradient sum_{j >= i} g_j out_j / a_i where no element is 0; elsewhere it is
    computed exactly from exclusive products (one pass per element of the dim, only for inputs with zeros)."""

    @staticmethod
    def forward(ctx, a, dim):
        return _scan_forward(ctx, a, dim, lambda x, d: x.cumprod(axis=d))

    @staticmethod
    def backward(ctx, g):
        if ctx.x.ndim == 0:
            return g, None
        x, out, d, xp, g = _scan_saved(ctx, g)
        rev_cumsum = lambda v: xp.flip(xp.flip(v, d).cumsum(axis=d), d)  # noqa: E731
        if bool((x != 0).all()):
            return (rev_cumsum(g * out) / x).astype(ctx.dtype, copy=False), None
        xm = xp.moveaxis(x, d, -1)
        gm = xp.moveaxis(g, d, -1)
        n = xm.shape[-1]
        res = xp.zeros_like(xm)
        before = xp.ones(xm.shape[:-1], dtype=xm.dtype)  # prod of x[:i]
        for i in range(n):
            after = xp.cumprod(xm[..., i + 1:], axis=-1)  # prod of x[i+1:j+1] for j > i
            res[..., i] = before * (gm[..., i] + (gm[..., i + 1:] * after).sum(axis=-1))
            before = before * xm[..., i]
        return xp.moveaxis(res, -1, d).astype(ctx.dtype, copy=False), None


def logcumsumexp_array(x, d):
    """log(cumsum(exp(x))) along ``d`` without overflow or underflow: a running logaddexp (NumPy's accumulate; one
    step per element of the dim elsewhere)."""
    xp = array_module(x)
    acc = getattr(getattr(xp, "logaddexp", None), "accumulate", None)
    if xp is np and acc is not None:
        return acc(x, axis=d)
    xm = xp.moveaxis(x, d, -1)
    out = xp.empty_like(xm)
    if xm.shape[-1]:
        out[..., 0] = xm[..., 0]
    for j in range(1, xm.shape[-1]):
        out[..., j] = xp.logaddexp(out[..., j - 1], xm[..., j])
    return xp.moveaxis(out, -1, d)


class Logcumsumexp(Op):
    """logcumsumexp along ``dim``. The gradient sum_{j >= i} g_j exp(x_i - out_j), computed as PyTorch's: reversed
    logcumsumexps of log|g| - out for the positive and the negative parts of g, so nothing overflows."""

    @staticmethod
    def forward(ctx, a, dim):
        return _scan_forward(ctx, a, dim, logcumsumexp_array)

    @staticmethod
    def backward(ctx, g):
        if ctx.x.ndim == 0:
            return g, None
        x, out, d, xp, g = _scan_saved(ctx, g)
        lowest = np.finfo(g.dtype).min
        with np.errstate(divide="ignore"):
            log_abs = xp.log(xp.abs(g))
        rev = lambda v: xp.flip(logcumsumexp_array(xp.flip(v, d), d), d)  # noqa: E731
        pos = xp.exp(rev(xp.where(g > 0, log_abs, lowest) - out) + x)
        neg = xp.exp(rev(xp.where(g < 0, log_abs, lowest) - out) + x)
        return (pos - neg).astype(ctx.dtype, copy=False), None
