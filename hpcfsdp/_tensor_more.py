"""TensorMoreMixin: Tensor's roll/flip/repeat, diagonals, index results (nonzero, unique, bincount), more
element-wise functions, fused multiply-adds, cumulative extremes, medians and quantiles, nan-reductions."""
import collections
import operator

import numpy as np

from . import _backend
from ._array import SCALAR_TYPES, dtype_category, random_array, wrap_dim
from ._tensor_base import TensorBase
from ._tensor_extra import _argsort, _axes, _dim_slice, _integral_to_int64, _tensor_arg
from ._tensor_math import _as_operand, _opmath, _promote_operands, _to_float
from .autograd import ops
from ._autocast import LOWER, autocast_op

__all__ = ["TensorMoreMixin", "ValuesIndices"]

# torch.return_types.cummax / cummin / median / kthvalue: tuples with .values and .indices
ValuesIndices = collections.namedtuple("return_types", ["values", "indices"])


def _shape_args(args):
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    return tuple(operator.index(a) for a in args)


def _float_only(t, name):
    if dtype_category(t._data.dtype) != 2:
        raise RuntimeError(f"{name}(): expected a floating-point input, got {t.dtype}")
    return t


def _same_dtype(name, *tensors):
    for t in tensors[1:]:
        if t.dtype != tensors[0].dtype:
            raise RuntimeError(f"{name}(): expected all tensors to have the same dtype, got {tensors[0].dtype} and "
                               f"{t.dtype}")


def _zero_div_check(a, b):
    """Integer division by zero raises, as PyTorch's ZeroDivisionError (NumPy would warn and return 0)."""
    t = a if isinstance(a, TensorBase) else b
    if dtype_category(t._data.dtype) == 2:
        return
    if bool((b._data == 0).any()) if isinstance(b, TensorBase) else b == 0:
        raise RuntimeError("ZeroDivisionError")


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


class TensorMoreMixin:
    """More methods of Tensor: differentiable ones apply an op of autograd/ops.py (or compose Tensor ops);
    index results are computed on the arrays (no graph)."""

    # -- shape -----------------------------------------------------------------------------------------
    def roll(self, shifts, dims=None):
        sh = (shifts,) if isinstance(shifts, (int, np.integer)) else tuple(shifts)
        if dims is None:
            if len(sh) != 1:
                raise RuntimeError(f"roll(): shifts {list(sh)} need dims of the same length when dims is not given")
            return ops.Roll.apply(self.flatten(), (int(sh[0]),), (0,)).reshape(self.shape)
        dm = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
        if len(sh) != len(dm):
            raise RuntimeError(f"roll(): shifts and dimensions must align. shifts: {len(sh)}, dims:{len(dm)}")
        return ops.Roll.apply(self, tuple(int(s) for s in sh), tuple(wrap_dim(d, self.ndim) for d in dm))

    def flip(self, *dims):
        dm = _shape_args(dims)
        wrapped = tuple(wrap_dim(d, self.ndim) for d in dm)
        if len(set(wrapped)) != len(wrapped):
            raise RuntimeError(f"flip(): dims has a repeated dim: {list(dm)}")
        if self.ndim == 0:
            return self.clone()
        return ops.Flip.apply(self, wrapped)

    def fliplr(self):
        if self.ndim < 2:
            raise RuntimeError(f"Input must be >= 2-d, got a {self.ndim}-d tensor")
        return self.flip(1)

    def flipud(self):
        if self.ndim < 1:
            raise RuntimeError("Input must be >= 1-d, got a 0-d tensor")
        return self.flip(0)

    def repeat(self, *sizes):
        reps = _shape_args(sizes)
        if len(reps) < self.ndim:
            raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number of dimensions of "
                               f"tensor (got {list(reps)} for a {self.ndim}-d tensor)")
        if any(r < 0 for r in reps):
            raise RuntimeError(f"Trying to create tensor with negative dimension: repeats {list(reps)}")
        return ops.Repeat.apply(self, reps)

    def tile(self, *dims):
        reps = _shape_args(dims)
        return self.repeat((1,) * (self.ndim - len(reps)) + reps)

    def repeat_interleave(self, repeats, dim=None, *, output_size=None):
        src = self.flatten() if dim is None else self
        d = 0 if dim is None else wrap_dim(dim, self.ndim)
        n = src.shape[d] if src.ndim else 1
        xp = self._xp()
        if isinstance(repeats, TensorBase):
            r = repeats._data
            if r.ndim > 1 or r.dtype.kind not in "iu":
                raise RuntimeError(f"repeat_interleave(): repeats must be a 0-d or 1-d integer tensor, got a "
                                   f"{r.ndim}-d {repeats.dtype} tensor")
            if r.ndim == 1 and r.shape[0] != n:
                raise RuntimeError(f"repeats must have the same size as input along dim, but got repeats.size(0) = "
                                   f"{r.shape[0]} and input.size({d}) = {n}")
            r = xp.asarray(r)
        else:
            r = operator.index(repeats)
        if bool((xp.asarray(r) < 0).any()):
            raise RuntimeError("repeats can not be negative")
        idx = xp.repeat(xp.arange(n), r)
        if output_size is not None and idx.shape[0] != output_size:
            raise RuntimeError(f"repeat_interleave(): output_size {output_size} does not match the sum of repeats "
                               f"{idx.shape[0]}")
        src = src if src.ndim else src.reshape(1)
        return ops.GetItem.apply(src, _dim_slice(d, idx))

    def diagonal(self, offset=0, dim1=0, dim2=1):
        d1, d2 = wrap_dim(dim1, self.ndim), wrap_dim(dim2, self.ndim)
        if d1 == d2:
            raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
        return ops.Diagonal.apply(self, operator.index(offset), d1, d2)

    def diag(self, diagonal=0):
        if self.ndim == 1:
            return ops.DiagEmbed.apply(self, operator.index(diagonal))
        if self.ndim == 2:
            return self.diagonal(diagonal)
        raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {self.ndim}D")

    def trace(self):
        if self.ndim != 2:
            raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {self.ndim}")
        return _integral_to_int64(self.diagonal(), None).sum()

    def diff(self, n=1, dim=-1, prepend=None, append=None):
        """The n-th forward difference along ``dim`` (``!=`` for bool), after concatenating prepend and append."""
        if self.ndim == 0:
            raise RuntimeError("diff expects input to be at least one-dimensional")
        if operator.index(n) < 0:
            raise RuntimeError(f"order must be non-negative but got {n}")
        d = wrap_dim(dim, self.ndim)
        parts = [p for p in (prepend, self, append) if p is not None]
        for p in parts:
            _tensor_arg(p, "diff", "prepend/append")
            if p.ndim != self.ndim:
                raise RuntimeError(f"diff expects prepend or append to be the same dimension as input ({self.ndim}), "
                                   f"got {p.ndim}")
        _same_dtype("diff", *parts)
        x = ops.Cat.apply(d, *parts) if len(parts) > 1 else self
        for _ in range(n):
            hi, lo = x[_dim_slice(d, slice(1, None))], x[_dim_slice(d, slice(None, -1))]
            x = (hi != lo) if x._data.dtype == np.bool_ else hi - lo
        return x

    # -- index results (no graph) ----------------------------------------------------------------------
    def nonzero(self, *, as_tuple=False):
        a = self._data if self.ndim else self._data.reshape(1)
        idx = [i.astype(np.int64) for i in self._xp().nonzero(a)]
        if as_tuple:
            return tuple(self._wrap(i) for i in idx)
        if self.ndim == 0:
            return self._wrap(self._xp().zeros((idx[0].shape[0], 0), dtype=np.int64))
        return self._wrap(self._xp().stack(idx, axis=1))

    def argwhere(self):
        return self.nonzero()

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

    def take(self, index):
        idx = _tensor_arg(index, "take", "index")._data
        if idx.dtype.kind not in "iu":
            raise RuntimeError(f"take(): Expected a long tensor for index, but got {index.dtype}")
        n = self.numel()
        if idx.size and bool(((idx < -n) | (idx >= n)).any()):
            bad = int(idx[(idx < -n) | (idx >= n)].ravel()[0])
            raise IndexError(f"out of range: tried to access index {bad} on a tensor of {n} elements.")
        return ops.GetItem.apply(self.reshape(-1), idx)

    # -- element-wise ----------------------------------------------------------------------------------
    def _unary(self, name):
        return ops.Unary.apply(_to_float(self), name)

    def log1p(self):
        return self._unary("log1p")

    def expm1(self):
        return self._unary("expm1")

    def log2(self):
        return self._unary("log2")

    def log10(self):
        return self._unary("log10")

    def sinh(self):
        return self._unary("sinh")

    def cosh(self):
        return self._unary("cosh")

    def asin(self):
        return self._unary("arcsin")

    def acos(self):
        return self._unary("arccos")

    def atan(self):
        return self._unary("arctan")

    arcsin, arccos, arctan = asin, acos, atan

    def reciprocal(self):
        return self._unary("reciprocal")

    def _binary_float(self, other, op, name):
        a, b = _promote_operands(self, _as_operand(other, self), name)
        a = _to_float(a) if isinstance(a, TensorBase) else float(a)
        b = _to_float(b) if isinstance(b, TensorBase) else float(b)
        if not isinstance(b, TensorBase):
            b = a._wrap(a._xp().asarray(b, dtype=a._data.dtype))
        try:
            return op.apply(a, b)
        except ValueError as e:
            raise RuntimeError(f"{name}: the shapes {tuple(a.shape)} and {tuple(b.shape)} do not broadcast ({e})") \
                from None

    def atan2(self, other):
        return self._binary_float(other, ops.Atan2, "atan2")

    arctan2 = atan2

    def hypot(self, other):
        return self._binary_float(other, ops.Hypot, "hypot")

    def _remainder(self, other, kind):
        a, b = _promote_operands(self, _as_operand(other, self), kind)
        _zero_div_check(a, b)
        low = None
        if not isinstance(b, TensorBase):
            a, b, low = _opmath(a, b)
        try:
            out = ops.Remainder.apply(a, b, kind)
        except ValueError as e:
            raise RuntimeError(f"{kind}: the operands do not broadcast ({e})") from None
        return out if low is None else out.to(low)

    def remainder(self, other):
        return self._remainder(other, "remainder")

    def fmod(self, other):
        return self._remainder(other, "fmod")

    def floor_divide(self, other):
        a, b = _promote_operands(self, _as_operand(other, self), "floor_divide")
        if dtype_category(a._data.dtype) == 2:
            return (a / b).floor()  # zero gradient, through floor
        _zero_div_check(a, b)
        return a._wrap(a._xp().floor_divide(a._data, b._data if isinstance(b, TensorBase) else b))

    def trunc(self):
        return self._rounding("trunc")

    fix = trunc

    def frac(self):
        if dtype_category(self._data.dtype) != 2:
            raise RuntimeError(f"\"frac_cpu\" not implemented for '{self.dtype}'")
        return self - self.trunc()

    def clamp_min(self, min):  # noqa: A002
        return self.clamp(min=min)

    def clamp_max(self, max):  # noqa: A002
        return self.clamp(max=max)

    def lerp(self, end, weight):
        """self + weight * (end - self); ``weight`` a number or a tensor (broadcast)."""
        _tensor_arg(end, "lerp", "end")
        _same_dtype("lerp", self, end)
        if isinstance(weight, TensorBase):
            _same_dtype("lerp", self, weight)
        elif not isinstance(weight, SCALAR_TYPES):
            raise TypeError(f"lerp(): argument 'weight' must be a Tensor or a number, not {type(weight).__name__}")
        return self + weight * (end - self)

    def isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        _tensor_arg(other, "isclose", "other")
        _same_dtype("isclose", self, other)
        return self._wrap(self._xp().isclose(self._data, other._data, rtol=rtol, atol=atol, equal_nan=equal_nan))

    # -- fused multiply-adds ---------------------------------------------------------------------------
    @autocast_op(cpu=LOWER, cuda=LOWER)
    def addmm(self, mat1, mat2, *, beta=1, alpha=1):
        _tensor_arg(mat1, "addmm", "mat1")
        if mat1.ndim != 2 or mat2.ndim != 2:
            raise RuntimeError(f"addmm: mat1 and mat2 must be matrices, got {mat1.ndim}-D and {mat2.ndim}-D")
        return _scaled_add(self, mat1.mm(mat2), beta, alpha)

    @autocast_op(cpu=LOWER, cuda=LOWER)
    def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
        _tensor_arg(batch1, "baddbmm", "batch1")
        return _scaled_add(self, batch1.bmm(batch2), beta, alpha)

    def addcmul(self, tensor1, tensor2, *, value=1):
        return self + value * (tensor1 * tensor2) if value != 1 else self + tensor1 * tensor2

    def addcdiv(self, tensor1, tensor2, *, value=1):
        if dtype_category(tensor1._data.dtype) < 2 and dtype_category(tensor2._data.dtype) < 2:
            raise RuntimeError("Integer division with addcdiv is no longer supported, and in a future release "
                               "addcdiv will perform a true division of tensor1 and tensor2.")
        return self + value * (tensor1 / tensor2) if value != 1 else self + tensor1 / tensor2

    # -- scans -----------------------------------------------------------------------------------------
    def cumprod(self, dim, *, dtype=None):
        a = _integral_to_int64(self, dtype)
        return ops.Cumprod.apply(a, wrap_dim(dim, a.ndim))

    def _cumextreme(self, dim, is_min):
        d = wrap_dim(dim, self.ndim)
        if self.ndim == 0 or self._data.size == 0:
            return ValuesIndices(self.clone(), self._wrap(self._xp().zeros(self._data.shape, dtype=np.int64)))
        idx = _cumextreme_indices(self._data, d, is_min)
        return ValuesIndices(ops.TakeAlong.apply(self, idx, d), self._wrap(idx))

    def cummax(self, dim):
        return self._cumextreme(dim, False)

    def cummin(self, dim):
        return self._cumextreme(dim, True)

    # -- order statistics ------------------------------------------------------------------------------
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

    def median(self, dim=None, keepdim=False):
        """The lower median; with ``dim`` (values, indices). Among equal values the index may differ from
        PyTorch's."""
        if dim is None:
            flat = self.reshape(-1)
            if flat.shape[0] == 0:
                return self._wrap(self._xp().asarray(np.nan, dtype=self._data.dtype))
            return flat._kth_smallest((flat.shape[0] - 1) // 2, 0, False).values
        n = self.shape[wrap_dim(dim, self.ndim)] if self.ndim else 1
        if n == 0:
            raise IndexError(f"median(): Expected reduction dim {dim} to have non-zero size.")
        return self._kth_smallest((n - 1) // 2, dim, keepdim)

    def kthvalue(self, k, dim=-1, keepdim=False):
        n = self.shape[wrap_dim(dim, self.ndim)] if self.ndim else 1
        k = operator.index(k)
        if not 1 <= k <= n:
            raise IndexError(f"kthvalue(): selected number k out of range for dimension {dim} (k={k}, size {n})")
        return self._kth_smallest(k - 1, dim, keepdim)

    def quantile(self, q, dim=None, keepdim=False, *, interpolation="linear"):
        """The q-th quantiles along ``dim`` (None: all elements); ``q`` a number or a 1-D tensor (its dim first)."""
        _float_only(self, "quantile")
        modes = ("linear", "lower", "higher", "midpoint", "nearest")
        if interpolation not in modes:
            raise ValueError(f"quantile() interpolation must be one of {', '.join(modes)}. Got {interpolation!r}")
        xp = self._xp()
        if isinstance(q, TensorBase):
            if q.ndim > 1:
                raise RuntimeError(f"quantile() q must be a scalar or 1D tensor, got a {q.ndim}-D tensor")
            _same_dtype("quantile", self, q)
            qa = xp.asarray(q._data, dtype=np.float64).reshape(-1)
        else:
            qa = xp.asarray([float(q)], dtype=np.float64)
        if qa.size and not bool(((qa >= 0) & (qa <= 1)).all()):
            raise RuntimeError("quantile() q values must be in the range [0, 1]")
        src = self.reshape(-1) if dim is None else self
        d = 0 if dim is None else wrap_dim(dim, self.ndim)
        if src.ndim == 0:
            src = src.reshape(1)
        n = src.shape[d]
        if n == 0:
            raise IndexError("quantile() input tensor must be non-empty")
        v = src.sort(d).values
        pos = qa * (n - 1)
        lo = xp.floor(pos).astype(np.int64)
        hi = xp.ceil(pos).astype(np.int64)
        if interpolation == "lower":
            hi = lo
        elif interpolation == "higher":
            lo = hi
        elif interpolation == "nearest":
            lo = hi = xp.round(pos).astype(np.int64)  # half to even, as PyTorch
        vlo, vhi = v.index_select(d, self._wrap(lo)), v.index_select(d, self._wrap(hi))
        frac = {"midpoint": xp.full(pos.shape, 0.5), "linear": pos - lo}.get(interpolation, xp.zeros(pos.shape))
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

    def movedim(self, source, destination):
        src = (source,) if isinstance(source, (int, np.integer)) else tuple(source)
        dst = (destination,) if isinstance(destination, (int, np.integer)) else tuple(destination)
        if len(src) != len(dst):
            raise RuntimeError(f"movedim: Invalid source or destination dims: source ({list(src)} dims) should "
                               f"contain the same number of dims as destination ({list(dst)} dims)")
        src = [wrap_dim(i, self.ndim) for i in src]
        dst = [wrap_dim(i, self.ndim) for i in dst]
        if len(set(src)) != len(src) or len(set(dst)) != len(dst):
            raise RuntimeError(f"movedim: repeated dim in source {list(source)} or destination {list(destination)}")
        perm = [None] * self.ndim
        for i, j in zip(src, dst):
            perm[j] = i
        rest = iter(i for i in range(self.ndim) if i not in src)
        perm = [next(rest) if p is None else p for p in perm]
        return self.permute(*perm) if self.ndim else self

    moveaxis = movedim

    # -- nan-reductions --------------------------------------------------------------------------------
    def nansum(self, dim=None, keepdim=False, *, dtype=None):
        a = _integral_to_int64(self, dtype)
        if dtype_category(a._data.dtype) == 2:
            a = a.masked_fill(a.isnan(), 0.0)
        return a.sum(_axes(dim, a.ndim), keepdim)

    def nanmean(self, dim=None, keepdim=False, *, dtype=None):
        a = self if dtype is None else self.to(dtype)
        _float_only(a, "nanmean")
        ok = ~a.isnan()
        return a.nansum(dim, keepdim) / ok.sum(_axes(dim, a.ndim), keepdim).to(a.dtype)

    # -- sampling --------------------------------------------------------------------------------------
    def bernoulli(self, p=None, *, generator=None):
        """0/1 samples with probability ``self`` (or the number ``p``), in self's dtype; no gradient."""
        _float_only(self, "bernoulli")
        xp = self._xp()
        prob = self._data if p is None else xp.full(self._data.shape, float(p), dtype=np.float64)
        if prob.size and not bool(((prob >= 0) & (prob <= 1)).all()):
            raise RuntimeError("bernoulli: Expected p_in >= 0 && p_in <= 1 to be true")
        u = random_array("rand", prob.shape, np.dtype(np.float64), self.device,
                         gen=_backend.generator_for(generator, self.device))
        return self._wrap((u < prob).astype(self._data.dtype))


def _scaled_add(inp, prod, beta, alpha):
    """beta * inp + alpha * prod; beta 0 ignores inp (its NaN and inf do not propagate), as PyTorch."""
    _tensor_arg(inp, "addmm", "input")
    if inp.dtype != prod.dtype:
        raise RuntimeError(f"expected scalar type {prod.dtype} but found {inp.dtype}")
    scaled = prod if alpha == 1 else prod * alpha
    if beta == 0:  # a mask of all True: the value 0 and a zero gradient
        return scaled + inp.masked_fill(inp._wrap(inp._xp().ones(inp._data.shape, dtype=bool)), 0)
    return scaled + (inp if beta == 1 else inp * beta)
