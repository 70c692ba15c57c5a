"""Resampling of the spatial dims of (N, C, *spatial): separable linear interpolation, adaptive max pooling.

[Note: Separable resampling]
Linear (bilinear, trilinear) interpolation is linear in the input and acts on each spatial dim separately:
it is one (out, in) matrix per dim, each row holding the two weights (1 - lambda, lambda) of the source
positions i0 and i1, applied as a batched matmul along that dim; the backward applies the transposes.
Nearest-neighbour modes are a gather along each dim (``ops_pad.PadGather``). The index and weight formulas
are PyTorch's CPU kernels' (``area_pixel_compute_source_index``, ``nearest_idx``), so the outputs match
PyTorch's. Adaptive max pooling gathers each output's window (clamped to a common length by repeating
its last position, which never changes a max) and then runs max pooling's tap loop over it.
"""
import numpy as np

from .._array import HALF_DTYPES, array_matmul, index_add
from .._backend import array_module
from .function import Op

__all__ = ["ResampleLinear", "AdaptiveMaxPoolNd", "linear_weights", "nearest_index", "adaptive_windows"]


def _scale(n_in, n_out, scale_factor):
    """PyTorch's compute_scales_value: 1 / scale_factor when one is given (and positive), else n_in / n_out."""
    return 1.0 / scale_factor if scale_factor is not None and scale_factor > 0 else n_in / n_out


def nearest_index(n_in, n_out, scale_factor, exact):
    """int64 host array: the source position of each of ``n_out`` outputs ('nearest' or 'nearest-exact').

    Computed in float32, as PyTorch's CPU kernel, so that positions on a boundary round the same way.
    """
    dst = np.arange(n_out, dtype=np.float32)
    if not exact:
        if n_out == n_in:
            return np.arange(n_out, dtype=np.int64)
        if n_out == 2 * n_in:
            return np.arange(n_out, dtype=np.int64) >> 1
    scale = np.float32(_scale(n_in, n_out, scale_factor))
    src = np.floor((dst + np.float32(0.5)) * scale if exact else dst * scale).astype(np.int64)
    return np.minimum(src, n_in - 1)


def linear_weights(n_in, n_out, align_corners, scale_factor):
    """(n_out, n_in) float64 host matrix of linear interpolation (one dim), as PyTorch computes it."""
    m = np.zeros((n_out, n_in), dtype=np.float64)
    if n_out == n_in:
        m[np.arange(n_out), np.arange(n_out)] = 1.0
        return m
    if align_corners:
        scale = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        src = scale * np.arange(n_out)
    else:
        scale = _scale(n_in, n_out, scale_factor)
        src = np.maximum(scale * (np.arange(n_out) + 0.5) - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    lam = np.clip(src - i0, 0.0, 1.0)
    i1 = i0 + (i0 < n_in - 1)
    rows = np.arange(n_out)
    np.add.at(m, (rows, i0), 1.0 - lam)
    np.add.at(m, (rows, i1), lam)
    return m


def _apply_along(y, mats, transpose):
    """Multiply spatial dim 2 + i of y by mats[i] (or its transpose) for each i; None leaves a dim alone."""
    for i, m in enumerate(mats):
        if m is None:
            continue
        ax = 2 + i
        y = array_matmul(y.swapaxes(ax, -1), m if transpose else m.T).swapaxes(ax, -1)
    return y


class ResampleLinear(Op):
    """x (N, C, *spatial) times one host (out, in) matrix per spatial dim (None: unchanged). See [Note: Separable
    resampling]. Half precision on NumPy is computed in float32."""

    @staticmethod
    def forward(ctx, x, mats):
        xp = array_module(x)
        dt = x.dtype
        cdt = np.float32 if dt in HALF_DTYPES else dt
        dev = [None if m is None else xp.asarray(m.astype(cdt)) for m in mats]
        ctx.mats, ctx.dt, ctx.cdt = dev, dt, cdt
        xc = x.astype(cdt, copy=False)
        return xp.ascontiguousarray(_apply_along(xc, dev, False)).astype(dt, copy=False)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        gc = g.astype(ctx.cdt, copy=False)
        return xp.ascontiguousarray(_apply_along(gc, ctx.mats, True)).astype(ctx.dt, copy=False), None


def adaptive_windows(n, o):
    """(o, K) int64 host array: the positions of window i = [floor(i n / o), ceil((i + 1) n / o)), each row padded
    to the longest window's length K by repeating its last position."""
    lo = (np.arange(o) * n) // o
    hi = -((-(np.arange(o) + 1) * n) // o)
    k = int((hi - lo).max())
    return np.minimum(lo[:, None] + np.arange(k)[None, :], hi[:, None] - 1)


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
