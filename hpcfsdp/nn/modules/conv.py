"""Convolution layers: Conv1d, Conv2d, Conv3d (PyTorch's arguments, attributes, init and repr)."""
import math

import numpy as np

import hpcfsdp.nn.functional as F
from hpcfsdp.nn import init
from hpcfsdp.nn._functional.conv import same_padding
from hpcfsdp.nn.modules.module import Module
from hpcfsdp.nn.parameter import Parameter

__all__ = ["Conv1d", "Conv2d", "Conv3d"]

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _ntuple(value, n, name):
    if isinstance(value, (int, np.integer)):
        return (int(value),) * n
    vals = tuple(int(v) for v in value)
    if len(vals) != n:
        raise ValueError(f"{name} must be an int or a tuple of {n} ints, got {value!r}")
    return vals


class _ConvNd(Module):
    """Shared body of Conv1d/2d/3d: weight (out_channels, in_channels / groups, *kernel_size), optional bias."""

    _nd = 0

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 padding_mode="zeros", device=None, dtype=None):
        super().__init__()
        nd = self._nd
        if not isinstance(groups, (int, np.integer)) or groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        if isinstance(padding, str):
            if padding not in ("valid", "same"):
                raise ValueError(f"Invalid padding string {padding!r}, should be one of {{'valid', 'same'}}")
            if padding == "same" and any(s != 1 for s in _ntuple(stride, nd, "stride")):
                raise ValueError("padding='same' is not supported for strided convolutions")
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {{'zeros', 'replicate', 'reflect', 'circular'}}, but got "
                             f"padding_mode={padding_mode!r}")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _ntuple(kernel_size, nd, "kernel_size")
        self.stride = _ntuple(stride, nd, "stride")
        self.padding = padding if isinstance(padding, str) else _ntuple(padding, nd, "padding")
        self.dilation = _ntuple(dilation, nd, "dilation")
        self.transposed = False
        self.output_padding = (0,) * nd
        self.groups = groups
        self.padding_mode = padding_mode
        # F.pad's order: (left, right) of the last dim first
        if padding == "same":
            pairs = same_padding(self.kernel_size, self.dilation)
        elif padding == "valid":
            pairs = ((0, 0),) * nd
        else:
            pairs = tuple((p, p) for p in self.padding)
        self._reversed_padding_repeated_twice = [v for pair in reversed(pairs) for v in pair]
        import hpcfsdp

        shape = (out_channels, in_channels // groups) + self.kernel_size
        self.weight = Parameter(hpcfsdp.empty(shape, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(hpcfsdp.empty((out_channels,), device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's default: kaiming_uniform_(a=sqrt(5)) for the weight, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the bias."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.in_channels // self.groups * int(np.prod(self.kernel_size))
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def _conv_forward(self, input, weight, bias):  # noqa: A002
        conv = (F.conv1d, F.conv2d, F.conv3d)[self._nd - 1]
        if self.padding_mode != "zeros":
            padded = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return conv(padded, weight, bias, self.stride, 0, self.dilation, self.groups)
        return conv(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def forward(self, input):  # noqa: A002
        return self._conv_forward(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        nd = self._nd
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * nd:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * nd:
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


class Conv1d(_ConvNd):
    """1-d convolution over (N, C_in, L) or (C_in, L) (See ``hpcfsdp.nn.functional.conv1d``).

    Args:
        in_channels: input channels.
        out_channels: output channels.
        kernel_size: an int or a 1-tuple.
        stride: an int or a 1-tuple.
        padding: an int, a 1-tuple, ``"valid"`` or ``"same"``.
        dilation: spacing between kernel taps.
        groups: channel groups convolved independently (divide both channel counts).
        bias: whether to learn an additive bias.
        padding_mode: ``"zeros"``, ``"reflect"``, ``"replicate"`` or ``"circular"``.
        device: where the parameters live (``"meta"`` allocates nothing).
        dtype: the parameters' dtype.
    """

    _nd = 1


class Conv2d(_ConvNd):
    """2-d convolution over (N, C_in, H, W) or (C_in, H, W) (See ``hpcfsdp.nn.functional.conv2d``).

    Args:
        in_channels: input channels.
        out_channels: output channels.
        kernel_size: an int or a pair.
        stride: an int or a pair.
        padding: an int, a pair, ``"valid"`` or ``"same"``.
        dilation: spacing between kernel taps.
        groups: channel groups convolved independently (divide both channel counts).
        bias: whether to learn an additive bias.
        padding_mode: ``"zeros"``, ``"reflect"``, ``"replicate"`` or ``"circular"``.
        device: where the parameters live (``"meta"`` allocates nothing).
        dtype: the parameters' dtype.

    Raises:
        ValueError: bad groups, padding string or padding_mode, or ``"same"`` with a stride, as PyTorch.
    """

    _nd = 2


class Conv3d(_ConvNd):
    """3-d convolution over (N, C_in, D, H, W) or (C_in, D, H, W); arguments as ``Conv2d`` with triples."""

    _nd = 3
