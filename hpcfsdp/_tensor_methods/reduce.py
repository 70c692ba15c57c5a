"""Reductions, scans and order statistics along dims: sum, mean, prod, amax/amin, max/min, argmax/argmin, var/std
(and var_mean/std_mean), logsumexp, count_nonzero, all/any, the nan-reductions, cumsum/cumprod/cummax/cummin, sort,
argsort, topk, median, kthvalue and quantile; statistics.py adds logcumsumexp, nanmedian, mode, histc, cov, corrcoef
and the trapezoid rule."""
import collections
import operator

import numpy as np

from .. import _backend
from .._array import dtype_category, wrap_dim
from .._registry import function_op, mixin, op
from ..autograd import ops
from ..autograd.ops._common import _axes
from ._common import (FP32, TensorBase, _argsort, _assign_result, _dim_slice, _float_only, _integral_to_int64,
                      _tensor_arg, _to_float, _topk_indices, autocast_op)

__all__ = ["ReduceMixin", "SortResult", "TopkResult", "ValuesIndices"]


class _MinMax(tuple):
    """(values, indices) result of max(dim)/min(dim), as torch.return_types."""

    __slots__ = ()

    def __new__(cls, values, indices):
        return super().__new__(cls, (values, indices))

    values = property(lambda self: self[0])
    indices = property(lambda self: self[1])


# torch.return_types.sort / torch.return_types.topk: tuples with .values and .indices
SortResult = collections.namedtuple("sort", ["values", "indices"])
TopkResult = collections.namedtuple("topk", ["values", "indices"])
# torch.return_types.cummax / cummin / median / kthvalue: tuples with .values and .indices
ValuesIndices = collections.namedtuple("return_types", ["values", "indices"])


def _wrap_dims(dim, ndim):
    if dim is None:
        return None
    if isinstance(dim, (list, tuple)):
        return tuple(wrap_dim(d, ndim) for d in dim)
    return wrap_dim(dim, ndim)


# -- sums and means ----------------------------------------------------------------------------------------
@op("reduce", function=True, functions=(ops.Sum,))
def sum(self, dim=None, keepdim=False, *, dtype=None):  # noqa: A001
    return ops.Sum.apply(self, _wrap_dims(dim, self.ndim), keepdim, None if dtype is None else _backend.to_dtype(dtype))


@op("reduce", function=True, functions=(ops.Mean,))
def mean(self, dim=None, keepdim=False, *, dtype=None):
    a = self if dtype is None else self.to(dtype)
    if dtype_category(a._data.dtype) != 2:
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a floating "
                           f"point or complex dtype. Got: {a.dtype}")
    return ops.Mean.apply(a, _wrap_dims(dim, a.ndim), keepdim)


@op("reduce", function=True)
def nansum(self, dim=None, keepdim=False, *, dtype=None):
    a = _integral_to_int64(self, dtype)
    if dtype_category(a._data.dtype) == 2:
        a = a.masked_fill(a.isnan(), 0.0)
    return a.sum(_axes(dim, a.ndim), keepdim)


@op("reduce", function=True)
def nanmean(self, dim=None, keepdim=False, *, dtype=None):
    a = self if dtype is None else self.to(dtype)
    _float_only(a, "nanmean")
    ok = ~a.isnan()
    return a.nansum(dim, keepdim) / ok.sum(_axes(dim, a.ndim), keepdim).to(a.dtype)


@op("reduce", function=True, functions=(ops.Prod,))
@autocast_op(cpu=FP32, cuda=FP32)
def prod(self, dim=None, keepdim=False, *, dtype=None):
    a = _integral_to_int64(self, dtype)
    d = None if dim is None else wrap_dim(dim, a.ndim)
    return ops.Prod.apply(a, d if a.ndim else None, keepdim)


@op("reduce", function=True, functions=(ops.Logsumexp,))
def logsumexp(self, dim, keepdim=False):
    a = _to_float(self)
    return ops.Logsumexp.apply(a, _axes(dim, a.ndim), keepdim)


@op("reduce", function=True)
def count_nonzero(self, dim=None):
    r = (self._data != 0).sum(axis=_axes(dim, self.ndim))
    return self._wrap(self._xp().asarray(r).astype(np.int64))


@op("reduce", function=True)
def all(self, dim=None, keepdim=False):  # noqa: A001
    return self._wrap(self._xp().asarray(self._data.all(axis=_wrap_dims(dim, self.ndim), keepdims=keepdim)))


@op("reduce", function=True)
def any(self, dim=None, keepdim=False):  # noqa: A001
    return self._wrap(self._xp().asarray(self._data.any(axis=_wrap_dims(dim, self.ndim), keepdims=keepdim)))


# -- extremes ----------------------------------------------------------------------------------------------
@op("reduce", function=True, functions=(ops.Amax,))
def amax(self, dim=(), keepdim=False):
    d = _wrap_dims(dim, self.ndim)
    return ops.Amax.apply(self, None if d == () else d, keepdim, False)  # () reduces all dims; 0 is a dim


@op("reduce", function=True, functions=(ops.Amax,))
def amin(self, dim=(), keepdim=False):
    d = _wrap_dims(dim, self.ndim)
    return ops.Amax.apply(self, None if d == () else d, keepdim, True)


def _max_or_min(self, dim, keepdim, other, is_min):
    if isinstance(dim, TensorBase):
        other = dim
    if other is not None:
        return self.minimum(other) if is_min else self.maximum(other)
    if dim is None:
        return ops.Amax.apply(self, None, False, is_min)
    vals, idx = ops.MaxDim.apply(self, wrap_dim(dim, self.ndim), keepdim, is_min)
    return _MinMax(vals, idx)


@op("reduce", function=True, functions=(ops.Amax, ops.MaxDim))
def max(self, dim=None, keepdim=False, *, other=None):  # noqa: A001
    return _max_or_min(self, dim, keepdim, other, False)


@op("reduce", function=True, functions=(ops.Amax, ops.MaxDim))
def min(self, dim=None, keepdim=False, *, other=None):  # noqa: A001
    return _max_or_min(self, dim, keepdim, other, True)


@op("reduce", function=True)
def argmax(self, dim=None, keepdim=False):
    a = self._data
    if dim is None:
        r = a.reshape(-1).argmax()
        return self._wrap(r.reshape((1,) * a.ndim if keepdim else ()).astype(np.int64))
    return self._wrap(a.argmax(axis=wrap_dim(dim, a.ndim), keepdims=keepdim).astype(np.int64))


@op("reduce", function=True)
def argmin(self, dim=None, keepdim=False):
    a = self._data
    if dim is None:
        r = a.reshape(-1).argmin()
        return self._wrap(r.reshape((1,) * a.ndim if keepdim else ()).astype(np.int64))
    return self._wrap(a.argmin(axis=wrap_dim(dim, a.ndim), keepdims=keepdim).astype(np.int64))


# -- variance ----------------------------------------------------------------------------------------------
@op("reduce", function=True, functions=(ops.Var,))
def var(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):  # var(unbiased) positional form
        dim, unbiased = None, dim
    if correction is None:
        correction = 0 if unbiased is False else 1
    return ops.Var.apply(_to_float(self), _wrap_dims(dim, self.ndim), correction, keepdim)


@op("reduce", function=True)
def std(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return self.var(dim, unbiased, keepdim, correction=correction).sqrt()


@function_op("reduce")
def var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):  # noqa: A002
    """(var, mean) over ``dim``, with PyTorch's var arguments (correction=1 by default)."""
    _tensor_arg(input, "var_mean")
    if isinstance(dim, bool):  # var_mean(input, unbiased)
        dim, unbiased = None, dim
    return input.var(dim, unbiased, keepdim, correction=correction), input.mean(dim, keepdim)


@function_op("reduce")
def std_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):  # noqa: A002
    """(std, mean) over ``dim``, with PyTorch's std arguments (correction=1 by default)."""
    _tensor_arg(input, "std_mean")
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    return input.std(dim, unbiased, keepdim, correction=correction), input.mean(dim, keepdim)


# -- scans -------------------------------------------------------------------------------------------------
@op("reduce", function=True, functions=(ops.Cumsum,))
def cumsum(self, dim, *, dtype=None):
    a = _integral_to_int64(self, dtype)
    return ops.Cumsum.apply(a, wrap_dim(dim, a.ndim))


@op("reduce", function=True, functions=(ops.Cumprod,))
def cumprod(self, dim, *, dtype=None):
    a = _integral_to_int64(self, dtype)
    return ops.Cumprod.apply(a, wrap_dim(dim, a.ndim))


def _cumulative_(name):
    def f(self, dim, *, dtype=None):
        if dtype is not None and _backend.to_dtype(dtype) != self._data.dtype:
            raise RuntimeError(f"Bad in-place call: input tensor dtype {self.dtype} and output tensor dtype "
                               f"{_backend.to_dtype(dtype)} should match")
        return _assign_result(self, getattr(self, name)(dim), name + "_")

    f.__name__ = f.__qualname__ = name + "_"
    f.__doc__ = f"In-place {name} along ``dim`` (not recorded by autograd)."
    return f


op("reduce", name="cumsum_")(_cumulative_("cumsum"))
op("reduce", name="cumprod_")(_cumulative_("cumprod"))


def _cumextreme_indices(a, dim, is_min):
    """Index of the running max (min) along ``dim``: the latest of equal values; NaN propagates, as PyTorch."""
    xp = _backend.array_module(a)
    x = a.astype(np.float32) if a.dtype in (np.float16, _backend.bfloat16) else a
    x = xp.moveaxis(x, dim, -1)
    idx = xp.zeros(x.shape, dtype=np.int64)
    best = x[..., 0]
    for j in range(1, x.shape[-1]):
        cur = x[..., j]
        take = (cur <= best) if is_min else (cur >= best)
        if x.dtype.kind == "f":
            take = (take | xp.isnan(cur)) & ~xp.isnan(best)
        best = xp.where(take, cur, best)
        idx[..., j] = xp.where(take, j, idx[..., j - 1])
    return xp.moveaxis(idx, -1, dim)


def _cumextreme(self, dim, is_min):
    d = wrap_dim(dim, self.ndim)
    if self.ndim == 0 or self._data.size == 0:
        return ValuesIndices(self.clone(), self._wrap(self._xp().zeros(self._data.shape, dtype=np.int64)))
    idx = _cumextreme_indices(self._data, d, is_min)
    return ValuesIndices(ops.TakeAlong.apply(self, idx, d), self._wrap(idx))


@op("reduce", function=True, functions=(ops.TakeAlong,))
def cummax(self, dim):
    return _cumextreme(self, dim, False)


@op("reduce", function=True, functions=(ops.TakeAlong,))
def cummin(self, dim):
    return _cumextreme(self, dim, True)


# -- aminmax ----------------------------------------------------------------------------------------------
# torch.return_types.aminmax: a tuple with .min and .max
MinMax = collections.namedtuple("aminmax", ["min", "max"])


@op("reduce", function=True, functions=(ops.Amax,))
def aminmax(self, *, dim=None, keepdim=False):
    """(min, max) over ``dim`` (all elements for None), differentiable as amin and amax."""
    if dim is None:
        if self._data.size == 0:
            raise RuntimeError("aminmax(): cannot compute aminmax over an empty dimension as the operation has no "
                               "identity.")
        return MinMax(self.amin(keepdim=keepdim), self.amax(keepdim=keepdim))
    d = wrap_dim(dim, self.ndim)
    if self.ndim and self._data.shape[d] == 0:
        raise IndexError(f"aminmax: Expected reduction dim {d} to have non-zero size.")
    return MinMax(self.amin(d, keepdim), self.amax(d, keepdim))


# -- sorting and order statistics --------------------------------------------------------------------------
@op("reduce", function=True, functions=(ops.TakeAlong,))
def sort(self, dim=-1, descending=False, stable=False):
    """(values, indices) sorted along ``dim``; always stable; NaN sorts as the largest, as PyTorch."""
    d = wrap_dim(dim, self.ndim)
    idx = _argsort(self._data, d, descending) if self.ndim else self._xp().zeros((), np.int64)
    return SortResult(ops.TakeAlong.apply(self, idx, d), self._wrap(idx))


@op("reduce", function=True, functions=(ops.TakeAlong,))
def msort(self):
    """The values sorted along dim 0."""
    return self.sort(0).values


@op("reduce", function=True)
def argsort(self, dim=-1, descending=False, stable=False):
    d = wrap_dim(dim, self.ndim)
    return self._wrap(_argsort(self._data, d, descending) if self.ndim else self._xp().zeros((), np.int64))


@op("reduce", function=True, functions=(ops.TakeAlong,))
def topk(self, k, dim=-1, largest=True, sorted=True):  # noqa: A002
    """(values, indices) of the k largest (smallest) along ``dim``; returned sorted whatever ``sorted``."""
    d = wrap_dim(dim, self.ndim)
    k = operator.index(k)
    n = self._data.shape[d] if self.ndim else 1
    if not 0 <= k <= n:
        raise RuntimeError(f"selected index k out of range: k={k} for dimension {d} of size {n}")
    if self._data.dtype == np.bool_:
        raise RuntimeError("topk does not support bool dtypes")
    idx = _topk_indices(self._data, k, d, largest) if self.ndim else self._xp().zeros((), np.int64)
    return TopkResult(ops.TakeAlong.apply(self, idx, d), self._wrap(idx))


def _kth_smallest(self, k, dim, keepdim):
    """(values, indices) of the k-th smallest (0-based) along ``dim``; NaN is picked if any, as PyTorch's
    median."""
    d = wrap_dim(dim, self.ndim)
    if self.ndim == 0:
        return ValuesIndices(self.clone(), self._wrap(self._xp().zeros((), np.int64)))
    xp = self._xp()
    a = self._data
    idx = _argsort(a, d, False)[_dim_slice(d, slice(k, k + 1))]
    if a.dtype.kind == "f" or a.dtype == _backend.bfloat16:
        nan = xp.isnan(a.astype(np.float32) if a.dtype == _backend.bfloat16 else a)
        first_nan = xp.argmax(nan, axis=d, keepdims=True).astype(np.int64)
        idx = xp.where(nan.any(axis=d, keepdims=True), first_nan, idx)
    vals = ops.TakeAlong.apply(self, idx, d)
    if not keepdim:
        vals, idx = vals.squeeze(d), idx.squeeze(d)
    return ValuesIndices(vals, self._wrap(idx))


@op("reduce", function=True, functions=(ops.TakeAlong,))
def median(self, dim=None, keepdim=False):
    """The lower median; with ``dim`` (values, indices). Among equal values the index may differ from
    PyTorch's."""
    if dim is None:
        flat = self.reshape(-1)
        if flat.shape[0] == 0:
            return self._wrap(self._xp().asarray(np.nan, dtype=self._data.dtype))
        return _kth_smallest(flat, (flat.shape[0] - 1) // 2, 0, False).values
    n = self.shape[wrap_dim(dim, self.ndim)] if self.ndim else 1
    if n == 0:
        raise IndexError(f"median(): Expected reduction dim {dim} to have non-zero size.")
    return _kth_smallest(self, (n - 1) // 2, dim, keepdim)


@op("reduce", function=True, functions=(ops.TakeAlong,))
def kthvalue(self, k, dim=-1, keepdim=False):
    n = self.shape[wrap_dim(dim, self.ndim)] if self.ndim else 1
    k = operator.index(k)
    if not 1 <= k <= n:
        raise IndexError(f"kthvalue(): selected number k out of range for dimension {dim} (k={k}, size {n})")
    return _kth_smallest(self, k - 1, dim, keepdim)


@op("reduce", function=True)
def quantile(self, q, dim=None, keepdim=False, *, interpolation="linear"):
    """The q-th quantiles along ``dim`` (None: all elements); ``q`` a number or a 1-D tensor (its dim first)."""
    qa, src, d = statistics.quantile_setup(self, q, dim, interpolation)
    xp = self._xp()
    n = src.shape[d]
    v = src.sort(d).values
    lo, hi, frac = statistics.quantile_positions(qa * (n - 1), interpolation, xp)
    vlo, vhi = v.index_select(d, self._wrap(lo)), v.index_select(d, self._wrap(hi))
    shape = [1] * v.ndim
    shape[d] = -1
    w = self._wrap(frac.astype(self._data.dtype).reshape(shape))
    out = vlo + (vhi - vlo) * w  # the quantiles along d
    nan = xp.isnan(src._data.astype(np.float32) if src._data.dtype == _backend.bfloat16 else src._data)
    out = out.masked_fill(self._wrap(nan.any(axis=d, keepdims=True)), float("nan")).movedim(d, 0)  # (nq, ...)
    if keepdim:
        out = out.unsqueeze(d + 1) if dim is not None else out.reshape((out.shape[0],) + (1,) * self.ndim)
    if not isinstance(q, TensorBase) or q.ndim == 0:
        out = out.squeeze(0)
    return out


from . import statistics  # noqa: E402,F401  (the family's other reductions, registered before its mixin is made)

ReduceMixin = mixin("reduce")
