"""New tensors shaped like another: zeros_like, ones_like, empty_like, full_like, randn_like, rand_like,
randint_like; and the in-place fills fill_ and zero_. (The constructors from shapes and data, hp.zeros and hp.tensor, are
hpcfsdp/_creation.py's: they are not ops on tensors.)"""
from .. import _backend
from .._array import new_array
from .._registry import function_op, mixin, op
from ._common import TensorBase, _inplace, _raw, _random, _wrap_array

__all__ = ["CreationMixin"]


def _like(t, dtype, device):
    return (_backend.to_dtype(dtype) if dtype is not None else t.dtype,
            _backend.to_device(device) if device is not None else t.device)


def _filled_like(input, dtype, device, requires_grad, how):  # noqa: A002
    dt, dev = _like(input, dtype, device)
    like = getattr(input, "__hp_like__", None)
    if like is not None:  # a DTensor: the same layout, each rank filling its local piece (PyTorch's result)
        return like(new_array(dev, input._data.shape, dt, how), requires_grad)
    return _wrap_array(new_array(dev, input.shape, dt, how), requires_grad)


@function_op("creation")
def zeros_like(input, *, dtype=None, device=None, requires_grad=False):  # noqa: A002
    return _filled_like(input, dtype, device, requires_grad, "zeros")


@function_op("creation")
def ones_like(input, *, dtype=None, device=None, requires_grad=False):  # noqa: A002
    return _filled_like(input, dtype, device, requires_grad, "ones")


@function_op("creation")
def empty_like(input, *, dtype=None, device=None, requires_grad=False):  # noqa: A002
    return _filled_like(input, dtype, device, requires_grad, "empty")


@function_op("creation")
def full_like(input, fill_value, *, dtype=None, device=None, requires_grad=False):  # noqa: A002
    t = empty_like(input, dtype=dtype, device=device)
    if not t.is_meta:
        t._data.fill(fill_value)
    return t.requires_grad_(requires_grad) if requires_grad else t


@function_op("creation")
def randn_like(input, *, generator=None, dtype=None, device=None, requires_grad=False):  # noqa: A002
    dt, dev = _like(input, dtype, device)
    return _wrap_array(_random("randn", tuple(input.shape), dt, dev, generator), requires_grad)


@function_op("creation")
def rand_like(input, *, generator=None, dtype=None, device=None, requires_grad=False):  # noqa: A002
    dt, dev = _like(input, dtype, device)
    return _wrap_array(_random("rand", tuple(input.shape), dt, dev, generator), requires_grad)


@function_op("creation")
def randint_like(input, low=0, high=None, *, generator=None, dtype=None, device=None, requires_grad=False):  # noqa: A002
    """Integers drawn uniformly from [low, high) in ``input``'s shape (its dtype unless ``dtype``):
    ``randint_like(input, high)`` or ``randint_like(input, low, high)``."""
    if high is None:
        low, high = 0, low
    if not low < high:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    dt, dev = _like(input, dtype, device)
    return _wrap_array(_random("randint", tuple(input.shape), dt, dev, generator, low, high), requires_grad)


# -- in place (See [Note: In-place ops and autograd] in _common.py) ----------------------------------------
@op("creation")
@_inplace
def zero_(a):
    a.fill(0)


@op("creation")
@_inplace
def fill_(a, value):
    a.fill(_raw(value).item() if isinstance(value, TensorBase) else value)


CreationMixin = mixin("creation")
