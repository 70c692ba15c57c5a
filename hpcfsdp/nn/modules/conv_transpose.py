"""Transposed convolution layers: ConvTranspose1d, ConvTranspose2d, ConvTranspose3d (PyTorch's layout, init, repr)."""
import math

import numpy as np

from hpcfsdp.nn import init
from hpcfsdp.nn._functional.conv_transpose import conv_transpose1d, conv_transpose2d, conv_transpose3d
from hpcfsdp.nn.modules.conv import _ntuple
from hpcfsdp.nn.modules.module import Module
from hpcfsdp.nn.parameter import Parameter

__all__ = ["ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"]


class _ConvTransposeNd(Module):
    """Shared body: weight (in_channels, out_channels / groups, *kernel_size), optional bias (out_channels,)."""

    _nd = 0

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1, padding_mode="zeros", device=None, dtype=None):
        super().__init__()
        nd = self._nd
        if not isinstance(groups, (int, np.integer)) or groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        if isinstance(padding, str):
            raise ValueError(f"padding={padding!r}: {type(self).__name__} takes an int or a tuple of {nd} ints "
                             f"(no 'same' or 'valid')")
        if padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for {type(self).__name__}')
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _ntuple(kernel_size, nd, "kernel_size")
        self.stride = _ntuple(stride, nd, "stride")
        self.padding = _ntuple(padding, nd, "padding")
        self.dilation = _ntuple(dilation, nd, "dilation")
        self.transposed = True
        self.output_padding = _ntuple(output_padding, nd, "output_padding")
        self.groups = groups
        self.padding_mode = padding_mode
        import hpcfsdp

        shape = (in_channels, out_channels // groups) + self.kernel_size
        self.weight = Parameter(hpcfsdp.empty(shape, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(hpcfsdp.empty((out_channels,), device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's default: kaiming_uniform_(a=sqrt(5)) for the weight, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the
        bias, fan_in being the weight's dim 1 times the kernel size (out_channels / groups * prod(kernel_size))."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.out_channels // self.groups * int(np.prod(self.kernel_size))
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def _output_padding(self, input, output_size):  # noqa: A002
        """The output_padding that makes the output ``output_size`` (self.output_padding when None)."""
        if output_size is None:
            return self.output_padding
        nd = self._nd
        sizes = [int(s) for s in output_size]
        lead = input.ndim - nd
        if len(sizes) == nd + lead:
            sizes = sizes[lead:]
        if len(sizes) != nd:
            raise ValueError(f"ConvTranspose{nd}D: for {input.ndim}D input, output_size must have {nd} or "
                             f"{nd + lead} elements (got {len(output_size)})")
        in_size = tuple(input.shape[input.ndim - nd:])
        lo = [(n - 1) * s - 2 * p + d * (k - 1) + 1
              for n, s, p, d, k in zip(in_size, self.stride, self.padding, self.dilation, self.kernel_size)]
        hi = [m + s - 1 for m, s in zip(lo, self.stride)]
        if any(not a <= v <= b for v, a, b in zip(sizes, lo, hi)):
            raise ValueError(f"requested an output size of {sizes}, but valid sizes range from {lo} to {hi} "
                             f"(for an input of {in_size})")
        return tuple(v - a for v, a in zip(sizes, lo))

    def forward(self, input, output_size=None):  # noqa: A002
        fn = (conv_transpose1d, conv_transpose2d, conv_transpose3d)[self._nd - 1]
        op = self._output_padding(input, output_size)
        return fn(input, self.weight, self.bias, self.stride, self.padding, op, self.groups, self.dilation)

    def extra_repr(self) -> str:
        nd = self._nd
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * nd:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * nd:
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * nd:
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s


class ConvTranspose1d(_ConvTransposeNd):
    """1-d transposed convolution over (N, C_in, L) or (C_in, L); arguments as ``ConvTranspose2d``."""

    _nd = 1


class ConvTranspose2d(_ConvTransposeNd):
    """2-d transposed convolution over (N, C_in, H, W) or (C_in, H, W) (See ``hpcfsdp.nn.functional.conv_transpose2d``).

    Args:
        in_channels: input channels.
        out_channels: output channels.
        kernel_size: an int or a pair.
        stride: an int or a pair.
        padding: an int or a pair: the output is cropped by it on each side.
        output_padding: extra size on one side of the output (smaller than stride or dilation).
        groups: channel groups convolved independently (divide both channel counts).
        bias: whether to learn an additive bias.
        dilation: spacing between kernel taps.
        padding_mode: only ``"zeros"``.
        device: where the parameters live (``"meta"`` allocates nothing).
        dtype: the parameters' dtype.

    ``forward(input, output_size=None)``: ``output_size`` (the spatial sizes, optionally with the leading dims)
    picks the output_padding that gives that size, as PyTorch.

    Raises:
        ValueError: bad groups, a padding string, a padding_mode other than ``"zeros"``, or an unreachable
            ``output_size``.
    """

    _nd = 2


class ConvTranspose3d(_ConvTransposeNd):
    """3-d transposed convolution over (N, C_in, D, H, W) or (C_in, D, H, W); arguments as ``ConvTranspose2d``."""

    _nd = 3
