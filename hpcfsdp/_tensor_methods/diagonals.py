"""Diagonal structure beyond linalg.py's diag/diagonal, of the linear-algebra family: diag_embed, diagflat and the
in-place fill_diagonal_; with the norm-based dist, renorm/renorm_ and the inner product vdot. Compositions of
differentiable ops (fill_diagonal_ writes in place). hpcfsdp/_tensor_methods/linalg.py loads this module before it
makes the family's mixin."""
import operator

import numpy as np

from .._array import wrap_dim
from .._registry import op
from ._common import TensorBase, _assign_result, _inplace, _raw, _tensor_arg

__all__ = []


@op("linalg", function=True)
def diag_embed(self, offset=0, dim1=-2, dim2=-1):
    """The last dim of self as the ``offset`` diagonal of new square matrices in dims ``dim1``, ``dim2`` of the
    result (the other dims in order); differentiable."""
    offset = operator.index(offset)
    nd = self.ndim + 1
    d1, d2 = wrap_dim(dim1, nd), wrap_dim(dim2, nd)
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    m = self.shape[-1] if self.ndim else 1
    x = self.reshape(1) if self.ndim == 0 else self
    n = m + abs(offset)
    xp = x._xp()
    onehot = np.zeros((m, n, n), dtype=np.float64)
    i = np.arange(m)
    onehot[i, i + max(-offset, 0), i + max(offset, 0)] = 1
    e = x._wrap(xp.asarray(onehot.astype(x._data.dtype)))
    out = (x.reshape(*x.shape, 1, 1) * e).sum(-3)  # (..., n, n)
    return out.movedim((-2, -1), (d1, d2))


@op("linalg", function=True)
def diagflat(self, offset=0):
    """The flattened self as the ``offset`` diagonal of a square matrix; differentiable."""
    return self.reshape(-1).diag(offset)


def _fill_diagonal(a, fill_value, wrap=False):
    if a.ndim < 2:
        raise RuntimeError("dimensions must larger than 1")
    if a.ndim > 2 and len(set(a.shape)) != 1:
        raise RuntimeError("all dimensions of input must be of equal length")
    value = _raw(fill_value).item() if isinstance(fill_value, TensorBase) else fill_value
    if a.ndim == 2:
        rows, cols = a.shape
        n = rows if wrap and rows > cols + 1 else min(rows, cols)
        r = np.arange(n)
        keep = (r % (cols + 1)) < cols if wrap else r >= 0  # after each full diagonal one row is skipped
        r = r[keep] if wrap else r
        c = (r % (cols + 1)) if wrap else r
        a[r, c] = value
        return
    i = np.arange(a.shape[0])
    a[(i,) * a.ndim] = value


@op("linalg")
@_inplace
def fill_diagonal_(a, fill_value, wrap=False):
    """Fill the main diagonal (all dims equal for more than 2; a tall matrix restarts it after every cols + 1
    rows with ``wrap``) with ``fill_value``, in place."""
    _fill_diagonal(a, fill_value, wrap)


@op("linalg", function=True)
def renorm(self, p, dim, maxnorm):
    """Each sub-tensor along ``dim`` whose p-norm exceeds ``maxnorm`` scaled down to that norm (by
    maxnorm / (norm + 1e-7), as PyTorch); differentiable."""
    if float(p) <= 0:
        raise RuntimeError(f"renorm: non-positive-norm not supported, got p = {p}")
    if float(maxnorm) < 0:
        raise RuntimeError(f"renorm: expected maxnorm to be >= 0 but got {maxnorm}")
    d = wrap_dim(dim, self.ndim)
    other = tuple(i for i in range(self.ndim) if i != d)
    norms = self.abs().pow(p).sum(other, keepdim=True).pow(1.0 / p) if other else self.abs()
    scale = (maxnorm / (norms + 1e-7)).where(norms > maxnorm, norms.new_ones(()))
    return self * scale


@op("linalg")
def renorm_(self, p, dim, maxnorm):
    return _assign_result(self, renorm(self, p, dim, maxnorm), "renorm_")


@op("linalg", function=True)
def dist(self, other, p=2):
    """The p-norm of self - other (broadcast), a 0-d tensor; differentiable."""
    _tensor_arg(other, "dist", "other")
    return (self - other).norm(p)


@op("linalg", function=True)
def vdot(self, other):
    """The dot product of two 1-D tensors of one dtype (the first conjugated: the same for real ones)."""
    _tensor_arg(other, "vdot", "other")
    if self.ndim != 1 or other.ndim != 1:
        raise RuntimeError(f"1D tensors expected, but got {self.ndim}D and {other.ndim}D tensors")
    if self.dtype != other.dtype:
        raise RuntimeError(f"dot : expected both vectors to have same dtype, but found {self.dtype} and {other.dtype}")
    if self.shape[0] != other.shape[0]:
        raise RuntimeError(f"inconsistent tensor size, expected tensor [{self.shape[0]}] and src [{other.shape[0]}] to "
                           f"have the same number of elements, but got {self.shape[0]} and {other.shape[0]} "
                           "elements respectively")
    return (self * other).sum()
