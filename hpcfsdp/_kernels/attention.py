"""Dense attention's row kernels (attention.cu): scaled causal softmax of the scores, and its backward."""
from __future__ import annotations

import numpy as np

from .._backend import array_module
from ._registry import kernel, launch
from .activation import acc_dtype

__all__ = ["causal_softmax", "softmax_backward_scaled", "BLOCK"]

BLOCK = 256  # threads per row: attention.cu's ATTN_THREADS (its block reductions are written for it)
_MAX_GRID = 132 * 64  # blocks loop over rows beyond this (a grid-stride loop over rows)


@kernel("causal_softmax_fwd", "attention", [("s", "in"), ("p", "out"), ("rows", "scalar", "long long"),
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


@kernel("softmax_bwd_scaled", "attention", [("p", "in"), ("dp", "in"), ("ds", "out"),
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


def causal_softmax(s, scale: float, causal: bool):
    """softmax(scale * s) over the last dim of contiguous scores s (..., L, S), causal-masked (j <= i) if asked;
    one launch, computed in float (double for double), in s's dtype."""
    xp = array_module(s)
    if not s.flags.c_contiguous:
        s = xp.ascontiguousarray(s)
    L, S = s.shape[-2], s.shape[-1]
    rows = s.size // S
    p = xp.empty_like(s)
    launch("causal_softmax_fwd", s.dtype, _grid(rows), BLOCK, (s, p, rows, L, S, scale, int(causal)))
    return p


def softmax_backward_scaled(p, dp, scale: float):
    """scale * p * (dp - sum(dp * p, -1)): the gradient of the scores of causal_softmax, one launch."""
    xp = array_module(p)
    dp = dp if dp.flags.c_contiguous and dp.dtype == p.dtype else xp.ascontiguousarray(dp, dtype=p.dtype)
    S = p.shape[-1]
    rows = p.size // S
    ds = xp.empty_like(p)
    launch("softmax_bwd_scaled", p.dtype, _grid(rows), BLOCK, (p, dp, ds, rows, S, scale))
    return ds
