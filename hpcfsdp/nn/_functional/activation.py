"""The activations of torch.nn.functional beyond the core ones in nn/functional.py: leaky_relu, elu, softplus,
mish, hardtanh, relu6, prelu, selu, celu, glu, hardswish, hardsigmoid, softsign, tanhshrink, threshold,
logsigmoid, softmin.

``inplace=True`` is accepted for signature compatibility; the result is always a new tensor.
"""
from ..._array import wrap_dim
from ...autograd import ops
from ._common import check_float, check_tensor, elementwise
from ..._autocast import FP32, LOWER, autocast_op

__all__ = ["leaky_relu", "elu", "softplus", "mish", "hardtanh", "relu6", "prelu", "selu", "celu", "glu", "hardswish",
           "hardsigmoid", "softsign", "tanhshrink", "threshold", "logsigmoid", "softmin"]

SELU_ALPHA = 1.6732632423543772848170429916717  # the self-normalizing constants of Klambauer et al. (2017)
SELU_SCALE = 1.0507009873554804934193349852946


@elementwise
def leaky_relu(input, negative_slope=0.01, inplace=False):  # noqa: A002
    """x where x > 0, else negative_slope * x."""
    return ops.LeakyRelu.apply(check_float(input, "leaky_relu"), float(negative_slope))


@elementwise
def elu(input, alpha=1.0, inplace=False):  # noqa: A002
    """x where x > 0, else alpha * (exp(x) - 1)."""
    return ops.Elu.apply(check_float(input, "elu"), float(alpha))


@elementwise
@autocast_op(cuda=FP32)
def softplus(input, beta=1.0, threshold=20.0):  # noqa: A002
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (for numerical stability)."""
    return ops.Softplus.apply(check_float(input, "softplus"), float(beta), float(threshold))


@elementwise
def mish(input, inplace=False):  # noqa: A002
    """x * tanh(softplus(x))."""
    return ops.Mish.apply(check_float(input, "mish"))


@elementwise
def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):  # noqa: A002
    """clip(x, min_val, max_val); the gradient is zero outside the open interval.

    Raises:
        ValueError: ``min_val`` > ``max_val``.
    """
    check_tensor(input, "hardtanh")
    if min_val > max_val:
        raise ValueError("min_val cannot be greater than max_val")
    return ops.Hardtanh.apply(input, min_val, max_val)


@elementwise
def relu6(input, inplace=False):  # noqa: A002
    """min(max(x, 0), 6): ``hardtanh(x, 0, 6)``."""
    return hardtanh(input, 0.0, 6.0)


@autocast_op(cpu=LOWER, cuda=LOWER)
def prelu(input, weight):  # noqa: A002
    """x where x > 0, else weight * x, with one weight per channel (dim 1) or a single shared weight.

    Args:
        input: the tensor; its channels are dim 1 (a 0- or 1-dimensional input has one channel).
        weight: a 0-D or 1-D tensor of 1 or C values.

    Raises:
        RuntimeError: ``weight`` has more than 1 dimension, or its size is neither 1 nor the channel count.
    """
    check_float(input, "prelu")
    check_tensor(weight, "prelu", "weight")
    if weight.ndim > 1:
        raise RuntimeError(f"prelu: Expected `weight` to be a scalar or 1D tensor, but got: ndim = {weight.ndim}")
    n = weight.numel()
    if n != 1:
        channels = input.shape[1] if input.ndim >= 2 else 1
        if channels != n:
            raise RuntimeError(f"Mismatch of parameter numbers and input channel size. Found parameter numbers = "
                               f"{n} and channel size = {channels}.")
        weight = weight.reshape((1, n) + (1,) * (input.ndim - 2))  # (1, C, 1, ...)
    elif weight.ndim > input.ndim:
        weight = weight.reshape(())
    return ops.Prelu.apply(input, weight)


@elementwise
def selu(input, inplace=False):  # noqa: A002
    """scale * elu(x, alpha) with the self-normalizing alpha = 1.6733 and scale = 1.0507."""
    return ops.ScaledElu.apply(check_float(input, "selu"), SELU_ALPHA, SELU_SCALE, 1.0)


@elementwise
def celu(input, alpha=1.0, inplace=False):  # noqa: A002
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1)).

    Raises:
        RuntimeError: ``alpha`` is 0 (PyTorch's message).
    """
    check_float(input, "celu")
    if alpha == 0:
        raise RuntimeError("ZeroDivisionError: alpha cannot be 0 for CELU")
    return ops.ScaledElu.apply(input, float(alpha), 1.0, 1.0 / float(alpha))


def glu(input, dim=-1):  # noqa: A002
    """The gated linear unit a * sigmoid(b), where a and b are the two halves of ``input`` along ``dim``.

    Raises:
        RuntimeError: ``input`` is 0-dimensional, or its size along ``dim`` is odd.
    """
    check_float(input, "glu")
    if input.ndim == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    d = wrap_dim(dim, input.ndim)
    if input.shape[d] % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {d} is size {input.shape[d]}")
    a, b = input.chunk(2, d)
    return a * b.sigmoid()


@elementwise
def hardswish(input, inplace=False):  # noqa: A002
    """x * relu6(x + 3) / 6."""
    return ops.Hardswish.apply(check_float(input, "hardswish"))


@elementwise
def hardsigmoid(input, inplace=False):  # noqa: A002
    """relu6(x + 3) / 6."""
    return ops.Hardsigmoid.apply(check_float(input, "hardsigmoid"))


@elementwise
def softsign(input):  # noqa: A002
    """x / (1 + |x|) (composed of Tensor ops, as PyTorch)."""
    check_float(input, "softsign")
    return input / (input.abs() + 1)


@elementwise
def tanhshrink(input):  # noqa: A002
    """x - tanh(x) (composed of Tensor ops, as PyTorch)."""
    check_float(input, "tanhshrink")
    return input - input.tanh()


@elementwise
def threshold(input, threshold, value, inplace=False):  # noqa: A002
    """x where x > threshold, else value; the gradient is 0 where x <= threshold."""
    check_tensor(input, "threshold")
    return ops.Threshold.apply(input, threshold, value)


@elementwise
def logsigmoid(input):  # noqa: A002
    """log(sigmoid(x)), computed without overflow."""
    return ops.LogSigmoid.apply(check_float(input, "logsigmoid"))


def softmin(input, dim=None, _stacklevel=3, dtype=None):  # noqa: A002
    """softmax(-input) along ``dim``; None picks PyTorch's legacy implicit dimension (0 for 0-, 1- and 3-dimensional
    input, else 1). ``dtype``, if given, casts ``input`` first."""
    check_tensor(input, "softmin")
    if dim is None:
        dim = 0 if input.ndim in (0, 1, 3) else 1
    if dtype is not None:
        input = input.to(dtype)  # noqa: A001
    return (-input).softmax(dim)
