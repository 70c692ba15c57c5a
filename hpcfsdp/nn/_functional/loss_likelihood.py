"""Negative log-likelihood losses of distributions, as torch.nn.functional's: poisson_nll_loss and
gaussian_nll_loss, composed of differentiable Tensor ops from PyTorch's formulas."""
import math

from ._common import check_float, check_tensor, legacy_reduction, reduce_loss

__all__ = ["poisson_nll_loss", "gaussian_nll_loss"]


def poisson_nll_loss(input, target, log_input=True, full=False, size_average=None, eps=1e-8,  # noqa: A002
                     reduce=None, reduction="mean"):
    """exp(x) - t x with ``log_input``, else x - t log(x + eps); ``full`` adds Stirling's term
    t log t - t + 0.5 log(2 pi t) where t > 1. Reduced.

    Raises:
        ValueError: an unknown reduction.
    """
    import hpcfsdp

    reduction = legacy_reduction(size_average, reduce, reduction)
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(reduction + " is not a valid value for reduction")
    check_float(input, "poisson_nll_loss")
    check_tensor(target, "poisson_nll_loss", "target")
    t = target.to(input.dtype) if target.dtype != input.dtype else target
    loss = input.exp() - t * input if log_input else input - t * (input + eps).log()
    if full:
        safe = hpcfsdp.where(t > 1, t, hpcfsdp.ones_like(t))  # log of t where t > 1 only: no nan elsewhere
        stirling = t * safe.log() - t + 0.5 * (2 * math.pi * safe).log()
        loss = loss + hpcfsdp.where(t > 1, stirling, hpcfsdp.zeros_like(stirling))
    return reduce_loss(loss, reduction)


def gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):  # noqa: A002
    """0.5 (log(max(var, eps)) + (input - target)^2 / max(var, eps)) (+ 0.5 log(2 pi) with ``full``), reduced.

    ``var`` is a float, a tensor of the input's shape, of the input's shape without its last dim (one variance
    for the last dim), or of the input's shape with one dim of size 1 (heteroscedastic); the clamp at ``eps``
    is outside autograd, as PyTorch's.

    Raises:
        ValueError: a negative variance, a variance of another size, or an unknown reduction.
    """
    import hpcfsdp

    check_float(input, "gaussian_nll_loss")
    check_tensor(target, "gaussian_nll_loss", "target")
    if isinstance(var, (int, float)):
        if var < 0:
            raise ValueError("var has negative entry/entries")
        var = hpcfsdp.ones_like(input) * float(var)
    elif bool((var < 0).any()):
        raise ValueError("var has negative entry/entries")
    if tuple(var.shape) != tuple(input.shape):
        if tuple(input.shape[:-1]) == tuple(var.shape):
            var = var.unsqueeze(-1)
        elif input.ndim == var.ndim and sum(y for x, y in zip(input.shape, var.shape) if x != y) == 1:
            pass  # heteroscedastic: one dim of size 1
        else:
            raise ValueError("var is of incorrect size")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(reduction + " is not valid")
    var = var.clone()
    with hpcfsdp.no_grad():
        var.clamp_(min=eps)
    t = target.to(input.dtype) if target.dtype != input.dtype else target
    loss = 0.5 * (var.log() + (input - t) ** 2 / var)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return reduce_loss(loss, reduction)
