"""TensorExtraMixin: Tensor's sorting and selection, scans, more reductions and element-wise functions, norms,
products beyond matmul and multinomial sampling; the vector/matrix norm functions hpcfsdp.linalg exposes."""
import collections
import math
import operator

import numpy as np

from . import _backend
from ._array import HALF_DTYPES, dtype_category, promote_types, random_array, wrap_dim
from ._tensor_base import TensorBase
from ._tensor_math import _to_float
from .autograd import ops
from ._autocast import FP32, LOWER, autocast_op

__all__ = ["TensorExtraMixin", "vector_norm", "matrix_norm", "svdvals"]

# torch.return_types.sort / torch.return_types.topk: tuples with .values and .indices
SortResult = collections.namedtuple("sort", ["values", "indices"])
TopkResult = collections.namedtuple("topk", ["values", "indices"])

_INDEX_DTYPES = (np.dtype(np.int64), np.dtype(np.int32))


def _tensor_arg(x, fn, name):
    if not isinstance(x, TensorBase):
        raise TypeError(f"{fn}(): argument '{name}' must be Tensor, not {type(x).__name__}")
    return x


def _axes(dim, ndim):
    """Reduction dims as a sorted tuple of non-negative dims; None (all dims) for dim None, () or a 0-d tensor."""
    if dim is None:
        return None
    dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
    wrapped = [wrap_dim(d, ndim) for d in dims]
    for i, d in enumerate(wrapped):
        if d in wrapped[:i]:
            raise RuntimeError(f"dim {d} appears multiple times in the list of dims {list(dims)}")
    return tuple(sorted(wrapped)) if wrapped and ndim else None


def _dim_slice(dim, s):
    """The index tuple taking slice ``s`` along ``dim`` (everything along the other dims)."""
    return (slice(None),) * dim + (s,)


def _integral_to_int64(t, dtype):
    """The input of sum-like ops: cast to ``dtype`` if given, else bool and integer tensors to int64 (as PyTorch)."""
    if dtype is not None:
        return t.to(dtype)
    return t.to(_backend.int64) if dtype_category(t._data.dtype) < 2 else t


def _out_of_range(idx, n):
    """The first index of ``idx`` outside [0, n), or None (one device-to-host sync on CuPy)."""
    if idx.size == 0:
        return None
    bad = (idx < 0) | (idx >= n)
    if not bool(bad.any()):
        return None
    return int(idx[bad].ravel()[0])


# -- sorting -------------------------------------------------------------------------------------------
def _key(a):
    return a.astype(np.float32) if a.dtype in HALF_DTYPES else a


def _argsort(a, dim, descending):
    """Stable argsort along ``dim`` as int64; descending keeps equal elements in order; NaN sorts as the largest."""
    xp = _backend.array_module(a)
    key = _key(a)
    stable = {"kind": "stable"} if xp is np else {}  # CuPy's sorts are always stable
    if not descending:
        return xp.argsort(key, axis=dim, **stable).astype(np.int64, copy=False)
    r = xp.argsort(xp.flip(key, dim), axis=dim, **stable)  # ascending over the reversed order
    return (key.shape[dim] - 1) - xp.flip(r, dim).astype(np.int64, copy=False)


def _topk_indices(a, k, dim, largest):
    """Indices of the k largest (smallest) along ``dim``, in sorted order: a partition, then a sort of k."""
    xp = _backend.array_module(a)
    key = _key(a)
    n = key.shape[dim]
    if not 0 < k < n:
        return _argsort(key, dim, largest)[_dim_slice(dim, slice(0, k))]
    part = xp.argpartition(key, n - k if largest else k - 1, axis=dim)
    sel = part[_dim_slice(dim, slice(n - k, None) if largest else slice(0, k))]
    order = _argsort(xp.take_along_axis(key, sel, axis=dim), dim, largest)
    return xp.take_along_axis(sel, order, axis=dim).astype(np.int64, copy=False)


# -- norms (hpcfsdp.linalg exposes these) --------------------------------------------------------------
def _norm_input(x, dtype, fn):
    if dtype_category(x._data.dtype) != 2:
        raise RuntimeError(f"linalg.{fn}: Expected a floating point or complex tensor as input. Got {x.dtype}")
    if dtype is None:
        return x
    dt = _backend.to_dtype(dtype)
    if dtype_category(dt) != 2 or promote_types(x._data.dtype, dt) != dt:
        raise RuntimeError(f"linalg.{fn}: the dtype of the input ({x.dtype}) should be convertible without "
                           f"narrowing to the specified dtype ({dt})")
    return x.to(dt)


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    """torch.linalg.vector_norm: (sum |x|^ord)^(1/ord) over ``dim`` (None or (): all), inf/-inf/0 included."""
    _tensor_arg(x, "linalg.vector_norm", "x")
    if isinstance(ord, (bool, np.bool_)) or not isinstance(ord, (int, float, np.number)):
        raise TypeError(f"linalg.vector_norm(): argument 'ord' must be a number, not {type(ord).__name__}")
    x = _norm_input(x, dtype, "vector_norm")
    axes = _axes(dim, x.ndim)
    ord = float(ord)  # noqa: A001
    if ord < 0 or math.isinf(ord):
        shape = x._data.shape
        n = math.prod(shape) if axes is None else math.prod(shape[a] for a in axes)
        if n == 0:
            raise RuntimeError(f"linalg.vector_norm cannot compute the {ord:g} norm on an empty tensor because the "
                               f"operation does not have an identity")
    return ops.VectorNorm.apply(x, ord, axes, keepdim)


def svdvals(A, *, driver=None):
    """torch.linalg.svdvals: the singular values of the matrices in the last two dims, descending (``driver``,
    a cuSOLVER choice in PyTorch, is ignored)."""
    _tensor_arg(A, "linalg.svdvals", "A")
    if A.ndim < 2:
        raise RuntimeError(f"linalg.svdvals: The input tensor A must have at least 2 dimensions, got {A.ndim}")
    return ops.Svdvals.apply(_norm_input(A, None, "svdvals"))


def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None):  # noqa: A002
    """torch.linalg.matrix_norm: 'fro', 'nuc', inf, -inf, 1, -1, 2, -2 over the two dims ``dim``."""
    _tensor_arg(A, "linalg.matrix_norm", "A")
    if A.ndim < 2:
        raise RuntimeError("linalg.matrix_norm: The input tensor A must have at least 2 dimensions.")
    dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
    if len(dims) != 2:
        raise RuntimeError(f"linalg.matrix_norm: dim must be a 2-tuple. Got {' '.join(str(d) for d in dims)}")
    d0, d1 = (wrap_dim(d, A.ndim) for d in dims)
    if d0 == d1:
        raise RuntimeError(f"linalg.matrix_norm: dims must be different. Got ({dims[0]}, {dims[1]})")
    A = _norm_input(A, dtype, "matrix_norm")
    if ord == "fro":
        return vector_norm(A, 2, (d0, d1), keepdim)
    if ord == "nuc" or ord in (2, -2):
        perm = [i for i in range(A.ndim) if i not in (d0, d1)] + [d0, d1]
        s = ops.Svdvals.apply(A.permute(*perm))
        r = s.sum(-1) if ord == "nuc" else (s.amax(-1) if ord == 2 else s.amin(-1))
        if keepdim:
            for d in sorted((d0, d1)):
                r = r.unsqueeze(d)
        return r
    if ord in (1, -1, math.inf, -math.inf):
        summed, reduced = (d0, d1) if abs(ord) == 1 else (d1, d0)  # 1: max column sum; inf: max row sum
        s = A.abs().sum(summed, keepdim=True)
        r = s.amax(reduced, keepdim=True) if ord > 0 else s.amin(reduced, keepdim=True)
        return r if keepdim else r.squeeze((d0, d1))
    raise RuntimeError(f"linalg.matrix_norm: Order {ord} not supported.")


class TensorExtraMixin:
    """More methods of Tensor: differentiable ones apply an op of autograd/ops.py (or compose Tensor ops);
    index results and predicates are computed on the arrays (no graph)."""

    # -- element-wise ----------------------------------------------------------------------------------
    def isinf(self):
        if dtype_category(self._data.dtype) != 2:
            return self._wrap(self._xp().zeros(self._data.shape, dtype=bool))
        return self._wrap(self._xp().isinf(self._data))

    def logical_and(self, other):
        return self._wrap(self._xp().logical_and(self._data, _tensor_arg(other, "logical_and", "other")._data))

    def logical_or(self, other):
        return self._wrap(self._xp().logical_or(self._data, _tensor_arg(other, "logical_or", "other")._data))

    def logical_xor(self, other):
        return self._wrap(self._xp().logical_xor(self._data, _tensor_arg(other, "logical_xor", "other")._data))

    def cos(self):
        return ops.Cos.apply(_to_float(self))

    def sin(self):
        return ops.Sin.apply(_to_float(self))

    def erf(self):
        return ops.Erf.apply(_to_float(self))

    def exp2(self):
        return 2.0 ** _to_float(self)

    def sign(self):
        if self._data.dtype == np.bool_:
            return self.clone()
        return ops.Rounding.apply(self, "sign", 0)

    def _rounding(self, kind, decimals=0):
        category = dtype_category(self._data.dtype)
        if category == 0:
            raise NotImplementedError(f"\"{kind}\" not implemented for 'Bool'")
        if category == 1:
            if decimals:
                raise NotImplementedError(f"round(decimals={decimals}) is not implemented for integer tensors "
                                          f"({self.dtype})")
            return self.clone()  # integers are already integral (PyTorch returns a copy)
        return ops.Rounding.apply(self, kind, decimals)

    def floor(self):
        return self._rounding("floor")

    def ceil(self):
        return self._rounding("ceil")

    def round(self, *, decimals=0):
        return self._rounding("round", decimals)

    # -- scans and reductions --------------------------------------------------------------------------
    def cumsum(self, dim, *, dtype=None):
        a = _integral_to_int64(self, dtype)
        return ops.Cumsum.apply(a, wrap_dim(dim, a.ndim))

    @autocast_op(cpu=FP32, cuda=FP32)
    def prod(self, dim=None, keepdim=False, *, dtype=None):
        a = _integral_to_int64(self, dtype)
        d = None if dim is None else wrap_dim(dim, a.ndim)
        return ops.Prod.apply(a, d if a.ndim else None, keepdim)

    def logsumexp(self, dim, keepdim=False):
        a = _to_float(self)
        return ops.Logsumexp.apply(a, _axes(dim, a.ndim), keepdim)

    def count_nonzero(self, dim=None):
        r = (self._data != 0).sum(axis=_axes(dim, self.ndim))
        return self._wrap(self._xp().asarray(r).astype(np.int64))

    def norm(self, p="fro", dim=None, keepdim=False, dtype=None):
        """torch.norm: p 'fro' (the 2-norm over ``dim``), 'nuc' or a number (vector norm over ``dim``)."""
        if isinstance(p, str):
            if p == "fro" and (dim is None or isinstance(dim, (int, np.integer)) or len(dim) <= 2):
                return vector_norm(self, 2, dim, keepdim, dtype=dtype)
            return matrix_norm(self, p, tuple(range(self.ndim)) if dim is None else dim, keepdim, dtype=dtype)
        return vector_norm(self, 2 if p is None else p, dim, keepdim, dtype=dtype)

    # -- sorting and selection -------------------------------------------------------------------------
    def sort(self, dim=-1, descending=False, stable=False):
        """(values, indices) sorted along ``dim``; always stable; NaN sorts as the largest, as PyTorch."""
        d = wrap_dim(dim, self.ndim)
        idx = _argsort(self._data, d, descending) if self.ndim else self._xp().zeros((), np.int64)
        return SortResult(ops.TakeAlong.apply(self, idx, d), self._wrap(idx))

    def argsort(self, dim=-1, descending=False, stable=False):
        d = wrap_dim(dim, self.ndim)
        return self._wrap(_argsort(self._data, d, descending) if self.ndim else self._xp().zeros((), np.int64))

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

    def gather(self, dim, index, *, sparse_grad=False):
        idx = _tensor_arg(index, "gather", "index")._data
        if idx.dtype not in _INDEX_DTYPES:
            raise RuntimeError(f"gather(): Expected dtype int64 or int32 for index, got {idx.dtype}")
        if max(idx.ndim, 1) != max(self.ndim, 1):
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

    def tensor_split(self, indices_or_sections, dim=0):
        """Sections (an int: the first size % n parts one longer) or split indices (slices between them)."""
        d = wrap_dim(dim, self.ndim)
        n = self._data.shape[d]
        ios = indices_or_sections
        if isinstance(ios, TensorBase):
            if ios.ndim > 1 or dtype_category(ios._data.dtype) != 1:
                raise RuntimeError(f"tensor_split expected tensor_indices_or_sections to be a zero-dimensional or "
                                   f"one-dimensional integer tensor, but got a {ios.ndim}-D {ios.dtype} tensor")
            ios = ios.item() if ios.ndim == 0 else ios.tolist()
        if isinstance(ios, (int, np.integer)):
            if ios <= 0:
                raise RuntimeError(f"number of sections must be larger than 0, got {ios}")
            q, r = divmod(n, int(ios))
            return ops.Split.apply(self, [q + 1] * r + [q] * (int(ios) - r), d)
        bounds = [None, *(operator.index(i) for i in ios), None]
        return tuple(self[_dim_slice(d, slice(a, b))] for a, b in zip(bounds[:-1], bounds[1:]))

    # -- products --------------------------------------------------------------------------------------
    def dot(self, other):
        _tensor_arg(other, "dot", "tensor")
        if self.ndim != 1 or other.ndim != 1:
            raise RuntimeError(f"1D tensors expected, but got {self.ndim}D and {other.ndim}D tensors")
        if self.dtype != other.dtype:
            raise RuntimeError(f"dot : expected both vectors to have same dtype, but found {self.dtype} and "
                               f"{other.dtype}")
        if self.shape[0] != other.shape[0]:
            raise RuntimeError(f"inconsistent tensor size, expected tensor [{self.shape[0]}] and src "
                               f"[{other.shape[0]}] to have the same number of elements")
        return self.matmul(other)

    @autocast_op(cpu=LOWER, cuda=LOWER)
    def mm(self, mat2):
        _tensor_arg(mat2, "mm", "mat2")
        if self.ndim != 2 or mat2.ndim != 2:
            raise RuntimeError(f"{'self' if self.ndim != 2 else 'mat2'} must be a matrix (got {self.ndim}-D and "
                               f"{mat2.ndim}-D tensors)")
        if self.dtype != mat2.dtype:
            raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {self.dtype} != {mat2.dtype}")
        return self.matmul(mat2)

    @autocast_op(cpu=LOWER, cuda=LOWER)
    def bmm(self, mat2):
        _tensor_arg(mat2, "bmm", "mat2")
        for name, t in (("batch1", self), ("batch2", mat2)):
            if t.ndim != 3:
                raise RuntimeError(f"{name} must be a 3D tensor, got {t.ndim}-D")
        if self.dtype != mat2.dtype:
            raise RuntimeError(f"expected scalar type {self.dtype} but found {mat2.dtype}")
        (b, _, k), (b2, k2, _) = self.shape, mat2.shape
        if (b2, k2) != (b, k):
            raise RuntimeError(f"Expected size for first two dimensions of batch2 tensor to be: [{b}, {k}] but got: "
                               f"[{b2}, {k2}].")
        return self.matmul(mat2)

    def outer(self, vec2):
        _tensor_arg(vec2, "outer", "vec2")
        for name, t in (("self", self), ("vec2", vec2)):
            if t.ndim != 1:
                raise RuntimeError(f"outer: Expected 1-D argument {name}, but got {t.ndim}-D")
        return self.unsqueeze(1) * vec2.unsqueeze(0)

    ger = outer

    # -- sampling ---------------------------------------------------------------------------------------
    def multinomial(self, num_samples, replacement=False, *, generator=None):
        """Indices sampled from the rows of weights ``self`` (1-D or 2-D, non-negative, any positive sum).

        With replacement: inverse CDF (one searchsorted over all rows); without: the exponential race, the
        ``num_samples`` largest of w / Exp(1) (categories of weight 0 come last, as PyTorch's).
        """
        if self.ndim not in (1, 2):
            raise RuntimeError(f"prob_dist must be 1 or 2 dim, got {self.ndim}")
        if dtype_category(self._data.dtype) != 2:
            raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {self.dtype}")
        k = operator.index(num_samples)
        if k <= 0:
            raise RuntimeError(f"cannot sample n_sample <= 0 samples (num_samples={k})")
        xp = self._xp()
        w = self._data.astype(np.float64).reshape(-1, self._data.shape[-1])  # (rows, n)
        rows, n = w.shape
        if not replacement and k > n:
            raise RuntimeError(f"cannot sample n_sample > prob_dist.size(-1) samples without replacement "
                               f"({k} > {n})")
        if not bool((xp.isfinite(w) & (w >= 0)).all()):
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        total = w.sum(axis=1, keepdims=True)  # (rows, 1)
        if not bool((total > 0).all()):
            raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
        dev = self.device
        u = random_array("rand", (rows, k if replacement else n), np.dtype(np.float64), dev,
                         gen=_backend.generator_for(generator, dev))
        if replacement:
            # row r's CDF, shifted into [r, r + 1] (ending at exactly r + 1), makes all rows one sorted array
            offset = xp.arange(rows, dtype=np.float64)[:, None]
            cdf = xp.cumsum(w, axis=1)
            cdf = cdf / cdf[:, -1:] + offset
            idx = xp.searchsorted(cdf.ravel(), (u + offset).ravel(), side="right").reshape(rows, k)
            idx = idx - (offset * n).astype(idx.dtype)
            last = (n - 1) - xp.argmax(xp.flip(w > 0, 1).astype(np.int8), axis=1)[:, None]  # never a 0 weight
            idx = xp.minimum(idx, last)
        else:
            with np.errstate(divide="ignore"):
                keys = xp.where(w > 0, w / -xp.log1p(-u), -1.0)
            idx = _topk_indices(keys, k, 1, True)
        idx = idx.astype(np.int64, copy=False)
        return self._wrap(idx.reshape(-1) if self.ndim == 1 else idx)
