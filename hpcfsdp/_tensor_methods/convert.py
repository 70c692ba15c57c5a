"""Conversions: to (dtype, device, another tensor's), cpu/cuda, float/double/half/bfloat16/long/int/bool, type and
type_as, the new_* constructors (a new tensor on this one's dtype and device), detach/detach_ and copy_."""
import builtins

import numpy as np

from .. import _backend
from .._array import new_array
from .._registry import mixin, op
from .._tensor_base import as_array, parse_shape
from ..autograd import ops
from ._common import TensorBase, _inplace, _raw

__all__ = ["ConvertMixin"]

_TYPE_NAMES = {_backend.float32: "hp.FloatTensor", _backend.float64: "hp.DoubleTensor",
               _backend.float16: "hp.HalfTensor", _backend.bfloat16: "hp.BFloat16Tensor",
               _backend.int64: "hp.LongTensor", _backend.int32: "hp.IntTensor", _backend.bool: "hp.BoolTensor",
               _backend.uint8: "hp.ByteTensor"}

# The methods below are named float, int, bool, type and bfloat16: this module refers to the builtins and the
# dtypes by their modules (builtins.int, _backend.bfloat16).


@op("convert", functions=(ops.Cast, ops.ToDevice))
def to(self, *args, **kwargs):
    """to(device=None, dtype=None, non_blocking=False, copy=False), to(dtype), to(device, dtype), to(tensor)."""
    dev = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    copy = kwargs.pop("copy", False)
    kwargs.pop("non_blocking", None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    for a in args:
        if isinstance(a, TensorBase):
            dev, dtype = a.device, a.dtype
        elif isinstance(a, (_backend.device, str)) and not (isinstance(a, str) and a in _backend._NAMES):
            dev = a
        elif a is None:
            continue
        else:
            dtype = a
    out = self
    if dtype is not None:
        dtype = _backend.to_dtype(dtype)
        if dtype != self._data.dtype:
            out = ops.Cast.apply(out, dtype)
    if dev is not None:
        dev = _backend.to_device(dev)
        if dev != self.device:
            out = ops.ToDevice.apply(out, dev)
    if copy and out is self:
        out = self.clone()
    return out


@op("convert")
def cpu(self):
    return self.to("cpu")


@op("convert")
def cuda(self, device=None, non_blocking=False):
    return self.to(_backend.device("cuda", device) if isinstance(device, builtins.int) else (device or "cuda"))


@op("convert")
def float(self):  # noqa: A001
    return self.to(_backend.float32)


@op("convert")
def double(self):
    return self.to(_backend.float64)


@op("convert")
def half(self):
    return self.to(_backend.float16)


@op("convert")
def bfloat16(self):
    return self.to(_backend.bfloat16)


@op("convert")
def long(self):
    return self.to(_backend.int64)


@op("convert")
def int(self):  # noqa: A001
    return self.to(_backend.int32)


@op("convert")
def bool(self):  # noqa: A001
    return self.to(_backend.bool)


@op("convert")
def byte(self):
    return self.to(_backend.uint8)


@op("convert")
def char(self):
    return self.to(_backend.int8)


@op("convert")
def short(self):
    return self.to(_backend.int16)


@op("convert")
def type_as(self, other):
    return self.to(other.dtype)


@op("convert")
def type(self, dtype=None):  # noqa: A001
    if dtype is None:
        return _TYPE_NAMES.get(self._data.dtype, str(self._data.dtype))
    return self.to(dtype)


# -- new tensors on this one's dtype and device ------------------------------------------------------------
def _new(self, size, dtype, device, requires_grad, kind):
    shape = parse_shape(size if isinstance(size, tuple) else (size,))
    dt = _backend.to_dtype(dtype) if dtype is not None else self._data.dtype
    dev = _backend.to_device(device) if device is not None else self.device
    return self._wrap(new_array(dev, shape, dt, kind), requires_grad)


@op("convert")
def new_empty(self, size, *, dtype=None, device=None, requires_grad=False):
    return _new(self, size, dtype, device, requires_grad, "empty")


@op("convert")
def new_zeros(self, *size, dtype=None, device=None, requires_grad=False):
    return _new(self, size, dtype, device, requires_grad, "zeros")


@op("convert")
def new_ones(self, *size, dtype=None, device=None, requires_grad=False):
    return _new(self, size, dtype, device, requires_grad, "ones")


@op("convert")
def new_full(self, size, fill_value, *, dtype=None, device=None, requires_grad=False):
    t = _new(self, size, dtype, device, requires_grad, "empty")
    if not t.is_meta:
        t._data[...] = fill_value
    return t


@op("convert")
def new_tensor(self, data, dtype=None, device=None, requires_grad=False):
    array = as_array(data, dtype or self.dtype, device or self.device, copy=True)
    return self._wrap(array, requires_grad)


# -- devices and pinned memory ----------------------------------------------------------------------------
@op("convert", function=True)
def get_device(self):
    """The CUDA device index of a GPU tensor, -1 for a CPU (or meta) tensor."""
    d = self.device
    return (d.index or 0) if d.type == "cuda" else -1


@op("convert")
def is_pinned(self, device=None):
    """Whether this CPU tensor's memory is page-locked (False for GPU and meta tensors)."""
    return _backend.is_pinned(self._data)


@op("convert")
def pin_memory(self, device=None):
    """This CPU tensor copied into page-locked memory (self if it already is); needs a GPU, as PyTorch's."""
    if self.device.type != "cpu":
        raise RuntimeError(f"cannot pin '{self.type()}' only dense CPU tensors can be pinned")
    if not _backend.cupy_available():
        raise RuntimeError("Cannot access accelerator device when none is available.")
    if _backend.is_pinned(self._data):
        return self
    out = _backend.pinned_empty(self._data.shape, self._data.dtype)
    out[...] = self._data
    return self._wrap(out)


# -- detach and copy ---------------------------------------------------------------------------------------
@op("convert", function=True)
def detach(self):
    return self._wrap(self._data)


@op("convert", function=True)
def detach_(self):
    self.grad_fn = None
    self._requires_grad = False
    return self


@op("convert")
@_inplace
def copy_(a, src, non_blocking=False):
    s = _raw(src)
    if _backend.is_meta_array(s):
        raise RuntimeError("copy_: cannot copy out of a meta tensor")
    xp = _backend.array_module(a)
    if xp is not _backend.array_module(s):
        s = xp.asarray(s) if xp is not np else _backend.to_numpy(s)
    a[...] = s


ConvertMixin = mixin("convert")
