"""Activation layers of the second batch: PReLU, SELU, CELU, GLU, Hardswish, Hardsigmoid, Softsign, Tanhshrink,
Threshold, Softmin, LogSigmoid, Softmax2d.

``inplace=True`` is accepted and shown in the repr as PyTorch does; the output is always a new tensor.
"""
import hpcfsdp.nn.functional as F
from hpcfsdp.nn import init
from hpcfsdp.nn._functional import activation as _act
from hpcfsdp.nn.modules.module import Module
from hpcfsdp.nn.parameter import Parameter

__all__ = ["PReLU", "SELU", "CELU", "GLU", "Hardswish", "Hardsigmoid", "Softsign", "Tanhshrink", "Threshold",
           "Softmin", "LogSigmoid", "Softmax2d"]


def _inplace(flag):
    return ", inplace=True" if flag else ""


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


class SELU(Module):
    """scale * elu(x, alpha) with alpha = 1.6733 and scale = 1.0507 (self-normalizing)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return _act.selu(input, self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


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


class GLU(Module):
    """a * sigmoid(b), where a and b are the halves of the input along ``dim``."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input):  # noqa: A002
        return _act.glu(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Hardswish(Module):
    """x * relu6(x + 3) / 6."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return _act.hardswish(input, self.inplace)


class Hardsigmoid(Module):
    """relu6(x + 3) / 6."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return _act.hardsigmoid(input, self.inplace)


class Softsign(Module):
    """x / (1 + |x|)."""

    def forward(self, input):  # noqa: A002
        return _act.softsign(input)


class Tanhshrink(Module):
    """x - tanh(x)."""

    def forward(self, input):  # noqa: A002
        return _act.tanhshrink(input)


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


class Softmin(Module):
    """softmax(-x) along ``dim`` (None: PyTorch's legacy implicit choice)."""

    def __init__(self, dim=None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input):  # noqa: A002
        return _act.softmin(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSigmoid(Module):
    """log(sigmoid(x))."""

    def forward(self, input):  # noqa: A002
        return _act.logsigmoid(input)


class Softmax2d(Module):
    """Softmax over the channels (dim -3) of a (C, H, W) or (N, C, H, W) input.

    Raises:
        ValueError: the input is not 3- or 4-dimensional (PyTorch's message).
    """

    def forward(self, input):  # noqa: A002
        if input.ndim not in (3, 4):
            raise ValueError(f"Softmax2d: expected input to be 3D or 4D, got {input.ndim}D instead")
        return F.softmax(input, -3)
