"""Padding layers over ``functional.pad``: constant, zero, reflection, replication and circular, 1-d to 3-d."""
from hpcfsdp.nn._functional.conv import pad
from hpcfsdp.nn.modules.module import Module

__all__ = ["ConstantPad1d", "ConstantPad2d", "ZeroPad1d", "ZeroPad2d", "ReflectionPad1d", "ReflectionPad2d",
           "ReplicationPad1d", "ReplicationPad2d", "ConstantPad3d", "ZeroPad3d", "ReflectionPad3d", "ReplicationPad3d",
           "CircularPad1d", "CircularPad2d", "CircularPad3d"]


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


class ConstantPad3d(_ConstantPadNd):
    """Pad the last three dims by ``padding`` (an int, or (l, r, t, b, front, back)) with ``value``."""

    _n = 6


class ZeroPad3d(ZeroPad2d):
    """Pad the last three dims by ``padding`` (an int, or (l, r, t, b, front, back)) with zeros."""

    _n = 6


class ReflectionPad3d(_PadNd):
    """Pad the last three dims of (N, C, D, H, W) or (C, D, H, W) by mirroring."""

    _n = 6
    _mode = "reflect"


class ReplicationPad3d(_PadNd):
    """Pad the last three dims of (N, C, D, H, W) or (C, D, H, W) by repeating the edges."""

    _n = 6
    _mode = "replicate"


class CircularPad1d(_PadNd):
    """Pad the last dim of (N, C, L) or (C, L) by wrapping around (the other end's values)."""

    _mode = "circular"


class CircularPad2d(_PadNd):
    """Pad the last two dims of (N, C, H, W) or (C, H, W) by wrapping around; ``padding`` an int or (l, r, t, b)."""

    _n = 4
    _mode = "circular"


class CircularPad3d(_PadNd):
    """Pad the last three dims of (N, C, D, H, W) or (C, D, H, W) by wrapping around."""

    _n = 6
    _mode = "circular"
