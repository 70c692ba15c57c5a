"""Joining and combining tensors, of the shape family: hstack/vstack (row_stack)/dstack/column_stack, tensordot,
block_diag, cartesian_prod, combinations and unravel_index. Compositions of differentiable ops (cat, reshape,
permute, matmul, index_select), so differentiable where PyTorch's are. hpcfsdp/_tensor_methods/shape.py loads this
module before it makes the family's mixin."""
import itertools
import operator

import numpy as np

from .. import _backend
from .._array import dtype_category, promote_types, wrap_dim
from .._registry import function_op
from ..autograd import ops
from ._common import TensorBase, _tensor_arg, _wrap_array

__all__ = []


def _seq(tensors, fn):
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{fn}(): argument 'tensors' must be tuple of Tensors, not {type(tensors).__name__}")
    if not tensors:
        raise RuntimeError(f"{fn} expects a non-empty TensorList")
    for i, t in enumerate(tensors):
        _tensor_arg(t, fn, f"tensors[{i}]")
    return list(tensors)


def _promoted(tensors):
    dt = tensors[0].dtype
    for t in tensors[1:]:
        dt = promote_types(dt, t.dtype)
    return [t if t.dtype == dt else t.to(dt) for t in tensors]


def _cat(tensors, dim, fn="cat"):
    """ops.Cat of the tensors promoted to one dtype, with cat's check of the other dims."""
    tensors = _promoted(tensors)
    ref = tensors[0].shape
    for t in tensors[1:]:
        if t.ndim != len(ref) or any(a != b for i, (a, b) in enumerate(zip(t.shape, ref)) if i != dim):
            raise RuntimeError(f"Sizes of tensors must match except in dimension {dim}. Expected {tuple(ref)} but got "
                               f"{tuple(t.shape)}")
    return ops.Cat.apply(dim, *tensors)


@function_op("shape")
def hstack(tensors):
    """The tensors joined along dim 1 (dim 0 for 1-D ones), 0-d ones made 1-D first."""
    ts = [t.reshape(1) if t.ndim == 0 else t for t in _seq(tensors, "hstack")]
    return _cat(ts, 0 if ts[0].ndim == 1 else 1)


@function_op("shape", aliases=("row_stack",))
def vstack(tensors):
    """The tensors joined along dim 0, each made at least 2-D first ((n,) -> (1, n))."""
    return _cat([t.reshape((1,) * (2 - t.ndim) + tuple(t.shape)) if t.ndim < 2 else t
                 for t in _seq(tensors, "vstack")], 0)


@function_op("shape")
def dstack(tensors):
    """The tensors joined along dim 2, each made at least 3-D first ((n,) -> (1, n, 1), (m, n) -> (m, n, 1))."""
    out = []
    for t in _seq(tensors, "dstack"):
        if t.ndim == 0:
            t = t.reshape(1, 1, 1)
        elif t.ndim == 1:
            t = t.reshape(1, -1, 1)
        elif t.ndim == 2:
            t = t.unsqueeze(-1)
        out.append(t)
    return _cat(out, 2)


@function_op("shape")
def column_stack(tensors):
    """The tensors joined along dim 1, 0-d and 1-D ones made columns (n, 1) first."""
    return _cat([t.reshape(-1, 1) if t.ndim <= 1 else t for t in _seq(tensors, "column_stack")], 1)


def _dims_list(d, fn):
    if isinstance(d, TensorBase):
        return [int(v) for v in d.reshape(-1).tolist()]
    if isinstance(d, (int, np.integer)):
        return [int(d)]
    return [operator.index(v) for v in d]


@function_op("shape")
def tensordot(a, b, dims=2, out=None):
    """The sum of products of ``a`` and ``b`` over the dims contracted: the last ``dims`` of ``a`` with the first
    ``dims`` of ``b`` (an int), or the dims listed in a pair ``(dims_a, dims_b)``; the result has ``a``'s other
    dims, then ``b``'s. Differentiable (a matmul of permuted, reshaped operands)."""
    _tensor_arg(a, "tensordot", "a")
    _tensor_arg(b, "tensordot", "b")
    if out is not None:
        raise TypeError("tensordot(): out= is not supported by hpcfsdp")
    if isinstance(dims, TensorBase) and dims.ndim == 0:
        dims = int(dims.item())
    if isinstance(dims, (int, np.integer)):
        n = int(dims)
        if n < 0:
            raise RuntimeError(f"tensordot expects dims >= 0, but got dims={n}")
        if n > a.ndim or n > b.ndim:
            raise RuntimeError(f"tensordot expects dims < ndim_a or ndim_b, but got dims={n}")
        da, db = list(range(a.ndim - n, a.ndim)), list(range(n))
    else:
        if isinstance(dims, TensorBase):
            dims = dims.tolist()
        if len(dims) != 2:
            raise RuntimeError(f"tensordot expects dims to be a pair of dim lists, got {dims!r}")
        da, db = (_dims_list(d, "tensordot") for d in dims)
        if len(da) != len(db):
            raise RuntimeError(f"both dimension lists should have same length, got {len(da)} and {len(db)}")
        da = [wrap_dim(d, a.ndim) for d in da]
        db = [wrap_dim(d, b.ndim) for d in db]
    if a.dtype != b.dtype:
        raise RuntimeError("both inputs should have same dtype")
    for x, y in zip(da, db):
        if a.shape[x] != b.shape[y]:
            raise RuntimeError(f"contracted dimensions need to match, but first has size {a.shape[x]} in dim {x} and "
                               f"second has size {b.shape[y]} in dim {y}")
    free_a = [d for d in range(a.ndim) if d not in da]
    free_b = [d for d in range(b.ndim) if d not in db]
    k = int(np.prod([a.shape[d] for d in da], dtype=np.int64))
    sa = [a.shape[d] for d in free_a]
    sb = [b.shape[d] for d in free_b]
    am = a.permute(*free_a, *da).reshape(int(np.prod(sa, dtype=np.int64)), k)
    bm = b.permute(*db, *free_b).reshape(k, int(np.prod(sb, dtype=np.int64)))
    return am.matmul(bm).reshape(*sa, *sb)


@function_op("shape")
def block_diag(*tensors):
    """The block-diagonal matrix of the tensors (0-d ones as 1x1, 1-D ones as one row), of their promoted dtype;
    differentiable."""
    for i, t in enumerate(tensors):
        _tensor_arg(t, "block_diag", f"tensors[{i}]")
        if t.ndim > 2:
            raise RuntimeError(f"torch.block_diag: Input tensors must have 2 or fewer dimensions. Input {i} has "
                               f"{t.ndim} dimensions")
    if not tensors:
        return _wrap_array(np.zeros((1, 0), dtype=_backend.default_float_dtype()))
    mats = [t.reshape(1, 1) if t.ndim == 0 else t.reshape(1, -1) if t.ndim == 1 else t for t in tensors]
    dt = mats[0].dtype
    for m in mats[1:]:
        dt = promote_types(dt, m.dtype)
    mats = [m.to(dt) for m in mats]
    cols = sum(m.shape[1] for m in mats)
    rows, left = [], 0
    for m in mats:
        r, c = m.shape
        parts = [m.new_zeros((r, left)), m, m.new_zeros((r, cols - left - c))]
        rows.append(_cat(parts, 1))
        left += c
    return _cat(rows, 0)


def _one_d(t):
    if t.ndim != 1:
        raise RuntimeError(f"Expect a 1D vector, but got shape {list(t.shape)}")
    return t


@function_op("shape")
def cartesian_prod(*tensors):
    """The Cartesian product of 1-D tensors of one dtype: (N, len(tensors)) rows of every combination in order
    (one tensor: itself)."""
    for i, t in enumerate(tensors):
        _tensor_arg(t, "cartesian_prod", f"tensors[{i}]")
        _one_d(t)
    if len(tensors) == 1:
        return tensors[0]
    if any(t.dtype != tensors[0].dtype for t in tensors):
        raise RuntimeError("meshgrid expects all tensors to have the same dtype")
    shape = tuple(t.shape[0] for t in tensors)
    cols = []
    for i, t in enumerate(tensors):
        view = [1] * len(tensors)
        view[i] = -1
        cols.append(t.reshape(view).expand(shape).reshape(-1))  # the i-th coordinate of each row, in 'ij' order
    return ops.Stack.apply(1, *cols)


@function_op("shape")
def combinations(input, r=2, with_replacement=False):  # noqa: A002
    """The length-``r`` combinations of the 1-D ``input``'s elements (itertools' order; ``with_replacement`` lets
    an element repeat), as rows of an (N, r) tensor; differentiable (an index_select)."""
    _tensor_arg(input, "combinations")
    _one_d(input)
    r = operator.index(r)
    if r < 0:
        raise RuntimeError(f"Expect a non-negative number, but got {r}")
    if r == 0:
        return input.new_zeros((0,))
    n = input.shape[0]
    pick = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    idx = np.array(list(pick(range(n), r)), dtype=np.int64).reshape(-1, r)
    index = input._wrap(input._xp().asarray(idx.reshape(-1)))
    return input.index_select(0, index).reshape(-1, r)


@function_op("shape")
def unravel_index(indices, shape):
    """The coordinates in an array of ``shape`` of the flat ``indices`` (an integer tensor): one int64 tensor per
    dim, each of ``indices``' shape (indices wrap around the shape, negative ones from the end, as PyTorch's)."""
    _tensor_arg(indices, "unravel_index", "indices")
    if dtype_category(indices._data.dtype) != 1:
        raise TypeError(f"expected 'indices' to be integer dtype, but got {str(indices.dtype).replace('hp.', '')}")
    dims = (operator.index(shape),) if isinstance(shape, (int, np.integer)) else tuple(operator.index(s) for s in shape)
    if any(s < 0 for s in dims):
        raise ValueError("'shape' cannot have negative values, but got " + str(tuple(dims)))
    xp = indices._xp()
    rest = indices._data.astype(np.int64)
    out = []
    for s in reversed(dims):
        if s == 0:
            raise RuntimeError("unravel_index: a dim of 'shape' is 0, which no index fits")
        out.append(indices._wrap(xp.mod(rest, s)))
        rest = xp.floor_divide(rest, s)
    return tuple(reversed(out))
