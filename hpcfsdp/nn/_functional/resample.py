"""interpolate (nearest, nearest-exact, linear, bilinear, trilinear, area) and adaptive max pooling."""
import math

import numpy as np

from ...autograd import ops
from ._common import check_float, check_tensor
from .pooling import adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d

__all__ = ["interpolate", "upsample", "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d"]

_ALL_MODES = "nearest | linear | bilinear | bicubic | trilinear | lanczos | area | nearest-exact"
_LINEAR = {"linear": 1, "bilinear": 2, "trilinear": 3}
_DIM_NAMES = ("D", "H", "W")


def _spatial_list(value, dim, what, input):  # noqa: A002
    if isinstance(value, (list, tuple)):
        if len(value) != dim:
            kind = "output size of" if what == "size" else "scale_factor of shape"
            fmt = "output size in (o1, o2, ...,oK)" if what == "size" else "scale_factor in (s1, s2, ...,sK)"
            raise ValueError(f"Input and {'output' if what == 'size' else 'scale_factor'} must have the same number "
                             f"of spatial dimensions, but got input with spatial dimensions of "
                             f"{list(input.shape[2:])} and {kind} {list(value)}. Please provide input tensor in "
                             f"(N, C, d1, d2, ...,dK) format and {fmt} format.")
        return list(value)
    return [value] * dim


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,  # noqa: A002
                recompute_scale_factor=None, antialias=False):
    """Resize the spatial dims of (N, C, L), (N, C, H, W) or (N, C, D, H, W) to ``size`` or by ``scale_factor``.

    Args:
        input: a floating tensor with a batch and a channel dim.
        size: the output's spatial size (an int for every dim, or one per dim).
        scale_factor: a multiplier (or one per dim); the output size is floor(in * scale_factor).
        mode: ``"nearest"`` (PyTorch's legacy floor(dst * scale)), ``"nearest-exact"`` (pixel centres),
            ``"linear"`` (3-D), ``"bilinear"`` (4-D), ``"trilinear"`` (5-D) or ``"area"`` (adaptive average).
        align_corners: for the linear modes: map the corner pixels' centres onto each other (True) or the
            corners of the pixel grids (False, the default); must be None for the other modes.
        recompute_scale_factor: True computes the sampling scale from the sizes instead of using
            ``scale_factor`` (only meaningful with ``scale_factor``).
        antialias: only False.

    Raises:
        ValueError: both or neither of size and scale_factor, lengths that do not match the spatial dims,
            align_corners with a non-linear mode, recompute_scale_factor with size.
        NotImplementedError: a mode this input rank does not take, or one not implemented (bicubic, lanczos,
            antialias), with PyTorch's message.
        RuntimeError: an empty input or output.
    """
    check_float(input, "interpolate")
    if mode in ("nearest", "area", "nearest-exact"):
        if align_corners is not None:
            raise ValueError("align_corners option can only be set with the interpolating modes: linear | bilinear | "
                             "bicubic | trilinear")
    elif align_corners is None:
        align_corners = False
    dim = input.ndim - 2
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    if size is not None:
        out = [int(s) for s in _spatial_list(size, dim, "size", input)]
        scales = [None] * dim
    elif scale_factor is not None:
        scales = [float(s) for s in _spatial_list(scale_factor, dim, "scale_factor", input)]
        out = [math.floor(float(n) * s) for n, s in zip(input.shape[2:], scales)]
    else:
        raise ValueError("either size or scale_factor should be defined")
    if recompute_scale_factor is not None and recompute_scale_factor and size is not None:
        raise ValueError("recompute_scale_factor is not meaningful with an explicit size.")
    if recompute_scale_factor:
        scales = [None] * dim
    if antialias:
        raise NotImplementedError("interpolate(): antialias=True is not implemented by hpcfsdp")
    known = ("nearest", "nearest-exact", "area") + tuple(_LINEAR)
    if not 1 <= dim <= 3 or mode not in known:
        if mode in ("bicubic", "lanczos") and 1 <= dim <= 3:
            raise NotImplementedError(f"interpolate(): mode {mode!r} is not implemented by hpcfsdp")
        raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {input.ndim}D) for "
                                  f"the modes: {_ALL_MODES} (got {mode})")
    if mode in _LINEAR and _LINEAR[mode] != dim:
        raise NotImplementedError(f"Got {input.ndim}D input, but {mode} mode needs {_LINEAR[mode] + 2}D input")
    spatial = tuple(input.shape[2:])
    if min(spatial) <= 0 or min(out) <= 0:
        names = _DIM_NAMES[3 - dim:]
        fi = ", ".join(f"{k}: {v}" for k, v in zip(names, spatial))
        fo = ", ".join(f"{k}: {v}" for k, v in zip(names, out))
        raise RuntimeError(f"Input and output sizes should be greater than 0, but got input ({fi}) and output ({fo})")
    if mode == "area":
        return (adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d)[dim - 1](input, out)
    if mode in _LINEAR:
        mats = [None if o == n else ops.linear_weights(n, o, bool(align_corners), s)
                for n, o, s in zip(spatial, out, scales)]
        return ops.ResampleLinear.apply(input, mats)
    exact = mode == "nearest-exact"
    index = {2 + i: ops.nearest_index(n, o, s, exact) for i, (n, o, s) in enumerate(zip(spatial, out, scales))}
    index = {d: i for d, i in index.items() if not (len(i) == spatial[d - 2] and (i == np.arange(len(i))).all())}
    if not index:
        return input.clone()
    return ops.PadGather.apply(input, index)


def upsample(input, size=None, scale_factor=None, mode="nearest", align_corners=None):  # noqa: A002
    """Deprecated alias of ``interpolate`` (as PyTorch's ``upsample``)."""
    return interpolate(input, size, scale_factor, mode, align_corners)


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
