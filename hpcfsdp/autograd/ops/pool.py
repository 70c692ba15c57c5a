"""Pooling family: max, average, adaptive average and adaptive max pooling over the spatial dims of (N, C, *spatial)."""
import numpy as np

from ..._array import HALF_DTYPES, index_add
from ..._backend import array_module
from ..function import Op
from ._common import _apply_along, _taps
from .conv import pad_zeros, tap_slices

# Max and average pooling loop over the kernel taps as the convolution does (See [Note: im2col by kernel
# offsets] in conv.py): each tap reads one strided slice of the padded input, so no window array is
# built. Adaptive average pooling is linear and separable: one (out, in) averaging matrix per spatial dim.

__all__ = ["MaxPoolNd", "AvgPoolNd", "AdaptiveAvgPoolNd", "AdaptiveMaxPoolNd", "avg_divisor", "adaptive_matrix",
           "adaptive_windows"]


_ALL2 = (slice(None), slice(None))


def _extra_hi(in_size, out_size, ks, stride, dilation, pads):
    """Padding so that every window of ``out_size`` outputs fits (ceil_mode windows may hang past ``pads``)."""
    res = []
    for n, o, k, s, d, (lo, hi) in zip(in_size, out_size, ks, stride, dilation, pads):
        need = (o - 1) * s + d * (k - 1) + 1
        res.append((lo, max(need - lo - n, 0)))
    return tuple(res)


def _first_inside(out_size, ks, stride, dilation, pads):
    """(*out) host array: the flat index of each window's first tap that lies inside the input."""
    first = np.zeros((), dtype=np.int64)
    for o, k, s, d, (lo, _) in zip(out_size, ks, stride, dilation, pads):
        start = np.arange(o) * s - lo
        first = first[..., None] * k + np.maximum(0, -(start // d))  # ceil(-start / d) where start < 0
    return first


def _lowest(dt):
    return -np.inf if dt.kind == "f" or dt in HALF_DTYPES else np.iinfo(dt).min


class MaxPoolNd(Op):
    """Max over each window; ties and NaN follow PyTorch's CPU kernel (the first maximum, the last NaN).

    Returns out, or (out, indices) with ``return_indices``: indices are flat positions in the unpadded
    spatial plane of each (n, c), int64.
    """

    @staticmethod
    def forward(ctx, x, ks, stride, pads, dilation, out_size, return_indices=False):
        xp = array_module(x)
        nd = len(ks)
        pads = _extra_hi(x.shape[2:], out_size, ks, stride, dilation, pads)
        xpad = pad_zeros(x, pads, _lowest(x.dtype))
        floating = x.dtype.kind == "f" or x.dtype in HALF_DTYPES
        arg_dt = np.int8 if np.prod(ks) < 128 else np.int32
        out = arg = None
        if any(lo for lo, _ in pads):
            # Windows may start in the padding: as PyTorch, start from -inf at the window's first tap inside
            # the input, so that padding is never selected (a window of -inf inputs points at that tap).
            out = xp.full(x.shape[:2] + tuple(out_size), _lowest(x.dtype), dtype=x.dtype)
            arg = xp.empty(out.shape, dtype=arg_dt)
            arg[...] = xp.asarray(_first_inside(out_size, ks, stride, dilation, pads).astype(arg_dt))
        for t, offs in enumerate(_taps(ks)):
            win = xpad[_ALL2 + tap_slices(offs, out_size, stride, dilation)]
            if out is None:
                out = win.copy()
                arg = xp.zeros(out.shape, dtype=arg_dt)
                continue
            take = win > out
            if floating:
                take |= xp.isnan(win)
            xp.copyto(out, win, where=take)
            xp.copyto(arg, t, where=take)
        ctx.arg, ctx.geom = arg, (x.shape, xpad.shape, pads, ks, stride, dilation, out_size)
        if not return_indices:
            return out
        # flat input index of each maximum: coordinate along dim i = o_i * s_i - lo_i + tap_i * d_i
        flat = xp.zeros(out.shape, dtype=np.int64)
        rem = arg.astype(np.int64)
        taps = []
        for k in reversed(ks):
            taps.append(rem % k)
            rem //= k
        taps.reverse()
        plane = 1
        for i in reversed(range(nd)):
            shape = [1] * (nd + 2)
            shape[2 + i] = out_size[i]
            base = (xp.arange(out_size[i], dtype=np.int64) * stride[i] - pads[i][0]).reshape(shape)
            flat += (base + taps[i] * dilation[i]) * plane
            plane *= x.shape[2 + i]
        return out, flat

    @staticmethod
    def backward(ctx, g, _gidx=None):
        xshape, pshape, pads, ks, stride, dilation, out_size = ctx.geom
        xp = array_module(g)
        gpad = xp.zeros(pshape, dtype=g.dtype)
        zero = g.dtype.type(0)
        for t, offs in enumerate(_taps(ks)):
            gpad[_ALL2 + tap_slices(offs, out_size, stride, dilation)] += xp.where(ctx.arg == t, g, zero)
        inner = _ALL2 + tuple(slice(lo, lo + n) for n, (lo, _) in zip(xshape[2:], pads))
        return xp.ascontiguousarray(gpad[inner]), None, None, None, None, None, None


def avg_divisor(in_size, out_size, ks, stride, pads, count_include_pad, xp, dtype):
    """Per-output-position divisor of average pooling, broadcastable to (N, C, *out), as PyTorch computes it.

    A window covers [o*s - lo, o*s - lo + k) clipped to the padded extent [-lo, n + lo); with
    count_include_pad=False it is clipped to the input [0, n) instead.
    """
    div = None
    nd = len(ks)
    for i, (n, o, k, s, (lo, _)) in enumerate(zip(in_size, out_size, ks, stride, pads)):
        start = np.arange(o) * s - lo
        end = np.minimum(start + k, n + lo)
        if not count_include_pad:
            start, end = np.maximum(start, 0), np.minimum(end, n)
        shape = [1] * nd
        shape[i] = o
        cnt = (end - start).reshape(shape)
        div = cnt if div is None else div * cnt
    return xp.asarray(div.astype(dtype))


class AvgPoolNd(Op):
    """Mean over each window (zero padding; ``div`` is the per-position divisor, or a number)."""

    @staticmethod
    def forward(ctx, x, ks, stride, pads, out_size, div):
        dt = x.dtype
        up = dt in HALF_DTYPES and array_module(x) is np
        if up:
            x = x.astype(np.float32)
        pads = _extra_hi(x.shape[2:], out_size, ks, stride, (1,) * len(ks), pads)
        xpad = pad_zeros(x, pads)
        out = None
        for offs in _taps(ks):
            win = xpad[_ALL2 + tap_slices(offs, out_size, stride, (1,) * len(ks))]
            if out is None:
                out = win.copy()
            else:
                out += win
        if not isinstance(div, (int, float)):
            div = div.astype(out.dtype, copy=False)
        out /= div
        ctx.div, ctx.geom = div, (x.shape, xpad.shape, pads, ks, stride, out_size, dt)
        return out.astype(dt) if up else out

    @staticmethod
    def backward(ctx, g):
        xshape, pshape, pads, ks, stride, out_size, dt = ctx.geom
        xp = array_module(g)
        gd = g.astype(np.float32) if dt in HALF_DTYPES and xp is np else g
        gd = gd / ctx.div
        gpad = xp.zeros(pshape, dtype=gd.dtype)
        for offs in _taps(ks):
            gpad[_ALL2 + tap_slices(offs, out_size, stride, (1,) * len(ks))] += gd
        inner = _ALL2 + tuple(slice(lo, lo + n) for n, (lo, _) in zip(xshape[2:], pads))
        return xp.ascontiguousarray(gpad[inner]).astype(dt, copy=False), None, None, None, None, None


# -- adaptive ------------------------------------------------------------------------------------------------
def adaptive_matrix(n, o, dtype):
    """(o, n) averaging matrix of adaptive pooling: row i averages [floor(i n / o), ceil((i + 1) n / o))."""
    a = np.zeros((o, n), dtype=np.float64)
    for i in range(o):
        lo, hi = (i * n) // o, -((-(i + 1) * n) // o)
        a[i, lo:hi] = 1.0 / (hi - lo)
    return a.astype(dtype)


class AdaptiveAvgPoolNd(Op):
    """Adaptive average pooling as one averaging matrix per spatial dim (None where the size is unchanged)."""

    @staticmethod
    def forward(ctx, x, out_size):
        xp = array_module(x)
        mats = [None if o == n else xp.asarray(adaptive_matrix(n, o, np.float32 if x.dtype in HALF_DTYPES
                                                                   else x.dtype))
                for n, o in zip(x.shape[2:], out_size)]
        ctx.mats, ctx.dt = mats, x.dtype
        return xp.ascontiguousarray(_apply_along(x, mats, False).astype(x.dtype, copy=False))

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        return xp.ascontiguousarray(_apply_along(g, ctx.mats, True).astype(ctx.dt, copy=False)), None


def adaptive_windows(n, o):
    """(o, K) int64 host array: the positions of window i = [floor(i n / o), ceil((i + 1) n / o)), each row padded
    to the longest window's length K by repeating its last position."""
    lo = (np.arange(o) * n) // o
    hi = -((-(np.arange(o) + 1) * n) // o)
    k = int((hi - lo).max())
    return np.minimum(lo[:, None] + np.arange(k)[None, :], hi[:, None] - 1)


# Adaptive max pooling gathers each output's window (clamped to a common length by repeating its last
# position, which never changes a max) and then runs max pooling's tap loop over it.
class AdaptiveMaxPoolNd(Op):
    """Max over adaptive windows of x (N, C, *spatial) -> (N, C, *out_size), and int64 flat input indices of the
    maxima with ``return_indices``. Ties and NaN as max pooling: the first maximum, the last NaN."""

    @staticmethod
    def forward(ctx, x, out_size, return_indices=False):
        xp = array_module(x)
        nd = len(out_size)
        n, c = x.shape[:2]
        spatial = x.shape[2:]
        wins = [adaptive_windows(s, o) for s, o in zip(spatial, out_size)]
        win = x
        for i, idx in enumerate(wins):  # (N, C, o1, K1, ..., o_i, K_i, s_{i+1}, ...)
            ax = 2 + 2 * i
            win = xp.take(win, xp.asarray(idx.ravel()), axis=ax).reshape(win.shape[:ax] + idx.shape + win.shape[ax + 1:])
        perm = (0, 1) + tuple(2 + 2 * i for i in range(nd)) + tuple(3 + 2 * i for i in range(nd))
        ks = tuple(w.shape[1] for w in wins)
        win = win.transpose(perm).reshape((n, c) + tuple(out_size) + (-1,))  # (N, C, *out, K1 * K2 * ...)
        floating = x.dtype.kind == "f" or x.dtype in HALF_DTYPES
        out = win[..., 0].copy()
        arg = xp.zeros(out.shape, dtype=np.int32)
        for t in range(1, win.shape[-1]):
            w = win[..., t]
            take = w > out
            if floating:
                take |= xp.isnan(w)
            xp.copyto(out, w, where=take)
            xp.copyto(arg, t, where=take)
        # flat input index: tap t -> (t_1, ..., t_nd) -> coordinate wins[i][o_i, t_i] along dim i
        flat = xp.zeros(out.shape, dtype=np.int64)
        rem = arg.astype(np.int64)
        taps = []
        for k in reversed(ks):
            taps.append(rem % k)
            rem //= k
        taps.reverse()
        for i in range(nd):
            shape = [1] * (nd + 2)
            shape[2 + i] = out_size[i]
            rows = xp.arange(out_size[i], dtype=np.int64).reshape(shape)
            coord = xp.asarray(wins[i])[rows, taps[i]]
            flat = flat * spatial[i] + coord
        ctx.flat, ctx.xshape = flat, x.shape
        return (out, flat) if return_indices else out

    @staticmethod
    def backward(ctx, g, _gidx=None):
        xp = array_module(g)
        xshape, flat = ctx.xshape, ctx.flat
        nc = xshape[0] * xshape[1]
        plane = int(np.prod(xshape[2:]))
        gx = xp.zeros(nc * plane, dtype=g.dtype)
        base = (xp.arange(nc, dtype=np.int64) * plane).reshape(xshape[:2] + (1,) * (flat.ndim - 2))
        index_add(gx, (flat + base).ravel(), xp.ascontiguousarray(g).ravel())
        return gx.reshape(xshape), None, None
