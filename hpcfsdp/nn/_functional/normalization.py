"""Normalization functions of torch.nn.functional: batch_norm, group_norm, instance_norm, normalize,
local_response_norm."""
import numpy as np

from ..._array import wrap_dim
from ...autograd import ops
from ._common import check_float
from ..._autocast import FP32, autocast_op

__all__ = ["batch_norm", "group_norm", "instance_norm", "normalize", "local_response_norm"]


@autocast_op(cuda=FP32)
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):  # noqa: A002
    """Normalize (N, C, *) over each group of C / num_groups channels (and all positions), then scale and shift
    per channel by ``weight`` and ``bias`` (C,).

    Raises:
        RuntimeError: fewer than 2 dims, C not divisible by ``num_groups``, or a weight or bias of the wrong size.
        ValueError: the input holds a single value.
    """
    check_float(input, "group_norm")
    if input.ndim < 2:
        raise RuntimeError(f"Expected at least 2 dimensions for input tensor but received {input.ndim}")
    shape = tuple(input.shape)
    n, c = shape[:2]
    if num_groups <= 0 or c % num_groups:
        raise RuntimeError(f"Expected number of channels in input to be divisible by num_groups, but got input of "
                           f"shape {list(shape)} and num_groups={num_groups}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and (p.ndim != 1 or p.shape[0] != c):
            raise RuntimeError(f"Expected {name} to be a vector of size equal to the number of channels in input, "
                               f"but got {name} of shape {list(p.shape)} and input of shape {list(shape)}")
    if input.numel() == 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size {input.shape}")
    per_group = c // num_groups * int(np.prod(shape[2:], dtype=np.int64))
    y = ops.LayerNorm.apply(input.reshape(n, num_groups, per_group), 1, None, None, float(eps)).reshape(shape)
    bshape = (1, c) + (1,) * (len(shape) - 2)
    if weight is not None:
        y = y * weight.reshape(bshape)
    if bias is not None:
        y = y + bias.reshape(bshape)
    return y


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):  # noqa: A002
    """input / max(||input||_p, eps) along ``dim``.

    Raises:
        IndexError: ``dim`` is out of range.
        NotImplementedError: ``out`` is given.
    """
    check_float(input, "normalize")
    if out is not None:
        raise NotImplementedError("normalize(): out= is not supported; use the returned tensor")
    d = wrap_dim(dim, input.ndim)
    norm = input.norm(float(p), dim=(d,) if input.ndim else None, keepdim=True)  # a DTensor's norm is global
    return input / norm.clamp(min=eps)


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,  # noqa: A002
                  use_input_stats=True, momentum=0.1, eps=1e-5):
    """Normalise (N, C, *) over the spatial dims of each (sample, channel), then scale and shift per channel.

    Args:
        input: (N, C, *spatial), at least one spatial dim.
        running_mean: optional (C,) buffer; with ``use_input_stats`` it is updated in place with the batch
            mean of the per-instance means, ``momentum`` weighting the new value.
        running_var: optional (C,) buffer updated alike with the unbiased per-instance variances.
        weight: optional (C,) scale.
        bias: optional (C,) shift.
        use_input_stats: normalise with each instance's statistics (True) or with the running ones (False).
        momentum: the running statistics' update factor.
        eps: added to the variance.

    Raises:
        ValueError: a single spatial element per instance with ``use_input_stats``.
        RuntimeError: fewer than 3 dims, or an input that is not floating point.
    """
    check_float(input, "instance_norm")
    if input.ndim < 3:
        raise RuntimeError(f"instance_norm(): expected (N, C, *spatial) input with at least 3 dims, got "
                           f"{list(input.shape)}")
    c = input.shape[1]
    shape = (1, c) + (1,) * (input.ndim - 2)  # per channel: (1, C, 1, ...)
    if use_input_stats:
        n = int(np.prod(input.shape[2:], dtype=np.int64))
        if n <= 1:
            raise ValueError(f"Expected more than 1 spatial element when training, got input size {input.shape}")
        y = group_norm(input, c, None, None, eps)
        if running_mean is not None or running_var is not None:
            import hpcfsdp

            with hpcfsdp.no_grad():
                flat = input.detach().reshape(input.shape[0], c, n)  # (N, C, n)
                if running_mean is not None:
                    m = flat.mean(dim=2).mean(dim=0).to(running_mean.dtype)
                    running_mean.mul_(1.0 - momentum).add_(m * momentum)
                if running_var is not None:
                    v = flat.var(dim=2, unbiased=True).mean(dim=0).to(running_var.dtype)
                    running_var.mul_(1.0 - momentum).add_(v * momentum)
    else:
        if running_mean is None or running_var is None:
            raise RuntimeError("instance_norm(): use_input_stats=False needs running_mean and running_var")
        mean = running_mean.to(input.dtype).reshape(shape)
        var = running_var.to(input.dtype).reshape(shape)
        y = (input - mean) / (var + eps).sqrt()
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,  # noqa: A002
               momentum=0.1, eps=1e-5):
    """Normalise (N, C, *) per channel over the batch and spatial dims, then scale and shift per channel.

    In training the batch mean and biased variance normalise, and ``running_mean``/``running_var`` (when given)
    are updated in place as (1 - momentum) * running + momentum * batch, the variance with the unbiased batch
    variance (See [Note: Batch norm statistics]); otherwise the running statistics normalise.

    Raises:
        ValueError: training with a single value per channel.
        RuntimeError: evaluation without running statistics, or a statistic, weight or bias of the wrong size.
    """
    check_float(input, "batch_norm")
    if input.ndim < 2:
        raise ValueError(f"batch_norm(): expected at least 2D input (got {input.ndim}D input)")
    c = input.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                    ("bias", bias)):
        if t is not None and t.numel() != c:
            raise RuntimeError(f"{name} should contain {c} elements not {t.numel()}")
    shape = (1, c) + (1,) * (input.ndim - 2)  # per channel: (1, C, 1, ...)
    if training:
        n = input.numel() // c if c else 0
        if n <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size "
                             f"{input.shape}")
        dims = (0,) + tuple(range(2, input.ndim))
        mean = input.mean(dim=dims)  # (C,)
        var = input.var(dim=dims, unbiased=False)  # (C,) biased
        if running_mean is not None or running_var is not None:
            import hpcfsdp

            with hpcfsdp.no_grad():
                if running_mean is not None:
                    running_mean.mul_(1.0 - momentum).add_(mean.detach().to(running_mean.dtype) * momentum)
                if running_var is not None:
                    unbiased = var.detach().to(running_var.dtype) * (n / (n - 1))
                    running_var.mul_(1.0 - momentum).add_(unbiased * momentum)
    else:
        if running_mean is None:
            raise RuntimeError("running_mean must be defined in evaluation mode")
        if running_var is None:
            raise RuntimeError("running_var must be defined in evaluation mode")
        mean = running_mean.to(input.dtype)
        var = running_var.to(input.dtype)
    y = (input - mean.reshape(shape)) / (var.reshape(shape) + eps).sqrt()
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def local_response_norm(input, size, alpha=1e-4, beta=0.75, k=1.0):  # noqa: A002
    """x / (k + alpha / size * sum of x^2 over ``size`` neighbouring channels)^beta (PyTorch's composition of
    padding and average pooling over the channel dim).

    Raises:
        ValueError: ``input`` has fewer than 3 dims.
    """
    from .conv import pad
    from .pooling import avg_pool2d, avg_pool3d

    check_float(input, "local_response_norm")
    dim = input.ndim
    if dim < 3:
        raise ValueError(f"Expected 3D or higher dimensionality input (got {dim} dimensions)")
    if input.numel() == 0:
        return input
    div = (input * input).unsqueeze(1)  # (N, 1, C, *)
    if dim == 3:
        div = pad(div, (0, 0, size // 2, (size - 1) // 2))
        div = avg_pool2d(div, (size, 1), stride=1).squeeze(1)
    else:
        sizes = input.shape
        div = div.reshape(sizes[0], 1, sizes[1], sizes[2], -1)
        div = pad(div, (0, 0, 0, 0, size // 2, (size - 1) // 2))
        div = avg_pool3d(div, (size, 1, 1), stride=1).squeeze(1)
        div = div.reshape(sizes)
    div = (div * alpha + k) ** beta
    return input / div
