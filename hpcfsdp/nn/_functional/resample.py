"""interpolate (nearest, nearest-exact, linear, bilinear, trilinear, area) and upsample."""
import math

import numpy as np

from ...autograd import ops
from ._common import check_float
from .pooling import adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d

__all__ = ["interpolate", "upsample"]

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
