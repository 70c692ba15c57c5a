"""Max, average, adaptive average and adaptive max pooling (1-, 2-, 3-d), with PyTorch's checks."""

import numpy as np

from ...autograd import ops
from ._common import check_float, check_tensor, expand_param

__all__ = ["max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
           "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool1d",
           "adaptive_max_pool2d", "adaptive_max_pool3d", "pool_output_size"]


def pool_output_size(n, k, s, p, d, ceil_mode):
    """PyTorch's pooling output length: floor (or ceil) of (n + 2p - d (k - 1) - 1) / s, plus 1; in ceil mode
    the last window must start inside the input or its left padding."""
    o = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (o - 1) * s >= n + p:
        o -= 1
    return o


def _pool_args(name, nd, input, kernel_size, stride, padding, dilation, ceil_mode):  # noqa: A002
    """(x batched, unbatched?, kernel, stride, padding, dilation, out_size) after PyTorch's checks."""
    if input.ndim not in (nd + 1, nd + 2) or 0 in input.shape[input.ndim - nd - 1:]:
        if nd == 1:
            raise RuntimeError(f"{name}() Expected 2D or 3D input tensor, but got {list(input.shape)}")
        raise RuntimeError(f"{name}(): non-empty {nd + 1}D or {nd + 2}D (batch mode) tensor expected for input, "
                           f"got {list(input.shape)}")
    ks = expand_param(kernel_size, nd, "kernel_size")
    st = ks if stride is None or (not isinstance(stride, (int, np.integer)) and len(stride) == 0) \
        else expand_param(stride, nd, "stride")
    pd = expand_param(padding, nd, "padding")
    dl = expand_param(dilation, nd, "dilation")
    if min(ks) <= 0:
        raise RuntimeError(f"{name}(): kernel_size must be greater than zero, but got {list(ks)}")
    if min(st) <= 0:
        raise RuntimeError("stride should not be zero")
    if min(dl) <= 0:
        raise RuntimeError(f"{name}(): dilation must be greater than zero, but got {list(dl)}")
    for k, p, d in zip(ks, pd, dl):
        if p < 0 or p > (d * (k - 1) + 1) // 2:
            raise RuntimeError(f"pad should be at most half of effective kernel size, but got pad={p}, "
                               f"kernel_size={k} and dilation={d}")
    if any(p > k // 2 for k, p in zip(ks, pd)):  # PyTorch also bounds it by half the undilated kernel
        raise RuntimeError(f"pad should be smaller than or equal to half of kernel size, but got padding={list(pd)}, "
                           f"kernel_size={list(ks)}")
    unbatched = input.ndim == nd + 1
    x = input.unsqueeze(0) if unbatched else input
    out = tuple(pool_output_size(n, k, s, p, d, ceil_mode) for n, k, s, p, d in zip(x.shape[2:], ks, st, pd, dl))
    if min(out) < 1:
        c = x.shape[1]
        raise RuntimeError(f"Given input size: ({'x'.join(map(str, (c,) + tuple(x.shape[2:])))}). Calculated output "
                           f"size: ({'x'.join(map(str, (c,) + out))}). Output size is too small")
    return x, unbatched, ks, st, pd, dl, out


def _max_pool(nd, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices):  # noqa: A002
    name = f"max_pool{nd}d"
    check_tensor(input, name)
    x, unbatched, ks, st, pd, dl, out = _pool_args(name, nd, input, kernel_size, stride, padding, dilation,
                                                   ceil_mode)
    res = ops.MaxPoolNd.apply(x, ks, st, tuple((p, p) for p in pd), dl, out, bool(return_indices))
    if not return_indices:
        return res.squeeze(0) if unbatched else res
    y, idx = res
    return (y.squeeze(0), idx.squeeze(0)) if unbatched else (y, idx)


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,  # noqa: A002
               return_indices=False):
    """Max over windows of (N, C, L) or (C, L); arguments as ``max_pool2d``."""
    return _max_pool(1, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,  # noqa: A002
               return_indices=False):
    """Max over kernel_size windows of (N, C, H, W) or (C, H, W).

    Args:
        input: the input, batched or not.
        kernel_size: an int or a pair.
        stride: defaults to ``kernel_size``.
        padding: implicit -inf padding on both sides, at most half the effective kernel size.
        dilation: spacing between window elements.
        ceil_mode: round the output size up (a last window that starts inside the input is kept).
        return_indices: also return, per output, the flat index (h * W + w) of its maximum in the input.

    Returns:
        The pooled tensor, or (pooled, indices) with ``return_indices``.

    Raises:
        RuntimeError: a bad rank, argument or an empty output, with PyTorch's message.
    """
    return _max_pool(2, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,  # noqa: A002
               return_indices=False):
    """Max over windows of (N, C, D, H, W) or (C, D, H, W); arguments as ``max_pool2d``."""
    return _max_pool(3, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def _avg_pool(nd, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):  # noqa: A002
    name = f"avg_pool{nd}d"
    check_float(input, name)
    x, unbatched, ks, st, pd, _, out = _pool_args(name, nd, input, kernel_size, stride, padding, 1, ceil_mode)
    pads = tuple((p, p) for p in pd)
    if divisor_override is not None:
        if divisor_override == 0:
            raise RuntimeError("divisor must be not zero")
        div = float(divisor_override)
    else:
        xp = x._xp()
        div = ops.avg_divisor(x.shape[2:], out, ks, st, pads, count_include_pad, xp, np.float64)
    y = ops.AvgPoolNd.apply(x, ks, st, pads, out, div)
    return y.squeeze(0) if unbatched else y


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):  # noqa: A002
    """Mean over windows of (N, C, L) or (C, L); arguments as ``avg_pool2d``."""
    return _avg_pool(1, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,  # noqa: A002
               divisor_override=None):
    """Mean over kernel_size windows of (N, C, H, W) or (C, H, W), floating point only.

    Args:
        input: the input, batched or not.
        kernel_size: an int or a pair.
        stride: defaults to ``kernel_size``.
        padding: implicit zero padding on both sides, at most half the kernel size.
        ceil_mode: round the output size up.
        count_include_pad: count the zero padding in the divisor (not the part of a ceil-mode window past it).
        divisor_override: divide every window's sum by this instead.
    """
    return _avg_pool(2, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,  # noqa: A002
               divisor_override=None):
    """Mean over windows of (N, C, D, H, W) or (C, D, H, W); arguments as ``avg_pool2d``."""
    return _avg_pool(3, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def _adaptive_avg(nd, input, output_size):  # noqa: A002
    name = f"adaptive_avg_pool{nd}d"
    check_float(input, name)
    if input.ndim not in (nd + 1, nd + 2):
        raise RuntimeError(f"{name}(): Expected {nd + 1}D or {nd + 2}D tensor, but got {list(input.shape)}")
    first = 1 if input.ndim == nd + 2 else 0  # the batch may be empty, no other dim
    for d in range(first, input.ndim):
        if input.shape[d] == 0:
            raise RuntimeError(f"{name}(): Expected input to have non-zero size for non-batch dimensions, but input "
                               f"has sizes {list(input.shape)} with dimension {d} being empty")
    sizes = [output_size] * nd if output_size is None or isinstance(output_size, (int, np.integer)) \
        else list(output_size)
    if len(sizes) != nd:
        raise RuntimeError(f"{name}: output_size must be {nd}")
    spatial = input.shape[input.ndim - nd:]
    out = tuple(int(n) if o is None else int(o) for n, o in zip(spatial, sizes))
    if min(out) < 0:
        raise RuntimeError(f"{name}: elements of output_size must be greater than or equal to 0 but received {out}")
    unbatched = input.ndim == nd + 1
    x = input.unsqueeze(0) if unbatched else input
    y = ops.AdaptiveAvgPoolNd.apply(x, out)
    return y.squeeze(0) if unbatched else y


def adaptive_avg_pool1d(input, output_size):  # noqa: A002
    """Average pooling of (N, C, L) or (C, L) to length ``output_size``; window i is [floor(i L / o), ceil((i + 1) L / o))."""
    return _adaptive_avg(1, input, output_size)


def adaptive_avg_pool2d(input, output_size):  # noqa: A002
    """Average pooling of (N, C, H, W) or (C, H, W) to ``output_size`` (an int, or a pair whose None entries
    keep that size); window i of a dim of size n covers [floor(i n / o), ceil((i + 1) n / o))."""
    return _adaptive_avg(2, input, output_size)


def adaptive_avg_pool3d(input, output_size):  # noqa: A002
    """Average pooling of (N, C, D, H, W) or (C, D, H, W) to ``output_size``; as ``adaptive_avg_pool2d``."""
    return _adaptive_avg(3, input, output_size)


def _adaptive_max(nd, input, output_size, return_indices):  # noqa: A002
    name = f"adaptive_max_pool{nd}d"
    check_tensor(input, name)
    if input.ndim not in (nd + 1, nd + 2):
        raise RuntimeError(f"{name}(): Expected {nd + 1}D or {nd + 2}D tensor, but got: {list(input.shape)}")
    first = 1 if input.ndim == nd + 2 else 0
    for d in range(first, input.ndim):
        if input.shape[d] == 0:
            raise RuntimeError(f"{name}(): Expected input to have non-zero size for non-batch dimensions, but input "
                               f"has sizes {list(input.shape)} with dimension {d} being empty")
    sizes = [output_size] * nd if output_size is None or isinstance(output_size, (int, np.integer)) \
        else list(output_size)
    if len(sizes) != nd:
        if nd == 1:
            raise RuntimeError(f"{name}() argument 'output_size' should contain one int (got {len(sizes)})")
        raise RuntimeError(f"{name}(): output_size must have {nd} elements, got {list(sizes)}")
    spatial = input.shape[input.ndim - nd:]
    out = tuple(int(n) if o is None else int(o) for n, o in zip(spatial, sizes))
    if min(out) < 0:
        raise RuntimeError(f"{name}: elements of output_size must be greater than or equal to 0 but received {out}")
    unbatched = input.ndim == nd + 1
    x = input.unsqueeze(0) if unbatched else input
    if min(out) == 0:
        import hpcfsdp

        y = hpcfsdp.zeros(tuple(x.shape[:2]) + out, dtype=x.dtype, device=x.device)
        idx = hpcfsdp.zeros(tuple(y.shape), dtype=hpcfsdp.int64, device=x.device)
        res = (y, idx)
    else:
        res = ops.AdaptiveMaxPoolNd.apply(x, out, True)
    y, idx = res
    if unbatched:
        y, idx = y.squeeze(0), idx.squeeze(0)
    return (y, idx) if return_indices else y


def adaptive_max_pool1d(input, output_size, return_indices=False):  # noqa: A002
    """Max pooling of (N, C, L) or (C, L) to length ``output_size``; window i is [floor(i L / o), ceil((i + 1) L / o)).

    With ``return_indices``, also the int64 position of each maximum in the input (the first maximum; NaN wins).
    """
    return _adaptive_max(1, input, output_size, return_indices)


def adaptive_max_pool2d(input, output_size, return_indices=False):  # noqa: A002
    """Max pooling of (N, C, H, W) or (C, H, W) to ``output_size`` (an int, or a pair whose None entries keep that
    size); with ``return_indices`` also the flat index h * W + w of each maximum."""
    return _adaptive_max(2, input, output_size, return_indices)


def adaptive_max_pool3d(input, output_size, return_indices=False):  # noqa: A002
    """Max pooling of (N, C, D, H, W) or (C, D, H, W) to ``output_size``; as ``adaptive_max_pool2d``."""
    return _adaptive_max(3, input, output_size, return_indices)
