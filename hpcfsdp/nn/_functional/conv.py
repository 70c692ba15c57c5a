"""conv1d/2d/3d and pad: argument checks and output sizes as PyTorch, then one autograd op."""
import numpy as np

from ...autograd import ops
from ._common import check_tensor, expand_param
from ..._autocast import LOWER, autocast_op

__all__ = ["conv1d", "conv2d", "conv3d", "pad", "same_padding"]

_CONV_DIMS = "to match the convolution dimensions"


def same_padding(kernel_size, dilation):
    """((lo, hi), ...) that keep the size at stride 1: d (k - 1) split with the extra one on the right."""
    res = []
    for k, d in zip(kernel_size, dilation):
        total = d * (k - 1)
        res.append((total // 2, total - total // 2))
    return tuple(res)


def _conv(nd, input, weight, bias, stride, padding, dilation, groups):  # noqa: A002
    name = f"conv{nd}d"
    check_tensor(input, name)
    check_tensor(weight, name, "weight")
    if input.ndim not in (nd + 1, nd + 2):
        raise RuntimeError(f"Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input to {name}, but got "
                           f"input of size: {list(input.shape)}")
    if weight.ndim != nd + 2:
        raise RuntimeError(f"{name}: expected a {nd + 2}-D weight (out_channels, in_channels / groups, "
                           f"*kernel_size), but got weight of size {list(weight.shape)}")
    what = "expected {name} to be a single integer value or a list of {n} values " + _CONV_DIMS
    stride = expand_param(stride, nd, "stride", what)
    dilation = expand_param(dilation, nd, "dilation", what)
    if min(stride) <= 0:
        raise RuntimeError("non-positive stride is not supported")
    if min(dilation) <= 0:
        raise RuntimeError("non-positive dilation is not supported")
    ks = tuple(weight.shape[2:])
    if isinstance(padding, str):
        if padding == "valid":
            pads = ((0, 0),) * nd
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise RuntimeError("padding='same' is not supported for strided convolutions")
            pads = same_padding(ks, dilation)
        else:
            raise RuntimeError(f"Invalid padding string: {padding!r}")
    else:
        p = expand_param(padding, nd, "padding", what)
        if min(p) < 0:
            raise RuntimeError("negative padding is not supported")
        pads = tuple((v, v) for v in p)
    if not isinstance(groups, (int, np.integer)) or groups <= 0:
        raise RuntimeError(f"non-positive groups is not supported, got groups={groups}")
    unbatched = input.ndim == nd + 1
    x = input.unsqueeze(0) if unbatched else input
    o, cg = weight.shape[:2]
    if o % groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, "
                           f"but got weight of size {list(weight.shape)} instead")
    if x.shape[1] != cg * groups:
        raise RuntimeError(f"Given groups={groups}, weight of size {list(weight.shape)}, expected input"
                           f"{list(x.shape)} to have {cg * groups} channels, but got {x.shape[1]} channels instead")
    if bias is not None:
        check_tensor(bias, name, "bias")
        if tuple(bias.shape) != (o,):
            raise RuntimeError(f"Given weight of size {list(weight.shape)}, expected bias to be 1-dimensional with "
                               f"{o} elements, but got bias of size {list(bias.shape)} instead")
    for other, what_ in ((weight, "weight"), (bias, "bias")):
        if other is not None and other.dtype != input.dtype:
            raise RuntimeError(f"Input type ({input.dtype}) and {what_} type ({other.dtype}) should be the same")
    padded = [n + lo + hi for n, (lo, hi) in zip(x.shape[2:], pads)]
    eff = [d * (k - 1) + 1 for k, d in zip(ks, dilation)]
    if any(p < e for p, e in zip(padded, eff)):
        raise RuntimeError(f"Calculated padded input size per channel: ({' x '.join(map(str, padded))}). Kernel "
                           f"size: ({' x '.join(map(str, eff))}). Kernel size can't be greater than actual input size")
    out = ops.ConvNd.apply(x, weight, bias, stride, pads, dilation, int(groups))
    return out.squeeze(0) if unbatched else out


@autocast_op(cpu=LOWER, cuda=LOWER)
def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    """1-d convolution (cross-correlation) of (N, C_in, L) or (C_in, L) by weight (C_out, C_in / groups, k).

    Args:
        input: the input, batched or not.
        weight: the filters.
        bias: optional (C_out,) added to every output position.
        stride: an int or a 1-tuple.
        padding: an int, a 1-tuple, ``"valid"`` (none) or ``"same"`` (output as long as the input; stride 1).
        dilation: spacing between kernel taps.
        groups: input and output channels split into this many independent groups.

    Returns:
        (N, C_out, L_out) with L_out = (L + 2 padding - dilation (k - 1) - 1) // stride + 1.

    Raises:
        RuntimeError: a shape, a dtype or an argument is inconsistent, with PyTorch's message.
    """
    return _conv(1, input, weight, bias, stride, padding, dilation, groups)


@autocast_op(cpu=LOWER, cuda=LOWER)
def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    """2-d convolution (cross-correlation) of (N, C_in, H, W) or (C_in, H, W) by weight (C_out, C_in / groups, kH, kW).

    Computed as im2col plus one batched matrix product on the input's array module (NumPy or CuPy).

    Args:
        input: the input, batched or not.
        weight: the filters.
        bias: optional (C_out,) added to every output position.
        stride: an int or a pair.
        padding: an int, a pair, ``"valid"`` (none) or ``"same"`` (output the size of the input; stride 1
            only; an odd total goes to the right and bottom, as PyTorch).
        dilation: spacing between kernel taps.
        groups: input and output channels split into this many independent groups.

    Returns:
        (N, C_out, H_out, W_out), H_out = (H + 2 padding - dilation (kH - 1) - 1) // stride + 1 (W alike).

    Raises:
        RuntimeError: a shape, a dtype or an argument is inconsistent, with PyTorch's message.
    """
    return _conv(2, input, weight, bias, stride, padding, dilation, groups)


@autocast_op(cpu=LOWER, cuda=LOWER)
def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    """3-d convolution of (N, C_in, D, H, W) or (C_in, D, H, W) by weight (C_out, C_in / groups, kD, kH, kW).

    Arguments and errors as ``conv2d``, with triples for stride, padding and dilation.
    """
    return _conv(3, input, weight, bias, stride, padding, dilation, groups)


_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def pad(input, pad, mode="constant", value=None):  # noqa: A002
    """Pad the last len(pad) // 2 dims: pad = (left, right) for the last dim, then the one before, ...

    Args:
        input: the tensor.
        pad: an even-length sequence of ints; in ``"constant"`` mode negative widths crop.
        mode: ``"constant"``, ``"reflect"`` (mirror without repeating the edge), ``"replicate"`` (repeat the
            edge) or ``"circular"`` (wrap around). The last three pad 1, 2 or 3 trailing dims of an input
            with one or two more dims, as PyTorch.
        value: the fill of ``"constant"`` mode (0 when None).

    Raises:
        RuntimeError: an odd or too long ``pad``, widths the mode cannot take, or ``value`` with another mode.
        NotImplementedError: an unknown mode, or a non-constant mode on an input rank PyTorch refuses.
    """
    check_tensor(input, "pad")
    pad_ = [int(p) for p in pad]
    if len(pad_) % 2:
        raise RuntimeError("Padding length must be divisible by 2")
    nd = len(pad_) // 2
    if nd > input.ndim:
        raise RuntimeError(f"Padding length should be less than or equal to two times the input dimension but got "
                           f"padding length {len(pad_)} and input of dimension {input.ndim}")
    if mode not in _PAD_MODES:
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    widths = [(0, 0)] * input.ndim
    for i in range(nd):
        widths[input.ndim - 1 - i] = (pad_[2 * i], pad_[2 * i + 1])
    shape = tuple(input.shape)
    if mode == "constant":
        for n, (lo, hi) in zip(shape, widths):
            if n + lo + hi < 0:
                raise RuntimeError(f"pad(): padding {(lo, hi)} of a dimension of size {n} leaves a negative size")
        return ops.PadConstant.apply(input, tuple(widths), 0 if value is None else value)
    if value is not None and value != 0:
        raise RuntimeError(f'Padding mode "{mode}" doesn\'t take in value argument')
    if nd == 0 or nd > 3 or input.ndim not in (nd + 1, nd + 2):
        raise NotImplementedError(f"Padding size {len(pad_)} is not supported for {input.ndim}D input tensor.")
    if 0 in shape[input.ndim - nd - 1:]:
        raise RuntimeError(f"pad(): expected a tensor with possibly 0 batch size and other non-zero dimensions, "
                           f"but got input of size {list(shape)}")
    index = {}
    for d in range(input.ndim - nd, input.ndim):
        n, (lo, hi) = shape[d], widths[d]
        if mode == "reflect" and (lo >= n or hi >= n):
            raise RuntimeError(f"Padding size should be less than the corresponding input dimension, but got: "
                               f"padding {(lo, hi)} at dimension {d} of input {list(shape)}")
        if mode == "circular" and (lo > n or hi > n):
            raise RuntimeError("Padding value causes wrapping around more than once.")
        if n + lo + hi <= 0 or (mode == "circular" and n - max(-lo, 0) - max(-hi, 0) <= 0):
            raise RuntimeError(f"input (size {n} at dimension {d}) is too small for padding {(lo, hi)}: the "
                               f"output size would be {n + lo + hi}")
        if lo or hi:
            index[d] = ops.pad_indices(n, lo, hi, mode)
    if not index:
        return input.clone()
    return ops.PadGather.apply(input, index)
