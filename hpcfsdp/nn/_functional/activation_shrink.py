"""hardshrink, softshrink and rrelu (composed of differentiable Tensor ops), and the in-place activations of
torch.nn.functional (relu_, elu_, leaky_relu_, hardtanh_, threshold_, selu_, celu_, rrelu_).

The in-place functions compute out of place and write the result into ``input`` (returned), with the in-place
methods' rule: refused on a tensor that autograd records (See [Note: In-place ops and autograd]).
"""
from ..._array import dtype_category
from ..._tensor_methods import activation as _tensor_activation
from ._common import check_float, check_tensor, elementwise
from . import activation as _act
from .activation import celu, elu, hardtanh, leaky_relu, selu

__all__ = ["hardshrink", "softshrink", "rrelu", "relu_", "elu_", "leaky_relu_", "hardtanh_", "threshold_", "selu_",
           "celu_", "rrelu_"]


def _lambd(lambd):
    if not 0 <= lambd:
        raise RuntimeError(f"lambda must be greater or equal to 0, but found to be {lambd}.")
    return float(lambd)


@elementwise
def hardshrink(input, lambd=0.5):  # noqa: A002
    """x where |x| > lambd, else 0; the gradient is 1 where |x| > lambd, else 0 (Tensor.hardshrink)."""
    return _tensor_activation.hardshrink(input, lambd)

@elementwise
def softshrink(input, lambd=0.5):  # noqa: A002
    """x - lambd where x > lambd, x + lambd where x < -lambd, else 0 (x - clamp(x, -lambd, lambd)).

    Raises:
        RuntimeError: ``lambd`` is negative.
    """
    check_float(input, "softshrink")
    lam = _lambd(lambd)
    return input - input.clamp(-lam, lam)


def rrelu(input, lower=1.0 / 8, upper=1.0 / 3, training=False, inplace=False):  # noqa: A002
    """x where x > 0, else a x: in training a is drawn uniformly from [lower, upper] for each element, in
    evaluation a = (lower + upper) / 2 (``leaky_relu``). ``inplace`` is accepted; the result is a new tensor.

    Raises:
        RuntimeError: ``lower`` > ``upper``.
    """
    import hpcfsdp

    check_float(input, "rrelu")
    if lower > upper:
        raise RuntimeError("Lower bound should be less than or equal to the upper bound")
    if not training:
        return leaky_relu(input, (lower + upper) / 2)
    with hpcfsdp.no_grad():
        slope = hpcfsdp.empty_like(input).uniform_(lower, upper)  # (input's shape)
        neg = input.detach() <= 0
        noise = hpcfsdp.where(neg, slope, hpcfsdp.ones_like(slope))
    return input * noise


def _write(input, out, name):  # noqa: A002
    check_tensor(input, name)
    if dtype_category(input.dtype) != 2:
        raise RuntimeError(f"{name}(): expected a floating point input, got dtype {input.dtype}")
    return input.copy_(out)


def relu_(input):  # noqa: A002
    """In-place ``relu``: input is overwritten with max(input, 0) and returned."""
    check_tensor(input, "relu_")
    return input.relu_()


def elu_(input, alpha=1.0):  # noqa: A002
    """In-place ``elu``."""
    return _write(input, elu(input, alpha), "elu_")


def leaky_relu_(input, negative_slope=0.01):  # noqa: A002
    """In-place ``leaky_relu``."""
    return _write(input, leaky_relu(input, negative_slope), "leaky_relu_")


def hardtanh_(input, min_val=-1.0, max_val=1.0):  # noqa: A002
    """In-place ``hardtanh``."""
    check_tensor(input, "hardtanh_")
    return input.copy_(hardtanh(input, min_val, max_val))


def threshold_(input, threshold, value):  # noqa: A002
    """In-place ``threshold``."""
    check_tensor(input, "threshold_")
    return input.copy_(_act.threshold(input, threshold, value))


def selu_(input):  # noqa: A002
    """In-place ``selu``."""
    return _write(input, selu(input), "selu_")


def celu_(input, alpha=1.0):  # noqa: A002
    """In-place ``celu``."""
    return _write(input, celu(input, alpha), "celu_")


def rrelu_(input, lower=1.0 / 8, upper=1.0 / 3, training=False):  # noqa: A002
    """In-place ``rrelu``."""
    return _write(input, rrelu(input, lower, upper, training), "rrelu_")

