"""cosine_similarity, pairwise_distance and instance_norm, composed of differentiable Tensor ops."""
import numpy as np

from ._common import check_float
from .activation import group_norm

__all__ = ["cosine_similarity", "pairwise_distance", "instance_norm"]


def _broadcast(x1, x2, name):
    try:
        shape = np.broadcast_shapes(tuple(x1.shape), tuple(x2.shape))
    except ValueError:
        a, b = tuple(x1.shape), tuple(x2.shape)
        n = max(len(a), len(b))
        a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
        d = next(i for i in range(n) if a[i] != b[i] and 1 not in (a[i], b[i]))
        raise RuntimeError(f"The size of tensor a ({a[d]}) must match the size of tensor b ({b[d]}) at "
                           f"non-singleton dimension {d}") from None
    return (x1 if tuple(x1.shape) == shape else x1.expand(*shape),
            x2 if tuple(x2.shape) == shape else x2.expand(*shape))


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """sum(x1 / max(||x1||, eps) * x2 / max(||x2||, eps)) along ``dim``, after broadcasting x1 and x2.

    Each vector is divided by its own norm clamped at ``eps`` (PyTorch's formula since 1.12), so a zero
    vector gives 0; as PyTorch, the gradient flows through the unclamped norm.

    Raises:
        RuntimeError: the shapes do not broadcast, or an input is not floating point.
    """
    check_float(x1, "cosine_similarity", "x1")
    check_float(x2, "cosine_similarity", "x2")
    a, b = _broadcast(x1, x2, "cosine_similarity")
    na, nb = a.norm(2, dim, keepdim=True), b.norm(2, dim, keepdim=True)
    # as PyTorch, the clamp is applied outside autograd: the gradient is that of the unclamped norm
    na = na + (na.detach().clamp(min=eps) - na.detach())
    nb = nb + (nb.detach().clamp(min=eps) - nb.detach())
    return ((a / na) * (b / nb)).sum(dim)


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """The p-norm of x1 - x2 + eps along the last dim (of the broadcast shape).

    Raises:
        RuntimeError: the shapes do not broadcast, or an input is not floating point.
    """
    check_float(x1, "pairwise_distance", "x1")
    check_float(x2, "pairwise_distance", "x2")
    a, b = _broadcast(x1, x2, "pairwise_distance")
    if a.ndim == 0:
        return (a - b + eps).abs()
    return (a - b + eps).norm(p, a.ndim - 1, keepdim=keepdim)


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


