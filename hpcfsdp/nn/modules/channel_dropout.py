"""Channel-wise dropout layers: Dropout1d, Dropout2d, Dropout3d (whole channels zeroed together)."""
import hpcfsdp.nn.functional as F
from hpcfsdp.nn.modules.module import Module

__all__ = ["Dropout1d", "Dropout2d", "Dropout3d"]


class _DropoutNd(Module):
    _fn = None

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self.inplace = inplace

    def forward(self, input):  # noqa: A002
        return type(self)._fn(input, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class Dropout1d(_DropoutNd):
    """In training, zero each channel of (N, C, L) or (C, L) with probability ``p``; scale the rest by 1 / (1 - p)."""

    _fn = staticmethod(F.dropout1d)


class Dropout2d(_DropoutNd):
    """In training, zero each channel of (N, C, H, W) with probability ``p``; scale the rest by 1 / (1 - p).

    A 3-D input is taken as (N, C, L), with PyTorch's warning.
    """

    _fn = staticmethod(F.dropout2d)


class Dropout3d(_DropoutNd):
    """In training, zero each channel of (N, C, D, H, W) or (C, D, H, W) with probability ``p``."""

    _fn = staticmethod(F.dropout3d)
