"""TensorInplaceMixin: Tensor's in-place methods (optimizers, init); they write into ``_data`` and are not recorded."""
import numpy as np

from . import _backend
from ._array import random_array
from ._tensor_base import TensorBase
from .autograd.grad_mode import is_grad_enabled

__all__ = ["TensorInplaceMixin", "check_inplace"]

# [Note: In-place ops and autograd]
# In-place methods write into ``_data`` and record nothing: they are for optimizers, initialisation and
# buffers, under hp.no_grad(). There are no version counters, so, unlike PyTorch, writing in place
# into an array that a recorded op saved for backward (an op's input or output) is not detected and
# gives wrong gradients. What PyTorch rejects is rejected here too: an in-place op on a leaf that
# requires grad while grad mode is on. On a non-leaf in grad mode the methods refuse as well, and the
# augmented operators (``y += x``) rebind ``y`` to the recorded out-of-place result instead.


# -- in-place ops (optimizers, init; not recorded) ---------------------------------------------------------
def check_inplace(t):
    """In-place writes are not recorded; refuse them where autograd would be silently wrong."""
    if is_grad_enabled() and t._requires_grad:
        if t.grad_fn is None:
            raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
        raise RuntimeError("in-place operation on a tensor that is part of an autograd graph is not supported "
                           "by hpcfsdp; use the out-of-place operation or run it under hp.no_grad()")


def _raw(x):
    return x._data if isinstance(x, TensorBase) else x


def _inplace(array_fn):
    """The method for ``array_fn(array, *args)``: checks, writes into ``self._data`` and returns self."""
    def method(self, *args, **kwargs):
        check_inplace(self)
        if _backend.is_meta_array(self._data):
            return self
        array_fn(self._data, *args, **kwargs)
        return self

    method.__name__ = method.__qualname__ = array_fn.__name__
    method.__doc__ = array_fn.__doc__ or f"In-place {array_fn.__name__[:-1]} (not recorded by autograd)."
    return method


def _needs_graph(self, o):
    """`x += y` on tensors in a graph rebinds x to x + y (the recorded result) instead of writing in place."""
    if not is_grad_enabled():
        return False
    return (self.requires_grad and self.grad_fn is not None) or (isinstance(o, TensorBase) and o.requires_grad)


class TensorInplaceMixin:
    """In-place methods of Tensor: each writes into ``self._data`` (nothing on meta tensors) and returns self.

    See [Note: In-place ops and autograd].
    """

    @_inplace
    def zero_(a):
        a.fill(0)

    @_inplace
    def fill_(a, value):
        a.fill(_raw(value).item() if isinstance(value, TensorBase) else value)

    @_inplace
    def copy_(a, src, non_blocking=False):
        s = _raw(src)
        if _backend.is_meta_array(s):
            raise RuntimeError("copy_: cannot copy out of a meta tensor")
        xp = _backend.array_module(a)
        if xp is not _backend.array_module(s):
            s = xp.asarray(s) if xp is not np else _backend.to_numpy(s)
        a[...] = s

    @_inplace
    def add_(a, other, *, alpha=1):
        o = _raw(other)
        if alpha != 1:
            o = o * alpha
        a += o

    @_inplace
    def sub_(a, other, *, alpha=1):
        o = _raw(other)
        if alpha != 1:
            o = o * alpha
        a -= o

    @_inplace
    def mul_(a, other):
        a *= _raw(other)

    @_inplace
    def div_(a, other):
        a /= _raw(other)

    @_inplace
    def addcmul_(a, tensor1, tensor2, *, value=1):
        t = _raw(tensor1) * _raw(tensor2)
        if value != 1:
            t *= value
        a += t

    @_inplace
    def addcdiv_(a, tensor1, tensor2, *, value=1):
        t = _raw(tensor1) / _raw(tensor2)
        if value != 1:
            t *= value
        a += t

    @_inplace
    def lerp_(a, end, weight):
        w = _raw(weight)
        a += (_raw(end) - a) * w

    @_inplace
    def clamp_(a, min=None, max=None):  # noqa: A002
        xp = _backend.array_module(a)
        if min is None and max is None:
            raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
        xp.clip(a, _raw(min), _raw(max), out=a)

    @_inplace
    def sqrt_(a):
        _backend.array_module(a).sqrt(a, out=a)

    @_inplace
    def exp_(a):
        _backend.array_module(a).exp(a, out=a)

    @_inplace
    def neg_(a):
        _backend.array_module(a).negative(a, out=a)

    @_inplace
    def pow_(a, exponent):
        _backend.array_module(a).power(a, _raw(exponent), out=a)

    @_inplace
    def maximum_(a, other):
        _backend.array_module(a).maximum(a, _raw(other), out=a)

    @_inplace
    def masked_fill_(a, mask, value):
        a[_raw(mask)] = _raw(value)

    @_inplace
    def logical_and_(a, other):
        """self = self AND other elementwise (nonzero is True), written as 1/0 in self's dtype, as PyTorch."""
        if not isinstance(other, TensorBase):
            raise TypeError(f"logical_and_(): argument 'other' must be Tensor, not {type(other).__name__}")
        o = other._data
        if np.broadcast_shapes(o.shape, a.shape) != a.shape:
            raise RuntimeError(f"logical_and_: output with shape {list(a.shape)} doesn't match the broadcast shape "
                               f"{list(np.broadcast_shapes(o.shape, a.shape))}")
        a[...] = _backend.array_module(a).logical_and(a != 0, o != 0)

    @_inplace
    def normal_(a, mean=0.0, std=1.0, *, generator=None):
        a[...] = random_array("randn", a.shape, a.dtype if a.dtype == np.float64 else np.dtype(np.float32),
                                _backend.device_of_array(a)) * std + mean

    @_inplace
    def uniform_(a, from_=0.0, to=1.0, *, generator=None):
        a[...] = random_array("rand", a.shape, a.dtype if a.dtype == np.float64 else np.dtype(np.float32),
                                _backend.device_of_array(a)) * (to - from_) + from_

    def __iadd__(self, o):
        return self.add_(o) if not _needs_graph(self, o) else self + o

    def __isub__(self, o):
        return self.sub_(o) if not _needs_graph(self, o) else self - o

    def __imul__(self, o):
        return self.mul_(o) if not _needs_graph(self, o) else self * o

    def __itruediv__(self, o):
        return self.div_(o) if not _needs_graph(self, o) else self / o
