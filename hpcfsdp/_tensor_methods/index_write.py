"""Indexed writes of the index family: index_fill, index_copy, index_put, put, masked_scatter, scatter_reduce and
index_reduce, with their in-place forms; all differentiable through ops.IndexPut / ops.ScatterReduce, with PyTorch's
checks, and the index checks of the scatter family. hpcfsdp/_tensor_methods/index.py imports this module before
it makes the family's mixin."""
import builtins

import numpy as np

from .. import _backend
from .._array import wrap_dim
from .._registry import op
from ..autograd import ops
from ..autograd.grad_mode import no_grad
from ._common import TensorBase, _dim_slice, _tensor_arg, check_inplace

__all__ = []

_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


def _out_of_range(idx, n, lo=0):
    """The first index of ``idx`` outside [lo, n), or None (one device-to-host sync on CuPy)."""
    if idx.size == 0:
        return None
    bad = (idx < lo) | (idx >= n)
    return int(idx[bad].ravel()[0]) if bool(bad.any()) else None


def _long_index(index, fn, msg):
    idx = _tensor_arg(index, fn, "index")._data
    if idx.dtype != np.int64:
        raise RuntimeError(msg.format(index.dtype))
    return idx


def _written(self, result):
    """An in-place form: ``result`` (computed without recording) written into self; returns self."""
    if not _backend.is_meta_array(self._data):
        self._data[...] = result._data
    return self


def _as_1d(self):
    return self if self.ndim else self.reshape(1)


def _back(self, out):
    return out if self.ndim else out.reshape(())


# -- along a dim -------------------------------------------------------------------------------------------
@op("index", function=True, functions=(ops.IndexPut,))
def index_fill(self, dim, index, value):
    """A copy of self with ``value`` (a number or a 0-d tensor, differentiable) at the entries ``index`` (1-D or
    0-d, negative counts from the end) of ``dim``."""
    idx = _tensor_arg(index, "index_fill", "index")._data
    if idx.dtype != np.int64:
        raise IndexError("index_fill_(): Expected dtype int64 for index.")
    if idx.ndim > 1:
        raise RuntimeError("Index has to be a vector/scalar")
    x = _as_1d(self)
    d = wrap_dim(dim, x.ndim)
    n = x._data.shape[d]
    bad = _out_of_range(idx, n, -n)
    if bad is not None:
        raise IndexError(f"index {bad} is out of bounds for dimension {d} with size {n}")
    if isinstance(value, TensorBase):
        if value.ndim:
            raise RuntimeError(f"index_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                               f"{value.ndim} dimension(s).")
        value = value.to(self.dtype)
    else:
        value = x._xp().asarray(value).astype(self._data.dtype)
    return _back(self, ops.IndexPut.apply(x, _dim_slice(d, idx.reshape(-1) % builtins.max(n, 1)), value, False))


@op("index", function=True, functions=(ops.IndexPut,))
def index_copy(self, dim, index, source):
    """A copy of self with the slices of ``source`` along ``dim`` written at the entries ``index`` (1-D)."""
    idx = _long_index(index, "index_copy", "index_copy_(): Expected a long tensor for index, but got {}")
    source = _tensor_arg(source, "index_copy", "source")
    if idx.ndim > 1:
        raise IndexError("index_copy_(): Index should have dimension 1 or 0 (got " + str(idx.ndim) + ")")
    x, src = _as_1d(self), _as_1d(source)
    d = wrap_dim(dim, x.ndim)
    if src.ndim != x.ndim or src.shape[:d] + src.shape[d + 1:] != x.shape[:d] + x.shape[d + 1:]:
        raise RuntimeError(f"index_copy_(): Source/destination tensor must have same slice shapes. Destination "
                           f"slice shape: {list(x.shape[:d] + x.shape[d + 1:])} at dimension {d} and source slice "
                           f"shape: {list(src.shape[:d] + src.shape[d + 1:])} at dimension {d}.")
    if idx.size != src.shape[d]:
        raise IndexError(f"index_copy_(): Number of indices ({idx.size}) should be equal to source.size(dim) "
                         f"({src.shape[d]})")
    if source.dtype != self.dtype:
        raise RuntimeError(f"index_copy_(): self and source expected to have the same dtype, but got (self) "
                           f"{self.dtype} and (source) {source.dtype}")
    bad = _out_of_range(idx, x._data.shape[d])
    if bad is not None:
        raise IndexError(f"index_copy_(): index {bad} is out of bounds for dimension {d} with size "
                         f"{x._data.shape[d]}")
    return _back(self, ops.IndexPut.apply(x, _dim_slice(d, idx.reshape(-1)), src, False))


# -- advanced indices --------------------------------------------------------------------------------------
def _index_put_where(self, indices, values):
    if not isinstance(indices, (tuple, list)):
        raise TypeError(f"index_put(): argument 'indices' (position 1) must be tuple of Tensors, not "
                        f"{type(indices).__name__}")
    _tensor_arg(values, "index_put", "values")
    if values.dtype != self.dtype:
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got {self.dtype} for the "
                           f"destination and {values.dtype} for the source.")
    where = []
    for i in indices:
        if not isinstance(i, TensorBase):
            raise TypeError(f"expected Tensor as element {len(where)} in argument 0, but got {type(i).__name__}")
        a = i._data
        if a.dtype.kind not in "biu":
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
        where.append(a.astype(bool) if a.dtype == np.uint8 else a)
    if builtins.sum(w.ndim if w.dtype == bool else 1 for w in where) > builtins.max(self.ndim, 1):
        raise IndexError(f"too many indices for tensor of dimension {self.ndim} (got {len(where)})")
    dim = 0
    for w in where:  # PyTorch's bounds check, dim by dim (a bool mask covers as many dims as it has)
        if w.dtype == bool:
            dim += w.ndim
            continue
        n = self._data.shape[dim]
        bad = _out_of_range(w, n, -n)
        if bad is not None:
            raise IndexError(f"index {bad} is out of bounds for dimension {dim} with size {n}")
        dim += 1
    return tuple(where)


@op("index", function=True, functions=(ops.IndexPut,))
def index_put(self, indices, values, accumulate=False):
    """A copy of self with ``values`` (broadcast) written, or added with ``accumulate``, at ``self[indices]`` for a
    tuple of index tensors (long, int or bool)."""
    where = _index_put_where(self, indices, values)
    try:
        return ops.IndexPut.apply(self, where, values, bool(accumulate))
    except ValueError as e:
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to "
                           f"the indexing result ({e})") from None


@op("index", function=True)
def index_put_(self, indices, values, accumulate=False):
    check_inplace(self)
    with no_grad():
        return _written(self, index_put(self, indices, values, accumulate))


@op("index", function=True, functions=(ops.IndexPut,))
def put(self, index, source, accumulate=False):
    """A copy of self with ``source``'s elements written (added with ``accumulate``) at the flat indices ``index``
    (negative counts from the end), both taken in row-major order whatever their shapes."""
    idx = _long_index(index, "put", "put_(): Expected a long tensor for index, but got {}")
    source = _tensor_arg(source, "put", "source")
    if source.numel() != idx.size:
        raise IndexError(f"put_(): Expected source and index to have the same number of elements, but got "
                         f"source.numel() = {source.numel()}, index.numel() = {idx.size}")
    if source.dtype != self.dtype:
        raise RuntimeError(f"put_(): self and source expected to have the same dtype, but got self.dtype = "
                           f"{self.dtype} and source.dtype = {source.dtype}")
    n = self.numel()
    bad = _out_of_range(idx, n, -n)
    if bad is not None:
        raise IndexError(f"out of range: tried to access index {bad} on a tensor of {n} elements.")
    flat = idx.reshape(-1) % builtins.max(n, 1)
    return ops.IndexPut.apply(self.reshape(-1), (flat,), source.reshape(-1), bool(accumulate)).reshape(self.shape)


@op("index", function=True, functions=(ops.IndexPut,))
def masked_scatter(self, mask, source):
    """A copy of self (broadcast with ``mask``) with the first elements of ``source``, in row-major order, written
    where the bool ``mask`` is True."""
    m = _tensor_arg(mask, "masked_scatter", "mask")
    source = _tensor_arg(source, "masked_scatter", "source")
    if m._data.dtype != np.bool_:
        raise RuntimeError(f"masked_scatter_ only supports boolean masks, but got mask with dtype {m.dtype}")
    if source.dtype != self.dtype:
        raise RuntimeError(f"masked_scatter: expected self and source to have same dtypes but got{self.dtype} and "
                           f"{source.dtype}")
    try:
        shape = tuple(np.broadcast_shapes(tuple(self.shape), tuple(m.shape)))
    except ValueError:
        raise RuntimeError(f"masked_scatter: the mask of shape {list(m.shape)} does not broadcast with the tensor's "
                           f"shape {list(self.shape)}") from None
    if not shape:  # 0-d: as 1-d (nonzero gives no index arrays)
        return masked_scatter(self.reshape(1), m.reshape(1), source).reshape(())
    xp = self._xp()
    where = xp.nonzero(xp.broadcast_to(m._data, shape))
    count = int(where[0].shape[0])
    if count > source.numel():
        raise RuntimeError("Number of elements of source < number of ones in mask")
    x = self if tuple(self.shape) == shape else self.expand(shape)
    return ops.IndexPut.apply(x, where, source.reshape(-1)[:count], False)


@op("index")
def masked_scatter_(self, mask, source):
    check_inplace(self)
    m = _tensor_arg(mask, "masked_scatter_", "mask")
    full = tuple(np.broadcast_shapes(tuple(self.shape), tuple(m.shape)))
    if full != tuple(self.shape):
        raise RuntimeError(f"masked_scatter_: the mask of shape {list(m.shape)} does not broadcast to the tensor's "
                           f"shape {list(self.shape)}")
    with no_grad():
        return _written(self, masked_scatter(self, mask, source))


@op("index")
def index_fill_(self, dim, index, value):
    check_inplace(self)
    with no_grad():
        return _written(self, index_fill(self, dim, index, value))


@op("index")
def index_copy_(self, dim, index, source):
    check_inplace(self)
    with no_grad():
        return _written(self, index_copy(self, dim, index, source))


@op("index")
def put_(self, index, source, accumulate=False):
    check_inplace(self)
    with no_grad():
        return _written(self, put(self, index, source, accumulate))


# -- reductions into indexed positions ---------------------------------------------------------------------
def _scatter_args(self, fn, dim, index, src):
    """(dim, index array) of scatter/scatter_add, checked as PyTorch checks them."""
    idx = _tensor_arg(index, fn, "index")._data
    if idx.dtype != np.int64:
        raise RuntimeError(f"{fn}(): Expected dtype int64 for index")
    if builtins.max(idx.ndim, 1) != builtins.max(self.ndim, 1):
        raise RuntimeError("Index tensor must have the same number of dimensions as self tensor")
    d = wrap_dim(dim, builtins.max(self.ndim, 1))
    shape = self._data.shape or (1,)
    src_shape = src._data.shape if isinstance(src, TensorBase) else None
    for i, m in enumerate(idx.shape):
        if (i != d and m > shape[i]) or (src_shape is not None and m > (src_shape or (1,))[i]):
            raise RuntimeError(f"Expected index {list(idx.shape)} to be smaller than self {list(self.shape)} apart "
                               f"from dimension {d}" + (f" and to be smaller size than src {list(src.shape)}"
                                                        if src_shape is not None else ""))
    bad = _out_of_range(idx, shape[d])
    if bad is not None:
        raise RuntimeError(f"index {bad} is out of bounds for dimension {d} with size {shape[d]}")
    return d, idx


def _check_reduce(reduce, allowed, fn):
    if reduce not in allowed:
        if fn == "index_reduce":
            raise RuntimeError(f"index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got "
                               f"{reduce}.")
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")


def _scatter_reduce_apply(self, d, idx, src, reduce, include_self):
    x = _as_1d(self)
    out = ops.ScatterReduce.apply(x, idx.reshape(idx.shape or (1,)), _as_1d(src), d, reduce, bool(include_self))
    return _back(self, out)


@op("index", function=True, functions=(ops.ScatterReduce,))
def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    """A copy of self with ``src``'s values reduced in at ``index`` along ``dim`` by ``reduce`` (sum, prod, mean,
    amax, amin); ``include_self=False`` leaves self's values out at the positions written. Integer means floor."""
    _tensor_arg(src, "scatter_reduce", "src")
    _check_reduce(reduce, _REDUCTIONS, "scatter_reduce")
    if isinstance(index, TensorBase) and index.dtype == _backend.int32:
        index = index.long()  # PyTorch's scatter_reduce takes int32 indices too
    d, idx = _scatter_args(self, "scatter_reduce", dim, index, src)
    if src.dtype != self.dtype:
        raise RuntimeError("scatter(): Expected self.dtype to be equal to src.dtype")
    return _scatter_reduce_apply(self, d, idx, src, reduce, include_self)


@op("index", function=True, functions=(ops.ScatterReduce,))
def index_reduce(self, dim, index, source, reduce, *, include_self=True):
    """A copy of self with the slices of ``source`` along ``dim`` reduced in at the entries ``index`` (1-D) by
    ``reduce`` (prod, mean, amax, amin); ``include_self=False`` leaves self's values out where written."""
    idx = _tensor_arg(index, "index_reduce", "index")._data
    source = _tensor_arg(source, "index_reduce", "source")
    _check_reduce(reduce, _REDUCTIONS[1:], "index_reduce")
    if idx.dtype.kind not in "iu":
        raise RuntimeError(f"index_reduce_(): Expected dtype int32/int64 for index but got: {index.dtype}")
    if idx.ndim > 1:
        raise IndexError("index_reduce_(): Index is supposed to be a vector")
    x, src = _as_1d(self), _as_1d(source)
    d = wrap_dim(dim, x.ndim)
    if src.ndim != x.ndim or src.shape[:d] + src.shape[d + 1:] != x.shape[:d] + x.shape[d + 1:]:
        raise RuntimeError(f"source tensor shape must match self tensor shape, excluding the specified dimension. "
                           f"Got self.shape = {list(self.shape)} source.shape = {list(source.shape)}")
    if idx.size != src.shape[d]:
        raise RuntimeError(f"index_reduce_(): Number of indices ({idx.size}) should be equal to source.size(dim): "
                           f"({src.shape[d]}), for dim: {d}")
    if source.dtype != self.dtype:
        raise RuntimeError(f"index_reduce_(): self ({self.dtype}) and source ({source.dtype}) must have the same "
                           f"scalar type")
    if _out_of_range(idx, x._data.shape[d]) is not None:
        raise IndexError("index out of range in self")
    xp = self._xp()
    shape = [1] * src.ndim
    shape[d] = idx.size
    full = xp.broadcast_to(idx.astype(np.int64).reshape(shape), src.shape)
    return _back(self, ops.ScatterReduce.apply(x, full, src, d, reduce, bool(include_self)))


@op("index")
def scatter_reduce_(self, dim, index, src, reduce, *, include_self=True):
    check_inplace(self)
    with no_grad():
        return _written(self, scatter_reduce(self, dim, index, src, reduce, include_self=include_self))


@op("index")
def index_reduce_(self, dim, index, source, reduce, *, include_self=True):
    check_inplace(self)
    with no_grad():
        return _written(self, index_reduce(self, dim, index, source, reduce, include_self=include_self))
