"""Rotary position embedding as one fused kernel each way (rotary.cu), in the memory order of the input."""
from __future__ import annotations

import numpy as np

from .._backend import array_module
from ._registry import kernel, launch
from .activation import acc_dtype
from .optim import grid_for

__all__ = ["rotary_forward", "rotary_backward", "layout_of"]

BLOCK = 256
_PARAMS = [("cos", "in"), ("sin", "in"), ("out", "out"), ("n", "scalar", "long long"), ("D", "scalar", "int"),
           ("T_len", "scalar", "int"), ("tdiv", "scalar", "long long")]


def _positions(n, D, T_len, tdiv):
    e = np.arange(int(n))
    return e % D, (e // int(tdiv)) % int(T_len)


@kernel("rotary_fwd", "rotary", [("x", "in")] + _PARAMS)
def _rotary_fwd_twin(args, dtype):
    x, cs, sn, y, n, D, T_len, tdiv = args
    f = acc_dtype(dtype)
    j, t = _positions(n, D, T_len, tdiv)
    xf, h = x.reshape(-1).astype(f), int(D) // 2
    e = np.arange(int(n))
    partner = np.where(j < h, -xf[np.minimum(e + h, int(n) - 1)], xf[np.maximum(e - h, 0)])
    c, s = cs.reshape(-1).astype(f)[t * int(D) + j], sn.reshape(-1).astype(f)[t * int(D) + j]
    y.reshape(-1)[...] = (xf * c + partner * s).astype(dtype)


@kernel("rotary_bwd", "rotary", [("g", "in")] + _PARAMS)
def _rotary_bwd_twin(args, dtype):
    g, cs, sn, dx, n, D, T_len, tdiv = args
    f = acc_dtype(dtype)
    j, t = _positions(n, D, T_len, tdiv)
    gf, h, e = g.reshape(-1).astype(f), int(D) // 2, np.arange(int(n))
    s = sn.reshape(-1).astype(f)
    other = np.where(j < h, gf[np.minimum(e + h, int(n) - 1)] * s[np.minimum(t * int(D) + j + h, s.size - 1)],
                     -gf[np.maximum(e - h, 0)] * s[np.maximum(t * int(D) + j - h, 0)])
    dx.reshape(-1)[...] = (gf * cs.reshape(-1).astype(f)[t * int(D) + j] + other).astype(dtype)


def layout_of(x):
    """(the contiguous array to traverse, tdiv, how to view a result of its shape as x's) for x of shape
    (..., T, D): x itself when contiguous; its (B, T, H, D) base when x is the (B, H, T, D) transpose of one; else
    None (the caller copies)."""
    D = x.shape[-1]
    if x.flags.c_contiguous:
        return x, D, lambda a: a
    if x.ndim == 4:
        base = x.transpose(0, 2, 1, 3)
        if base.flags.c_contiguous:
            return base, x.shape[1] * D, lambda a: a.transpose(0, 2, 1, 3)
    return None


def _run(name, x, cos, sin):
    xp = array_module(x)
    lay = layout_of(x)
    if lay is None:
        x = xp.ascontiguousarray(x)
        lay = layout_of(x)
    base, tdiv, back = lay
    cos = cos if cos.flags.c_contiguous and cos.dtype == x.dtype else xp.ascontiguousarray(cos, dtype=x.dtype)
    sin = sin if sin.flags.c_contiguous and sin.dtype == x.dtype else xp.ascontiguousarray(sin, dtype=x.dtype)
    out = xp.empty_like(base)
    launch(name, x.dtype, grid_for(base.size, BLOCK), BLOCK,
           (base, cos, sin, out, base.size, x.shape[-1], x.shape[-2], tdiv))
    return back(out)


def rotary_forward(x, cos, sin):
    """x * cos + rotate_half(x) * sin for x (..., T, D) and cos, sin (T, D), one launch, in x's layout."""
    return _run("rotary_fwd", x, cos, sin)


def rotary_backward(g, cos, sin):
    """The gradient of rotary_forward's x for output gradient g (one launch)."""
    return _run("rotary_bwd", g, cos, sin)
