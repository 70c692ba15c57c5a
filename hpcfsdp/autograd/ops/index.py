"""Index family: indexing (getitem), gather (take along a dim) with scatter-add gradients, indexed writes (put,
scatter, index_add, scatter_reduce), where and masked_fill."""
import numpy as np

from ..._array import index_add, shape_of, sum_to
from ..._backend import array_module
from ..function import Op
from ._common import _up

__all__ = ["GetItem", "TakeAlong", "Scatter", "IndexAdd", "IndexPut", "ScatterReduce", "Where", "MaskedFill",
           "index_add", "segment_reduce"]


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


class IndexPut(Op):
    """out = a with ``values`` (broadcast to the indexed shape) written (``accumulate`` False) or added (True) at the
    advanced index ``where``: index_put, index_copy, index_fill, put, masked_scatter. Gradients: a's is g (zeroed
    where the write overwrote), values' is g at ``where`` summed back to values' shape."""

    @staticmethod
    def forward(ctx, a, where, values, accumulate):
        xp = array_module(a)
        out = a.copy()
        shape = out[where].shape
        vals = xp.broadcast_to(xp.asarray(values, dtype=out.dtype), shape)
        if accumulate:
            index_add(out, where, vals)
        else:
            out[where] = vals
        ctx.where, ctx.accumulate, ctx.vshape = where, accumulate, shape_of(values)
        return out

    @staticmethod
    def backward(ctx, g):
        ga = g
        if not ctx.accumulate:
            ga = g.copy()
            ga[ctx.where] = 0
        gv = sum_to(g[ctx.where], ctx.vshape) if ctx.needs_input_grad[2] else None
        return ga, None, gv, None


# [Note: Segmented reductions]
# scatter_reduce's prod/amax/amin have no atomic form on every backend (CuPy's cupyx has scatter_add only, and
# NumPy's ufunc.at is slow), so the values are sorted by destination and each run of equal destinations is reduced
# by a segmented inclusive scan (Hillis-Steele: log2(n) steps of whole-array ops, each combining an element with the
# one 2^k before it where both lie in the same run); the last element of a run holds its reduction. Exact for
# integers, and NaN propagates through maximum/minimum as PyTorch's amax/amin.
_COMBINE = {"sum": "add", "mean": "add", "prod": "multiply", "amax": "maximum", "amin": "minimum"}


def segment_reduce(keys, values, reduce, xp):
    """(the distinct keys, sorted; the reduction of the values of each) for 1-D ``keys`` and ``values``."""
    order = xp.argsort(keys, kind="stable") if xp is np else xp.argsort(keys)
    k, v = keys[order], values[order]
    combine = getattr(xp, _COMBINE[reduce])
    n = k.shape[0]
    step = 1
    while step < n:
        same = k[step:] == k[:-step]
        v = xp.concatenate([v[:step], xp.where(same, combine(v[step:], v[:-step]), v[step:])])
        step *= 2
    last = xp.concatenate([k[1:] != k[:-1], xp.ones((min(n, 1),), dtype=bool)])
    return k[last], v[last]


_IDENTITY = {"sum": 0, "mean": 0, "prod": 1}


class ScatterReduce(Op):
    """out = a with the values of ``src`` (its leading block that ``index`` addresses) reduced into it at ``index``
    along ``dim`` by sum, prod, mean, amax or amin; ``include_self`` False leaves a's values out of the reduction at
    the positions written. Gradients as PyTorch's: mean's divided by the count, prod's the product of the others
    (zeros counted), amax/amin's shared evenly among the elements equal to the result."""

    @staticmethod
    def forward(ctx, a, index, src, dim, reduce, include_self):
        xp = array_module(a)
        where = _positions(index, dim, xp)
        strides = np.cumprod((1,) + a.shape[:0:-1])[::-1]  # C-order element strides of a
        flat = sum(xp.broadcast_to(w, index.shape).ravel() * int(st) for w, st in zip(where, strides))
        vals = _up(_block(index, src).ravel())
        keys, red = segment_reduce(flat, vals, reduce, xp)
        base = _up(a.reshape(-1))
        out = a.reshape(-1).copy()
        if include_self:
            red = getattr(xp, _COMBINE[reduce])(red, base[keys])
        count = None
        if reduce == "mean":
            count = xp.zeros(base.shape, dtype=np.int64)
            index_add(count, flat, xp.ones(flat.shape, dtype=np.int64))
            count = count + int(include_self)
            c = count[keys]
            red = red // c if a.dtype.kind in "iu" else red / c  # integers: floor division, as PyTorch's
        out[keys] = red.astype(a.dtype, copy=False)
        out = out.reshape(a.shape)
        ctx.a, ctx.src, ctx.out, ctx.flat, ctx.keys, ctx.count = a, src, out, flat, keys, count
        ctx.where, ctx.ishape, ctx.reduce, ctx.include_self = where, index.shape, reduce, include_self
        return out

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        reduce, flat, keys, incl = ctx.reduce, ctx.flat, ctx.keys, ctx.include_self
        g_flat = g.reshape(-1)
        written = xp.zeros(g_flat.shape, dtype=bool)
        written[keys] = True
        if reduce == "sum":
            ga, gs_vals = g_flat if incl else xp.where(written, 0, g_flat), g_flat[flat]
        elif reduce == "mean":
            gm = xp.where(written, g_flat / xp.maximum(ctx.count, 1).astype(g.dtype), g_flat)
            ga, gs_vals = (gm if incl else xp.where(written, 0, gm)), gm[flat]
        elif reduce == "prod":
            ga, gs_vals = _prod_grads(xp, ctx, g_flat, written)
        else:
            res = ctx.out.reshape(-1)
            # as PyTorch's: self's element counts among the ties even with include_self=False (its gradient is 0)
            a_hit = written & (ctx.a.reshape(-1) == res)
            s_hit = _block_of(ctx).ravel() == res[flat]
            n_eq = a_hit.astype(g.dtype)
            index_add(n_eq, flat, s_hit.astype(g.dtype))
            share = g_flat / xp.maximum(n_eq, 1)
            ga = xp.where(written, xp.where(a_hit & incl, share, 0), g_flat)
            gs_vals = xp.where(s_hit, share[flat], 0)
        gs = None
        if ctx.needs_input_grad[2]:
            gs = xp.zeros(ctx.src.shape, dtype=g.dtype)
            gs[tuple(slice(0, n) for n in ctx.ishape)] = gs_vals.reshape(ctx.ishape)
        return ga.reshape(g.shape), None, gs, None, None, None


def _block_of(ctx):
    return ctx.src[tuple(slice(0, n) for n in ctx.ishape)]


def _prod_grads(xp, ctx, g_flat, written):
    """prod's gradients: each contributor gets g times the product of the others of its destination, computed from
    the destination's count of zeros and product of its non-zero contributors (no division by zero)."""
    a, flat, incl = ctx.a.reshape(-1), ctx.flat, ctx.include_self
    s = _block_of(ctx).ravel()
    zeros = xp.zeros(a.shape, dtype=np.int64)
    index_add(zeros, flat, (s == 0).astype(np.int64))
    nz = xp.ones(a.shape, dtype=a.dtype)
    keys, p = segment_reduce(flat, xp.where(s == 0, 1, s).astype(a.dtype), "prod", xp)
    nz[keys] = p
    if incl:
        zeros = zeros + (written & (a == 0))
        nz = xp.where(written & (a != 0), nz * a, nz)

    def others(x, at):
        z, q = zeros[at], nz[at]
        return xp.where(x == 0, xp.where(z == 1, q, 0), xp.where(z == 0, q / xp.where(x == 0, 1, x), 0))

    ga = xp.where(written, (g_flat * others(a, slice(None))) if incl else 0, g_flat)
    return ga, g_flat[flat] * others(s, flat)


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
