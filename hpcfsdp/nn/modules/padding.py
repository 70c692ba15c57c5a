"""Padding layers over ``functional.pad``: constant, zero, reflection and replication, 1-d and 2-d."""
from hpcfsdp.nn._functional.conv import pad
from hpcfsdp.nn.modules.module import Module

__all__ = ["ConstantPad1d", "ConstantPad2d", "ZeroPad1d", "ZeroPad2d", "ReflectionPad1d", "ReflectionPad2d",
           "ReplicationPad1d", "ReplicationPad2d"]


def _ntuple(value, n):
    """PyTorch's _pair / _quadruple: a sequence as a tuple (its length is checked by pad), else n copies."""
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return (value,) * n


class _PadNd(Module):
    _n = 2
    _mode = "constant"

    def __init__(self, padding):
        super().__init__()
        self.padding = _ntuple(padding, self._n)

    def forward(self, input):  # noqa: A002
        return pad(input, self.padding, self._mode)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class _ConstantPadNd(_PadNd):
    def __init__(self, padding, value):
        super().__init__(padding)
        self.value = value

    def forward(self, input):  # noqa: A002
        return pad(input, self.padding, "constant", self.value)

    def extra_repr(self) -> str:
        return f"padding={self.padding}, value={self.value}"


class ConstantPad1d(_ConstantPadNd):
    """Pad the last dim by ``padding`` (an int, or (left, right)) with ``value``."""


class ConstantPad2d(_ConstantPadNd):
    """Pad the last two dims by ``padding`` (an int, or (left, right, top, bottom)) with ``value``."""

    _n = 4


class ZeroPad1d(_ConstantPadNd):
    """Pad the last dim by ``padding`` (an int, or (left, right)) with zeros."""

    def __init__(self, padding):
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class ZeroPad2d(_ConstantPadNd):
    """Pad the last two dims by ``padding`` (an int, or (left, right, top, bottom)) with zeros."""

    _n = 4

    def __init__(self, padding):
        super().__init__(padding, 0.0)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class ReflectionPad1d(_PadNd):
    """Pad the last dim of (N, C, L) or (C, L) by mirroring about the edges (the edge itself not repeated)."""

    _mode = "reflect"


class ReflectionPad2d(_PadNd):
    """Pad the last two dims of (N, C, H, W) or (C, H, W) by mirroring; ``padding`` an int or (l, r, t, b)."""

    _n = 4
    _mode = "reflect"


class ReplicationPad1d(_PadNd):
    """Pad the last dim of (N, C, L) or (C, L) by repeating the edge values."""

    _mode = "replicate"


class ReplicationPad2d(_PadNd):
    """Pad the last two dims of (N, C, H, W) or (C, H, W) by repeating the edges; ``padding`` an int or (l, r, t, b)."""

    _n = 4
    _mode = "replicate"
