"""Pooling of torch.nn.functional beyond max/avg/adaptive (pooling.py): power-average pooling lp_pool1d/2d/3d,
the *_with_indices forms of max pooling, and max_unpool1d/2d/3d (the scatter of max pooling's values back to
their indices), composed of differentiable Tensor ops as PyTorch's."""
from ._common import check_tensor, expand_param

from .pooling import (
    adaptive_max_pool1d, adaptive_max_pool2d, adaptive_max_pool3d, avg_pool1d, avg_pool2d, avg_pool3d, max_pool1d,
    max_pool2d, max_pool3d,
)

__all__ = ["lp_pool1d", "lp_pool2d", "lp_pool3d", "max_pool1d_with_indices", "max_pool2d_with_indices",
           "max_pool3d_with_indices", "adaptive_max_pool1d_with_indices", "adaptive_max_pool2d_with_indices",
           "adaptive_max_pool3d_with_indices", "max_unpool1d", "max_unpool2d", "max_unpool3d"]

_AVG = {1: avg_pool1d, 2: avg_pool2d, 3: avg_pool3d}
_MAX = {1: max_pool1d, 2: max_pool2d, 3: max_pool3d}


def _lp_pool(nd, input, norm_type, kernel_size, stride, ceil_mode):  # noqa: A002
    check_tensor(input, f"lp_pool{nd}d")
    ks = expand_param(kernel_size, nd, "kernel_size")
    if norm_type == float("inf"):
        return _MAX[nd](input.abs(), kernel_size, stride, 0, 1, ceil_mode)
    if norm_type == -float("inf"):
        return -_MAX[nd](-input.abs(), kernel_size, stride, 0, 1, ceil_mode)
    if stride is not None:
        out = _AVG[nd](input.pow(norm_type), kernel_size, stride, 0, ceil_mode)
    else:
        out = _AVG[nd](input.pow(norm_type), kernel_size, padding=0, ceil_mode=ceil_mode)
    n = 1
    for k in ks:
        n *= k
    return (out.sign() * out.abs().relu()).mul(n).pow(1.0 / norm_type)


def lp_pool1d(input, norm_type, kernel_size, stride=None, ceil_mode=False):  # noqa: A002
    """(sum over each window of x^p)^(1/p) of (N, C, L): at p = inf max pooling of |x|, at p = 1 sum pooling."""
    return _lp_pool(1, input, norm_type, kernel_size, stride, ceil_mode)


def lp_pool2d(input, norm_type, kernel_size, stride=None, ceil_mode=False):  # noqa: A002
    """(sum over each window of x^p)^(1/p) of (N, C, H, W); arguments as ``lp_pool1d``."""
    return _lp_pool(2, input, norm_type, kernel_size, stride, ceil_mode)


def lp_pool3d(input, norm_type, kernel_size, stride=None, ceil_mode=False):  # noqa: A002
    """(sum over each window of x^p)^(1/p) of (N, C, D, H, W); arguments as ``lp_pool1d``."""
    return _lp_pool(3, input, norm_type, kernel_size, stride, ceil_mode)


def max_pool1d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,  # noqa: A002
                            return_indices=False):
    """``max_pool1d`` returning (values, indices) whatever ``return_indices`` says, as PyTorch's."""
    return max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool2d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,  # noqa: A002
                            return_indices=False):
    """``max_pool2d`` returning (values, indices)."""
    return max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool3d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,  # noqa: A002
                            return_indices=False):
    """``max_pool3d`` returning (values, indices)."""
    return max_pool3d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


def adaptive_max_pool1d_with_indices(input, output_size, return_indices=False):  # noqa: A002
    """``adaptive_max_pool1d`` returning (values, indices)."""
    return adaptive_max_pool1d(input, output_size, True)


def adaptive_max_pool2d_with_indices(input, output_size, return_indices=False):  # noqa: A002
    """``adaptive_max_pool2d`` returning (values, indices)."""
    return adaptive_max_pool2d(input, output_size, True)


def adaptive_max_pool3d_with_indices(input, output_size, return_indices=False):  # noqa: A002
    """``adaptive_max_pool3d`` returning (values, indices)."""
    return adaptive_max_pool3d(input, output_size, True)


def _unpool_size(nd, input, kernel_size, stride, padding, output_size):  # noqa: A002
    ks = expand_param(kernel_size, nd, "kernel_size")
    st = ks if stride is None else expand_param(stride, nd, "stride")
    pad = expand_param(padding, nd, "padding")
    default = tuple((input.shape[input.ndim - nd + d] - 1) * st[d] + ks[d] - 2 * pad[d] for d in range(nd))
    if output_size is None:
        return default
    size = tuple(int(s) for s in output_size)
    if len(size) == nd + 2:
        size = size[2:]
    if len(size) != nd:
        raise ValueError(f"output_size should be a sequence containing {nd} or {nd + 2} elements, but it has a "
                         f"length of '{len(size)}'")
    for d in range(nd):
        lo, hi = default[d] - st[d], default[d] + st[d]
        if not lo < size[d] < hi:
            raise ValueError(f'invalid output_size "{output_size}" (dim {d} must be between {lo} and {hi})')
    return size


def _max_unpool(nd, input, indices, kernel_size, stride, padding, output_size):  # noqa: A002
    import hpcfsdp

    check_tensor(input, f"max_unpool{nd}d")
    check_tensor(indices, f"max_unpool{nd}d", "indices")
    if tuple(indices.shape) != tuple(input.shape):
        raise RuntimeError(f"Expected shape of indices to be same as that of the input tensor "
                           f"({list(input.shape)}) but got indices tensor with shape: {list(indices.shape)}")
    if input.ndim not in (nd + 1, nd + 2):
        raise RuntimeError(f"max_unpool{nd}d(): expected a {nd + 1}D or {nd + 2}D input, got {input.ndim}D")
    size = _unpool_size(nd, input, kernel_size, stride, padding, output_size)
    lead = tuple(input.shape[:input.ndim - nd])  # (N, C) or (C,)
    n_out = 1
    for s in size:
        n_out *= s
    flat_idx = indices.reshape(*lead, -1)
    if flat_idx.numel() and (int(flat_idx.min().item()) < 0 or int(flat_idx.max().item()) >= n_out):
        raise RuntimeError(f"Found an invalid max index: {int(flat_idx.max().item())} (output volumes are of "
                           f"size {'x'.join(map(str, size))}")
    out = hpcfsdp.zeros(*lead, n_out, dtype=input.dtype, device=input.device)
    out = out.scatter(len(lead), flat_idx, input.reshape(*lead, -1))
    return out.reshape(*lead, *size)


def max_unpool1d(input, indices, kernel_size, stride=None, padding=0, output_size=None):  # noqa: A002
    """The partial inverse of ``max_pool1d``: each value written at its index (within the flattened output of
    each channel), zeros elsewhere; the output size defaults to (L - 1) stride - 2 padding + kernel_size."""
    return _max_unpool(1, input, indices, kernel_size, stride, padding, output_size)


def max_unpool2d(input, indices, kernel_size, stride=None, padding=0, output_size=None):  # noqa: A002
    """The partial inverse of ``max_pool2d``; arguments as ``max_unpool1d``."""
    return _max_unpool(2, input, indices, kernel_size, stride, padding, output_size)


def max_unpool3d(input, indices, kernel_size, stride=None, padding=0, output_size=None):  # noqa: A002
    """The partial inverse of ``max_pool3d``; arguments as ``max_unpool1d``."""
    return _max_unpool(3, input, indices, kernel_size, stride, padding, output_size)
