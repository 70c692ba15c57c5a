"""In-place Tensor methods (optimizers, init): they write into ``_data`` and are not recorded."""
import numpy as np

from . import _backend
from ._tensor import Tensor, _check_inplace
from .autograd.grad_mode import is_grad_enabled

__all__ = []

# [Note: In-place ops and autograd]
# In-place methods write into ``_data`` and record nothing: they are for optimizers, initialisation and
# buffers, under hp.no_grad(). There are no version counters, so, unlike PyTorch, writing in place
# into an array that a recorded op saved for backward (an op's input or output) is not detected and
# gives wrong gradients. What PyTorch rejects is rejected here too: an in-place op on a leaf that
# requires grad while grad mode is on. On a non-leaf in grad mode the methods refuse as well, and the
# augmented operators (``y += x``) rebind ``y`` to the recorded out-of-place result instead.


# -- in-place ops (optimizers, init; not recorded) ---------------------------------------------------------
def _raw(x):
    return x._data if isinstance(x, Tensor) else x


def _inplace(fn):
    def wrapper(self, *args, **kwargs):
        _check_inplace(self)
        if _backend.is_meta_array(self._data):
            return self
        fn(self._data, *args, **kwargs)
        return self

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = f"In-place {fn.__name__[:-1]} (not recorded by autograd)."
    setattr(Tensor, fn.__name__, wrapper)


@_inplace
def zero_(a):
    a.fill(0)


@_inplace
def fill_(a, value):
    a.fill(_raw(value).item() if isinstance(value, Tensor) else value)


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
def normal_(a, mean=0.0, std=1.0, *, generator=None):
    from ._creation import _random

    a[...] = _random("randn", a.shape, a.dtype if a.dtype == np.float64 else np.dtype(np.float32),
                     _backend.device_of_array(a)) * std + mean


@_inplace
def uniform_(a, from_=0.0, to=1.0, *, generator=None):
    from ._creation import _random

    a[...] = _random("rand", a.shape, a.dtype if a.dtype == np.float64 else np.dtype(np.float32),
                     _backend.device_of_array(a)) * (to - from_) + from_


Tensor.__iadd__ = lambda self, o: self.add_(o) if not _needs_graph(self, o) else self + o
Tensor.__isub__ = lambda self, o: self.sub_(o) if not _needs_graph(self, o) else self - o
Tensor.__imul__ = lambda self, o: self.mul_(o) if not _needs_graph(self, o) else self * o
Tensor.__itruediv__ = lambda self, o: self.div_(o) if not _needs_graph(self, o) else self / o


def _needs_graph(self, o):
    """`x += y` on tensors in a graph rebinds x to x + y (the recorded result) instead of writing in place."""
    if not is_grad_enabled():
        return False
    return (self.requires_grad and self.grad_fn is not None) or (isinstance(o, Tensor) and o.requires_grad)
