"""Pooling layers: MaxPool1d/2d/3d, AvgPool1d/2d/3d, AdaptiveAvgPool1d/2d/3d, AdaptiveMaxPool1d/2d/3d (PyTorch's
arguments and reprs); LPPool1d/2d/3d and MaxUnpool1d/2d/3d, defined in lp_unpool.py, are here too, as in
torch.nn.modules.pooling."""
import hpcfsdp.nn.functional as F
from hpcfsdp.nn._functional.pooling import adaptive_max_pool1d, adaptive_max_pool2d, adaptive_max_pool3d
from hpcfsdp.nn.modules.lp_unpool import LPPool1d, LPPool2d, LPPool3d, MaxUnpool1d, MaxUnpool2d, MaxUnpool3d
from hpcfsdp.nn.modules.module import Module

__all__ = ["MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d",
           "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d",
           "LPPool1d", "LPPool2d", "LPPool3d", "MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d"]


def _single(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


class _MaxPoolNd(Module):
    _fn = None

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if (stride is not None) else kernel_size
        self.padding = padding
        self.dilation = dilation
        self.return_indices = return_indices
        self.ceil_mode = ceil_mode

    def forward(self, input):  # noqa: A002
        return type(self)._fn(input, self.kernel_size, self.stride, self.padding, self.dilation,
                              ceil_mode=self.ceil_mode, return_indices=self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class MaxPool1d(_MaxPoolNd):
    """Max over windows of (N, C, L) or (C, L); arguments as ``MaxPool2d``."""

    _fn = staticmethod(F.max_pool1d)


class MaxPool2d(_MaxPoolNd):
    """Max over kernel_size windows of (N, C, H, W) or (C, H, W) (See ``hpcfsdp.nn.functional.max_pool2d``).

    Args:
        kernel_size: an int or a pair.
        stride: defaults to ``kernel_size``.
        padding: implicit -inf padding, at most half the effective kernel size.
        dilation: spacing between window elements.
        return_indices: also return the flat input index of each maximum.
        ceil_mode: round the output size up.
    """

    _fn = staticmethod(F.max_pool2d)


class MaxPool3d(_MaxPoolNd):
    """Max over windows of (N, C, D, H, W) or (C, D, H, W); arguments as ``MaxPool2d``."""

    _fn = staticmethod(F.max_pool3d)


class AvgPool1d(Module):
    """Mean over windows of (N, C, L) or (C, L); arguments as ``AvgPool2d`` (no divisor_override)."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
        super().__init__()
        self.kernel_size = _single(kernel_size)
        self.stride = _single(stride if stride is not None else kernel_size)
        self.padding = _single(padding)
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad

    def forward(self, input):  # noqa: A002
        return F.avg_pool1d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class _AvgPoolNd(Module):
    _fn = None

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if (stride is not None) else kernel_size
        self.padding = padding
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad
        self.divisor_override = divisor_override

    def forward(self, input):  # noqa: A002
        return type(self)._fn(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                              self.count_include_pad, self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(_AvgPoolNd):
    """Mean over kernel_size windows of (N, C, H, W) or (C, H, W) (See ``hpcfsdp.nn.functional.avg_pool2d``).

    Args:
        kernel_size: an int or a pair.
        stride: defaults to ``kernel_size``.
        padding: implicit zero padding, at most half the kernel size.
        ceil_mode: round the output size up.
        count_include_pad: count the zero padding in the divisor.
        divisor_override: divide each window's sum by this instead.
    """

    _fn = staticmethod(F.avg_pool2d)


class AvgPool3d(_AvgPoolNd):
    """Mean over windows of (N, C, D, H, W) or (C, D, H, W); arguments as ``AvgPool2d``."""

    _fn = staticmethod(F.avg_pool3d)


class _AdaptiveAvgPoolNd(Module):
    _fn = None

    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, input):  # noqa: A002
        return type(self)._fn(input, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveAvgPool1d(_AdaptiveAvgPoolNd):
    """Average pooling of (N, C, L) or (C, L) to length ``output_size``."""

    _fn = staticmethod(F.adaptive_avg_pool1d)


class AdaptiveAvgPool2d(_AdaptiveAvgPoolNd):
    """Average pooling of (N, C, H, W) or (C, H, W) to ``output_size`` (an int, or a pair; None keeps a size)."""

    _fn = staticmethod(F.adaptive_avg_pool2d)


class AdaptiveAvgPool3d(_AdaptiveAvgPoolNd):
    """Average pooling of (N, C, D, H, W) or (C, D, H, W) to ``output_size``."""

    _fn = staticmethod(F.adaptive_avg_pool3d)


class _AdaptiveMaxPoolNd(Module):
    _fn = None

    def __init__(self, output_size, return_indices=False):
        super().__init__()
        self.output_size = output_size
        self.return_indices = return_indices

    def forward(self, input):  # noqa: A002
        return type(self)._fn(input, self.output_size, self.return_indices)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveMaxPool1d(_AdaptiveMaxPoolNd):
    """Max pooling of (N, C, L) or (C, L) to length ``output_size``; ``return_indices`` also returns the argmax."""

    _fn = staticmethod(adaptive_max_pool1d)


class AdaptiveMaxPool2d(_AdaptiveMaxPoolNd):
    """Max pooling of (N, C, H, W) or (C, H, W) to ``output_size`` (an int, or a pair; None keeps a size).

    With ``return_indices`` the forward returns (out, indices), indices the flat h * W + w of each maximum.
    """

    _fn = staticmethod(adaptive_max_pool2d)


class AdaptiveMaxPool3d(_AdaptiveMaxPoolNd):
    """Max pooling of (N, C, D, H, W) or (C, D, H, W) to ``output_size``."""

    _fn = staticmethod(adaptive_max_pool3d)
