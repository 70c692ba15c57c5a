"""Convolution family: N-d convolution as im2col + one batched GEMM (backward through col2im), and its transpose."""
import numpy as np

from ..._array import HALF_DTYPES, array_matmul
from ..._backend import array_module
from ..function import Op
from ._common import _taps

__all__ = ["ConvNd", "ConvTransposeNd", "tap_slices", "pad_zeros"]


def tap_slices(offsets, out_size, stride, dilation):
    """The strided slices of the padded spatial dims that kernel tap ``offsets`` reads for ``out_size`` outputs."""
    return tuple(slice(o * d, o * d + s * (n - 1) + 1, s) for o, n, s, d in zip(offsets, out_size, stride, dilation))


def pad_zeros(x, pads, value=0):
    """x (N, C, *spatial) padded with ``value`` by ``pads`` = ((lo, hi), ...) per spatial dim (x itself if none)."""
    if not any(lo or hi for lo, hi in pads):
        return x
    xp = array_module(x)
    shape = x.shape[:2] + tuple(n + lo + hi for n, (lo, hi) in zip(x.shape[2:], pads))
    out = xp.full(shape, value, dtype=x.dtype) if value else xp.zeros(shape, dtype=x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(lo, lo + n) for n, (lo, _) in zip(x.shape[2:], pads))] = x
    return out


def _crop(gpad, pads, shape):
    if not any(lo or hi for lo, hi in pads):
        return gpad
    inner = (slice(None), slice(None)) + tuple(slice(lo, lo + n) for n, (lo, _) in zip(shape[2:], pads))
    return array_module(gpad).ascontiguousarray(gpad[inner])


# [Note: im2col by kernel offsets]
# For a kernel of K = k1 * k2 * ... taps, the column matrix holds, for every tap (i1, i2, ...), the strided
# slice of the padded input that tap reads: ``xpad[:, :, i1*d1 : i1*d1 + s1*(o1-1) + 1 : s1, ...]``. One
# copy per tap fills it (K strided copies, no index arrays), which works the same on NumPy and CuPy. The
# columns are laid out (C, k1, k2, ..., N, o1, o2, ...) so that, with C = groups * C/g outermost, they reshape
# without a copy to (groups, C/g * K, N * L) (L = o1 * o2 * ...): the forward is one batched GEMM of the
# weight (groups, O/g, C/g * K) by it, the weight gradient one GEMM against its transpose, and the column
# gradient one GEMM of the transposed weight by the output gradient. col2im is the forward loop run
# backwards: each tap's slice of the padded input gradient += its rows of the column gradient (for one tap
# the slice positions are distinct, so plain += is exact; overlapping windows of different taps add up
# across iterations).
class ConvNd(Op):
    """Cross-correlation of x (N, C, *spatial) with w (O, C/groups, *kernel) plus bias b (O,) or None.

    ``pads`` is ((lo, hi), ...) zero padding per spatial dim; ``stride`` and ``dilation`` are tuples.
    See [Note: im2col by kernel offsets]. Half precision on NumPy is computed in float32.
    """

    @staticmethod
    def forward(ctx, x, w, b, stride, pads, dilation, groups):
        xp = array_module(x)
        dt = x.dtype
        up = dt in HALF_DTYPES and xp is np
        if up:
            x, w = x.astype(np.float32), w.astype(np.float32)
            b = b.astype(np.float32) if b is not None else None
        n, c = x.shape[:2]
        o, ks = w.shape[0], w.shape[2:]
        xpad = pad_zeros(x, pads)
        out_size = tuple((p - d * (k - 1) - 1) // s + 1 for p, k, s, d in zip(xpad.shape[2:], ks, stride, dilation))
        cols = xp.empty((c,) + ks + (n,) + out_size, dtype=x.dtype)  # (C, *kernel, N, *out)
        for offs in _taps(ks):
            view = xpad[(slice(None), slice(None)) + tap_slices(offs, out_size, stride, dilation)]
            cols[(slice(None),) + offs] = view.swapaxes(0, 1)
        kk = int(np.prod(ks))
        length = n * int(np.prod(out_size))
        cols = cols.reshape(groups, c // groups * kk, length)
        wg = w.reshape(groups, o // groups, c // groups * kk)
        out = array_matmul(wg, cols).reshape(o, length)  # (O, N * L)
        if b is not None:
            out += b[:, None]
        out = xp.ascontiguousarray(out.reshape((o, n) + out_size).swapaxes(0, 1))  # (N, O, *out)
        ctx.cols, ctx.w, ctx.has_b = cols, w, b is not None
        ctx.geom = (x.shape, xpad.shape, pads, stride, dilation, groups, out_size, dt)
        return out.astype(dt) if up else out

    @staticmethod
    def backward(ctx, g):
        cols, w = ctx.cols, ctx.w
        xshape, pshape, pads, stride, dilation, groups, out_size, dt = ctx.geom
        nx, nw, nb = ctx.needs_input_grad[:3]
        xp = array_module(cols)
        if g.dtype != cols.dtype:
            g = g.astype(cols.dtype)
        n, c = xshape[:2]
        o, ks = w.shape[0], w.shape[2:]
        length = cols.shape[-1]
        # (N, O, *out) -> (groups, O/g, N * L)
        g2 = xp.ascontiguousarray(g.reshape(n, o, -1).swapaxes(0, 1)).reshape(groups, o // groups, length)
        gx = gw = gb = None
        if nb and ctx.has_b:
            gb = g2.reshape(o, length).sum(axis=1).astype(dt, copy=False)
        if nw:
            gw = array_matmul(g2, cols.swapaxes(1, 2)).reshape(w.shape).astype(dt, copy=False)
        if nx:
            wg = w.reshape(groups, o // groups, -1)
            gcols = array_matmul(wg.swapaxes(1, 2), g2).reshape((c,) + ks + (n,) + out_size)
            gpad = xp.zeros(pshape, dtype=cols.dtype)
            for offs in _taps(ks):
                sl = (slice(None), slice(None)) + tap_slices(offs, out_size, stride, dilation)
                gpad[sl] += gcols[(slice(None),) + offs].swapaxes(0, 1)
            gx = _crop(gpad, pads, xshape).astype(dt, copy=False)
        return gx, gw, gb, None, None, None, None


# -- transposed ----------------------------------------------------------------------------------------------
# [Note: Transposed convolution as the convolution's input gradient]
# conv_transpose(x, w) is the gradient of conv(., w) with respect to its input, applied to x. The forward is
# therefore ConvNd's input-gradient path (See [Note: im2col by kernel offsets] above): one batched
# GEMM of the transposed weight (groups, C_out/g * K, C_in/g) by x laid out (groups, C_in/g, N * L_in) gives
# columns (C_out, *kernel, N, *in); each tap's rows are added into the strided slice of a "padded output"
# of size (L_in - 1) s + d (k - 1) + 1 + output_padding, and the result is that buffer cropped by
# ``padding`` on each side. Its backward is ConvNd's forward: im2col of the zero-padded output gradient,
# then a GEMM by the weight for the input gradient and a GEMM against x for the weight gradient.
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
