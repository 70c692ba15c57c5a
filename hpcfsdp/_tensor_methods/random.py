"""Sampling: bernoulli, multinomial, hp.normal and the in-place fills normal_/uniform_ (initialisation), exponential_,
geometric_, log_normal_, cauchy_, random_ and bernoulli_. Samples carry no gradient (hp.normal's to its tensor mean and
std is zero, as PyTorch's)."""
import operator

import ml_dtypes
import numpy as np

from .. import _backend
from .._array import dtype_category, random_array
from .._normal_math import standard_normal_
from .._registry import function_op, mixin, op
from .._tensor_base import Size
from ..autograd import ops
from ._common import TensorBase, _float_only, _inplace, _random, _topk_indices, _wrap_array, check_inplace

__all__ = ["RandomMixin"]


@op("random", function=True)
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


@op("random", function=True)
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


@function_op("random", functions=(ops.Sampled,))
def normal(mean, std=1.0, size=None, *, generator=None, out=None, dtype=None, layout=None, device=None,
           pin_memory=False, requires_grad=False):
    """normal(mean, std) with a Tensor mean and/or std (broadcast; their gradients are zero, as PyTorch's), or
    normal(mean: float, std: float, size) with dtype=, device=; generator= takes an hp.Generator."""
    if out is not None:
        raise TypeError("normal(): out= is not supported by hpcfsdp; use the returned tensor")
    tensors = [t for t in (mean, std) if isinstance(t, TensorBase)]
    if not tensors:
        if size is None:
            raise TypeError("normal() received an invalid combination of arguments: (float mean, float std) needs "
                            "size=")
        if float(std) < 0:
            raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
        dt = _backend.to_dtype(dtype) if dtype is not None else _backend.default_float_dtype()
        dev = _backend.to_device(device)
        shape = tuple(size) if isinstance(size, (tuple, list, Size)) else (size,)
        noise = random_array("randn", shape, np.dtype(np.float64), dev, gen=_backend.generator_for(generator, dev))
        return _wrap_array((noise * float(std) + float(mean)).astype(dt), requires_grad)
    ref = tensors[0]
    if size is not None:
        raise TypeError("normal(): size= is only accepted with a float mean and a float std")
    if isinstance(std, TensorBase) and std.numel() and not bool((std._data >= 0).all()):
        raise RuntimeError("normal expects all elements of std >= 0.0")
    if not isinstance(std, TensorBase) and float(std) < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    shape = np.broadcast_shapes(*(tuple(t.shape) for t in tensors))
    dt = ref.dtype if len(tensors) == 1 else np.result_type(mean.dtype, std.dtype)
    if not _backend.is_floating_dtype(dt):
        raise RuntimeError(f"normal(): expected a floating-point mean and std, got {dt}")
    noise = random_array("randn", shape, np.dtype(np.float64), ref.device,
                         gen=_backend.generator_for(generator, ref.device))
    m = mean._data if isinstance(mean, TensorBase) else float(mean)
    s = std._data if isinstance(std, TensorBase) else float(std)
    sample = (noise * s + m).astype(dt)
    return ops.Sampled.apply(sample, *tensors)


# -- in place (initialisation; See [Note: In-place ops and autograd] in _common.py) ------------------------
@op("random")
@_inplace
def normal_(a, mean=0.0, std=1.0, *, generator=None):
    """In-place N(mean, std^2) by Box-Muller on uniform pairs, the values a DTensor's normal_ gives its piece (See
    [Note: Normal values at fixed positions] in hpcfsdp/random.py)."""
    dev = _backend.device_of_array(a)
    z = _backend.array_module(a).empty(int(a.size), dtype=a.dtype if a.dtype == np.float64 else np.dtype(np.float32))
    standard_normal_(_backend.generator_for(generator, dev), z)
    a[...] = z.reshape(a.shape) * std + mean


@op("random")
@_inplace
def uniform_(a, from_=0.0, to=1.0, *, generator=None):
    a[...] = random_array("rand", a.shape, a.dtype if a.dtype == np.float64 else np.dtype(np.float32),
                          _backend.device_of_array(a)) * (to - from_) + from_


def _uniform(a, generator):
    """Uniform samples on [0, 1) of a's shape in float64 (a's device and generator)."""
    return _random("rand", a.shape, np.dtype(np.float64), _backend.device_of_array(a), generator)


def _continuous(a, what):
    if dtype_category(a.dtype) != 2:
        raise RuntimeError(f"{what} distribution is a continuous probability distribution. dtype must be a floating "
                           f"point but you specified {a.dtype}")


@op("random")
@_inplace
def exponential_(a, lambd=1.0, *, generator=None):
    """In place: samples of the exponential distribution of rate ``lambd``, -log(1 - U) / lambd."""
    _continuous(a, "Exponential")
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")
    a[...] = -_backend.array_module(a).log1p(-_uniform(a, generator)) / lambd


@op("random")
@_inplace
def geometric_(a, p, *, generator=None):
    """In place: the number of Bernoulli(p) trials up to the first success (1, 2, ...), any dtype."""
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p}")
    xp = _backend.array_module(a)
    u = 1 - _uniform(a, generator)  # (0, 1]
    a[...] = xp.maximum(xp.ceil(xp.log(u) / np.log1p(-p)), 1)


@op("random")
@_inplace
def log_normal_(a, mean=1.0, std=2.0, *, generator=None):
    """In place: exp of N(mean, std^2) samples."""
    if dtype_category(a.dtype) != 2:
        raise NotImplementedError(f"\"log_normal_cpu\" not implemented for '{a.dtype}'")
    if not std > 0:
        raise RuntimeError(f"log_normal_ expects std > 0.0, but found std={std}")
    z = _random("randn", a.shape, np.dtype(np.float64), _backend.device_of_array(a), generator)
    a[...] = _backend.array_module(a).exp(z * std + mean)


@op("random")
@_inplace
def cauchy_(a, median=0.0, sigma=1.0, *, generator=None):
    """In place: samples of the Cauchy distribution, median + sigma tan(pi (U - 1/2))."""
    _continuous(a, "Cauchy")
    if not sigma > 0:
        raise RuntimeError(f"cauchy_ expects sigma > 0.0, but found sigma={sigma}")
    a[...] = median + sigma * _backend.array_module(a).tan(np.pi * (_uniform(a, generator) - 0.5))


def _random_bounds(dtype, low, high):
    """random_'s [low, high) for a's dtype: by default [0, 2^mantissa digits] for floats, [0, max] for integers."""
    if high is None:
        if dtype == np.bool_:
            return 0, 2
        if dtype_category(dtype) == 2:
            return 0, 2 ** (int(ml_dtypes.finfo(dtype).nmant) + 1) + 1
        return 0, int(np.iinfo(dtype).max) if dtype == np.int64 else int(np.iinfo(dtype).max) + 1
    if low >= high:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    if dtype_category(dtype) == 1:
        info = np.iinfo(dtype)
        if not info.min <= low <= info.max:
            raise RuntimeError(f"from is out of bounds for {dtype}")
        if not info.min <= high - 1 <= info.max:
            raise RuntimeError(f"to - 1 is out of bounds for {dtype}")
    return low, high


@op("random")
def random_(self, from_=None, to=None, *, generator=None):
    """In place: integers uniform on [from, to) (``random_(to)``: [0, to); ``random_()``: [0, 2^digits] for floats,
    [0, max] for integers; int64's default stops at 2^63 - 2)."""
    check_inplace(self)
    if from_ is not None and to is None:
        from_, to = 0, from_
    low, high = _random_bounds(self._data.dtype, 0 if from_ is None else operator.index(from_),
                               None if to is None else operator.index(to))
    if not _backend.is_meta_array(self._data):
        self._data[...] = _random("randint", self._data.shape, np.dtype(np.int64), self.device, generator, low, high)
    return self


@op("random")
def bernoulli_(self, p=0.5, *, generator=None):
    """In place: 0/1 samples with probability ``p`` (a number or a tensor broadcast to self), any dtype."""
    check_inplace(self)
    if isinstance(p, TensorBase):
        try:
            prob = self._xp().broadcast_to(p._data.astype(np.float64), self._data.shape)
        except ValueError:
            raise RuntimeError(f"bernoulli_: p of shape {list(p.shape)} does not broadcast to the tensor's shape "
                               f"{list(self.shape)}") from None
        if prob.size and not bool(((prob >= 0) & (prob <= 1)).all()):
            raise RuntimeError("bernoulli_: Expected p_in >= 0 && p_in <= 1 to be true")
    else:
        if not 0 <= p <= 1:
            raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p}")
        prob = float(p)
    if not _backend.is_meta_array(self._data):
        self._data[...] = _uniform(self._data, generator) < prob
    return self


RandomMixin = mixin("random")
