"""Shape family: reshape, permute, expand, split, cat, stack, roll, flip, repeat, diagonals; clone, casts, moves."""
import numpy as np

from ... import _backend
from ..._array import sum_to
from ..._backend import array_module
from ..function import Op

__all__ = ["Reshape", "Permute", "Expand", "Split", "Cat", "Stack", "Roll", "Flip", "Repeat", "Diagonal",
           "DiagEmbed", "Clone", "Contiguous", "Cast", "ToDevice"]


# -- views where the array library gives them ----------------------------------------------------------------
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


# -- joins, rolls, flips, repeats and diagonals (copies) -----------------------------------------------------
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


class Roll(Op):
    @staticmethod
    def forward(ctx, a, shifts, dims):
        ctx.shifts, ctx.dims = shifts, dims
        return array_module(a).roll(a, shifts, dims)

    @staticmethod
    def backward(ctx, g):
        return array_module(g).roll(g, tuple(-s for s in ctx.shifts), ctx.dims), None, None


class Flip(Op):
    """flip along ``dims``: a copy, as PyTorch's (a view would let writes to the result reach the input)."""

    @staticmethod
    def forward(ctx, a, dims):
        ctx.dims = dims
        xp = array_module(a)
        return xp.ascontiguousarray(xp.flip(a, dims))

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        return xp.ascontiguousarray(xp.flip(g, ctx.dims)), None


class Repeat(Op):
    """Tensor.repeat(*reps) (len(reps) >= ndim): tile; the gradient sums the copies."""

    @staticmethod
    def forward(ctx, a, reps):
        xp = array_module(a)
        shape = (1,) * (len(reps) - a.ndim) + a.shape
        ctx.shape, ctx.full, ctx.reps = a.shape, shape, reps
        return xp.tile(a.reshape(shape), reps)

    @staticmethod
    def backward(ctx, g):
        split = []
        for r, s in zip(ctx.reps, ctx.full):
            split += [r, s]
        return g.reshape(split).sum(axis=tuple(range(0, len(split), 2))).reshape(ctx.shape), None


def _diag_index(n_rows, n_cols, offset, xp):
    """(rows, cols) of the ``offset`` diagonal of an n_rows x n_cols matrix."""
    k = max(0, min(n_rows + min(offset, 0), n_cols - max(offset, 0)))
    i = xp.arange(k)
    return i - min(offset, 0), i + max(offset, 0)


class Diagonal(Op):
    """diagonal(offset, dim1, dim2): the diagonal as the last dim (a copy); the gradient fills it back in."""

    @staticmethod
    def forward(ctx, a, offset, d1, d2):
        ctx.shape, ctx.offset, ctx.d1, ctx.d2 = a.shape, offset, d1, d2
        return array_module(a).diagonal(a, offset, d1, d2).copy()

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        out = xp.zeros(ctx.shape, dtype=g.dtype)
        moved = xp.moveaxis(out, (ctx.d1, ctx.d2), (-2, -1))  # a view: writes land in out
        rows, cols = _diag_index(moved.shape[-2], moved.shape[-1], ctx.offset, xp)
        moved[..., rows, cols] = g
        return out, None, None, None


class DiagEmbed(Op):
    """diag(v, offset) of a vector: a square matrix with v on the ``offset`` diagonal."""

    @staticmethod
    def forward(ctx, v, offset):
        xp = array_module(v)
        n = v.shape[0] + abs(offset)
        ctx.offset = offset
        out = xp.zeros((n, n), dtype=v.dtype)
        rows, cols = _diag_index(n, n, offset, xp)
        out[rows, cols] = v
        return out

    @staticmethod
    def backward(ctx, g):
        return array_module(g).diagonal(g, ctx.offset).copy(), None


# -- clone, casts and device moves ---------------------------------------------------------------------------
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
