"""Transposed convolution (1-, 2- and 3-d): the adjoint of ConvNd, one batched GEMM plus col2im.

[Note: Transposed convolution as the convolution's input gradient]
conv_transpose(x, w) is the gradient of conv(., w) with respect to its input, applied to x. The forward is
therefore ConvNd's input-gradient path (See [Note: im2col by kernel offsets] in ops_conv.py): one batched
GEMM of the transposed weight (groups, C_out/g * K, C_in/g) by x laid out (groups, C_in/g, N * L_in) gives
columns (C_out, *kernel, N, *in); each tap's rows are added into the strided slice of a "padded output"
of size (L_in - 1) s + d (k - 1) + 1 + output_padding, and the result is that buffer cropped by
``padding`` on each side. Its backward is ConvNd's forward: im2col of the zero-padded output gradient,
then a GEMM by the weight for the input gradient and a GEMM against x for the weight gradient.
"""
import itertools

import numpy as np

from .._array import HALF_DTYPES, array_matmul
from .._backend import array_module
from .function import Op
from .ops_conv import pad_zeros, tap_slices

__all__ = ["ConvTransposeNd"]


def _taps(ks):
    return itertools.product(*(range(k) for k in ks))


class ConvTransposeNd(Op):
    """Transposed convolution of x (N, C_in, *in) by w (C_in, C_out/groups, *kernel) plus bias b (C_out,) or None.

    ``padding`` and ``output_padding`` are tuples; the output size along each dim is
    (in - 1) stride - 2 padding + dilation (k - 1) + output_padding + 1.
    See [Note: Transposed convolution as the convolution's input gradient].
    """

    @staticmethod
    def forward(ctx, x, w, b, stride, padding, output_padding, dilation, groups):
        xp = array_module(x)
        dt = x.dtype
        if dt in HALF_DTYPES and xp is np:
            x, w = x.astype(np.float32), w.astype(np.float32)
            b = b.astype(np.float32) if b is not None else None
        n, c = x.shape[:2]
        in_size, ks = x.shape[2:], w.shape[2:]
        o = w.shape[1] * groups
        kk = int(np.prod(ks))
        length = n * int(np.prod(in_size))
        full = tuple((i - 1) * s + d * (k - 1) + 1 + op
                     for i, k, s, d, op in zip(in_size, ks, stride, dilation, output_padding))
        x2 = xp.ascontiguousarray(x.reshape(n, c, -1).swapaxes(0, 1)).reshape(groups, c // groups, length)
        wg = w.reshape(groups, c // groups, o // groups * kk)
        cols = array_matmul(wg.swapaxes(1, 2), x2).reshape((o,) + ks + (n,) + in_size)  # (O, *kernel, N, *in)
        ypad = xp.zeros((n, o) + full, dtype=x.dtype)
        for offs in _taps(ks):
            ypad[(slice(None), slice(None)) + tap_slices(offs, in_size, stride, dilation)] += \
                cols[(slice(None),) + offs].swapaxes(0, 1)
        inner = (slice(None), slice(None)) + tuple(slice(p, f - p) for p, f in zip(padding, full))
        y = xp.ascontiguousarray(ypad[inner])
        if b is not None:
            y += b.reshape((1, o) + (1,) * len(ks))
        ctx.x2, ctx.w, ctx.has_b = x2, w, b is not None
        ctx.geom = (x.shape, full, padding, stride, dilation, groups, dt)
        return y.astype(dt, copy=False)

    @staticmethod
    def backward(ctx, g):
        x2, w = ctx.x2, ctx.w
        xshape, full, padding, stride, dilation, groups, dt = ctx.geom
        nx, nw, nb = ctx.needs_input_grad[:3]
        xp = array_module(g)
        if g.dtype != x2.dtype:
            g = g.astype(x2.dtype)
        n, c = xshape[:2]
        in_size, ks = xshape[2:], w.shape[2:]
        o = g.shape[1]
        gb = g.sum(axis=(0,) + tuple(range(2, g.ndim))).astype(dt, copy=False) if nb and ctx.has_b else None
        gx = gw = None
        if nx or nw:
            gpad = pad_zeros(g, tuple((p, f - g.shape[2 + i] - p) for i, (p, f) in enumerate(zip(padding, full))))
            cols = xp.empty((o,) + ks + (n,) + in_size, dtype=g.dtype)  # im2col, as ConvNd's forward
            for offs in _taps(ks):
                view = gpad[(slice(None), slice(None)) + tap_slices(offs, in_size, stride, dilation)]
                cols[(slice(None),) + offs] = view.swapaxes(0, 1)
            cols = cols.reshape(groups, o // groups * int(np.prod(ks)), -1)  # (groups, O/g * K, N * L_in)
            if nx:
                wg = w.reshape(groups, c // groups, -1)
                gx2 = array_matmul(wg, cols).reshape((c, n) + in_size)  # (C_in, N, *in)
                gx = xp.ascontiguousarray(gx2.swapaxes(0, 1)).astype(dt, copy=False)
            if nw:
                gw = array_matmul(x2, cols.swapaxes(1, 2)).reshape(w.shape).astype(dt, copy=False)
        return gx, gw, gb, None, None, None, None, None
