"""Activations that PyTorch makes Tensor methods: relu, sigmoid, softmax, log_softmax and hardshrink (the others are
hpcfsdp.nn.functional's)."""
from .._array import dtype_category, wrap_dim
from .._registry import mixin, op
from ..autograd import ops
from ._common import FP32, _to_float, autocast_op

__all__ = ["ActivationMixin"]


@op("activation", function=True, functions=(ops.Relu,))
def relu(self):
    return ops.Relu.apply(self)


@op("activation", function=True, functions=(ops.Sigmoid,))
def sigmoid(self):
    return ops.Sigmoid.apply(_to_float(self))


@op("activation", function=True, functions=(ops.Softmax,))
@autocast_op(cuda=FP32)
def softmax(self, dim, dtype=None):
    a = self.to(dtype) if dtype is not None else _to_float(self)
    return ops.Softmax.apply(a, wrap_dim(dim, a.ndim))


@op("activation", function=True, functions=(ops.LogSoftmax,))
@autocast_op(cuda=FP32)
def log_softmax(self, dim, dtype=None):
    a = self.to(dtype) if dtype is not None else _to_float(self)
    return ops.LogSoftmax.apply(a, wrap_dim(dim, a.ndim))


@op("activation", function=True)
def hardshrink(self, lambd=0.5):
    """x where |x| > lambd, else 0; the gradient is 1 where |x| > lambd, else 0 (nn.functional.hardshrink)."""
    if dtype_category(self._data.dtype) != 2:
        raise RuntimeError(f"hardshrink(): expected a floating point input, got dtype {self.dtype}")
    return self * (self.abs() > lambd).to(self.dtype)


ActivationMixin = mixin("activation")
