"""torch.finfo and torch.iinfo: the numeric limits of a floating or integer dtype (bfloat16 through ml_dtypes);
the dtype queries and settings get_default_dtype, set_default_dtype, is_floating_point, promote_types, result_type
and can_cast; the constants inf, nan, pi, e and newaxis.
None of them computes on a tensor's data: they are not in the op registry.

The usual use of finfo is an attention mask's fill value, ``torch.finfo(x.dtype).min``.
"""
import math

import ml_dtypes
import numpy as np

from . import _backend
from ._array import dtype_category, result_type_scalar
from ._array import promote_types as _promote

__all__ = ["finfo", "iinfo", "get_default_dtype", "set_default_dtype", "is_floating_point", "promote_types",
           "result_type", "can_cast", "inf", "nan", "pi", "e",
           "newaxis"]

inf = math.inf
nan = math.nan
pi = math.pi
e = math.e
newaxis = None


def get_default_dtype():
    """The dtype of floating tensors made from Python floats and by the factories (float32 unless changed)."""
    return _backend.default_float_dtype()


def set_default_dtype(d):
    """Make the floating dtype ``d`` the default dtype (hp.tensor of Python floats, hp.zeros, hp.rand, ...); a
    TypeError for a non-floating one, as PyTorch."""
    dt = _backend.to_dtype(d)
    if not _backend.is_floating_dtype(dt):
        raise TypeError("only floating-point types are supported as the default type")
    _backend.set_default_float_dtype(dt)


def is_floating_point(t):
    return t.is_floating_point()


def promote_types(type1, type2):
    return _promote(_backend.to_dtype(type1), _backend.to_dtype(type2))

# PyTorch's resolution is 10 ** -precision, with precision floor(-log10(eps)) (2 for bfloat16, 3 for float16).
_RESOLUTION = {np.dtype(np.float64): 1e-15, np.dtype(np.float32): 1e-6, np.dtype(np.float16): 1e-3,
               _backend.bfloat16: 0.01}


def _dtype_name(dt):
    return "bfloat16" if dt == _backend.bfloat16 else str(dt)


class finfo:  # noqa: N801  (PyTorch's name)
    """finfo(type=None): bits, eps, max, min, tiny (= smallest_normal), resolution and dtype (a name) of a
    floating dtype; the default dtype without an argument."""

    __slots__ = ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution", "dtype")

    def __init__(self, type=None):  # noqa: A002
        dt = _backend.default_float_dtype() if type is None else _backend.to_dtype(type)
        if not _backend.is_floating_dtype(dt):
            raise TypeError(f"torch.finfo() requires a floating point input type, got {_dtype_name(dt)}. "
                            f"Use torch.iinfo to handle integer types")
        info = ml_dtypes.finfo(dt) if dt == _backend.bfloat16 else np.finfo(dt)
        self.bits = int(info.bits)
        self.eps = float(info.eps)
        self.max = float(info.max)
        self.min = float(info.min)
        self.tiny = self.smallest_normal = float(info.smallest_normal)
        self.resolution = _RESOLUTION[dt]
        self.dtype = _dtype_name(dt)

    def __eq__(self, other):
        return isinstance(other, finfo) and other.dtype == self.dtype

    def __hash__(self):
        return hash(("finfo", self.dtype))

    def __repr__(self):
        return (f"finfo(resolution={self.resolution:g}, min={self.min:g}, max={self.max:g}, eps={self.eps:g}, "
                f"smallest_normal={self.smallest_normal:g}, tiny={self.tiny:g}, dtype={self.dtype})")


class iinfo:  # noqa: N801  (PyTorch's name)
    """iinfo(type): bits, max, min and dtype (a name) of an integer dtype (bool is refused, as PyTorch)."""

    __slots__ = ("bits", "max", "min", "dtype")

    def __init__(self, type):  # noqa: A002
        dt = _backend.to_dtype(type)
        if dt.kind not in "iu":
            raise TypeError(f"torch.iinfo() requires an integer input type, got {_dtype_name(dt)}. "
                            f"Use torch.finfo to handle floating types")
        info = np.iinfo(dt)
        self.bits, self.max, self.min, self.dtype = int(info.bits), int(info.max), int(info.min), str(dt)

    def __eq__(self, other):
        return isinstance(other, iinfo) and other.dtype == self.dtype

    def __hash__(self):
        return hash(("iinfo", self.dtype))

    def __repr__(self):
        return f"iinfo(min={self.min:g}, max={self.max:g}, dtype={self.dtype})"


def _scalar_dtype(x):
    """The dtype PyTorch gives a Python number standing alone: bool, int64 or the default float dtype."""
    if isinstance(x, (bool, np.bool_)):
        return _backend.bool
    if isinstance(x, (int, np.integer)):
        return _backend.int64
    if isinstance(x, (float, np.floating)):
        return _backend.default_float_dtype()
    raise TypeError(f"result_type(): expected a Tensor or a number, got {type(x).__name__}")


def result_type(tensor1, tensor2):
    """The dtype of an arithmetic op on ``tensor1`` and ``tensor2`` (tensors or numbers), by PyTorch's promotion:
    a number or a 0-d tensor raises the result's category but not its size within the category."""
    def is_t(x):
        return hasattr(x, "_data")

    if is_t(tensor1) and is_t(tensor2):
        a, b = tensor1._data, tensor2._data
        return _promote(a.dtype, b.dtype, a.ndim == 0, b.ndim == 0)
    if is_t(tensor1) or is_t(tensor2):
        t, s = (tensor1, tensor2) if is_t(tensor1) else (tensor2, tensor1)
        _scalar_dtype(s)
        return result_type_scalar(t._data.dtype, s)
    d1, d2 = _scalar_dtype(tensor1), _scalar_dtype(tensor2)
    return d1 if dtype_category(d1) >= dtype_category(d2) else d2


def can_cast(from_, to):
    """Whether PyTorch's casting rules allow ``from_`` into ``to`` where it does so implicitly (an op's ``out=`` or
    in-place result): not down a category (floating to integer, integer to bool); any size within one."""
    return dtype_category(_backend.to_dtype(from_)) <= dtype_category(_backend.to_dtype(to))
