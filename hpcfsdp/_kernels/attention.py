"""Dense attention's kernels (attention.cu): scaled causal softmax of the scores and its backward (the scores in the
accumulation type: float for half inputs), and the packed q/k/v heads split into contiguous arrays and merged back."""
from __future__ import annotations

import numpy as np

from .._backend import array_module
from ._registry import kernel, launch
from .activation import acc_dtype
from .optim import grid_for

__all__ = ["causal_softmax", "softmax_backward_scaled", "split_heads3", "merge_heads3", "BLOCK"]

BLOCK = 256  # threads per row: attention.cu's ATTN_THREADS (its block reductions are written for it)
_MAX_GRID = 132 * 64  # blocks loop over rows beyond this (a grid-stride loop over rows)


@kernel("causal_softmax_fwd", "attention", [("s", "in", "A"), ("p", "out"), ("rows", "scalar", "long long"),
                                            ("L", "scalar", "int"), ("S", "scalar", "int"),
                                            ("scale", "scalar", "float"), ("causal", "scalar", "int")],
        block_max=BLOCK)
def _causal_softmax_twin(args, dtype):
    s, p, rows, L, S, scale, causal = args
    a = s.reshape(-1, L, S).astype(acc_dtype(dtype)) * acc_dtype(dtype).type(scale)
    if causal:
        a = np.where(np.arange(S)[None, :] <= np.arange(L)[:, None], a, -np.inf)
    a -= a.max(axis=-1, keepdims=True)
    np.exp(a, out=a)
    a /= a.sum(axis=-1, keepdims=True)
    p[...] = a.reshape(p.shape).astype(dtype)


@kernel("softmax_bwd_scaled", "attention", [("p", "in"), ("dp", "in", "A"), ("ds", "out"),
                                            ("rows", "scalar", "long long"), ("S", "scalar", "int"),
                                            ("scale", "scalar", "float")], block_max=BLOCK)
def _softmax_bwd_twin(args, dtype):
    p, dp, ds, rows, S, scale = args
    f = acc_dtype(dtype)
    pa, ga = p.reshape(-1, S).astype(f), dp.reshape(-1, S).astype(f)
    dot = (ga * pa).sum(axis=-1, keepdims=True)
    ds[...] = (f.type(scale) * pa * (ga - dot)).reshape(ds.shape).astype(dtype)


def _grid(rows):
    return max(1, min(int(rows), _MAX_GRID))


def causal_softmax(s, scale: float, causal: bool, dtype=None):
    """softmax(scale * s) over the last dim of contiguous scores s (..., L, S), causal-masked (j <= i) if asked;
    one launch, computed in float (double for double), in ``dtype`` (s's by default; s is float32 when ``dtype``
    is a half type: the scores of half inputs)."""
    xp = array_module(s)
    if not s.flags.c_contiguous:
        s = xp.ascontiguousarray(s)
    dtype = np.dtype(s.dtype if dtype is None else dtype)
    L, S = s.shape[-2], s.shape[-1]
    rows = s.size // S
    p = xp.empty(s.shape, dtype)
    launch("causal_softmax_fwd", dtype, _grid(rows), BLOCK, (s, p, rows, L, S, scale, int(causal)))
    return p


def softmax_backward_scaled(p, dp, scale: float):
    """scale * p * (dp - sum(dp * p, -1)): the gradient of the scores of causal_softmax, one launch, in p's dtype
    (dp in its accumulation type: float32 for half p)."""
    xp = array_module(p)
    f = acc_dtype(p.dtype)
    dp = dp if dp.flags.c_contiguous and dp.dtype == f else xp.ascontiguousarray(dp, dtype=f)
    S = p.shape[-1]
    rows = p.size // S
    ds = xp.empty_like(p)
    launch("softmax_bwd_scaled", p.dtype, _grid(rows), BLOCK, (p, dp, ds, rows, S, scale))
    return ds


_HEADS = [("n", "scalar", "long long"), ("T_len", "scalar", "int"), ("H", "scalar", "int"), ("D", "scalar", "int")]


@kernel("heads_split3", "attention", [("x", "in"), ("bias", "in"), ("q", "out"), ("k", "out"), ("v", "out")] + _HEADS
        + [("has_bias", "scalar", "int")])
def _heads_split3_twin(args, dtype):
    x, bias, q, k, v, n, T_len, H, D, has_bias = args
    if has_bias:
        f = acc_dtype(dtype)
        x = (x.reshape(-1, bias.size).astype(f) + bias.astype(f)).astype(dtype)
    parts = x.reshape(-1, int(T_len), 3, int(H), int(D)).transpose(2, 0, 3, 1, 4)  # (3, B, H, T, D)
    for out, part in zip((q, k, v), parts):
        out.reshape(part.shape)[...] = part


@kernel("heads_merge3", "attention", [("q", "in"), ("k", "in"), ("v", "in"), ("x", "out")] + _HEADS)
def _heads_merge3_twin(args, dtype):
    q, k, v, x, n, T_len, H, D = args
    view = x.reshape(-1, int(T_len), 3, int(H), int(D))
    for i, part in enumerate((q, k, v)):
        view[:, :, i] = part.reshape(-1, int(H), int(T_len), int(D)).transpose(0, 2, 1, 3)


def split_heads3(x, n_head: int, bias=None):
    """q, k, v (B, H, T, D), each C-contiguous, from the packed projection x (B, T, 3 * H * D) plus its bias
    (3 * H * D,) if given; one launch."""
    xp = array_module(x)
    x = xp.ascontiguousarray(x)
    b = x if bias is None else xp.ascontiguousarray(bias, dtype=x.dtype)
    B, T = x.shape[0], x.shape[1]
    D = x.shape[-1] // (3 * n_head)
    outs = [xp.empty((B, n_head, T, D), x.dtype) for _ in range(3)]
    n = B * n_head * T * D
    if n:
        launch("heads_split3", x.dtype, grid_for(n, BLOCK), BLOCK, (x, b, *outs, n, T, n_head, D,
                                                                     int(bias is not None)))
    return tuple(outs)


def merge_heads3(q, k, v):
    """The packed (B, T, 3 * H * D) array of q, k, v (B, H, T, D): the gradient of split_heads3; one launch."""
    xp = array_module(q)
    q, k, v = (xp.ascontiguousarray(a, dtype=q.dtype) for a in (q, k, v))
    B, H, T, D = q.shape
    x = xp.empty((B, T, 3 * H * D), q.dtype)
    n = q.size
    if n:
        launch("heads_merge3", q.dtype, grid_for(n, BLOCK), BLOCK, (q, k, v, x, n, T, H, D))
    return x
