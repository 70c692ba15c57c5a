"""Losses on pairs and triplets of embeddings and on scores, as torch.nn.functional's: margin_ranking_loss,
hinge_embedding_loss, cosine_embedding_loss, triplet_margin_loss, triplet_margin_with_distance_loss,
soft_margin_loss. Composed of differentiable Tensor ops from PyTorch's formulas (ATen's Loss.cpp).
"""
from ._common import check_float, check_reduction, check_tensor, legacy_reduction, reduce_loss
from .activation import softplus
from .distance import pairwise_distance

__all__ = ["margin_ranking_loss", "hinge_embedding_loss", "cosine_embedding_loss", "triplet_margin_loss",
           "triplet_margin_with_distance_loss", "soft_margin_loss"]


def _target(target, like, name):
    check_tensor(target, name, "target")
    return target.to(like.dtype) if target.dtype != like.dtype else target


def margin_ranking_loss(input1, input2, target, margin=0, size_average=None, reduce=None,  # noqa: A002
                        reduction="mean"):
    """max(0, -target * (input1 - input2) + margin), reduced.

    Raises:
        RuntimeError: the three tensors differ in their number of dimensions.
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_reduction(reduction)
    check_float(input1, "margin_ranking_loss", "input1")
    check_float(input2, "margin_ranking_loss", "input2")
    check_tensor(target, "margin_ranking_loss", "target")
    if input1.ndim != input2.ndim or input1.ndim != target.ndim:
        raise RuntimeError(f"margin_ranking_loss : All input tensors should have same dimension but got sizes: "
                           f"input1: {input1.shape}, input2: {input2.shape}, target: {target.shape} ")
    t = _target(target, input1, "margin_ranking_loss")
    return reduce_loss((-t * (input1 - input2) + margin).clamp(min=0), reduction)


def hinge_embedding_loss(input, target, margin=1.0, size_average=None, reduce=None,  # noqa: A002
                         reduction="mean"):
    """x where target is 1, max(0, margin - x) where target is -1 (ATen's: the first term wherever target != -1,
    the second wherever target != 1), reduced."""
    import hpcfsdp

    reduction = legacy_reduction(size_average, reduce, reduction)
    check_reduction(reduction)
    check_float(input, "hinge_embedding_loss")
    check_tensor(target, "hinge_embedding_loss", "target")
    zeros = hpcfsdp.zeros_like(input)
    out_margin = hpcfsdp.where(target != 1, (margin - input).clamp(min=0), zeros)
    out_self = hpcfsdp.where(target != -1, input, zeros)
    return reduce_loss(out_margin + out_self, reduction)


def cosine_embedding_loss(input1, input2, target, margin=0, size_average=None, reduce=None,  # noqa: A002
                          reduction="mean"):
    """1 - cos(x1, x2) where target is 1, max(0, cos(x1, x2) - margin) where target is -1, with
    cos = <x1, x2> / sqrt((|x1|^2 + 1e-12)(|x2|^2 + 1e-12)) along the last dim; reduced.

    Raises:
        RuntimeError: a target of more than 1 dim, or inputs that are not one dim more than the target.
    """
    import hpcfsdp

    reduction = legacy_reduction(size_average, reduce, reduction)
    check_reduction(reduction)
    check_float(input1, "cosine_embedding_loss", "input1")
    check_float(input2, "cosine_embedding_loss", "input2")
    check_tensor(target, "cosine_embedding_loss", "target")
    td = target.ndim
    if td > 1:
        raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
    if td == 1 and not (input1.ndim == 2 and input2.ndim == 2):
        raise RuntimeError(f"1D target tensor expects 2D input tensors, but found inputs with sizes "
                           f"{list(input1.shape)} and {list(input2.shape)}.")
    if td == 0 and not (input1.ndim == 1 and input2.ndim == 1):
        raise RuntimeError(f"0D target tensor expects 1D input tensors, but found inputs with sizes "
                           f"{list(input1.shape)} and {list(input2.shape)}.")
    d = input1.ndim - 1
    eps = 1e-12
    prod = (input1 * input2).sum(d)
    mag1 = (input1 * input1).sum(d) + eps
    mag2 = (input2 * input2).sum(d) + eps
    cos = prod / (mag1 * mag2).sqrt()
    zeros = hpcfsdp.zeros_like(cos)
    pos = hpcfsdp.where(target == 1, 1 - cos, zeros)
    neg = hpcfsdp.where(target == -1, (cos - margin).clamp(min=0), zeros)
    return reduce_loss(pos + neg, reduction)


def _check_triplet(anchor, positive, negative, margin):
    if margin <= 0:
        raise ValueError(f"margin must be greater than 0, got {margin}")
    a, p, n = anchor.ndim, positive.ndim, negative.ndim
    if not (a == p and p == n):
        raise RuntimeError(f"The anchor, positive, and negative tensors are expected to have the same number of "
                           f"dimensions, but got: anchor {a}D, positive {p}D, and negative {n}D inputs")


def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2, eps=1e-6, swap=False,  # noqa: A002
                        size_average=None, reduce=None, reduction="mean"):
    """max(0, margin + d(a, p) - d(a, n)) with d the ``pairwise_distance`` (p-norm of the difference + eps along
    the last dim); with ``swap``, d(a, n) is min(d(a, n), d(p, n)). Reduced.

    Raises:
        ValueError: ``margin`` is not positive.
        RuntimeError: the three tensors differ in their number of dimensions.
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_reduction(reduction)
    for name, t in (("anchor", anchor), ("positive", positive), ("negative", negative)):
        check_float(t, "triplet_margin_loss", name)
    _check_triplet(anchor, positive, negative, margin)
    d_pos = pairwise_distance(anchor, positive, p, eps)
    d_neg = pairwise_distance(anchor, negative, p, eps)
    if swap:
        d_neg = d_neg.minimum(pairwise_distance(positive, negative, p, eps))
    return reduce_loss((margin + d_pos - d_neg).clamp(min=0), reduction)


def triplet_margin_with_distance_loss(anchor, positive, negative, *, distance_function=None, margin=1.0,
                                      swap=False, reduction="mean"):
    """``triplet_margin_loss`` with any ``distance_function(x1, x2)`` (default ``pairwise_distance``).

    Raises:
        ValueError: an unknown reduction, or ``margin`` is not positive.
        RuntimeError: the three tensors differ in their number of dimensions.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    _check_triplet(anchor, positive, negative, margin)
    dist = pairwise_distance if distance_function is None else distance_function
    d_pos = dist(anchor, positive)
    d_neg = dist(anchor, negative)
    if swap:
        d_neg = d_neg.minimum(dist(positive, negative))
    return reduce_loss((margin + d_pos - d_neg).clamp(min=0), reduction)


def soft_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):  # noqa: A002
    """log(1 + exp(-target * input)), reduced (the mean over every element)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_reduction(reduction)
    check_float(input, "soft_margin_loss")
    t = _target(target, input, "soft_margin_loss")
    return reduce_loss(softplus(-t * input), reduction)

