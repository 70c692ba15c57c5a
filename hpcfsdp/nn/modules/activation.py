"""Activation layers: GELU, ReLU, SiLU, Tanh."""
import hpcfsdp.nn.functional as F
from hpcfsdp.nn.modules.module import Module

__all__ = ["GELU", "ReLU", "SiLU", "Tanh"]


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


class ReLU(Module):
    """max(x, 0)."""

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.relu(input)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class Tanh(Module):
    """tanh(x)."""

    def forward(self, input):
        return F.tanh(input)


class SiLU(Module):
    """x * sigmoid(x) (the swish)."""

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.silu(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""
