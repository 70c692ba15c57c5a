"""Shape primitives on raw arrays (views where the array library gives them), cat/stack/where, casts.

Part of the primitive set of ops.py (See its docstring), which re-exports them.
"""
import numpy as np

from .. import _backend
from .._array import index_add, shape_of, sum_to
from .._backend import array_module
from .function import Op

__all__ = ["Reshape", "Permute", "Expand", "GetItem", "Split", "Cat", "Stack", "Where", "MaskedFill", "Clone",
           "Contiguous", "Cast", "ToDevice", "index_add"]


# -- shape ops (views where the array library gives them) ---------------------------------------------
class Reshape(Op):
    @staticmethod
    def forward(ctx, a, shape):
        ctx.shape = a.shape
        return a.reshape(shape)

    @staticmethod
    def backward(ctx, g):
        return g.reshape(ctx.shape), None


class Permute(Op):
    @staticmethod
    def forward(ctx, a, dims):
        ctx.dims = dims
        return a.transpose(dims)

    @staticmethod
    def backward(ctx, g):
        return g.transpose(tuple(np.argsort(ctx.dims))), None


class Expand(Op):
    @staticmethod
    def forward(ctx, a, shape):
        ctx.shape = a.shape
        return array_module(a).broadcast_to(a, shape)

    @staticmethod
    def backward(ctx, g):
        return sum_to(g, ctx.shape), None


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


class Split(Op):
    """Split along dim at the given section sizes: several outputs, each a view."""

    @staticmethod
    def forward(ctx, a, sizes, dim):
        xp = array_module(a)
        bounds = np.cumsum(sizes)[:-1].tolist()
        ctx.shape, ctx.dim, ctx.sizes = a.shape, dim, sizes
        return tuple(xp.split(a, bounds, axis=dim))

    @staticmethod
    def backward(ctx, *grads):
        ref = next(g for g in grads if g is not None)
        xp = array_module(ref)
        parts = []
        for g, s in zip(grads, ctx.sizes):
            if g is None:
                shp = list(ctx.shape)
                shp[ctx.dim] = s
                g = xp.zeros(shp, dtype=ref.dtype)
            parts.append(g)
        return xp.concatenate(parts, axis=ctx.dim), None, None


class Cat(Op):
    @staticmethod
    def forward(ctx, dim, *arrays):
        ctx.dim = dim
        ctx.sizes = [a.shape[dim] for a in arrays]
        return array_module(arrays[0]).concatenate(arrays, axis=dim)

    @staticmethod
    def backward(ctx, g):
        bounds = np.cumsum(ctx.sizes)[:-1].tolist()
        return (None,) + tuple(array_module(g).split(g, bounds, axis=ctx.dim))


class Stack(Op):
    @staticmethod
    def forward(ctx, dim, *arrays):
        ctx.dim = dim
        return array_module(arrays[0]).stack(arrays, axis=dim)

    @staticmethod
    def backward(ctx, g):
        g = array_module(g).moveaxis(g, ctx.dim, 0)
        return (None,) + tuple(g[i] for i in range(g.shape[0]))


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


class Clone(Op):
    @staticmethod
    def forward(ctx, a):
        if _backend.is_meta_array(a):
            return a
        return a.copy()

    @staticmethod
    def backward(ctx, g):
        return g


class Contiguous(Op):
    @staticmethod
    def forward(ctx, a):
        return array_module(a).ascontiguousarray(a)

    @staticmethod
    def backward(ctx, g):
        return g


class Cast(Op):
    @staticmethod
    def forward(ctx, a, dtype):
        ctx.src = a.dtype
        if _backend.is_meta_array(a):
            return _backend.meta_array(a.shape, dtype)
        return a.astype(dtype)

    @staticmethod
    def backward(ctx, g):
        return g.astype(ctx.src), None


class ToDevice(Op):
    @staticmethod
    def forward(ctx, a, dev):
        src = _backend.device_of_array(a)
        ctx.src = src
        return _move(a, src, dev)

    @staticmethod
    def backward(ctx, g):
        return _move(g, _backend.device_of_array(g), ctx.src), None


def _move(a, src, dev):
    if dev.type == "meta":
        return _backend.meta_array(a.shape, a.dtype)
    if src.type == "meta":
        raise NotImplementedError(f"Cannot copy out of meta tensor; use to_empty() / hp.empty_like on {dev}")
    if dev.type == "cpu":
        return _backend.to_numpy(a) if src.type == "cuda" else a
    cp = _backend.array_module(dev)
    with cp.cuda.Device(dev.index):
        return cp.asarray(a)
