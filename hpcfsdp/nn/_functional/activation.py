"""Activations with parameters, group_norm, normalize and one_hot.

``inplace=True`` is accepted for signature compatibility; the result is always a new tensor.
"""
import numpy as np

from ..._array import wrap_dim
from ..._tensor import Tensor
from ...autograd import ops
from ._common import check_float, check_tensor
from ..._autocast import FP32, autocast_op

__all__ = ["leaky_relu", "elu", "softplus", "mish", "hardtanh", "relu6", "group_norm", "normalize", "one_hot"]


def leaky_relu(input, negative_slope=0.01, inplace=False):  # noqa: A002
    """x where x > 0, else negative_slope * x."""
    return ops.LeakyRelu.apply(check_float(input, "leaky_relu"), float(negative_slope))


def elu(input, alpha=1.0, inplace=False):  # noqa: A002
    """x where x > 0, else alpha * (exp(x) - 1)."""
    return ops.Elu.apply(check_float(input, "elu"), float(alpha))


@autocast_op(cuda=FP32)
def softplus(input, beta=1.0, threshold=20.0):  # noqa: A002
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (for numerical stability)."""
    return ops.Softplus.apply(check_float(input, "softplus"), float(beta), float(threshold))


def mish(input, inplace=False):  # noqa: A002
    """x * tanh(softplus(x))."""
    return ops.Mish.apply(check_float(input, "mish"))


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):  # noqa: A002
    """clip(x, min_val, max_val); the gradient is zero outside the open interval.

    Raises:
        ValueError: ``min_val`` > ``max_val``.
    """
    check_tensor(input, "hardtanh")
    if min_val > max_val:
        raise ValueError("min_val cannot be greater than max_val")
    return ops.Hardtanh.apply(input, min_val, max_val)


def relu6(input, inplace=False):  # noqa: A002
    """min(max(x, 0), 6): ``hardtanh(x, 0, 6)``."""
    return hardtanh(input, 0.0, 6.0)


@autocast_op(cuda=FP32)
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):  # noqa: A002
    """Normalize (N, C, *) over each group of C / num_groups channels (and all positions), then scale and shift
    per channel by ``weight`` and ``bias`` (C,).

    Raises:
        RuntimeError: fewer than 2 dims, C not divisible by ``num_groups``, or a weight or bias of the wrong size.
        ValueError: the input holds a single value.
    """
    check_float(input, "group_norm")
    if input.ndim < 2:
        raise RuntimeError(f"Expected at least 2 dimensions for input tensor but received {input.ndim}")
    shape = tuple(input.shape)
    n, c = shape[:2]
    if num_groups <= 0 or c % num_groups:
        raise RuntimeError(f"Expected number of channels in input to be divisible by num_groups, but got input of "
                           f"shape {list(shape)} and num_groups={num_groups}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and (p.ndim != 1 or p.shape[0] != c):
            raise RuntimeError(f"Expected {name} to be a vector of size equal to the number of channels in input, "
                               f"but got {name} of shape {list(p.shape)} and input of shape {list(shape)}")
    if input.numel() == 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size {input.shape}")
    per_group = c // num_groups * int(np.prod(shape[2:], dtype=np.int64))
    y = ops.LayerNorm.apply(input.reshape(n, num_groups, per_group), 1, None, None, float(eps)).reshape(shape)
    bshape = (1, c) + (1,) * (len(shape) - 2)
    if weight is not None:
        y = y * weight.reshape(bshape)
    if bias is not None:
        y = y + bias.reshape(bshape)
    return y


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):  # noqa: A002
    """input / max(||input||_p, eps) along ``dim``.

    Raises:
        IndexError: ``dim`` is out of range.
        NotImplementedError: ``out`` is given.
    """
    check_float(input, "normalize")
    if out is not None:
        raise NotImplementedError("normalize(): out= is not supported; use the returned tensor")
    d = wrap_dim(dim, input.ndim)
    norm = ops.VectorNorm.apply(input, float(p), (d,) if input.ndim else None, True)
    return input / norm.clamp(min=eps)


def one_hot(tensor, num_classes=-1):
    """(*, num_classes) int64 with 1 at each value of the int64 ``tensor``; num_classes=-1 means max + 1.

    Raises:
        RuntimeError: a non-int64 tensor, a negative value, a value >= num_classes, or an empty tensor
            with num_classes=-1, with PyTorch's messages.
    """
    check_tensor(tensor, "one_hot", "tensor")
    if tensor.dtype != np.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    a = tensor._data
    xp = tensor._xp()
    if a.size == 0:
        if num_classes == -1:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
    else:
        if int(a.min()) < 0:
            raise RuntimeError("Class values must be non-negative.")
        hi = int(a.max())
        if num_classes == -1:
            num_classes = hi + 1
        elif hi >= num_classes:
            raise RuntimeError("Class values must be smaller than num_classes.")
    if num_classes < 0:
        raise RuntimeError("Class values must be smaller than num_classes.")
    return Tensor._wrap((a[..., None] == xp.arange(int(num_classes))).astype(np.int64))
