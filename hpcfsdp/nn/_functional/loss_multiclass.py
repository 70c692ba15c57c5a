"""Multi-class and multi-label margin losses, as torch.nn.functional's: multi_margin_loss, multilabel_margin_loss,
multilabel_soft_margin_loss. Composed of differentiable Tensor ops from PyTorch's formulas; the class indices
are turned into masks on the array module of the input (NumPy or CuPy).
"""
from ..._tensor import Tensor
from ._common import check_float, check_reduction, check_tensor, legacy_reduction, reduce_loss
from .activation import logsigmoid

__all__ = ["multi_margin_loss", "multilabel_margin_loss", "multilabel_soft_margin_loss"]


def _batched(input, target, name):  # noqa: A002
    """(N, C) input and (N, ...) target: an unbatched (C,) input gains a batch dim."""
    if input.ndim not in (1, 2) or input.numel() == 0 and input.ndim == 1:
        raise RuntimeError(f"{name}: Expected non-empty vector or matrix with optional 0-dim batch size, but got: "
                           f"{list(input.shape)}")
    if input.ndim == 1:
        return input.unsqueeze(0), target.reshape((1,) + tuple(target.shape)), True
    return input, target, False


def multi_margin_loss(input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None,  # noqa: A002
                      reduction="mean"):
    """sum over j != y of max(0, margin - x[y] + x[j])^p (times weight[y]) / C for each sample, reduced over
    the samples (the multi-class hinge loss).

    Raises:
        ValueError: ``p`` is not 1 or 2, or ``weight`` is not 1-D.
        RuntimeError: a target of the wrong size or outside [0, C).
    """

    reduction = legacy_reduction(size_average, reduce, reduction)
    check_reduction(reduction)
    if p != 1 and p != 2:
        raise ValueError("only p == 1 and p == 2 supported")
    if weight is not None and weight.ndim != 1:
        raise ValueError("weight must be one-dimensional")
    check_float(input, "multi_margin_loss")
    check_tensor(target, "multi_margin_loss", "target")
    x, t, unbatched = _batched(input, target, "multi_margin_loss")
    n, c = x.shape
    if tuple(t.shape) != (n,):
        raise RuntimeError(f"multi_margin_loss: target tensor should be 1-D with size equal to the number of input "
                           f"samples (batch size). Expected target size [{n}], but got {list(target.shape)}. Input "
                           f"has shape {list(input.shape)}.")
    ta = t._data
    if ta.size and bool(((ta < 0) | (ta >= c)).any()):
        raise RuntimeError("target out of range")
    if weight is not None and weight.numel() != c:
        raise RuntimeError(f"inconsistent weight size, expected {c} but got {list(weight.shape)}")
    xp = x._xp()
    tt = Tensor._wrap(ta.astype(xp.int64).reshape(n, 1))
    xy = x.gather(1, tt)  # (N, 1)
    others = Tensor._wrap((xp.arange(c)[None, :] != ta.reshape(n, 1)).astype(x.dtype))  # (N, C): j != y
    z = (margin - xy + x).clamp(min=0) * others
    if p == 2:
        z = z * z
    if weight is not None:
        z = z * weight.to(x.dtype)[tt.reshape(n)].unsqueeze(1)
    loss = z.sum(1) / c  # (N,)
    if unbatched and reduction == "none":
        return loss.reshape(())
    return reduce_loss(loss, reduction)


def multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):  # noqa: A002
    """sum over the target classes y_j and the non-target classes i of max(0, 1 - (x[y_j] - x[i])) / C for each
    sample, reduced; each target row lists class indices and ends at its first -1.

    Raises:
        RuntimeError: a target of another shape than the input, or an index outside [-1, C).
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_reduction(reduction)
    check_float(input, "multilabel_margin_loss")
    check_tensor(target, "multilabel_margin_loss", "target")
    x, t, unbatched = _batched(input, target, "multilabel_margin_loss")
    n, c = x.shape
    if tuple(t.shape) != (n, c):
        raise RuntimeError(f"inconsistent target size: {list(target.shape)} for input of size: "
                           f"{list(input.shape)}")
    xp = x._xp()
    ta = t._data.astype(xp.int64)
    valid = xp.cumprod(ta >= 0, axis=1).astype(bool)  # (N, C): the indices before the first -1
    if ta.size and bool(((ta < -1) | (ta >= c)).any()):
        raise RuntimeError("argument #2 'target' is out of range")
    tsafe = xp.where(valid, ta, 0)
    is_target = ((tsafe[:, :, None] == xp.arange(c)[None, None, :]) & valid[:, :, None]).any(axis=1)  # (N, C)
    xy = x.gather(1, Tensor._wrap(tsafe))  # (N, C): x[y_j]
    pair = (valid[:, :, None] & ~is_target[:, None, :]).astype(x.dtype)  # (N, C_j, C_i)
    z = (1 - xy.unsqueeze(2) + x.unsqueeze(1)).clamp(min=0) * Tensor._wrap(pair)
    loss = z.sum((1, 2)) / c  # (N,)
    if unbatched and reduction == "none":
        return loss.reshape(())
    return reduce_loss(loss, reduction)


def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None,  # noqa: A002
                                reduction="mean"):
    """-(t log sigmoid(x) + (1 - t) log sigmoid(-x)) (times ``weight``), averaged over the classes (the last
    dim), then reduced over the samples.

    Raises:
        ValueError: an unknown reduction.
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_float(input, "multilabel_soft_margin_loss")
    check_tensor(target, "multilabel_soft_margin_loss", "target")
    t = target.to(input.dtype) if target.dtype != input.dtype else target
    loss = -(t * logsigmoid(input) + (1 - t) * logsigmoid(-input))
    if weight is not None:
        loss = loss * weight
    d = input.ndim - 1
    loss = loss.sum(d) / input.shape[d]
    if reduction == "none":
        return loss
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    raise ValueError(reduction + " is not valid")
