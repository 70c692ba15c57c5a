"""Sliding-window extraction and its adjoint: Im2Col (nn.functional.unfold) and Col2Im (nn.functional.fold), one the
backward of the other. See [Note: im2col by kernel offsets] in conv.py: one strided copy per kernel tap."""
import numpy as np

from ..._backend import array_module
from ..function import Op
from ._common import _taps
from .conv import _crop, pad_zeros, tap_slices

__all__ = ["Im2Col", "Col2Im", "im2col", "col2im"]


def im2col(x, ks, pads, stride, dilation, out_size):
    """x (N, C, *spatial) -> columns (N, C * K, L): row c * K + k holds tap k's strided slice of the padded x."""
    xp = array_module(x)
    n, c = x.shape[:2]
    xpad = pad_zeros(x, pads)
    cols = xp.empty((n, c) + tuple(ks) + tuple(out_size), dtype=x.dtype)  # (N, C, *kernel, *out)
    for offs in _taps(ks):
        cols[(slice(None), slice(None)) + offs] = xpad[(slice(None), slice(None)) +
                                                       tap_slices(offs, out_size, stride, dilation)]
    return cols.reshape(n, c * int(np.prod(ks)), int(np.prod(out_size)))


def col2im(cols, shape, ks, pads, stride, dilation, out_size):
    """The adjoint of im2col: columns (N, C * K, L) summed into (N, C, *spatial) of ``shape``."""
    xp = array_module(cols)
    n, c = shape[:2]
    cols = cols.reshape((n, c) + tuple(ks) + tuple(out_size))
    gpad = xp.zeros((n, c) + tuple(s + lo + hi for s, (lo, hi) in zip(shape[2:], pads)), dtype=cols.dtype)
    for offs in _taps(ks):  # overlapping windows of different taps add up across iterations
        gpad[(slice(None), slice(None)) + tap_slices(offs, out_size, stride, dilation)] += \
            cols[(slice(None), slice(None)) + offs]
    return xp.ascontiguousarray(_crop(gpad, pads, shape))


class Im2Col(Op):
    """Sliding blocks of x (N, C, *spatial) as columns (N, C * K, L); ``pads`` ((lo, hi), ...)."""

    @staticmethod
    def forward(ctx, x, ks, pads, stride, dilation, out_size):
        ctx.geom = (x.shape, ks, pads, stride, dilation, out_size)
        return im2col(x, ks, pads, stride, dilation, out_size)

    @staticmethod
    def backward(ctx, g):
        return (col2im(g, *ctx.geom),) + (None,) * 5


class Col2Im(Op):
    """Columns (N, C * K, L) summed into x (N, C, *spatial) of ``shape``: the adjoint of Im2Col."""

    @staticmethod
    def forward(ctx, cols, shape, ks, pads, stride, dilation, out_size):
        ctx.geom = (ks, pads, stride, dilation, out_size)
        return col2im(cols, shape, ks, pads, stride, dilation, out_size)

    @staticmethod
    def backward(ctx, g):
        return (im2col(g, *ctx.geom),) + (None,) * 6
