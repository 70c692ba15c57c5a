"""Index family: indexing (getitem), gather (take along a dim) with scatter-add gradients, where and masked_fill."""
import numpy as np

from ..._array import index_add, shape_of, sum_to
from ..._backend import array_module
from ..function import Op

__all__ = ["GetItem", "TakeAlong", "Scatter", "IndexAdd", "Where", "MaskedFill", "index_add"]


def _is_basic(idx):
    items = idx if isinstance(idx, tuple) else (idx,)
    return all(i is None or i is Ellipsis or isinstance(i, (int, slice, np.integer)) for i in items)


class GetItem(Op):
    @staticmethod
    def forward(ctx, a, idx):
        ctx.shape, ctx.dtype, ctx.idx = a.shape, a.dtype, idx
        return a[idx]

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        out = xp.zeros(ctx.shape, dtype=g.dtype)
        if _is_basic(ctx.idx):
            out[ctx.idx] = g
        else:
            index_add(out, ctx.idx, g)
        return out, None


class TakeAlong(Op):
    """out = take_along_axis(a, index, dim): gather, and the values of sort and topk.

    ``index`` may be smaller than ``a`` in the other dims (gather reads the leading block of ``a``); repeated
    indices accumulate their gradients.
    """

    @staticmethod
    def forward(ctx, a, index, dim):
        ctx.shape, ctx.index, ctx.dim = a.shape, index, dim
        if a.ndim == 0:
            return a.copy()
        block = tuple(slice(0, n) for n in index.shape[:dim]) + (slice(None),) + tuple(
            slice(0, n) for n in index.shape[dim + 1:])
        return array_module(a).take_along_axis(a[block], index, axis=dim)

    @staticmethod
    def backward(ctx, g):
        if g.ndim == 0:
            return g, None, None
        xp, index, dim = array_module(g), ctx.index, ctx.dim
        out = xp.zeros(ctx.shape, dtype=g.dtype)
        nd = index.ndim
        where = tuple(index if i == dim else xp.arange(n).reshape((-1,) + (1,) * (nd - i - 1))
                      for i, n in enumerate(index.shape))
        index_add(out, where, g)
        return out, None, None


def _positions(index, dim, xp):
    """The advanced index of every element of ``index`` into a tensor: ``index`` at ``dim``, its own position in
    the other dims (scatter's and gather's addressing)."""
    nd = index.ndim
    return tuple(index if i == dim else xp.arange(n).reshape((-1,) + (1,) * (nd - i - 1))
                 for i, n in enumerate(index.shape))


def _block(index, src):
    """The leading block of ``src`` that ``index`` addresses (src may be larger in every dim)."""
    return src[tuple(slice(0, n) for n in index.shape)]


class Scatter(Op):
    """out = a with src's leading block written (``add`` False) or added (True) at ``index`` along ``dim``:
    Tensor.scatter / scatter_add. Gradients: a's is g (zeroed where scatter overwrote), src's g gathered back."""

    @staticmethod
    def forward(ctx, a, index, src, dim, add):
        xp = array_module(a)
        out = a.copy()
        where = _positions(index, dim, xp)
        vals = _block(index, src) if getattr(src, "ndim", 0) else src
        if add:
            index_add(out, where, xp.broadcast_to(xp.asarray(vals, dtype=out.dtype), index.shape))
        else:
            out[where] = vals
        ctx.where, ctx.add, ctx.src_shape, ctx.ishape = where, add, getattr(src, "shape", None), index.shape
        return out

    @staticmethod
    def backward(ctx, g):
        ga = g
        if not ctx.add:
            ga = g.copy()
            ga[ctx.where] = 0
        gs = None
        if ctx.src_shape is not None and ctx.needs_input_grad[2]:
            gs = array_module(g).zeros(ctx.src_shape, dtype=g.dtype)
            gs[tuple(slice(0, n) for n in ctx.ishape)] = g[ctx.where]
        return ga, None, gs, None, None


class IndexAdd(Op):
    """out = a with ``alpha * source`` added at ``index`` (1-D) along ``dim``: Tensor.index_add."""

    @staticmethod
    def forward(ctx, a, index, source, dim, alpha):
        out = a.copy()
        at = (slice(None),) * dim + (index,)
        index_add(out, at, source * source.dtype.type(alpha) if alpha != 1 else source)
        ctx.at, ctx.alpha = at, alpha
        return out

    @staticmethod
    def backward(ctx, g):
        gs = g[ctx.at]
        return g, None, (gs * gs.dtype.type(ctx.alpha) if ctx.alpha != 1 else gs), None, None


class Where(Op):
    @staticmethod
    def forward(ctx, cond, a, b):
        ctx.cond, ctx.sa, ctx.sb = cond, shape_of(a), shape_of(b)
        return array_module(cond).where(cond, a, b)

    @staticmethod
    def backward(ctx, g):
        _, na, nb = ctx.needs_input_grad
        xp = array_module(g)
        zero = g.dtype.type(0)
        ga = sum_to(xp.where(ctx.cond, g, zero), ctx.sa) if na else None
        gb = sum_to(xp.where(ctx.cond, zero, g), ctx.sb) if nb else None
        return None, ga, gb


class MaskedFill(Op):
    @staticmethod
    def forward(ctx, a, mask, value):
        xp = array_module(a)
        ctx.mask = mask
        if hasattr(value, "shape"):
            value = value.astype(a.dtype)
        else:
            value = a.dtype.type(value)
        out = xp.where(mask, value, a)
        if out.shape != a.shape:
            raise RuntimeError(f"masked_fill: mask of shape {mask.shape} does not broadcast to the input "
                               f"shape {a.shape}")
        return out

    @staticmethod
    def backward(ctx, g):
        return array_module(g).where(ctx.mask, g.dtype.type(0), g), None, None
