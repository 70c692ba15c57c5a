"""Losses: nll_loss, binary_cross_entropy (of probabilities and of logits), l1, smooth L1, Huber, KL divergence."""
import warnings

import numpy as np

from ..._tensor import Tensor
from ...autograd import ops
from ._common import check_float, check_reduction, check_tensor, dtensor_rule, legacy_reduction, reduce_loss
from ..._autocast import FP32, autocast_op

__all__ = ["nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "l1_loss", "smooth_l1_loss",
           "huber_loss", "kl_div"]


def _broadcast_pair(input, target, name, warn=True):  # noqa: A002
    """input and target expanded to their common shape, warning as PyTorch when the shapes differ."""
    check_tensor(input, name)
    check_tensor(target, name, "target")
    if target.dtype != input.dtype:
        target = target.to(input.dtype)
    if tuple(input.shape) == tuple(target.shape):
        return input, target
    if warn:
        warnings.warn(f"Using a target size ({target.shape}) that is different to the input size ({input.shape}). "
                      "This will likely lead to incorrect results due to broadcasting. Please ensure they have "
                      "the same size.", stacklevel=3)
    try:
        shape = np.broadcast_shapes(tuple(input.shape), tuple(target.shape))
    except ValueError:
        raise RuntimeError(f"{name}(): the size of input {list(input.shape)} and of target {list(target.shape)} "
                           "do not broadcast") from None
    return input.expand(*shape), target.expand(*shape)


@autocast_op(cpu=FP32, cuda=FP32)
@dtensor_rule
def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,  # noqa: A002
             reduction="mean"):
    """Negative log likelihood of log-probabilities (N, C), (C,) or (N, C, d1, ...) at integer class targets.

    Args:
        input: log-probabilities, classes along dim 1 (dim 0 for a 1-D input).
        target: class indices, (N,), () or (N, d1, ...).
        weight: optional (C,) class weights.
        size_average: deprecated; with ``reduce`` mapped onto ``reduction`` as PyTorch does.
        ignore_index: targets equal to it contribute nothing (nor to the mean's denominator).
        reduce: deprecated, see ``size_average``.
        reduction: ``"mean"`` (sum of -w[t] x[t] over the sum of w[t]), ``"sum"`` or ``"none"``.

    Raises:
        ValueError: the batch sizes differ, or an unknown reduction.
        RuntimeError: a target of another shape or not integer, a weight of the wrong size.
        IndexError: a target outside [0, C) that is not ``ignore_index``.
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_reduction(reduction)
    check_tensor(input, "nll_loss")
    check_tensor(target, "nll_loss", "target")
    if input.ndim == 0:
        raise ValueError("nll_loss(): expected input of at least 1 dimension (the classes), got a 0-d tensor")
    if target.dtype.kind not in "iu":
        raise RuntimeError(f"expected target dtype to be an integer type (Long or Byte), but got {target.dtype}")
    if input.ndim >= 2 and (target.ndim == 0 or input.shape[0] != target.shape[0]):
        raise ValueError(f"Expected input batch_size ({input.shape[0]}) to match target batch_size "
                         f"({target.shape[0] if target.ndim else 0}).")
    unbatched = input.ndim == 1
    x = input.unsqueeze(0) if unbatched else input
    t = target.reshape(1) if unbatched else target
    n, c = x.shape[:2]
    spatial = tuple(x.shape[2:])
    if tuple(t.shape) != (n,) + spatial:
        raise RuntimeError(f"Expected target size {[n, *spatial]}, got {list(target.shape)}")
    if weight is not None:
        check_tensor(weight, "nll_loss", "weight")
        if weight.numel() != c:
            raise RuntimeError(f"weight tensor should be defined either for all {c} classes or no classes but got "
                               f"weight tensor of shape: {list(weight.shape)}")
    if spatial:  # (N, C, d1, ...) -> (N d1 ..., C)
        x = x.permute(0, *range(2, x.ndim), 1).reshape(-1, c)
    xp = x._xp()
    ta = t._data.reshape(-1)
    valid = ta != ignore_index
    tsafe = xp.where(valid, ta, 0)
    if ta.size and bool(((tsafe < 0) | (tsafe >= c)).any()):
        bad = ta[valid & ((ta < 0) | (ta >= c))]
        raise IndexError(f"Target {int(bad.reshape(-1)[0])} is out of bounds.")
    picked = x[Tensor._wrap(xp.arange(ta.size)), Tensor._wrap(tsafe)]  # (M,)
    validf = Tensor._wrap(valid.astype(x.dtype))
    wt = weight.reshape(-1).to(x.dtype)[Tensor._wrap(tsafe)] * validf if weight is not None else validf
    loss = -(picked * wt)
    if reduction == "none":
        return loss.reshape(()) if unbatched else loss.reshape((n,) + spatial)
    if reduction == "sum":
        return loss.sum()
    with np.errstate(invalid="ignore", divide="ignore"):  # every target ignored: nan, silently, as PyTorch
        return loss.sum() / wt.sum()


@autocast_op(cpu=FP32)
@dtensor_rule
def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):  # noqa: A002
    """-w (t log x + (1 - t) log(1 - x)) of probabilities x in [0, 1]; the logs are clamped at -100.

    Args:
        input: probabilities.
        target: targets of the input's shape (may require grad).
        weight: optional, broadcast against the input.
        size_average: deprecated, as in ``nll_loss``.
        reduce: deprecated, as in ``nll_loss``.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    Raises:
        ValueError: the target's shape differs from the input's.
        RuntimeError: an input element outside [0, 1].
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_reduction(reduction)
    check_float(input, "binary_cross_entropy")
    check_tensor(target, "binary_cross_entropy", "target")
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Using a target size ({target.shape}) that is different to the input size ({input.shape}) "
                         "is deprecated. Please ensure they have the same size.")
    x = input._data
    if x.size and bool((~((x >= 0) & (x <= 1))).any()):
        raise RuntimeError("all elements of input should be between 0 and 1")
    if target.dtype != input.dtype:
        target = target.to(input.dtype)
    loss = ops.BinaryCrossEntropy.apply(input, target)
    if weight is not None:
        loss = loss * weight.to(input.dtype)
    return reduce_loss(loss, reduction)


@autocast_op(cpu=FP32, cuda=FP32)
@dtensor_rule
def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,  # noqa: A002
                                     reduction="mean", pos_weight=None):
    """Binary cross entropy of sigmoid(input), computed stably from the logits.

    loss = -w [pw t log sigmoid(x) + (1 - t) log(1 - sigmoid(x))].

    Args:
        input: logits.
        target: targets of the input's shape (may require grad).
        weight: optional, broadcast against the input.
        size_average: deprecated, as in ``nll_loss``.
        reduce: deprecated, as in ``nll_loss``.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        pos_weight: optional weight of the positive term, broadcast against the input (per class along the
            last dim); it gets no gradient.

    Raises:
        ValueError: the target's shape differs from the input's.
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_reduction(reduction)
    check_float(input, "binary_cross_entropy_with_logits")
    check_tensor(target, "binary_cross_entropy_with_logits", "target")
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Target size ({target.shape}) must be the same as input size ({input.shape})")
    if target.dtype != input.dtype:
        target = target.to(input.dtype)
    pw = None
    if pos_weight is not None:
        check_tensor(pos_weight, "binary_cross_entropy_with_logits", "pos_weight")
        try:
            np.broadcast_shapes(tuple(pos_weight.shape), tuple(input.shape))
        except ValueError:
            raise RuntimeError(f"binary_cross_entropy_with_logits(): pos_weight of size {list(pos_weight.shape)} "
                               f"does not broadcast to the input's {list(input.shape)}") from None
        pw = pos_weight._data.astype(input.dtype, copy=False)
    loss = ops.BinaryCrossEntropyWithLogits.apply(input, target, pw)
    if weight is not None:
        loss = loss * weight.to(input.dtype)
    return reduce_loss(loss, reduction)


@autocast_op(cpu=FP32, cuda=FP32)
@dtensor_rule
def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):  # noqa: A002
    """|input - target|, reduced; ``weight`` (the input's shape) scales each term, and the weighted mean
    divides by the weights' sum, as PyTorch."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_reduction(reduction)
    x, t = _broadcast_pair(input, target, "l1_loss")
    loss = (x - t).abs()
    if weight is None:
        return reduce_loss(loss, reduction)
    if tuple(weight.shape) != tuple(input.shape):
        raise ValueError("Weights and input must have the same size.")
    loss = loss * weight
    return loss.sum() / weight.sum() if reduction == "mean" else reduce_loss(loss, reduction)


@autocast_op(cpu=FP32, cuda=FP32)
@dtensor_rule
def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):  # noqa: A002
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta, of d = input - target (beta = 0: |d|).

    Raises:
        RuntimeError: ``beta`` is negative.
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_reduction(reduction)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    x, t = _broadcast_pair(input, target, "smooth_l1_loss")
    return reduce_loss(ops.SmoothL1.apply(x - t, float(beta), False), reduction)


@autocast_op(cpu=FP32, cuda=FP32)
@dtensor_rule
def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):  # noqa: A002
    """0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta), of d = input - target.

    ``weight`` (the input's shape) scales each term before the reduction (a plain mean, as PyTorch).

    Raises:
        RuntimeError: ``delta`` is not positive.
    """
    check_reduction(reduction)
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    x, t = _broadcast_pair(input, target, "huber_loss")
    loss = ops.SmoothL1.apply(x - t, float(delta), True)
    if weight is not None:
        if tuple(weight.shape) != tuple(input.shape):
            raise ValueError("Weights and input must have the same size.")
        loss = loss * weight
    return reduce_loss(loss, reduction)


@autocast_op(cpu=FP32, cuda=FP32)
@dtensor_rule
def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):  # noqa: A002
    """Kullback-Leibler divergence of target from input, with ``input`` holding log-probabilities.

    Pointwise t (log t - input) (0 where t = 0), or exp(t) (t - input) with ``log_target``.

    Args:
        input: log-probabilities.
        target: probabilities (log-probabilities with ``log_target``), broadcast against the input.
        size_average: deprecated, as in ``nll_loss``.
        reduce: deprecated, as in ``nll_loss``.
        reduction: ``"batchmean"`` (the sum over the batch size: the mathematical KL divergence),
            ``"mean"`` (over every element; warns, as PyTorch), ``"sum"`` or ``"none"``.
        log_target: whether ``target`` is given in log space.
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_reduction(reduction, ("batchmean",))
    if reduction == "mean":
        warnings.warn("reduction: 'mean' divides the total loss by both the batch size and the support size."
                      "'batchmean' divides only by the batch size, and aligns with the KL div math definition."
                      "'mean' will be changed to behave the same as 'batchmean' in the next major release.",
                      stacklevel=2)
    x, t = _broadcast_pair(input, target, "kl_div", warn=False)
    loss = ops.KlDiv.apply(x, t, bool(log_target))
    if reduction == "batchmean":
        return loss.sum() / float(input.shape[0]) if input.ndim else loss.sum()
    return reduce_loss(loss, reduction)
