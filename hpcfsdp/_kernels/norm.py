"""LayerNorm and RMSNorm as fused kernels (norm.cu): one launch forward, one for dx and one for the weight and bias
gradients."""
from __future__ import annotations

import numpy as np

from .._backend import array_module
from ._registry import kernel, launch
from .activation import acc_dtype

__all__ = ["norm_forward", "norm_backward", "add_norm_forward", "add_norm_backward", "BLOCK", "WB_BLOCK"]

# Launch configuration (asserted below): norm_fwd and norm_bwd_dx run one block of BLOCK threads per row, a grid-stride
# loop over rows beyond _MAX_GRID blocks; BLOCK is a multiple of 32 (common.cuh's block_sum). norm_bwd_wb runs exactly
# WB_BLOCK = 32 columns x 8 row lanes (norm.cu's NORM_WB_COLS, NORM_WB_LANES), one block per 32-column tile.
BLOCK = 256
WB_BLOCK = 256
_MAX_GRID = 132 * 32
assert BLOCK % 32 == 0 and BLOCK <= 1024 and WB_BLOCK == 32 * 8


def _rows(a, c):
    return a.reshape(-1, c)


@kernel("norm_fwd", "norm", [("x", "in"), ("w", "in"), ("b", "in"), ("y", "out"), ("mean", "out", "A"),
                             ("rstd", "out", "A"), ("rows", "scalar", "long long"), ("C", "scalar", "long long"),
                             ("eps", "scalar", "double"), ("has_w", "scalar", "int"), ("has_b", "scalar", "int"),
                             ("rms", "scalar", "int")])
def _norm_fwd_twin(args, dtype):
    x, w, b, y, mean, rstd, rows, C, eps, has_w, has_b, rms = args
    f = acc_dtype(dtype).type
    xa = _rows(x, C).astype(f)
    m = np.zeros((xa.shape[0], 1), f) if rms else xa.sum(axis=1, keepdims=True) * f(1.0 / C)
    d = xa - m
    rs = f(1) / np.sqrt((d * d).sum(axis=1, keepdims=True) * f(1.0 / C) + f(eps))
    h = d * rs
    if rms:
        h = h.astype(dtype).astype(f)
        if has_w:
            h *= w.astype(f)
    else:
        if has_w:
            h *= w.astype(f)
        if has_b:
            h += b.astype(f)
    y[...] = h.astype(dtype).reshape(y.shape)
    mean[...], rstd[...] = m[:, 0], rs[:, 0]


@kernel("add_norm_fwd", "norm", [("x", "in"), ("y", "in"), ("yb", "in"), ("w", "in"), ("b", "in"), ("s", "out"),
                                 ("out", "out"), ("mean", "out", "A"), ("rstd", "out", "A"),
                                 ("rows", "scalar", "long long"), ("C", "scalar", "long long"),
                                 ("eps", "scalar", "double"), ("has_yb", "scalar", "int"), ("has_w", "scalar", "int"),
                                 ("has_b", "scalar", "int"), ("rms", "scalar", "int")])
def _add_norm_fwd_twin(args, dtype):
    x, y, yb, w, b, s, out, mean, rstd, rows, C, eps, has_yb, has_w, has_b, rms = args
    f = acc_dtype(dtype)
    t = (_rows(y, C).astype(f) + yb.astype(f)).astype(dtype) if has_yb else _rows(y, C)
    s[...] = (_rows(x, C).astype(f) + t.astype(f)).astype(dtype).reshape(s.shape)
    _norm_fwd_twin((s, w, b, out, mean, rstd, rows, C, eps, has_w, has_b, rms), dtype)


@kernel("norm_bwd_dx", "norm", [("g", "in"), ("x", "in"), ("w", "in"), ("mean", "in", "A"), ("rstd", "in", "A"),
                                ("gres", "in"), ("dx", "out"), ("rows", "scalar", "long long"),
                                ("C", "scalar", "long long"), ("has_w", "scalar", "int"), ("has_res", "scalar", "int"),
                                ("rms", "scalar", "int")])
def _norm_bwd_dx_twin(args, dtype):
    g, x, w, mean, rstd, gres, dx, rows, C, has_w, has_res, rms = args
    f = acc_dtype(dtype).type
    gw = _rows(g, C).astype(f)
    if has_w:
        gw = gw * w.astype(f)
    rs = rstd.reshape(-1, 1)
    h = (_rows(x, C).astype(f) - mean.reshape(-1, 1)) * rs
    m1 = f(0) if rms else gw.sum(axis=1, keepdims=True) * f(1.0 / C)
    m2 = (gw * h).sum(axis=1, keepdims=True) * f(1.0 / C)
    d = (gw - m1 - h * m2) * rs
    if has_res:
        d = d + _rows(gres, C).astype(f)
    dx[...] = d.astype(dtype).reshape(dx.shape)


@kernel("norm_bwd_wb", "norm", [("g", "in"), ("x", "in"), ("mean", "in", "A"), ("rstd", "in", "A"), ("e", "in"),
                                ("dw", "out"), ("db", "out"), ("de", "out"), ("rows", "scalar", "long long"),
                                ("C", "scalar", "long long"), ("rms", "scalar", "int"), ("has_e", "scalar", "int")],
        block_max=WB_BLOCK)
def _norm_bwd_wb_twin(args, dtype):
    g, x, mean, rstd, e, dw, db, de, rows, C, rms, has_e = args
    f = acc_dtype(dtype).type
    ga = _rows(g, C).astype(f)
    h = (_rows(x, C).astype(f) - mean.reshape(-1, 1)) * rstd.reshape(-1, 1)
    if rms:
        h = h.astype(dtype).astype(f)
    dw[...] = (ga * h).sum(axis=0).astype(dtype)
    db[...] = ga.sum(axis=0).astype(dtype)
    if has_e:
        de[...] = _rows(e, C).astype(f).sum(axis=0).astype(dtype)


def _contig(xp, a, dtype):
    return a if a.flags.c_contiguous and a.dtype == dtype else xp.ascontiguousarray(a, dtype=dtype)


def _grid(rows):
    return max(1, min(int(rows), _MAX_GRID))


def norm_forward(x, c: int, w, b, eps: float, rms: bool):
    """(y, mean, rstd, x): LayerNorm (or RMSNorm, ``rms``) of CuPy x over its trailing ``c`` elements, weight and bias
    (or None) of x's dtype; y in x's dtype, mean and rstd (rows,) in the accumulation dtype, and x made contiguous
    (what backward should keep). One launch."""
    xp = array_module(x)
    x = _contig(xp, x, x.dtype)
    rows = x.size // c
    f = acc_dtype(x.dtype)
    y, mean, rstd = xp.empty_like(x), xp.empty(rows, f), xp.empty(rows, f)
    wa = _contig(xp, w, x.dtype) if w is not None else x  # an absent pointer is never read: any array of T
    ba = _contig(xp, b, x.dtype) if b is not None else x
    launch("norm_fwd", x.dtype, _grid(rows), BLOCK, (x, wa, ba, y, mean, rstd, rows, c, eps, int(w is not None),
                                                      int(b is not None), int(rms)))
    return y, mean, rstd, x


def norm_backward(g, x, c: int, w, mean, rstd, rms: bool, need_dx=True, need_wb=False):
    """(dx, dw, db): the input gradient in x's shape (one launch) and the (c,) weight and bias gradients (one launch),
    in x's dtype, each None unless asked; each a fresh array (the engine makes a leaf's fresh gradient its .grad)."""
    xp = array_module(x)
    x = _contig(xp, x, x.dtype)
    g = _contig(xp, g, x.dtype)
    rows = x.size // c
    dx = dw = db = None
    if need_dx:
        dx = xp.empty_like(x)
        wa = _contig(xp, w, x.dtype) if w is not None else x
        launch("norm_bwd_dx", x.dtype, _grid(rows), BLOCK, (g, x, wa, mean, rstd, x, dx, rows, c, int(w is not None),
                                                             0, int(rms)))
    if need_wb:
        dw, db = _wb(g, x, c, mean, rstd, rms, None)[:2]
    return dx, dw, db


def _wb(g, x, c, mean, rstd, rms, e):
    """(dw, db, de): norm_bwd_wb's column sums (de of ``e`` only when given, else None); one launch."""
    xp = array_module(x)
    rows = x.size // c
    dw, db = xp.empty(c, x.dtype), xp.empty(c, x.dtype)
    de = xp.empty(c, x.dtype) if e is not None else None
    launch("norm_bwd_wb", x.dtype, max(1, min((c + 31) // 32, _MAX_GRID)), WB_BLOCK,
           (g, x, mean, rstd, x if e is None else e, dw, db, db if de is None else de, rows, c, int(rms),
            int(e is not None)))
    return dw, db, de


def add_norm_forward(x, y, yb, c: int, w, b, eps: float, rms: bool):
    """(s, out, mean, rstd): the residual sum s = x + (y + yb) (yb (c,) broadcast, or None: s = x + y), rounded as the
    unfused adds round it, and the norm of s (as norm_forward); x, y contiguous of one dtype and shape. One launch."""
    xp = array_module(x)
    x, y = _contig(xp, x, x.dtype), _contig(xp, y, x.dtype)
    rows = x.size // c
    f = acc_dtype(x.dtype)
    s, out, mean, rstd = xp.empty_like(x), xp.empty_like(x), xp.empty(rows, f), xp.empty(rows, f)
    ya = _contig(xp, yb, x.dtype) if yb is not None else x
    wa = _contig(xp, w, x.dtype) if w is not None else x
    ba = _contig(xp, b, x.dtype) if b is not None else x
    launch("add_norm_fwd", x.dtype, _grid(rows), BLOCK,
           (x, y, ya, wa, ba, s, out, mean, rstd, rows, c, eps, int(yb is not None), int(w is not None),
            int(b is not None), int(rms)))
    return s, out, mean, rstd


def add_norm_backward(g_out, g_s, s, c: int, w, mean, rstd, rms: bool, need_wb: bool, need_yb: bool):
    """(ds, dw, db, dyb) of add_norm_forward: ds = g_s + the norm's input gradient of g_out (one launch; the gradient
    of x and of y), and the weight, bias and yb gradients (column sums, one launch, when asked)."""
    xp = array_module(s)
    g_out, g_s = _contig(xp, g_out, s.dtype), _contig(xp, g_s, s.dtype)
    rows = s.size // c
    ds = xp.empty_like(s)
    wa = _contig(xp, w, s.dtype) if w is not None else s
    launch("norm_bwd_dx", s.dtype, _grid(rows), BLOCK, (g_out, s, wa, mean, rstd, g_s, ds, rows, c,
                                                         int(w is not None), 1, int(rms)))
    dw = db = dyb = None
    if need_wb or need_yb:
        dw, db, dyb = _wb(g_out, s, c, mean, rstd, rms, ds if need_yb else None)
    return ds, dw, db, dyb
