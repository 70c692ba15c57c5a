"""Embedding's forward as one fused gather with its bounds check deferred to the host's next read (embedding.cu)."""
from __future__ import annotations

import numpy as np

from .._backend import array_module
from ._registry import kernel, launch
from .optim import grid_for

__all__ = ["embedding_forward"]

BLOCK = 256


@kernel("embedding_fwd", "embedding", [("idx", "in", "long long"), ("w", "in"), ("out", "out"),
                                       ("flag", "inout", "long long"), ("count", "scalar", "long long"),
                                       ("dim", "scalar", "long long"), ("nrows", "scalar", "long long")])
def _embedding_twin(args, dtype):
    idx, w, out, flag, count, dim, nrows = args
    flat = idx.reshape(-1)
    bad = (flat < 0) | (flat >= nrows)
    rows = out.reshape(int(count), int(dim))
    rows[...] = w[np.where(bad, 0, flat)] if w.shape[0] else 0
    rows[bad] = 0
    if bad.any():  # the kernel's signed atomicMax over the positions, flag starting at -1
        pos = int(np.flatnonzero(bad)[-1])
        flag[0] = max(int(flag[0]), pos)


def embedding_forward(idx, w):
    """(rows of ``w`` at ``idx`` (idx.shape + (dim,)), a device int64 flag: -1, or the flat position of a bad index)."""
    xp = array_module(w)
    flat = idx.reshape(-1)
    if flat.dtype != np.int64 or not flat.flags.c_contiguous:
        flat = xp.ascontiguousarray(flat, dtype=np.int64)
    dim = int(w.shape[1])
    out = xp.empty(idx.shape + (dim,), w.dtype)
    flag = xp.full(1, -1, np.int64)
    launch("embedding_fwd", w.dtype, grid_for(flat.size * dim, BLOCK), BLOCK,
           (flat, w if w.flags.c_contiguous else xp.ascontiguousarray(w), out, flag, flat.size, dim, w.shape[0]))
    return out, flag
