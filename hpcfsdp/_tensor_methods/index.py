"""Indexing and selection: ``t[idx]`` and ``t[idx] = v``, gather, scatter, scatter_add and index_add (and their
in-place forms), index_select, take, narrow, masked_fill (and masked_fill_), masked_select, where; index results computed on the arrays (no graph): nonzero, argwhere, unique,
bincount, searchsorted, bucketize."""
import builtins
import operator

import numpy as np

from .. import _backend
from .._array import promote_types, result_type_scalar, wrap_dim
from .._backend import int64
from .._registry import function_op, mixin, op
from ..autograd import ops
from ..autograd.grad_mode import is_grad_enabled, no_grad
from ._common import TensorBase, _dim_slice, _inplace, _raw, _tensor_arg, _wrap_array, check_inplace
from .index_write import _out_of_range, _scatter_args  # also registers the family's indexed writes

__all__ = ["IndexMixin"]

_INDEX_DTYPES = (np.dtype(np.int64), np.dtype(np.int32))


# -- t[idx] ------------------------------------------------------------------------------------------------
def _index_arg(i, xp):
    if isinstance(i, TensorBase):
        a = i._data
    elif isinstance(i, (list,)):
        a = np.asarray(i)
        if a.dtype.kind == "f":
            raise IndexError(f"tensors used as indices must be long, int, byte or bool tensors, got list of {a.dtype}")
        return xp.asarray(a) if xp is not np else a
    elif isinstance(i, np.ndarray) or _backend.is_cupy_array(i):
        a = i
    else:
        return i
    if a.dtype.kind not in "biu":
        raise IndexError(f"tensors used as indices must be long, int, byte or bool tensors, got {a.dtype}")
    if a.dtype == np.uint8:
        a = a.astype(bool)
    return a


def _normalize_index(self, idx):
    xp = self._xp()
    if isinstance(idx, tuple):
        return tuple(_index_arg(i, xp) for i in idx)
    return _index_arg(idx, xp)


@op("index", functions=(ops.GetItem,))
def __getitem__(self, idx):
    return ops.GetItem.apply(self, _normalize_index(self, idx))


@op("index")
def __setitem__(self, idx, value):
    check_inplace(self)
    if isinstance(value, TensorBase):
        if is_grad_enabled() and value.requires_grad:
            raise RuntimeError("hpcfsdp does not record setitem of a tensor that requires grad; use torch-style "
                               "out-of-place ops (e.g. hp.where / hp.cat) or run under hp.no_grad()")
        value = value._data
    if _backend.is_meta_array(self._data):
        return
    self._data[_normalize_index(self, idx)] = value


# -- selection along a dim ---------------------------------------------------------------------------------
@op("index", function=True, functions=(ops.TakeAlong,))
def gather(self, dim, index, *, sparse_grad=False):
    idx = _tensor_arg(index, "gather", "index")._data
    if idx.dtype not in _INDEX_DTYPES:
        raise RuntimeError(f"gather(): Expected dtype int64 or int32 for index, got {idx.dtype}")
    if builtins.max(idx.ndim, 1) != builtins.max(self.ndim, 1):
        raise RuntimeError(f"Index tensor must have the same number of dimensions as input tensor "
                           f"(index {idx.ndim}-D, input {self.ndim}-D)")
    if self.ndim == 0 or idx.ndim == 0:
        return self.reshape(1).gather(0, index.reshape(1)).reshape(idx.shape)
    d = wrap_dim(dim, self.ndim)
    for i, (m, n) in enumerate(zip(idx.shape, self._data.shape)):
        if i != d and m > n:
            raise RuntimeError(f"Size does not match at dimension {i} expected index {list(idx.shape)} to be no "
                               f"larger than self {list(self.shape)} apart from dimension {d}")
    bad = _out_of_range(idx, self._data.shape[d])
    if bad is not None:
        raise RuntimeError(f"index {bad} is out of bounds for dimension {d} with size {self._data.shape[d]}")
    return ops.TakeAlong.apply(self, idx, d)


@op("index", function=True)
def take_along_dim(self, indices, dim=None):
    """gather along ``dim`` with ``indices`` and self broadcast against each other except along dim; dim None takes
    from the flattened tensor."""
    _tensor_arg(indices, "take_along_dim", "indices")
    if indices._data.dtype != np.int64:
        raise RuntimeError(f"torch.take_along_dim(): dtype of indices should be Long but got {indices.dtype}")
    if dim is None:
        return self.reshape(-1).gather(0, indices.reshape(-1))
    if self.ndim != indices.ndim:
        raise RuntimeError(f"torch.take_along_dim(): input and indices should have the same number of dimensions, "
                           f"but got {self.ndim} dimensions for input, and {indices.ndim} dimensions for indices")
    d = wrap_dim(dim, self.ndim)
    a, i = list(self.shape), list(indices.shape)
    a[d] = i[d] = 1
    try:
        common = list(np.broadcast_shapes(tuple(a), tuple(i)))
    except ValueError:
        k = next(j for j, (x, y) in enumerate(zip(a, i)) if x != y and 1 not in (x, y))
        raise RuntimeError(f"The size of tensor a ({a[k]}) must match the size of tensor b ({i[k]}) at non-singleton "
                           f"dimension {k}") from None
    src_shape, idx_shape = list(common), list(common)
    src_shape[d], idx_shape[d] = self.shape[d], indices.shape[d]
    return self.expand(src_shape).gather(d, indices.expand(idx_shape))


def _scatter(self, fn, dim, index, src, add):
    d, idx = _scatter_args(self, fn, dim, index, src)
    if isinstance(src, TensorBase) and src.dtype != self.dtype:
        raise RuntimeError(f"{fn}(): Expected self.dtype to be equal to src.dtype")
    x = self if self.ndim else self.reshape(1)
    out = ops.Scatter.apply(x, idx.reshape(idx.shape or (1,)), src if isinstance(src, TensorBase) else src, d, add)
    return out if self.ndim else out.reshape(())


@op("index", function=True, functions=(ops.Scatter,))
def scatter(self, dim, index, src=None, value=None, *, reduce=None):
    """``src`` (a tensor, or a number: ``value``) written into a copy of self at ``index`` along ``dim``."""
    if reduce is not None:
        raise NotImplementedError(f"scatter(reduce={reduce!r}) is not supported by hpcfsdp; use scatter_add or "
                                  "scatter_reduce's out-of-place equivalent")
    if (src is None) == (value is None):
        raise TypeError("scatter() expects exactly one of src or value")
    return _scatter(self, "scatter", dim, index, src if src is not None else value, False)


@op("index", function=True, functions=(ops.Scatter,))
def scatter_add(self, dim, index, src):
    """A copy of self with ``src`` added at ``index`` along ``dim`` (repeated indices accumulate)."""
    return _scatter(self, "scatter_add", dim, index, _tensor_arg(src, "scatter_add", "src"), True)


@op("index", function=True, functions=(ops.IndexAdd,))
def index_add(self, dim, index, source, *, alpha=1):
    """A copy of self with ``alpha * source`` added at the rows ``index`` (1-D) of ``dim``."""
    idx = _tensor_arg(index, "index_add", "index")._data
    source = _tensor_arg(source, "index_add", "source")
    if idx.dtype not in _INDEX_DTYPES:
        raise RuntimeError("index_add_(): Expected dtype int32/int64 for index")
    if idx.ndim > 1:
        raise IndexError("index_add_(): Index is supposed to be a vector")
    d = wrap_dim(dim, builtins.max(self.ndim, 1))
    x = self if self.ndim else self.reshape(1)
    want = x.shape[:d] + (idx.size,) + x.shape[d + 1:]
    if tuple(source.shape if source.ndim else (1,)) != tuple(want):
        raise RuntimeError(f"index_add_(): source has shape {list(source.shape)}, expected {list(want)}")
    if source.dtype != self.dtype:
        raise RuntimeError("index_add_(): self (" + str(self.dtype) + ") and source (" + str(source.dtype)
                           + ") must have the same scalar type")
    bad = _out_of_range(idx, x._data.shape[d])
    if bad is not None:
        raise IndexError(f"index out of range in self: index {bad} for dimension {d} of size {x._data.shape[d]}")
    out = ops.IndexAdd.apply(x, idx.reshape(-1), source.reshape(want), d, alpha)
    return out if self.ndim else out.reshape(())


def _into(self, result):
    """The in-place variant: ``result`` (computed without recording) written into self; returns self."""
    check_inplace(self)
    if not _backend.is_meta_array(self._data):
        self._data[...] = result._data
    return self


@op("index")
def scatter_(self, dim, index, src=None, value=None, *, reduce=None):
    check_inplace(self)
    with no_grad():
        return _into(self, scatter(self, dim, index, src, value, reduce=reduce))


@op("index")
def scatter_add_(self, dim, index, src):
    check_inplace(self)
    with no_grad():
        return _into(self, scatter_add(self, dim, index, src))


@op("index")
def index_add_(self, dim, index, source, *, alpha=1):
    check_inplace(self)
    with no_grad():
        return _into(self, index_add(self, dim, index, source, alpha=alpha))


@op("index", function=True, functions=(ops.GetItem,))
def index_select(self, dim, index):
    idx = _tensor_arg(index, "index_select", "index")._data
    if idx.dtype not in _INDEX_DTYPES:
        raise RuntimeError(f"index_select(): Expected dtype int32 or int64 for index, got {idx.dtype}")
    if idx.ndim > 1:
        raise IndexError(f"index_select(): Index is supposed to be a vector, got shape {list(idx.shape)}")
    d = wrap_dim(dim, self.ndim)
    src = self if self.ndim else self.reshape(1)
    bad = _out_of_range(idx, src._data.shape[d])
    if bad is not None:
        raise IndexError(f"index out of range in self: index {bad} for dimension {d} of size {src._data.shape[d]}")
    out = ops.GetItem.apply(src, _dim_slice(d, idx.reshape(-1)))
    return out if self.ndim else out.reshape(idx.shape)


@op("index", function=True)
def narrow(self, dim, start, length):
    if self.ndim == 0:
        raise RuntimeError("narrow() cannot be applied to a 0-dim tensor.")
    d = wrap_dim(dim, self.ndim)
    n = self._data.shape[d]
    start, length = operator.index(start), operator.index(length)
    if not -n <= start <= n:
        raise IndexError(f"start out of range (expected to be in range of [{-n}, {n}], but got {start})")
    start = start + n if start < 0 else start
    if length < 0:
        raise RuntimeError(f"narrow(): length must be non-negative, got {length}.")
    if start + length > n:
        raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size ({n}).")
    return self[_dim_slice(d, slice(start, start + length))]


@op("index", function=True, functions=(ops.GetItem,))
def take(self, index):
    idx = _tensor_arg(index, "take", "index")._data
    if idx.dtype.kind not in "iu":
        raise RuntimeError(f"take(): Expected a long tensor for index, but got {index.dtype}")
    n = self.numel()
    if idx.size and bool(((idx < -n) | (idx >= n)).any()):
        bad = int(idx[(idx < -n) | (idx >= n)].ravel()[0])
        raise IndexError(f"out of range: tried to access index {bad} on a tensor of {n} elements.")
    return ops.GetItem.apply(self.reshape(-1), idx)


# -- masks -------------------------------------------------------------------------------------------------
@op("index", function=True, functions=(ops.MaskedFill,))
def masked_fill(self, mask, value):
    m = mask._data if isinstance(mask, TensorBase) else mask
    if m.dtype != np.bool_:
        raise RuntimeError(f"masked_fill only supports boolean masks, but got mask with dtype {m.dtype}")
    try:
        np.broadcast_shapes(tuple(m.shape), tuple(self.shape))
    except ValueError:
        raise RuntimeError(f"masked_fill: the mask of shape {tuple(m.shape)} does not broadcast to the tensor's "
                           f"shape {tuple(self.shape)}") from None
    if isinstance(value, TensorBase):
        if value.ndim != 0:
            raise RuntimeError(f"masked_fill only supports a 0-dimensional value tensor, but got one with "
                               f"{value.ndim} dimension(s)")
        value = value.item()
    return ops.MaskedFill.apply(self, m, value)


@op("index")
@_inplace
def masked_fill_(a, mask, value):
    a[_raw(mask)] = _raw(value)


@op("index", function=True, functions=(ops.GetItem,))
def masked_select(self, mask):
    m = _tensor_arg(mask, "masked_select", "mask")
    if m._data.dtype != np.bool_:
        raise RuntimeError(f"masked_select: expected BoolTensor for mask, got {m.dtype}")
    try:
        shape = tuple(np.broadcast_shapes(tuple(self.shape), tuple(m.shape)))
    except ValueError:
        raise RuntimeError(f"masked_select: the mask of shape {tuple(m.shape)} does not broadcast with the "
                           f"input's shape {tuple(self.shape)}") from None
    src = self if tuple(self.shape) == shape else self.expand(shape)
    return ops.GetItem.apply(src, self._xp().nonzero(self._xp().broadcast_to(m._data, shape)))


def _where(condition, input=None, other=None):  # noqa: A002
    """where(cond, x, y) element-wise select (broadcasting); where(cond) -> tuple of index tensors."""
    c = condition._data if isinstance(condition, TensorBase) else np.asarray(condition)
    if input is None and other is None:
        return tuple(_wrap_array(i.astype(np.int64)) for i in c.nonzero())
    if c.dtype != np.bool_:
        raise RuntimeError(f"where expected condition to be a boolean tensor, but got a tensor with dtype {c.dtype}")
    a, b = input, other
    if isinstance(a, TensorBase) and isinstance(b, TensorBase):
        dt = promote_types(a.dtype, b.dtype, a.ndim == 0, b.ndim == 0)
        a, b = a.to(dt), b.to(dt)
    elif isinstance(a, TensorBase):
        a = a.to(result_type_scalar(a.dtype, b))
        b = a._data.dtype.type(b)
    elif isinstance(b, TensorBase):
        b = b.to(result_type_scalar(b.dtype, a))
        a = b._data.dtype.type(a)
    else:
        dt = _backend.default_float_dtype() if builtins.any(isinstance(v, float) for v in (a, b)) else int64
        a, b = dt.type(a), dt.type(b)
    return ops.Where.apply(c, a, b)


_where.__name__ = _where.__qualname__ = "where"


@op("index", function=_where, functions=(ops.Where,))
def where(self, condition, other):
    """self where ``condition`` is True, else ``other`` (hp.where(condition, self, other))."""
    return _where(condition, self, other)


# -- index results (no graph) ------------------------------------------------------------------------------
@op("index", function=True)
def nonzero(self, *, as_tuple=False):
    a = self._data if self.ndim else self._data.reshape(1)
    idx = [i.astype(np.int64) for i in self._xp().nonzero(a)]
    if as_tuple:
        return tuple(self._wrap(i) for i in idx)
    if self.ndim == 0:
        return self._wrap(self._xp().zeros((idx[0].shape[0], 0), dtype=np.int64))
    return self._wrap(self._xp().stack(idx, axis=1))


@op("index", function=True)
def argwhere(self):
    return self.nonzero()


@op("index", function=True)
def unique(self, sorted=True, return_inverse=False, return_counts=False, dim=None):  # noqa: A002
    """Sorted unique values (``sorted=False`` sorts too, as PyTorch on CPU); inverse and counts int64."""
    xp = self._xp()
    a = self._data
    if dim is not None:
        d = wrap_dim(dim, self.ndim)
        vals, inv, cnt = xp.unique(a, return_inverse=True, return_counts=True, axis=d)
    else:
        vals, inv, cnt = xp.unique(a.reshape(-1), return_inverse=True, return_counts=True)
        inv = inv.reshape(a.shape)
    out = [self._wrap(vals)]
    if return_inverse:
        out.append(self._wrap(inv.reshape(-1).astype(np.int64) if dim is not None else inv.astype(np.int64)))
    if return_counts:
        out.append(self._wrap(cnt.astype(np.int64)))
    return out[0] if len(out) == 1 else tuple(out)


@op("index", function=True)
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    """The first element of every run of equal consecutive elements (slices along ``dim``; NaN equals nothing),
    with each element's run (int64, the input's shape; along ``dim``, its length) and each run's length."""
    xp = self._xp()
    a = self._data
    if dim is None:
        rows = a.reshape(-1, 1)
    else:
        d = wrap_dim(dim, self.ndim)
        rows = xp.moveaxis(a, d, 0).reshape(a.shape[d], -1)
    n = rows.shape[0]
    starts = xp.ones(n, dtype=bool)
    if n > 1:
        starts[1:] = (rows[1:] != rows[:-1]).any(axis=1)
    first = xp.flatnonzero(starts)
    if dim is None:
        vals = a.reshape(-1)[first]
    else:
        vals = xp.moveaxis(xp.moveaxis(a, d, 0)[first], 0, d)
    out = [self._wrap(xp.ascontiguousarray(vals))]
    if return_inverse:
        inv = (xp.cumsum(starts) - 1).astype(np.int64)
        out.append(self._wrap(inv.reshape(a.shape) if dim is None else inv))
    if return_counts:
        out.append(self._wrap(xp.diff(xp.append(first, n)).astype(np.int64)))
    return out[0] if len(out) == 1 else tuple(out)


@op("index", function=True)
def bincount(self, weights=None, minlength=0):
    a = self._data
    if a.ndim != 1 or a.dtype.kind not in "iu" or (a.size and bool((a < 0).any())):
        if a.ndim == 1 and a.dtype.kind not in "iub":
            raise NotImplementedError(f"\"bincount_cpu\" not implemented for '{self.dtype}'")
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise RuntimeError(f"minlength should be >= 0, got {minlength}")
    xp = self._xp()
    w = None
    if weights is not None:
        w = _tensor_arg(weights, "bincount", "weights")._data
        if w.shape != a.shape:
            raise RuntimeError(f"weights should be 1-d and have the same length as input (got {list(w.shape)} "
                               f"for an input of {a.shape[0]})")
    out_dtype = np.int64 if w is None else (np.float32 if w.dtype == np.float32 else np.float64)
    r = xp.bincount(a, weights=None if w is None else w.astype(np.float64), minlength=minlength)
    return self._wrap(r.astype(out_dtype, copy=False))


@function_op("index")
def searchsorted(sorted_sequence, input, *, out_int32=False, right=False, side=None, sorter=None):  # noqa: A002
    """Indices where ``input`` (a Tensor or a number) would be inserted into the last dim of sorted_sequence
    (1-D, or with leading dims equal to input's) to keep it sorted; int64 (int32 with out_int32)."""
    seq = _tensor_arg(sorted_sequence, "searchsorted", "sorted_sequence")
    if side not in (None, "left", "right"):
        raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
    if side is not None and (side == "right") != right and right:
        raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, got side of left "
                           "while right was True")
    right = right or side == "right"
    xp = seq._xp()
    s = seq._data
    if sorter is not None:
        s = xp.take_along_axis(s, _tensor_arg(sorter, "searchsorted", "sorter")._data, axis=-1)
    scalar = not isinstance(input, TensorBase)
    v = xp.asarray(input) if scalar else input._data
    if s.ndim == 0:
        raise RuntimeError("torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 dimensions "
                           "of boundaries tensor and input value tensor must match, but we got boundaries tensor [] "
                           f"and input value tensor {list(v.shape)}")
    if s.ndim == 1:
        idx = xp.searchsorted(s, v, side="right" if right else "left")
    else:
        if scalar or s.shape[:-1] != v.shape[:-1]:
            raise RuntimeError(f"torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 "
                               f"dimensions of boundaries tensor and input value tensor must match, but we got "
                               f"boundaries tensor {list(s.shape)} and input value tensor {list(v.shape)}")
        below = (s[..., None, :] <= v[..., :, None]) if right else (s[..., None, :] < v[..., :, None])
        idx = below.sum(axis=-1)
    return _wrap_array(xp.asarray(idx).astype(np.int32 if out_int32 else np.int64))


@function_op("index")
def bucketize(input, boundaries, *, out_int32=False, right=False):  # noqa: A002
    """The bucket of each element of ``input`` for 1-D sorted ``boundaries``: i with boundaries[i-1] < x <=
    boundaries[i] (right=False) or boundaries[i-1] <= x < boundaries[i] (right=True)."""
    b = _tensor_arg(boundaries, "bucketize", "boundaries")
    if b.ndim != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({b.ndim})")
    return searchsorted(b, input, out_int32=out_int32, right=right)


IndexMixin = mixin("index")
