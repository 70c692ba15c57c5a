"""Activation layers (torch.nn.modules.activation): pointwise functions, PReLU (a learned slope) and GLU (a gate over
two halves), and the softmax family. MultiheadAttention, which PyTorch also keeps on this path, is in attention.py.

``inplace=True`` is accepted and shown in the repr as PyTorch does; the output is always a new tensor.
"""
import warnings

import hpcfsdp.nn.functional as F
from hpcfsdp.nn import init
from hpcfsdp.nn._functional import activation as _act
from hpcfsdp.nn.modules.module import Module
from hpcfsdp.nn.parameter import Parameter

__all__ = [
    "ReLU", "Hardtanh", "ReLU6", "LeakyReLU", "Threshold", "ELU", "CELU", "SELU", "GELU", "SiLU", "Mish", "Sigmoid",
    "LogSigmoid", "Hardsigmoid", "Hardswish", "Tanh", "Tanhshrink", "Softsign", "Softplus",
    "PReLU", "GLU",
    "Softmax", "LogSoftmax", "Softmin", "Softmax2d",
]


def _inplace(flag):
    return ", inplace=True" if flag else ""


# -- pointwise --------------------------------------------------------------------------------------------------------

class ReLU(Module):
    """max(x, 0)."""

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.relu(input)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class Hardtanh(Module):
    """clip(x, min_val, max_val).

    Raises:
        ValueError: ``max_val`` is not greater than ``min_val`` (PyTorch asserts).
    """

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False, min_value=None,
                 max_value=None) -> None:
        super().__init__()
        if min_value is not None:
            warnings.warn("keyword argument `min_value` is deprecated and rename to `min_val`", FutureWarning,
                          stacklevel=2)
            min_val = min_value
        if max_value is not None:
            warnings.warn("keyword argument `max_value` is deprecated and rename to `max_val`", FutureWarning,
                          stacklevel=2)
            max_val = max_value
        if not max_val > min_val:
            raise ValueError(f"max_val ({max_val}) must be greater than min_val ({min_val})")
        self.min_val = min_val
        self.max_val = max_val
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return F.hardtanh(input, self.min_val, self.max_val, self.inplace)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}{_inplace(self.inplace)}"


class ReLU6(Hardtanh):
    """min(max(x, 0), 6)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class LeakyReLU(Module):
    """x where x > 0, else negative_slope * x."""

    def __init__(self, negative_slope: float = 1e-2, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope = negative_slope
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}{_inplace(self.inplace)}"


class Threshold(Module):
    """x where x > threshold, else value."""

    def __init__(self, threshold: float, value: float, inplace: bool = False) -> None:
        super().__init__()
        self.threshold = threshold
        self.value = value
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return _act.threshold(input, self.threshold, self.value, self.inplace)

    def extra_repr(self) -> str:
        return f"threshold={self.threshold}, value={self.value}{_inplace(self.inplace)}"


class ELU(Module):
    """x where x > 0, else alpha * (exp(x) - 1)."""

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha = alpha
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return F.elu(input, self.alpha, self.inplace)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}{_inplace(self.inplace)}"


class CELU(Module):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha = alpha
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return _act.celu(input, self.alpha, self.inplace)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}{_inplace(self.inplace)}"


class SELU(Module):
    """scale * elu(x, alpha) with alpha = 1.6733 and scale = 1.0507 (self-normalizing)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return _act.selu(input, self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class GELU(Module):
    """x * Phi(x); ``approximate="tanh"`` uses the tanh approximation."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate argument must be either none or tanh, got {approximate!r}")
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={repr(self.approximate)}"


class SiLU(Module):
    """x * sigmoid(x) (the swish)."""

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.silu(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class Mish(Module):
    """x * tanh(softplus(x))."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return F.mish(input)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class Sigmoid(Module):
    """1 / (1 + exp(-x))."""

    def forward(self, input):  # noqa: A002
        return F.sigmoid(input)


class LogSigmoid(Module):
    """log(sigmoid(x))."""

    def forward(self, input):  # noqa: A002
        return _act.logsigmoid(input)


class Hardsigmoid(Module):
    """relu6(x + 3) / 6."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return _act.hardsigmoid(input, self.inplace)


class Hardswish(Module):
    """x * relu6(x + 3) / 6."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return _act.hardswish(input, self.inplace)


class Tanh(Module):
    """tanh(x)."""

    def forward(self, input):
        return F.tanh(input)


class Tanhshrink(Module):
    """x - tanh(x)."""

    def forward(self, input):  # noqa: A002
        return _act.tanhshrink(input)


class Softsign(Module):
    """x / (1 + |x|)."""

    def forward(self, input):  # noqa: A002
        return _act.softsign(input)


class Softplus(Module):
    """log(1 + exp(beta x)) / beta; linear where beta x > threshold."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, input):  # noqa: A002
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


# -- a learned slope, a gate ------------------------------------------------------------------------------------------

class PReLU(Module):
    """x where x > 0, else a * x, with a learnable ``a``: one shared value or one per channel (dim 1).

    Args:
        num_parameters: 1, or the number of input channels.
        init: the initial value of every ``a``.
    """

    def __init__(self, num_parameters: int = 1, init: float = 0.25, device=None, dtype=None) -> None:
        import hpcfsdp

        super().__init__()
        self.num_parameters = num_parameters
        self.init = init
        self.weight = Parameter(hpcfsdp.empty((num_parameters,), device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Fill the weight with ``init``."""
        init.constant_(self.weight, self.init)

    def forward(self, input):  # noqa: A002
        return _act.prelu(input, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


class GLU(Module):
    """a * sigmoid(b), where a and b are the halves of the input along ``dim``."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input):  # noqa: A002
        return _act.glu(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


# -- the softmax family -----------------------------------------------------------------------------------------------

class Softmax(Module):
    """exp(x) / sum(exp(x)) along ``dim`` (None: PyTorch's legacy implicit choice)."""

    def __init__(self, dim=None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input):  # noqa: A002
        return F.softmax(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Module):
    """log(softmax(x)) along ``dim``, computed stably."""

    def __init__(self, dim=None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input):  # noqa: A002
        return F.log_softmax(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmin(Module):
    """softmax(-x) along ``dim`` (None: PyTorch's legacy implicit choice)."""

    def __init__(self, dim=None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input):  # noqa: A002
        return _act.softmin(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmax2d(Module):
    """Softmax over the channels (dim -3) of a (C, H, W) or (N, C, H, W) input.

    Raises:
        ValueError: the input is not 3- or 4-dimensional (PyTorch's message).
    """

    def forward(self, input):  # noqa: A002
        if input.ndim not in (3, 4):
            raise ValueError(f"Softmax2d: expected input to be 3D or 4D, got {input.ndim}D instead")
        return F.softmax(input, -3)
