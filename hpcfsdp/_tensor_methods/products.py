"""Linear algebra's structured products, of the same family: kron, cross (and the linalg.cross it calls), vander
and linalg.vander, compositions of differentiable ops. hpcfsdp/_tensor_methods/linalg.py loads this module before it makes the family's
mixin."""
import operator
import warnings

import numpy as np

from .. import _backend
from .._array import dtype_category, wrap_dim
from .._registry import function_op, op
from ..autograd import ops
from ._common import TensorBase, _tensor_arg

__all__ = ["linalg_cross", "linalg_vander"]


@op("linalg", function=True)
def kron(self, other):
    """The Kronecker product: dims paired from the right (the shorter operand padded with leading 1s), result size
    ``self.shape[i] * other.shape[i]`` along each."""
    _tensor_arg(other, "kron", "other")
    nd = max(self.ndim, other.ndim)
    a_shape = (1,) * (nd - self.ndim) + tuple(self.shape)
    b_shape = (1,) * (nd - other.ndim) + tuple(other.shape)
    a = self.reshape([s for n in a_shape for s in (n, 1)])  # (a0, 1, a1, 1, ...)
    b = other.reshape([s for n in b_shape for s in (1, n)])  # (1, b0, 1, b1, ...)
    return (a * b).reshape([x * y for x, y in zip(a_shape, b_shape)])


def linalg_cross(input, other, *, dim=-1):  # noqa: A002
    """torch.linalg.cross: the cross product of the 3-vectors along ``dim``, the other dims broadcast."""
    _tensor_arg(input, "linalg.cross")
    _tensor_arg(other, "linalg.cross", "other")
    if input.ndim != other.ndim:
        raise RuntimeError("linalg.cross: inputs must have the same number of dimensions.")
    if input.dtype != other.dtype:
        raise RuntimeError(f"expected scalar type {input.dtype} but found {other.dtype}")
    d = wrap_dim(dim, input.ndim)
    if input.shape[d] != 3 or other.shape[d] != 3:
        raise RuntimeError(f"linalg.cross: inputs dimension {dim} must have length 3. Got {input.shape[d]} and "
                           f"{other.shape[d]}")
    try:
        np.broadcast_shapes(tuple(input.shape), tuple(other.shape))
    except ValueError:
        raise RuntimeError(f"linalg.cross: the shapes {tuple(input.shape)} and {tuple(other.shape)} do not "
                           "broadcast") from None
    a = [input.narrow(d, i, 1) for i in range(3)]
    b = [other.narrow(d, i, 1) for i in range(3)]
    parts = [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]]
    return ops.Cat.apply(d, *parts)


@op("linalg", function=True, functions=(ops.Cat,))
def cross(self, other, dim=None):
    """The cross product along ``dim``; without it, along the first dim of size 3 of ``self`` (deprecated, as
    PyTorch: warns; use linalg.cross, whose default is the last dim)."""
    if dim is None:
        warnings.warn("Using torch.cross without specifying the dim arg is deprecated.\nPlease either pass the dim "
                      "explicitly or simply use torch.linalg.cross.\nThe default value of dim will change to agree "
                      "with that of linalg.cross in a future release.", UserWarning, stacklevel=3)
        dim = next((i for i, s in enumerate(self.shape) if s == 3), None)
        if dim is None:
            raise RuntimeError("no dimension of size 3 in input")
    return linalg_cross(self, other, dim=dim)


@function_op("linalg")
def vander(x, N=None, increasing=False):  # noqa: N803
    """The Vandermonde matrix of the 1-D ``x``: columns ``x ** (N - 1)``, ..., ``x ** 0`` (the reverse with
    ``increasing``), N = len(x) by default; bool and integer inputs give int64, as PyTorch."""
    _tensor_arg(x, "vander", "x")
    if x.ndim != 1:
        raise RuntimeError("x must be a one-dimensional tensor.")
    n = x.shape[0] if N is None else operator.index(N)
    if n < 0:
        raise RuntimeError("N must be non-negative.")
    if dtype_category(x._data.dtype) < 2:
        x = x.to(_backend.int64)
    if n == 0:
        return x._wrap(x._xp().zeros((x.shape[0], 0), dtype=x._data.dtype))
    cols = [x.new_ones(x.shape)]
    for _ in range(n - 1):
        cols.append(cols[-1] * x)  # products, so the gradient is exact at 0
    if not increasing:
        cols.reverse()
    return ops.Stack.apply(1, *cols)


def linalg_vander(x, *, N=None):  # noqa: N803
    """torch.linalg.vander: the Vandermonde matrix of ``x`` (..., n) in increasing powers, (..., n, N), N = n by
    default (N > 1); differentiable (products of x)."""
    if not isinstance(x, TensorBase):
        raise TypeError(f"linalg.vander(): argument 'x' must be Tensor, not {type(x).__name__}")
    if x._data.dtype == np.bool_:
        raise RuntimeError("linalg.vander supports floating point, complex, and integer tensors, but got Bool")
    n = (x.shape[-1] if x.ndim else 1) if N is None else int(N)
    if n <= 1:
        raise RuntimeError("N must be greater than 1.")
    if dtype_category(x._data.dtype) < 2:
        x = x.to(np.int64)
    cols = [x.new_ones(x.shape)]
    for _ in range(n - 1):
        cols.append(cols[-1] * x)
    return ops.Stack.apply(x.ndim, *cols)
