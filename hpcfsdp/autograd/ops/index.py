"""Index family: indexing (getitem), gather (take along a dim) with scatter-add gradients, where and masked_fill."""
import numpy as np

from ..._array import index_add, shape_of, sum_to
from ..._backend import array_module
from ..function import Op

__all__ = ["GetItem", "TakeAlong", "Where", "MaskedFill", "index_add"]


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
