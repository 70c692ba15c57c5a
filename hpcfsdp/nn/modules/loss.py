"""Loss modules (torch.nn.modules.loss): regression (MSELoss, L1Loss, SmoothL1Loss, HuberLoss), classification
(CrossEntropyLoss, NLLLoss, BCELoss, BCEWithLogitsLoss), distribution matching (KLDivLoss) and likelihoods
(PoissonNLLLoss, GaussianNLLLoss). The margin and embedding losses are in loss_margin.py.

They map the deprecated size_average/reduce arguments onto ``reduction`` as PyTorch does (with its warning).
An unknown reduction is refused at construction.
"""
import hpcfsdp.nn.functional as F
from hpcfsdp.nn._functional import loss_likelihood as _lik
from hpcfsdp.nn._functional._common import check_reduction, legacy_reduction
from hpcfsdp.nn.modules.module import Module

__all__ = ["MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "CrossEntropyLoss", "NLLLoss", "BCELoss",
           "BCEWithLogitsLoss", "KLDivLoss", "PoissonNLLLoss", "GaussianNLLLoss"]

class _Loss(Module):
    _extra = ()

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = legacy_reduction(size_average, reduce, reduction)
        check_reduction(self.reduction, self._extra)


class _WeightedLoss(_Loss):
    def __init__(self, weight=None, size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)


# -- regression -------------------------------------------------------------------------------------------------------

class MSELoss(_Loss):
    """Mean (or sum, or none) of the squared differences."""

    def forward(self, input, target):  # noqa: A002
        return F.mse_loss(input, target, reduction=self.reduction)


class L1Loss(_Loss):
    """Mean (or sum, or none) of |input - target|."""

    def forward(self, input, target):  # noqa: A002
        return F.l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    """Smooth L1: quadratic below ``beta``, linear above (``F.smooth_l1_loss``)."""

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input, target):  # noqa: A002
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    """Huber loss: quadratic below ``delta``, delta-scaled linear above (``F.huber_loss``)."""

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction=reduction)
        self.delta = delta

    def forward(self, input, target):  # noqa: A002
        return F.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


# -- classification ---------------------------------------------------------------------------------------------------

class CrossEntropyLoss(_WeightedLoss):
    """Cross entropy between logits (N, C) and class indices (N,) (``F.cross_entropy`` with the stored options)."""

    def __init__(self, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
                 reduction: str = "mean", label_smoothing: float = 0.0) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, input, target):  # noqa: A002
        return F.cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction, label_smoothing=self.label_smoothing)


class NLLLoss(_WeightedLoss):
    """Negative log likelihood of log-probabilities at class targets (``F.nll_loss`` with the stored options).

    Args:
        weight: optional (C,) class weights (a buffer).
        size_average: deprecated.
        ignore_index: targets equal to it are skipped.
        reduce: deprecated.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    """

    def __init__(self, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
                 reduction: str = "mean") -> None:
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index

    def forward(self, input, target):  # noqa: A002
        return F.nll_loss(input, target, weight=self.weight, ignore_index=self.ignore_index, reduction=self.reduction)


class BCELoss(_WeightedLoss):
    """Binary cross entropy of probabilities (``F.binary_cross_entropy``); ``weight`` is a buffer."""

    def forward(self, input, target):  # noqa: A002
        return F.binary_cross_entropy(input, target, weight=self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_Loss):
    """Binary cross entropy of logits, computed stably (``F.binary_cross_entropy_with_logits``).

    Args:
        weight: optional element weight broadcast against the input (a buffer).
        size_average: deprecated.
        reduce: deprecated.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        pos_weight: optional weight of positive examples, per class along the last dim (a buffer).
    """

    def __init__(self, weight=None, size_average=None, reduce=None, reduction: str = "mean", pos_weight=None) -> None:
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input, target):  # noqa: A002
        return F.binary_cross_entropy_with_logits(input, target, self.weight, pos_weight=self.pos_weight,
                                                  reduction=self.reduction)


# -- distributions ----------------------------------------------------------------------------------------------------

class KLDivLoss(_Loss):
    """Kullback-Leibler divergence with log-probability input (``F.kl_div``); reduction may be ``"batchmean"``."""

    _extra = ("batchmean",)

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean", log_target: bool = False) -> None:
        super().__init__(size_average, reduce, reduction)
        self.log_target = log_target

    def forward(self, input, target):  # noqa: A002
        return F.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)


class PoissonNLLLoss(_Loss):
    """Poisson negative log likelihood (``F.poisson_nll_loss``): exp(x) - t x of log-rates (``log_input``), else
    x - t log(x + eps); ``full`` adds Stirling's approximation of log(t!)."""

    def __init__(self, log_input: bool = True, full: bool = False, size_average=None, eps: float = 1e-8,
                 reduce=None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.log_input = log_input
        self.full = full
        self.eps = eps

    def forward(self, log_input, target):
        return _lik.poisson_nll_loss(log_input, target, log_input=self.log_input, full=self.full, eps=self.eps,
                                     reduction=self.reduction)


class GaussianNLLLoss(_Loss):
    """Gaussian negative log likelihood of targets under N(input, var) (``F.gaussian_nll_loss``)."""

    def __init__(self, *, full: bool = False, eps: float = 1e-6, reduction: str = "mean") -> None:
        super().__init__(None, None, reduction)
        self.full = full
        self.eps = eps

    def forward(self, input, target, var):  # noqa: A002
        return _lik.gaussian_nll_loss(input, target, var, full=self.full, eps=self.eps, reduction=self.reduction)
