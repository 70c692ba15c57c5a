"""Reductions beyond reduce.py, of the same family: logcumsumexp, nanmedian, nanquantile, mode, histc, histogram, cov,
corrcoef, and the trapezoid rule (trapezoid/trapz, cumulative_trapezoid). hpcfsdp/_tensor_methods/reduce.py loads this module before
it makes the family's mixin."""
import collections
import operator
import warnings

import numpy as np

from .. import _backend
from .._array import dtype_category, wrap_dim
from .._dtype_info import get_default_dtype
from .._registry import function_op, op
from ..autograd import ops
from ._common import TensorBase, _argsort, _key, _same_dtype, _tensor_arg

__all__ = ["Mode", "Nanmedian", "Histogram"]

# torch.return_types.mode / torch.return_types.nanmedian: tuples with .values and .indices
Mode = collections.namedtuple("mode", ["values", "indices"])
Nanmedian = collections.namedtuple("nanmedian", ["values", "indices"])
Histogram = collections.namedtuple("histogram", ["hist", "bin_edges"])  # torch.return_types.histogram


def _dtype_name(t):
    return str(t.dtype).replace("hpcfsdp.", "")


# -- scans -------------------------------------------------------------------------------------------------
@op("reduce", function=True, functions=(ops.Logcumsumexp,))
def logcumsumexp(self, dim):
    """log(cumsum(exp(self))) along ``dim``, computed without overflow; floating-point inputs only, as PyTorch."""
    if dtype_category(self._data.dtype) != 2:
        raise NotImplementedError(f"\"logcumsumexp\" not implemented for '{_dtype_name(self)}'")
    return ops.Logcumsumexp.apply(self, wrap_dim(dim, self.ndim))


# -- order statistics --------------------------------------------------------------------------------------
def _nan_mask(a):
    xp = _backend.array_module(a)
    if a.dtype.kind == "f" or a.dtype == _backend.bfloat16:
        return xp.isnan(_key(a))
    return xp.zeros(a.shape, dtype=bool)


@op("reduce", function=True, functions=(ops.TakeAlong,))
def nanmedian(self, dim=None, keepdim=False):
    """The lower median of the non-NaN values (NaN where all are NaN); with ``dim`` (values, indices)."""
    if dim is None:
        flat = self.reshape(-1)
        if flat.shape[0] == 0:
            return self._wrap(self._xp().asarray(np.nan, dtype=self._data.dtype))
        return _nanmedian_along(flat, 0, False).values
    d = wrap_dim(dim, self.ndim)
    if self.ndim and self.shape[d] == 0:
        raise IndexError(f"median(): Expected reduction dim {d} to have non-zero size.")
    return _nanmedian_along(self, d, keepdim)


def _nanmedian_along(self, d, keepdim):
    if self.ndim == 0:
        return Nanmedian(self.clone(), self._wrap(self._xp().zeros((), np.int64)))
    xp = self._xp()
    a = self._data
    order = _argsort(a, d, False)  # NaN last
    k = (~_nan_mask(a)).sum(axis=d, keepdims=True)
    pos = xp.maximum((k - 1) // 2, 0).astype(np.int64)
    idx = xp.take_along_axis(order, pos, axis=d)
    vals = ops.TakeAlong.apply(self, idx, d)
    if not keepdim:
        vals, idx = vals.squeeze(d), idx.squeeze(d)
    return Nanmedian(vals, self._wrap(idx))


def quantile_setup(self, q, dim, interpolation):
    """quantile's and nanquantile's checks (PyTorch's messages): the levels as float64 (nq,), the input along
    which they are taken (flattened when ``dim`` is None, at least 1-D) and that dim."""
    if dtype_category(self._data.dtype) != 2:
        raise RuntimeError("quantile() input tensor must be either float or double dtype")
    if interpolation not in QUANTILE_MODES:
        raise RuntimeError(f"quantile() interpolation must be one of linear, lower, higher, midpoint or nearest, "
                           f"but got {interpolation}")
    xp = self._xp()
    if isinstance(q, TensorBase):
        if q.ndim > 1:
            raise RuntimeError(f"quantile() q must be a scalar or 1D tensor, got a {q.ndim}-D tensor")
        _same_dtype("quantile", self, q)
        qa = xp.asarray(q._data, dtype=np.float64).reshape(-1)
    else:
        qa = xp.asarray([float(q)], dtype=np.float64)
    if qa.size and not bool(((qa >= 0) & (qa <= 1)).all()):
        bad = float(qa[~((qa >= 0) & (qa <= 1))][0])
        raise RuntimeError(f"quantile() q must be in the range [0, 1] but got {bad:g}")
    src = self.reshape(-1) if dim is None else self
    d = 0 if dim is None else wrap_dim(dim, self.ndim)
    if src.ndim == 0:
        src = src.reshape(1)
    if src.shape[d] == 0:
        raise RuntimeError("quantile() input tensor must be non-empty")
    return qa, src, d


QUANTILE_MODES = ("linear", "lower", "higher", "midpoint", "nearest")


def quantile_positions(pos, interpolation, xp):
    """The two sorted positions each quantile reads (int64) and the weight of the upper one."""
    lo = xp.floor(pos).astype(np.int64)
    hi = xp.ceil(pos).astype(np.int64)
    if interpolation == "lower":
        hi = lo
    elif interpolation == "higher":
        lo = hi
    elif interpolation == "nearest":
        lo = hi = xp.round(pos).astype(np.int64)  # half to even, as PyTorch
    frac = {"midpoint": xp.full(pos.shape, 0.5), "linear": pos - lo}.get(interpolation, xp.zeros(pos.shape))
    return lo, hi, frac


@op("reduce", function=True, functions=(ops.TakeAlong,))
def nanquantile(self, q, dim=None, keepdim=False, *, interpolation="linear"):
    """quantile of the values that are not NaN (NaN where a slice has none); differentiable in ``self``."""
    qa, src, d = quantile_setup(self, q, dim, interpolation)
    xp = self._xp()
    a = src._data
    order = _argsort(a, d, False)  # NaN last
    valid = (~_nan_mask(a)).sum(axis=d, keepdims=True)[None]  # (1, ..., 1 at d, ...)
    nq = qa.size
    lo, hi, frac = quantile_positions(qa.reshape((nq,) + (1,) * a.ndim) * xp.maximum(valid - 1, 0),
                                      interpolation, xp)  # (nq, ..., 1 at d, ...)
    orders = xp.broadcast_to(order[None], (nq,) + order.shape)
    srcs = src.unsqueeze(0).expand((nq,) + tuple(src.shape))
    vlo = ops.TakeAlong.apply(srcs, xp.take_along_axis(orders, lo, axis=d + 1), d + 1)
    vhi = ops.TakeAlong.apply(srcs, xp.take_along_axis(orders, hi, axis=d + 1), d + 1)
    out = vlo + (vhi - vlo) * self._wrap(frac.astype(a.dtype))
    out = out.masked_fill(self._wrap(xp.broadcast_to(valid == 0, out.shape)), float("nan")).squeeze(d + 1)
    if keepdim:
        out = out.unsqueeze(d + 1) if dim is not None else out.reshape((nq,) + (1,) * self.ndim)
    if not isinstance(q, TensorBase) or q.ndim == 0:
        out = out.squeeze(0)
    return out


@op("reduce", function=True, functions=(ops.TakeAlong,))
def mode(self, dim=-1, keepdim=False):
    """(values, indices): the most frequent value along ``dim`` (the smallest of equally frequent ones; NaNs are
    all distinct) and the index of its last occurrence."""
    d = wrap_dim(dim, self.ndim)
    if self.ndim == 0:
        return Mode(self.clone(), self._wrap(self._xp().zeros((), np.int64)))
    if self.shape[d] == 0:
        raise IndexError(f"mode(): Expected reduction dim {d} to have non-zero size.")
    xp = self._xp()
    a = self._data
    order = xp.moveaxis(_argsort(a, d, False), d, -1)  # stable: equal values in index order
    s = xp.take_along_axis(xp.moveaxis(_key(a), d, -1), order, axis=-1)
    n = s.shape[-1]
    start = xp.concatenate([xp.ones(s.shape[:-1] + (1,), dtype=bool), s[..., 1:] != s[..., :-1]], axis=-1)
    pos = xp.broadcast_to(xp.arange(n), s.shape)
    run_start = xp.maximum.accumulate(xp.where(start, pos, 0), axis=-1) if xp is np else \
        _running_max(xp.where(start, pos, 0))
    count = pos - run_start + 1  # elements so far in each position's run of equal values
    best = count.max(axis=-1, keepdims=True)
    end = xp.argmax(count == best, axis=-1)[..., None]  # the end of the first (smallest) longest run
    idx = xp.moveaxis(xp.take_along_axis(order, end, axis=-1), -1, d).astype(np.int64)
    vals = ops.TakeAlong.apply(self, idx, d)
    if not keepdim:
        vals, idx = vals.squeeze(d), idx.squeeze(d)
    return Mode(vals, self._wrap(idx))


def _running_max(x):
    """maximum.accumulate along the last axis, for array modules without ufunc.accumulate."""
    xp = _backend.array_module(x)
    out = x.copy()
    for j in range(1, x.shape[-1]):
        out[..., j] = xp.maximum(out[..., j - 1], x[..., j])
    return out


# -- histogram ---------------------------------------------------------------------------------------------
@op("reduce", function=True)
def histc(self, bins=100, min=0, max=0):  # noqa: A002
    """Counts of the elements in ``bins`` equal-width bins over [min, max] (the data's range where min == max,
    widened by 1 each way if that is one value); elements outside, and NaN, are not counted. Not differentiable."""
    if dtype_category(self._data.dtype) != 2:
        raise NotImplementedError(f"\"histc\" not implemented for '{_dtype_name(self)}'")
    bins = operator.index(bins)
    if bins <= 0:
        raise RuntimeError(f"histc(): bins must be > 0, but got {bins} for dimension 0")
    xp = self._xp()
    x = self._data.reshape(-1).astype(np.float64)
    lo, hi = float(min), float(max)
    if lo > hi:
        raise RuntimeError("torch.histc: max must be larger than min")
    if lo == hi and x.size:
        lo, hi = float(x.min()), float(x.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise RuntimeError(f"torch.histc: range of [{lo:g}, {hi:g}] is not finite")
    x = x[(x >= lo) & (x <= hi)]  # NaN compares False
    pos = xp.minimum(((x - lo) * (bins / (hi - lo))).astype(np.int64), bins - 1)
    counts = xp.bincount(pos, minlength=bins)[:bins]
    return self._wrap(counts.astype(self._data.dtype))


@op("reduce", function=True)
def histogram(self, bins=100, *, range=None, weight=None, density=False):  # noqa: A002
    """(hist, bin_edges): counts (or summed ``weight``) of the elements in ``bins`` equal bins over ``range`` (the
    data's range by default) or between the edges of a 1-D tensor ``bins``; the last bin includes its right edge,
    elements outside are not counted. ``density`` divides by the total and the bin widths. Not differentiable."""
    if dtype_category(self._data.dtype) != 2:
        raise NotImplementedError(f"\"histogramdd\" not implemented for '{_histogram_dtype(self)}'")
    xp = self._xp()
    x = self._data.reshape(-1)
    w = None
    if weight is not None:
        weight = _tensor_arg(weight, "histogram", "weight")
        if tuple(weight.shape) != tuple(self.shape):
            raise RuntimeError("torch.histogram: if weight tensor is provided it should have the same shape as the "
                               "input tensor excluding its innermost dimension")
        if weight.dtype != self.dtype:
            raise RuntimeError(f"torch.histogramdd: if weight tensor is provided, input tensor and weight tensor should "
                               f"have the same dtype, but got input({_torch_name(self)}), and weight({_torch_name(weight)})")
        w = weight._data.reshape(-1).astype(np.float64)
    if isinstance(bins, TensorBase):
        if bins.ndim != 1:
            raise RuntimeError(f"torch.histogram: bins tensor should have one dimension, but got {bins.ndim} dimensions")
        if bins.dtype != self.dtype:
            raise RuntimeError(f"torch.histogramdd: input tensor and bins tensors should have the same dtype, but got "
                               f"input with dtype {_torch_name(self)} and bins for dimension 0 with dtype "
                               f"{_torch_name(bins)}")
        edges = bins._data.astype(np.float64)
        if edges.size and bool((edges[1:] < edges[:-1]).any()):
            raise RuntimeError("torch.histogram: bin edges must be a non-decreasing sequence")
    else:
        n = operator.index(bins)
        if n <= 0:
            raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {n} for dimension 0")
        lo, hi = (float(range[0]), float(range[1])) if range is not None else (
            (float(x.min()), float(x.max())) if x.size else (0.0, 0.0))
        if lo > hi:
            raise RuntimeError(f"torch.histogram: min should not exceed max, but got min {lo} max {hi}")
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5  # an empty or one-valued range widened, as numpy.histogram
        edges = xp.linspace(lo, hi, n + 1)
    hist, _ = xp.histogram(x.astype(np.float64), bins=edges, weights=w, density=bool(density))
    dt = self._data.dtype
    return Histogram(self._wrap(hist.astype(dt)), self._wrap(edges.astype(dt)))


def _histogram_dtype(t):
    return {"int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
            "bool": "Bool"}.get(_dtype_name(t), _dtype_name(t))


def _torch_name(t):  # the C type names PyTorch's histogram messages use
    return {"float64": "double", "float32": "float", "float16": "half", "bfloat16": "bfloat16"}.get(
        _dtype_name(t), _dtype_name(t))


# -- covariance --------------------------------------------------------------------------------------------
def _check_weights(w, kind, n, integral):
    _tensor_arg(w, "cov", kind)
    if w.ndim > 1:
        raise RuntimeError(f"cov(): expected {kind} to have one or fewer dimensions but got {kind} with {w.ndim} "
                           "dimensions")
    cat = dtype_category(w._data.dtype)
    if integral and cat != 1:
        raise RuntimeError(f"cov(): expected {kind} to have integral dtype but got {kind} with {_dtype_name(w)} dtype")
    if not integral and cat != 2:
        raise RuntimeError(f"cov(): expected {kind} to have floating point dtype but got {kind} with "
                           f"{_dtype_name(w)} dtype")
    if w.numel() != n:
        raise RuntimeError(f"cov(): expected {kind} to have the same numel as there are observations in the input "
                           f"but got {w.numel()} != {n}")
    if n and bool((w._data < 0).any()):
        raise RuntimeError(f"cov(): {kind} cannot be negative")


@op("reduce", function=True)
def cov(self, *, correction=1, fweights=None, aweights=None):
    """The covariance matrix of the variables in the rows of ``self`` (observations in the columns), as
    PyTorch's: ``fweights`` integer frequencies and ``aweights`` float weights per observation; a 0-d result for
    one variable."""
    if self.ndim > 2:
        raise RuntimeError(f"cov(): expected input to have two or fewer dimensions but got an input with {self.ndim} "
                           "dimensions")
    x = self.reshape(1, -1) if self.ndim < 2 else self
    if dtype_category(x._data.dtype) != 2:
        x = x.to(get_default_dtype())
    n = x.shape[1]
    w = None
    if fweights is not None:
        _check_weights(fweights, "fweights", n, True)
        w = fweights
    if aweights is not None:
        _check_weights(aweights, "aweights", n, False)
        w = aweights if w is None else w * aweights
    w_sum = w.sum() if w is not None else n
    avg = (x * w if w is not None else x).sum(1) / w_sum
    if w is not None and aweights is not None and correction != 0:
        norm = w_sum - correction * (w * aweights).sum() / w_sum
    else:
        norm = w_sum - correction
    if float(norm) <= 0:
        warnings.warn("cov(): degrees of freedom is <= 0. Correction should be strictly less than the number of "
                      "observations.", UserWarning, stacklevel=3)
        norm = norm * 0
    xc = x - avg.unsqueeze(1)
    c = xc.mm((xc * w if w is not None else xc).t())
    if not isinstance(norm, TensorBase):
        norm = float(norm)
    return (c / norm).squeeze()


@op("reduce", function=True)
def corrcoef(self):
    """Pearson's correlation coefficients of the variables in the rows of ``self``, clipped to [-1, 1]."""
    c = self.cov()
    if c.ndim == 0:
        return c / c
    std = c.diagonal().sqrt()
    c = c / std.reshape(-1, 1)
    c = c / std.reshape(1, -1)
    return c.clip(-1, 1)


# -- the trapezoid rule ------------------------------------------------------------------------------------
def _trapezoid_args(name, y, x, dx, dim):
    _tensor_arg(y, name, "y")
    if x is not None and not isinstance(x, TensorBase):
        raise TypeError(f"{name}() received an invalid combination of arguments: x must be a Tensor (use dx= for a "
                        f"spacing), got {type(x).__name__}")
    if x is not None and dx is not None:
        raise TypeError(f"{name}() received an invalid combination of arguments: x and dx are exclusive")
    if y.ndim == 0:
        raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
    d = wrap_dim(dim, y.ndim)
    if x is None:
        return d, 1 if dx is None else dx
    if x.ndim == 1:
        if x.shape[0] != y.shape[d]:
            raise RuntimeError(f"{name}: There must be one `x` value for each sample point")
        shape = [1] * y.ndim
        shape[d] = x.shape[0]
        x = x.reshape(shape)
    elif x.ndim < y.ndim:
        x = x.reshape((1,) * (y.ndim - x.ndim) + tuple(x.shape))
    n = x.shape[d]
    return d, x.narrow(d, 1, n - 1) - x.narrow(d, 0, n - 1) if n else x


def _halves(y, d):
    n = y.shape[d]
    return y.narrow(d, 1, n - 1) + y.narrow(d, 0, n - 1)


@function_op("reduce", aliases=("trapz",))
def trapezoid(y, x=None, *, dx=None, dim=-1):
    """The trapezoid rule along ``dim``: samples ``y`` at points ``x`` (a tensor) or spaced ``dx`` (1 by default)."""
    d, spacing = _trapezoid_args("trapezoid", y, x, dx, dim)
    if y.shape[d] == 0:
        return y.sum(d) * 0
    if isinstance(spacing, TensorBase):
        return (spacing * _halves(y, d) * 0.5).sum(d)
    return (y.sum(d) - (y.select(d, 0) + y.select(d, -1)) * 0.5) * spacing


@function_op("reduce")
def cumulative_trapezoid(y, x=None, *, dx=None, dim=-1):
    """The running trapezoid rule along ``dim`` (one element fewer than ``y`` along it): ``y`` at points ``x`` or
    spaced ``dx``."""
    d, spacing = _trapezoid_args("cumulative_trapezoid", y, x, dx, dim)
    if y.shape[d] == 0:
        return y * 0.5
    if isinstance(spacing, TensorBase):
        return (spacing * _halves(y, d) * 0.5).cumsum(d)
    return (_halves(y, d) * (spacing / 2.0)).cumsum(d)
