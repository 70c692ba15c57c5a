"""Dropout as one fused kernel each way (dropout.cu) around one draw of the device's random generator."""
from __future__ import annotations

import numpy as np

from .._backend import array_module
from ._registry import kernel, launch
from .activation import acc_dtype
from .optim import grid_for

__all__ = ["dropout_forward", "dropout_backward"]

BLOCK = 256


@kernel("dropout_fwd", "dropout", [("x", "in"), ("r", "in", "float"), ("y", "out"), ("keep", "out", "unsigned char"),
                                   ("n", "scalar", "long long"), ("p", "scalar", "float"),
                                   ("scale", "scalar", "float")])
def _dropout_fwd_twin(args, dtype):
    x, r, y, keep, n, p, scale = args
    k = r >= np.float32(p)
    keep[...] = k
    f = acc_dtype(dtype)
    y[...] = np.where(k, x.astype(f) * f.type(scale), f.type(0)).astype(dtype)


@kernel("dropout_bwd", "dropout", [("g", "in"), ("keep", "in", "unsigned char"), ("dx", "out"),
                                   ("n", "scalar", "long long"), ("scale", "scalar", "float")])
def _dropout_bwd_twin(args, dtype):
    g, keep, dx, n, scale = args
    f = acc_dtype(dtype)
    dx[...] = np.where(keep != 0, g.astype(f) * f.type(scale), f.type(0)).astype(dtype)


def dropout_forward(x, r, p: float, scale: float):
    """(y, keep): x where the uniform draws ``r`` (float32, x's shape) are >= p, times ``scale``, else 0, and the uint8
    keep mask; one launch."""
    xp = array_module(x)
    x = x if x.flags.c_contiguous else xp.ascontiguousarray(x)
    y, keep = xp.empty_like(x), xp.empty(x.shape, np.uint8)
    if x.size:
        launch("dropout_fwd", x.dtype, grid_for(x.size, BLOCK), BLOCK, (x, r, y, keep, x.size, p, scale))
    return y, keep


def dropout_backward(g, keep, scale: float):
    """g where ``keep``, times ``scale``, else 0; one launch."""
    xp = array_module(g)
    g = g if g.flags.c_contiguous else xp.ascontiguousarray(g)
    dx = xp.empty_like(g)
    if g.size:
        launch("dropout_bwd", g.dtype, grid_for(g.size, BLOCK), BLOCK, (g, keep, dx, g.size, scale))
    return dx
