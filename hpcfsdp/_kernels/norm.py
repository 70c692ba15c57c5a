"""LayerNorm and RMSNorm as fused kernels (norm.cu): one launch forward, one for dx and one for the weight and bias
gradients."""
from __future__ import annotations

import numpy as np

from .._backend import array_module
from ._registry import kernel, launch
from .activation import acc_dtype

__all__ = ["norm_forward", "norm_backward", "BLOCK", "WB_BLOCK"]

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


@kernel("norm_bwd_dx", "norm", [("g", "in"), ("x", "in"), ("w", "in"), ("mean", "in", "A"), ("rstd", "in", "A"),
                                ("dx", "out"), ("rows", "scalar", "long long"), ("C", "scalar", "long long"),
                                ("has_w", "scalar", "int"), ("rms", "scalar", "int")])
def _norm_bwd_dx_twin(args, dtype):
    g, x, w, mean, rstd, dx, rows, C, has_w, rms = args
    f = acc_dtype(dtype).type
    gw = _rows(g, C).astype(f)
    if has_w:
        gw = gw * w.astype(f)
    rs = rstd.reshape(-1, 1)
    h = (_rows(x, C).astype(f) - mean.reshape(-1, 1)) * rs
    m1 = f(0) if rms else gw.sum(axis=1, keepdims=True) * f(1.0 / C)
    m2 = (gw * h).sum(axis=1, keepdims=True) * f(1.0 / C)
    dx[...] = ((gw - m1 - h * m2) * rs).astype(dtype).reshape(dx.shape)


@kernel("norm_bwd_wb", "norm", [("g", "in"), ("x", "in"), ("mean", "in", "A"), ("rstd", "in", "A"), ("dw", "out"),
                                ("db", "out"), ("rows", "scalar", "long long"), ("C", "scalar", "long long"), ("rms", "scalar", "int")],
        block_max=WB_BLOCK)
def _norm_bwd_wb_twin(args, dtype):
    g, x, mean, rstd, dw, db, rows, C, rms = args
    f = acc_dtype(dtype).type
    ga = _rows(g, C).astype(f)
    h = (_rows(x, C).astype(f) - mean.reshape(-1, 1)) * rstd.reshape(-1, 1)
    if rms:
        h = h.astype(dtype).astype(f)
    dw[...] = (ga * h).sum(axis=0).astype(dtype)
    db[...] = ga.sum(axis=0).astype(dtype)


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
        launch("norm_bwd_dx", x.dtype, _grid(rows), BLOCK, (g, x, wa, mean, rstd, dx, rows, c, int(w is not None),
                                                             int(rms)))
    if need_wb:
        dw, db = xp.empty(c, x.dtype), xp.empty(c, x.dtype)
        launch("norm_bwd_wb", x.dtype, max(1, min((c + 31) // 32, _MAX_GRID)), WB_BLOCK,
               (g, x, mean, rstd, dw, db, rows, c, int(rms)))
    return dx, dw, db
