"""Yet more of PyTorch's top-level names: constants (inf, nan, pi, e, newaxis), finfo/iinfo and tensor functions
(roll, repeat_interleave, unique, median, quantile, normal, meshgrid, searchsorted, cdist, ...).

Each is the Tensor method of the same name where PyTorch has one (the math lives there and in autograd/);
functions PyTorch has only at the top level are written out here.
"""
import math

import numpy as np

from . import _backend
from ._array import random_array
from ._dtype_info import finfo, iinfo
from ._ops_api import _method_as_function
from ._tensor import Size, Tensor
from ._tensor_extra import vector_norm
from ._tensor_math import _as_operand, _promote_operands
from ._tensor_more import _zero_div_check
from .autograd import ops
from ._autocast import FP32, autocast_op

__all__ = [
    "inf", "nan", "pi", "e", "newaxis", "finfo", "iinfo",
    "roll", "flip", "fliplr", "flipud", "repeat_interleave", "tile", "diag", "diagonal", "trace", "tril_indices",
    "triu_indices", "movedim", "moveaxis",
    "normal", "bernoulli", "nonzero", "argwhere", "unique", "bincount", "searchsorted", "bucketize",
    "clamp_min", "clamp_max", "lerp", "addmm", "baddbmm", "addcmul", "addcdiv",
    "log1p", "expm1", "log2", "log10", "atan2", "arctan2", "hypot", "sinh", "cosh", "asin", "acos", "atan",
    "arcsin", "arccos", "arctan", "masked_select", "take", "meshgrid", "broadcast_tensors", "broadcast_shapes",
    "broadcast_to", "atleast_1d", "atleast_2d", "atleast_3d", "diff", "cummax", "cummin", "cumprod", "median",
    "kthvalue", "quantile", "nanmean", "nansum", "var_mean", "std_mean", "remainder", "fmod", "floor_divide",
    "reciprocal", "trunc", "fix", "frac", "isclose", "cdist",
]

inf = math.inf
nan = math.nan
pi = math.pi
e = math.e
newaxis = None

roll = _method_as_function("roll")
flip = _method_as_function("flip")
fliplr = _method_as_function("fliplr")
flipud = _method_as_function("flipud")
tile = _method_as_function("tile")
diag = _method_as_function("diag")
diagonal = _method_as_function("diagonal")
trace = _method_as_function("trace")
movedim = _method_as_function("movedim")
moveaxis = _method_as_function("movedim")
bernoulli = _method_as_function("bernoulli")
nonzero = _method_as_function("nonzero")
argwhere = _method_as_function("argwhere")
unique = _method_as_function("unique")
bincount = _method_as_function("bincount")
clamp_min = _method_as_function("clamp_min")
clamp_max = _method_as_function("clamp_max")
lerp = _method_as_function("lerp")
addmm = _method_as_function("addmm")
baddbmm = _method_as_function("baddbmm")
addcmul = _method_as_function("addcmul")
addcdiv = _method_as_function("addcdiv")
log1p = _method_as_function("log1p")
expm1 = _method_as_function("expm1")
log2 = _method_as_function("log2")
log10 = _method_as_function("log10")
atan2 = arctan2 = _method_as_function("atan2")
hypot = _method_as_function("hypot")
sinh = _method_as_function("sinh")
cosh = _method_as_function("cosh")
asin = arcsin = _method_as_function("asin")
acos = arccos = _method_as_function("acos")
atan = arctan = _method_as_function("atan")
masked_select = _method_as_function("masked_select")
take = _method_as_function("take")
broadcast_to = _method_as_function("broadcast_to")
diff = _method_as_function("diff")
cummax = _method_as_function("cummax")
cummin = _method_as_function("cummin")
cumprod = _method_as_function("cumprod")
median = _method_as_function("median")
kthvalue = _method_as_function("kthvalue")
quantile = _method_as_function("quantile")
nanmean = _method_as_function("nanmean")
nansum = _method_as_function("nansum")
floor_divide = _method_as_function("floor_divide")
reciprocal = _method_as_function("reciprocal")
trunc = fix = _method_as_function("trunc")
frac = _method_as_function("frac")
isclose = _method_as_function("isclose")


def _need_tensor(x, fn, name="input"):
    if not isinstance(x, Tensor):
        raise TypeError(f"{fn}(): argument '{name}' must be Tensor, not {type(x).__name__}")
    return x


def _remainder_like(kind):
    def f(input, other):  # noqa: A002
        if isinstance(input, Tensor):
            return getattr(input, kind)(other)
        other = _need_tensor(other, kind, "other")
        a, b = _promote_operands(_as_operand(input, other), other, kind)
        _zero_div_check(a, b)
        return ops.Remainder.apply(a, b, kind)

    f.__name__ = kind
    f.__doc__ = f"hp.{kind}(input, other): input a Tensor or a number (then other is a Tensor)."
    return f


remainder = _remainder_like("remainder")
fmod = _remainder_like("fmod")


def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):  # noqa: A002
    """torch.repeat_interleave(input, repeats, dim=None) or repeat_interleave(repeats): the indices 0, 1, ...
    each repeated repeats[i] times."""
    _need_tensor(input, "repeat_interleave")
    if repeats is None:
        idx = Tensor._wrap(input._xp().arange(input.shape[0] if input.ndim else 1, dtype=np.int64))
        return idx.repeat_interleave(input, output_size=output_size)
    return input.repeat_interleave(repeats, dim, output_size=output_size)


def _indices(kind, row, col, offset, dtype, device):
    r, c = getattr(np, f"{kind}_indices")(row, offset, col)
    t = Tensor._wrap(np.stack([r, c]).astype(_backend.to_dtype(dtype)))
    return t if device is None else t.to(device)


def tril_indices(row, col, offset=0, *, dtype=_backend.int64, device=None, layout=None):
    """The (2, N) row and column indices of the lower triangle of a row x col matrix, row by row."""
    return _indices("tril", row, col, offset, dtype, device)


def triu_indices(row, col, offset=0, *, dtype=_backend.int64, device=None, layout=None):
    """The (2, N) row and column indices of the upper triangle of a row x col matrix, row by row."""
    return _indices("triu", row, col, offset, dtype, device)


def normal(mean, std=1.0, size=None, *, generator=None, out=None, dtype=None, layout=None, device=None,
           pin_memory=False, requires_grad=False):
    """normal(mean, std) with a Tensor mean and/or std (broadcast; their gradients are zero, as PyTorch's), or
    normal(mean: float, std: float, size) with dtype=, device=; generator= takes an hp.Generator."""
    if out is not None:
        raise TypeError("normal(): out= is not supported by hpcfsdp; use the returned tensor")
    tensors = [t for t in (mean, std) if isinstance(t, Tensor)]
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
        return Tensor._wrap((noise * float(std) + float(mean)).astype(dt), requires_grad)
    ref = tensors[0]
    if size is not None:
        raise TypeError("normal(): size= is only accepted with a float mean and a float std")
    if isinstance(std, Tensor) and std.numel() and not bool((std._data >= 0).all()):
        raise RuntimeError("normal expects all elements of std >= 0.0")
    if not isinstance(std, Tensor) and float(std) < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    shape = np.broadcast_shapes(*(tuple(t.shape) for t in tensors))
    dt = ref.dtype if len(tensors) == 1 else np.result_type(mean.dtype, std.dtype)
    if not _backend.is_floating_dtype(dt):
        raise RuntimeError(f"normal(): expected a floating-point mean and std, got {dt}")
    noise = random_array("randn", shape, np.dtype(np.float64), ref.device,
                         gen=_backend.generator_for(generator, ref.device))
    m = mean._data if isinstance(mean, Tensor) else float(mean)
    s = std._data if isinstance(std, Tensor) else float(std)
    sample = (noise * s + m).astype(dt)
    return ops.Sampled.apply(sample, *tensors)


def searchsorted(sorted_sequence, input, *, out_int32=False, right=False, side=None, sorter=None):  # noqa: A002
    """Indices where ``input`` (a Tensor or a number) would be inserted into the last dim of sorted_sequence
    (1-D, or with leading dims equal to input's) to keep it sorted; int64 (int32 with out_int32)."""
    seq = _need_tensor(sorted_sequence, "searchsorted", "sorted_sequence")
    if side not in (None, "left", "right"):
        raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
    if side is not None and (side == "right") != right and right:
        raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, got side of left "
                           "while right was True")
    right = right or side == "right"
    xp = seq._xp()
    s = seq._data
    if sorter is not None:
        s = xp.take_along_axis(s, _need_tensor(sorter, "searchsorted", "sorter")._data, axis=-1)
    scalar = not isinstance(input, Tensor)
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
    return Tensor._wrap(xp.asarray(idx).astype(np.int32 if out_int32 else np.int64))


def bucketize(input, boundaries, *, out_int32=False, right=False):  # noqa: A002
    """The bucket of each element of ``input`` for 1-D sorted ``boundaries``: i with boundaries[i-1] < x <=
    boundaries[i] (right=False) or boundaries[i-1] <= x < boundaries[i] (right=True)."""
    b = _need_tensor(boundaries, "bucketize", "boundaries")
    if b.ndim != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({b.ndim})")
    return searchsorted(b, input, out_int32=out_int32, right=right)


def _tensor_list(tensors, fn):
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    for i, t in enumerate(tensors):
        _need_tensor(t, fn, f"tensors[{i}]")
    return tensors


def meshgrid(*tensors, indexing=None):
    """Coordinate grids of 0-D or 1-D tensors; indexing 'ij' (the default, without PyTorch's warning) or 'xy'
    (the first two dims swapped). Each grid is a broadcast view, differentiable."""
    tensors = _tensor_list(tensors, "meshgrid")
    indexing = "ij" if indexing is None else indexing
    if indexing not in ("ij", "xy"):
        raise ValueError(f"torch.meshgrid: indexing must be one of \"xy\" or \"ij\", but received: {indexing}")
    if not tensors:
        raise RuntimeError("torch.meshgrid expects a non-empty TensorList")
    for t in tensors:
        if t.ndim > 1:
            raise RuntimeError(f"torch.meshgrid: Expected 0D or 1D tensor in the tensor list but got: {t.ndim}D")
        if t.dtype != tensors[0].dtype or t.device != tensors[0].device:
            raise RuntimeError("torch.meshgrid: Expected all tensors in the tensor list to have the same dtype and "
                               "device")
    flat = [t.reshape(-1) for t in tensors]
    order = list(range(len(flat)))
    if indexing == "xy" and len(flat) >= 2:
        order[0], order[1] = 1, 0
    shape = tuple(flat[i].shape[0] for i in order)
    out = []
    for i, t in enumerate(flat):
        view = [1] * len(flat)
        view[order.index(i)] = -1
        out.append(t.reshape(view).expand(shape))
    return tuple(out)


def broadcast_shapes(*shapes):
    """The shape that tensors of ``shapes`` broadcast to (RuntimeError if they do not)."""
    try:
        return Size(np.broadcast_shapes(*((s,) if isinstance(s, int) else tuple(s) for s in shapes)))
    except ValueError:
        raise RuntimeError(f"Shape mismatch: objects cannot be broadcast to a single shape: "
                           f"{[list(s) if not isinstance(s, int) else s for s in shapes]}") from None


def broadcast_tensors(*tensors):
    """The tensors expanded to their common broadcast shape (differentiable views)."""
    tensors = _tensor_list(tensors, "broadcast_tensors")
    shape = broadcast_shapes(*(t.shape for t in tensors))
    return tuple(t.expand(shape) for t in tensors)


def _atleast(n, tensors, fn):
    single = len(tensors) == 1 and isinstance(tensors[0], Tensor)
    tensors = _tensor_list(tensors, fn)
    out = []
    for t in tensors:
        if t.ndim >= n:
            out.append(t)
        elif n == 3 and t.ndim == 2:
            out.append(t.unsqueeze(-1))
        elif n == 3 and t.ndim == 1:
            out.append(t.reshape(1, -1, 1))
        else:
            out.append(t.reshape((1,) * (n - t.ndim) + tuple(t.shape)))
    return out[0] if single else tuple(out)


def atleast_1d(*tensors):
    """Each tensor with at least 1 dim (a 0-d tensor becomes shape (1,)); one tensor in, one out."""
    return _atleast(1, tensors, "atleast_1d")


def atleast_2d(*tensors):
    """Each tensor with at least 2 dims, new dims in front; one tensor in, one out."""
    return _atleast(2, tensors, "atleast_2d")


def atleast_3d(*tensors):
    """Each tensor with at least 3 dims: (n,) -> (1, n, 1), (m, n) -> (m, n, 1); one tensor in, one out."""
    return _atleast(3, tensors, "atleast_3d")


def var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):  # noqa: A002
    """(var, mean) over ``dim``, with PyTorch's var arguments (correction=1 by default)."""
    _need_tensor(input, "var_mean")
    if isinstance(dim, bool):  # var_mean(input, unbiased)
        dim, unbiased = None, dim
    return input.var(dim, unbiased, keepdim, correction=correction), input.mean(dim, keepdim)


def std_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):  # noqa: A002
    """(std, mean) over ``dim``, with PyTorch's std arguments (correction=1 by default)."""
    _need_tensor(input, "std_mean")
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    return input.std(dim, unbiased, keepdim, correction=correction), input.mean(dim, keepdim)


@autocast_op(cpu=FP32, cuda=FP32)
def cdist(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    """The p-norm distances between the rows of x1 (..., P, M) and x2 (..., R, M): (..., P, R); differentiable,
    zero gradient where a distance is 0 (as PyTorch's)."""
    _need_tensor(x1, "cdist", "x1")
    _need_tensor(x2, "cdist", "x2")
    if x1.ndim < 2 or x2.ndim < 2:
        raise RuntimeError(f"cdist only supports at least 2D tensors, X1 got: {x1.ndim}D, X2 got: {x2.ndim}D")
    if x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError(f"X1 and X2 must have the same number of columns. X1: {x1.shape[-1]} X2: {x2.shape[-1]}")
    for name, t in (("X1", x1), ("X2", x2)):
        if not t.is_floating_point():
            raise RuntimeError(f"cdist only supports floating-point dtypes, {name} got: {t.dtype}")
    if p < 0:
        raise RuntimeError(f"cdist only supports non-negative p values, got {p}")
    return vector_norm(x1.unsqueeze(-2) - x2.unsqueeze(-3), p, -1)  # (..., P, R, M) -> (..., P, R)
