"""cosine_similarity, pairwise_distance and pdist, composed of differentiable Tensor ops."""
import numpy as np

from ._common import check_float

__all__ = ["cosine_similarity", "pairwise_distance", "pdist"]


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


def pdist(input, p=2):  # noqa: A002
    """The p-norm distances between every pair of rows i < j of (N, M), in row-major order of the pairs: the
    upper triangle of ``cdist(input, input)`` without its diagonal, shape (N (N - 1) / 2,).

    Raises:
        RuntimeError: ``input`` is not 2-D, or ``p`` is negative.
    """
    import hpcfsdp

    check_float(input, "pdist")
    if input.ndim != 2:
        raise RuntimeError(f"pdist only supports 2D tensors, got: {input.ndim}D")
    if p < 0:
        raise RuntimeError("pdist only supports non-negative p values")
    n = input.shape[0]
    xp = input._xp()
    i, j = xp.triu_indices(n, 1) if hasattr(xp, "triu_indices") else np.triu_indices(n, 1)
    a = input[hpcfsdp.Tensor._wrap(xp.asarray(i))]  # (P, M)
    b = input[hpcfsdp.Tensor._wrap(xp.asarray(j))]
    return (a - b).norm(float(p), 1)
