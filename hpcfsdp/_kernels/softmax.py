"""softmax, log_softmax and cross-entropy as fused kernels (softmax.cu): one launch each way for the softmaxes; for
cross-entropy one launch for the losses and gradient rows, one for the reduction, one for backward."""
from __future__ import annotations

import numpy as np

from .._backend import array_module
from ._registry import kernel, launch
from .activation import acc_dtype, grid_for

__all__ = ["softmax_forward", "softmax_backward", "cross_entropy_forward", "cross_entropy_backward", "BLOCK",
           "REDUCE_BLOCK", "MODES"]

# Launch configuration (asserted below): the row kernels (softmax_fwd, softmax_bwd, ce_fwd) run one block of BLOCK
# threads per row, a grid-stride loop over rows beyond _MAX_GRID blocks; ce_reduce runs one block of REDUCE_BLOCK
# threads over every row; ce_bwd is an element-wise grid-stride loop of BLOCK threads. Block sizes are multiples of 32
# (common.cuh's block_sum).
BLOCK = 256
REDUCE_BLOCK = 1024
_MAX_GRID = 132 * 32
MODES = {"none": 0, "sum": 1, "mean": 2}
assert BLOCK % 32 == 0 and REDUCE_BLOCK % 32 == 0 and REDUCE_BLOCK <= 1024


@kernel("softmax_fwd", "softmax", [("x", "in"), ("y", "out"), ("rows", "scalar", "long long"),
                                   ("C", "scalar", "long long"), ("log", "scalar", "int")], block_max=1024)
def _softmax_fwd_twin(args, dtype):
    x, y, rows, C, log = args
    f = acc_dtype(dtype)
    z = x.reshape(-1, C).astype(f)
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    s = e.sum(axis=1, keepdims=True)
    y[...] = (z - np.log(s) if log else e / s).astype(dtype).reshape(y.shape)


@kernel("softmax_bwd", "softmax", [("g", "in"), ("y", "in"), ("dx", "out"), ("rows", "scalar", "long long"),
                                   ("C", "scalar", "long long"), ("log", "scalar", "int")])
def _softmax_bwd_twin(args, dtype):
    g, y, dx, rows, C, log = args
    f = acc_dtype(dtype)
    ga, ya = g.reshape(-1, C).astype(f), y.reshape(-1, C).astype(f)
    if log:
        out = ga - np.exp(ya) * ga.sum(axis=1, keepdims=True)
    else:
        out = ya * (ga - (ga * ya).sum(axis=1, keepdims=True))
    dx[...] = out.astype(dtype).reshape(dx.shape)


@kernel("ce_fwd", "softmax", [("x", "in"), ("tgt", "in", "long long"), ("loss", "out", "A"), ("grad", "out"),
                              ("rows", "scalar", "long long"), ("C", "scalar", "long long"),
                              ("ignore_index", "scalar", "long long"), ("eps", "scalar", "double")])
def _ce_fwd_twin(args, dtype):
    x, tgt, loss, grad, rows, C, ignore_index, eps = args
    f = acc_dtype(dtype).type
    ok = (tgt != ignore_index) & (tgt >= 0) & (tgt < C)
    t = np.where(ok, tgt, 0)
    z = x.reshape(-1, C).astype(f)
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    s = e.sum(axis=1)
    lse = np.log(s)
    nll = lse - z[np.arange(z.shape[0]), t]
    los = nll * f(1 - eps) + (lse * f(C) - z.sum(axis=1)) * f(eps / C) if eps > 0 else nll
    p = e / s[:, None] - f(eps / C)
    p[np.arange(z.shape[0]), t] -= f(1 - eps)
    loss[...] = np.where(ok, los, f(0))
    grad[...] = np.where(ok[:, None], p, f(0)).astype(dtype).reshape(grad.shape)


@kernel("ce_reduce", "softmax", [("tgt", "in", "long long"), ("loss", "in", "A"), ("out", "out"), ("den", "out", "A"),
                                 ("flag", "out", "long long"), ("rows", "scalar", "long long"),
                                 ("C", "scalar", "long long"), ("ignore_index", "scalar", "long long"),
                                 ("mode", "scalar", "int")])
def _ce_reduce_twin(args, dtype):
    tgt, loss, out, den, flag, rows, C, ignore_index, mode = args
    f = acc_dtype(dtype).type
    valid = tgt != ignore_index
    bad = np.flatnonzero(valid & ((tgt < 0) | (tgt >= C)))
    s, n = loss.sum(dtype=f), f(valid.sum())
    if mode == 0:
        out[...] = loss.astype(dtype).reshape(out.shape)
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            out[...] = (s / n if mode == 2 else s).astype(dtype)
    den[...] = n
    flag[...] = bad[0] if bad.size else -1


@kernel("ce_bwd", "softmax", [("grad", "in"), ("g", "in"), ("den", "in", "A"), ("dx", "out"),
                              ("n", "scalar", "long long"), ("C", "scalar", "long long"), ("mode", "scalar", "int")])
def _ce_bwd_twin(args, dtype):
    grad, g, den, dx, n, C, mode = args
    f = acc_dtype(dtype).type
    ga = g.astype(f).reshape(-1)
    a = ga[:, None] if mode == 0 else (ga[0] / den[0] if mode == 2 else ga[0])
    dx[...] = (grad.reshape(-1, C).astype(f) * a).astype(dtype).reshape(dx.shape)


def _contig(xp, a, dtype):
    return a if a.flags.c_contiguous and a.dtype == dtype else xp.ascontiguousarray(a, dtype=dtype)


def _grid(rows):
    return max(1, min(int(rows), _MAX_GRID))


def softmax_forward(x, log: bool):
    """softmax (or log_softmax, ``log``) of CuPy x over its last dim, in x's dtype; one launch."""
    xp = array_module(x)
    x = _contig(xp, x, x.dtype)
    c = x.shape[-1] if x.ndim else 1
    y = xp.empty_like(x)
    launch("softmax_fwd", x.dtype, _grid(x.size // max(c, 1)), BLOCK, (x, y, x.size // max(c, 1), c, int(log)))
    return y


def softmax_backward(g, y, log: bool):
    """The input gradient of softmax (log_softmax) from its output y and output gradient g; one launch."""
    xp = array_module(y)
    g = _contig(xp, g, y.dtype)
    c = y.shape[-1] if y.ndim else 1
    dx = xp.empty_like(y)
    launch("softmax_bwd", y.dtype, _grid(y.size // max(c, 1)), BLOCK, (g, y, dx, y.size // max(c, 1), c, int(log)))
    return dx


def cross_entropy_forward(x, target, ignore_index: int, reduction: str, label_smoothing: float):
    """(out, grad, den, flag) for (N, C) CuPy logits and (N,) targets: the loss in x's dtype ((N,) for "none", else a
    scalar), the gradient rows of the per-row losses (x's dtype), the count of non-ignored rows (device) and the device
    flag: the first row with a target out of [0, C) that is not ignore_index, or -1. Two launches, no host read."""
    xp = array_module(x)
    x = _contig(xp, x, x.dtype)
    t = _contig(xp, target, np.dtype(np.int64))
    n, c = x.shape
    f = acc_dtype(x.dtype)
    loss, grad = xp.empty(n, f), xp.empty_like(x)
    mode = MODES[reduction]
    out = xp.empty(n if mode == 0 else (), x.dtype)
    den, flag = xp.empty(1, f), xp.empty(1, np.int64)
    if n:
        launch("ce_fwd", x.dtype, _grid(n), BLOCK, (x, t, loss, grad, n, c, ignore_index, label_smoothing))
    launch("ce_reduce", x.dtype, 1, REDUCE_BLOCK, (t, loss, out, den, flag, n, c, ignore_index, mode))
    return out, grad, den, flag


def cross_entropy_backward(grad, g, den, reduction: str):
    """The logits' gradient: the saved rows scaled by the upstream gradient g (and 1 / den for "mean"); one launch."""
    xp = array_module(grad)
    g = _contig(xp, g, grad.dtype)
    dx = xp.empty_like(grad)
    n, c = grad.shape
    if grad.size:
        launch("ce_bwd", grad.dtype, grid_for(grad.size, BLOCK), BLOCK, (grad, g, den, dx, grad.size, c,
                                                                         MODES[reduction]))
    return dx
