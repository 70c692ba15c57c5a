"""conv_transpose1d/2d/3d: PyTorch's argument checks and output sizes, then one autograd op."""
import numpy as np

from ...autograd import ops
from ._common import check_tensor, expand_param
from ..._autocast import LOWER, autocast_op

__all__ = ["conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "conv_transpose_output_size"]

_DIMS = ("depth", "height", "width")


def conv_transpose_output_size(in_size, kernel_size, stride, padding, output_padding, dilation):
    """Per spatial dim: (in - 1) stride - 2 padding + dilation (k - 1) + output_padding + 1."""
    return tuple((n - 1) * s - 2 * p + d * (k - 1) + op + 1
                 for n, k, s, p, op, d in zip(in_size, kernel_size, stride, padding, output_padding, dilation))


def _conv_transpose(nd, input, weight, bias, stride, padding, output_padding, groups, dilation):  # noqa: A002
    name = f"conv_transpose{nd}d"
    check_tensor(input, name)
    check_tensor(weight, name, "weight")
    if input.ndim not in (nd + 1, nd + 2):
        raise RuntimeError(f"Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input to {name}, but got "
                           f"input of size: {list(input.shape)}")
    if weight.ndim != nd + 2:
        raise RuntimeError(f"{name}: expected a {nd + 2}-D weight (in_channels, out_channels / groups, "
                           f"*kernel_size), but got weight of size {list(weight.shape)}")
    if isinstance(padding, str):
        raise TypeError(f"{name}(): argument 'padding' must be an int or a tuple of ints, not str ({padding!r})")
    what = "expected {name} to be a single integer value or a list of {n} values to match the convolution dimensions"
    stride = expand_param(stride, nd, "stride", what)
    padding = expand_param(padding, nd, "padding", what)
    output_padding = expand_param(output_padding, nd, "output_padding", what)
    dilation = expand_param(dilation, nd, "dilation", what)
    if min(stride) <= 0:
        raise RuntimeError("non-positive stride is not supported")
    if min(dilation) <= 0:
        raise RuntimeError("non-positive dilation is not supported")
    if min(padding) < 0:
        raise RuntimeError("negative padding is not supported")
    if min(output_padding) < 0:
        raise RuntimeError("negative output_padding is not supported")
    if any(op >= s and op >= d for op, s, d in zip(output_padding, stride, dilation)):
        dims = _DIMS[3 - nd:]
        desc = " ".join([f"output_padding_{n}: {v}" for n, v in zip(dims, output_padding)]
                        + [f"stride_{n}: {v}" for n, v in zip(dims, stride)]
                        + [f"dilation_{n}: {v}" for n, v in zip(dims, dilation)])
        raise RuntimeError(f"output padding must be smaller than either stride or dilation, but got {desc}")
    if not isinstance(groups, (int, np.integer)) or groups <= 0:
        raise RuntimeError(f"non-positive groups is not supported, got groups={groups}")
    unbatched = input.ndim == nd + 1
    x = input.unsqueeze(0) if unbatched else input
    cin, og = weight.shape[:2]
    if cin % groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, "
                           f"but got weight of size [{list(weight.shape)}] instead")
    if x.shape[1] != cin:
        raise RuntimeError(f"Given transposed=1, weight of size {list(weight.shape)}, expected input"
                           f"{list(x.shape)} to have {cin} channels, but got {x.shape[1]} channels instead")
    o = og * groups
    if bias is not None:
        check_tensor(bias, name, "bias")
        if tuple(bias.shape) != (o,):
            raise RuntimeError(f"Given transposed=1, weight of size {list(weight.shape)}, expected bias to be "
                               f"1-dimensional with {o} elements, but got bias of size {list(bias.shape)} instead")
    for other, what_ in ((weight, "weight"), (bias, "bias")):
        if other is not None and other.dtype != input.dtype:
            raise RuntimeError(f"Input type ({input.dtype}) and {what_} type ({other.dtype}) should be the same")
    out = conv_transpose_output_size(x.shape[2:], weight.shape[2:], stride, padding, output_padding, dilation)
    if min(out) < 1:
        raise RuntimeError(f"Given input size per channel: ({' x '.join(map(str, x.shape[2:]))}). Calculated output "
                           f"size per channel: ({' x '.join(map(str, out))}). Output size is too small")
    y = ops.ConvTransposeNd.apply(x, weight, bias, stride, padding, output_padding, dilation, int(groups))
    return y.squeeze(0) if unbatched else y


@autocast_op(cpu=LOWER, cuda=LOWER)
def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,  # noqa: A002
                     dilation=1):
    """1-d transposed convolution of (N, C_in, L) or (C_in, L) by weight (C_in, C_out / groups, k).

    Arguments as ``conv_transpose2d``, with ints or 1-tuples.
    """
    return _conv_transpose(1, input, weight, bias, stride, padding, output_padding, groups, dilation)


@autocast_op(cpu=LOWER, cuda=LOWER)
def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,  # noqa: A002
                     dilation=1):
    """2-d transposed convolution ("deconvolution") of (N, C_in, H, W) or (C_in, H, W).

    The gradient of ``conv2d`` with respect to its input: each input value scatters ``weight`` scaled by
    it into the output, windows ``stride`` apart, overlaps adding up.

    Args:
        input: the input, batched or not.
        weight: (C_in, C_out / groups, kH, kW), PyTorch's layout (in and out swapped relative to conv2d).
        bias: optional (C_out,).
        stride: an int or a pair.
        padding: an int or a pair: ``dilation (k - 1) - padding`` zero padding of the input, i.e. the
            output is cropped by ``padding`` on each side.
        output_padding: extra size added to one side of the output (smaller than stride or dilation).
        groups: input and output channels split into this many independent groups.
        dilation: spacing between kernel taps.

    Returns:
        (N, C_out, H_out, W_out), H_out = (H - 1) stride - 2 padding + dilation (kH - 1) + output_padding + 1.

    Raises:
        RuntimeError: a shape, a dtype or an argument is inconsistent, with PyTorch's message.
    """
    return _conv_transpose(2, input, weight, bias, stride, padding, output_padding, groups, dilation)


@autocast_op(cpu=LOWER, cuda=LOWER)
def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,  # noqa: A002
                     dilation=1):
    """3-d transposed convolution of (N, C_in, D, H, W) or (C_in, D, H, W); arguments as ``conv_transpose2d``."""
    return _conv_transpose(3, input, weight, bias, stride, padding, output_padding, groups, dilation)
