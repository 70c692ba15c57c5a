"""Around Linear layers' GEMMs (linear.cu): the bias gradient as one column-sum launch, and the residual add of a
layer's output with its bias as one launch."""
from __future__ import annotations


from .._backend import array_module
from ._registry import kernel, launch
from .activation import acc_dtype
from .optim import grid_for

__all__ = ["col_sum", "bias_residual", "SUM_BLOCK"]

SUM_BLOCK = 256  # col_sum's tile: linear.cu's LIN_COLS x LIN_LANES
BLOCK = 256
_MAX_GRID = 132 * 32


@kernel("col_sum", "linear", [("g", "in"), ("out", "out"), ("rows", "scalar", "long long"),
                              ("C", "scalar", "long long")], block_max=SUM_BLOCK)
def _col_sum_twin(args, dtype):
    g, out, rows, C = args
    out[...] = g.reshape(-1, int(C)).astype(acc_dtype(dtype)).sum(axis=0).astype(dtype)


@kernel("bias_residual_fwd", "linear", [("x", "in"), ("y", "in"), ("b", "in"), ("out", "out"),
                                        ("n", "scalar", "long long"), ("C", "scalar", "long long")])
def _bias_residual_twin(args, dtype):
    x, y, b, out, n, C = args
    f = acc_dtype(dtype)
    t = (y.reshape(-1, int(C)).astype(f) + b.astype(f)).astype(dtype)
    out[...] = (x.reshape(-1, int(C)).astype(f) + t.astype(f)).astype(dtype).reshape(out.shape)


def _contig(xp, a, dtype):
    return a if a.flags.c_contiguous and a.dtype == dtype else xp.ascontiguousarray(a, dtype=dtype)


def col_sum(g):
    """The sums over every row of g (..., C): a (C,) array in g's dtype, accumulated in float; one launch."""
    xp = array_module(g)
    g = _contig(xp, g, g.dtype)
    C = g.shape[-1]
    out = xp.empty(C, g.dtype)
    if C:
        rows = g.size // C
        if rows == 0:
            out.fill(0)
        else:
            launch("col_sum", g.dtype, max(1, min((C + 31) // 32, _MAX_GRID)), SUM_BLOCK, (g, out, rows, C))
    return out


def bias_residual(x, y, b):
    """x + (y + b), b (C,) broadcast over the rows of x and y (same shape and dtype); one launch."""
    xp = array_module(x)
    x, y, b = _contig(xp, x, x.dtype), _contig(xp, y, x.dtype), _contig(xp, b, x.dtype)
    out = xp.empty_like(x)
    if x.size:
        launch("bias_residual_fwd", x.dtype, grid_for(x.size, BLOCK), BLOCK, (x, y, b, out, x.size, x.shape[-1]))
    return out
