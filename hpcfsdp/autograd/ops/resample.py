"""Resample family: separable linear interpolation (linear, bilinear, trilinear), nearest-neighbour source indices."""
import numpy as np

from ..._array import HALF_DTYPES
from ..._backend import array_module
from ..function import Op
from ._common import _apply_along

__all__ = ["ResampleLinear", "linear_weights", "nearest_index"]


# [Note: Separable resampling]
# Linear (bilinear, trilinear) interpolation is linear in the input and acts on each spatial dim separately:
# it is one (out, in) matrix per dim, each row holding the two weights (1 - lambda, lambda) of the source
# positions i0 and i1, applied as a batched matmul along that dim; the backward applies the transposes.
# Nearest-neighbour modes are a gather along each dim (``pad.PadGather``). The index and weight formulas
# are PyTorch's CPU kernels' (``area_pixel_compute_source_index``, ``nearest_idx``), so the outputs match
# PyTorch's. Adaptive max pooling, which gathers windows instead, is in pool.py.
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
