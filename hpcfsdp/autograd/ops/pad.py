"""Pad family: by a constant (negative widths crop), or by gathering along each dim (reflect, replicate, circular)."""
import numpy as np

from ..._array import index_add
from ..._backend import array_module
from ..function import Op

# The gather form takes, per padded dim, an index array of the source position of every output position;
# its backward scatter-adds the gradient back through the same indices.

__all__ = ["PadConstant", "PadGather", "pad_indices"]


class PadConstant(Op):
    """x padded by ``pads`` = ((lo, hi), ...) for every dim with ``value``; negative widths crop."""

    @staticmethod
    def forward(ctx, x, pads, value):
        xp = array_module(x)
        src, dst, shape = [], [], []
        for n, (lo, hi) in zip(x.shape, pads):
            a, b = max(-lo, 0), n - max(-hi, 0)
            m = max(b - a, 0)
            src.append(slice(a, a + m))
            dst.append(slice(max(lo, 0), max(lo, 0) + m))
            shape.append(n + lo + hi)
        src, dst = tuple(src), tuple(dst)
        out = xp.full(tuple(shape), value, dtype=x.dtype) if value else xp.zeros(tuple(shape), dtype=x.dtype)
        out[dst] = x[src]
        ctx.src, ctx.dst, ctx.shape = src, dst, x.shape
        return out

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        gx = xp.zeros(ctx.shape, dtype=g.dtype)
        gx[ctx.src] = g[ctx.dst]
        return gx, None, None


def pad_indices(n, lo, hi, mode):
    """Source index of each output position of one dim of size n padded by (lo, hi) in ``mode``, as PyTorch."""
    if mode == "circular":  # wraps within the part left after negative widths crop (PyTorch's order)
        start = max(-lo, 0)
        m = n - start - max(-hi, 0)
        return start + np.arange(-max(lo, 0), m + max(hi, 0)) % m
    p = np.arange(-lo, n + hi)
    if mode == "replicate":
        return np.clip(p, 0, n - 1)
    p = np.abs(p)  # reflect: mirror about 0 and about n - 1 (the edge itself is not repeated)
    return np.where(p >= n, 2 * (n - 1) - p, p)


class PadGather(Op):
    """x gathered along each dim in ``index`` ({dim: int64 host array of source positions})."""

    @staticmethod
    def forward(ctx, x, index):
        xp = array_module(x)
        idx = {d: xp.asarray(i) for d, i in index.items()}
        sizes = {}
        for d, i in idx.items():
            sizes[d] = x.shape[d]
            x = xp.take(x, i, axis=d)
        ctx.idx, ctx.sizes = idx, sizes
        return x

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        for d, i in reversed(list(ctx.idx.items())):
            shape = list(g.shape)
            shape[d] = ctx.sizes[d]
            acc = xp.zeros(tuple(shape), dtype=g.dtype)
            index_add(xp.moveaxis(acc, d, 0), i, xp.moveaxis(g, d, 0))
            g = acc
        return g, None
