"""Margin and embedding losses (torch.nn.modules.loss): MarginRankingLoss, HingeEmbeddingLoss, CosineEmbeddingLoss,
TripletMarginLoss, TripletMarginWithDistanceLoss, SoftMarginLoss, MultiMarginLoss, MultiLabelMarginLoss,
MultiLabelSoftMarginLoss. Each stores its options and calls its functional (nn/_functional/loss_embedding.py,
loss_multiclass.py)."""
from hpcfsdp.nn._functional import loss_embedding as _emb
from hpcfsdp.nn._functional import loss_multiclass as _mc
from hpcfsdp.nn.modules.distance import PairwiseDistance
from hpcfsdp.nn.modules.loss import _Loss, _WeightedLoss

__all__ = ["MarginRankingLoss", "HingeEmbeddingLoss", "CosineEmbeddingLoss", "TripletMarginLoss",
           "TripletMarginWithDistanceLoss", "SoftMarginLoss", "MultiMarginLoss", "MultiLabelMarginLoss",
           "MultiLabelSoftMarginLoss"]


class MarginRankingLoss(_Loss):
    """max(0, -y (x1 - x2) + margin) (``F.margin_ranking_loss``)."""

    def __init__(self, margin: float = 0.0, size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.margin = margin

    def forward(self, input1, input2, target):
        return _emb.margin_ranking_loss(input1, input2, target, margin=self.margin, reduction=self.reduction)


class HingeEmbeddingLoss(_Loss):
    """x for y = 1, max(0, margin - x) for y = -1 (``F.hinge_embedding_loss``)."""

    def __init__(self, margin: float = 1.0, size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.margin = margin

    def forward(self, input, target):  # noqa: A002
        return _emb.hinge_embedding_loss(input, target, margin=self.margin, reduction=self.reduction)


class CosineEmbeddingLoss(_Loss):
    """1 - cos(x1, x2) for y = 1, max(0, cos(x1, x2) - margin) for y = -1 (``F.cosine_embedding_loss``)."""

    def __init__(self, margin: float = 0.0, size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.margin = margin

    def forward(self, input1, input2, target):
        return _emb.cosine_embedding_loss(input1, input2, target, margin=self.margin, reduction=self.reduction)


class TripletMarginLoss(_Loss):
    """max(0, margin + d(a, p) - d(a, n)) with the p-norm distance (``F.triplet_margin_loss``)."""

    def __init__(self, margin: float = 1.0, p: float = 2.0, eps: float = 1e-6, swap: bool = False,
                 size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        if margin <= 0:
            raise ValueError(f"TripletMarginLoss: expected margin to be greater than 0, got {margin} instead")
        self.margin = margin
        self.p = p
        self.eps = eps
        self.swap = swap

    def forward(self, anchor, positive, negative):
        return _emb.triplet_margin_loss(anchor, positive, negative, margin=self.margin, p=self.p, eps=self.eps,
                                        swap=self.swap, reduction=self.reduction)


class TripletMarginWithDistanceLoss(_Loss):
    """The triplet margin loss with any distance function (default ``PairwiseDistance()``)."""

    def __init__(self, *, distance_function=None, margin: float = 1.0, swap: bool = False,
                 reduction: str = "mean") -> None:
        super().__init__(size_average=None, reduce=None, reduction=reduction)
        if margin <= 0:
            raise ValueError(f"TripletMarginWithDistanceLoss: expected margin to be greater than 0, got {margin} "
                             f"instead")
        self.distance_function = distance_function if distance_function is not None else PairwiseDistance()
        self.margin = margin
        self.swap = swap

    def forward(self, anchor, positive, negative):
        return _emb.triplet_margin_with_distance_loss(anchor, positive, negative,
                                                      distance_function=self.distance_function,
                                                      margin=self.margin, swap=self.swap, reduction=self.reduction)


class SoftMarginLoss(_Loss):
    """log(1 + exp(-y x)) (``F.soft_margin_loss``)."""

    def forward(self, input, target):  # noqa: A002
        return _emb.soft_margin_loss(input, target, reduction=self.reduction)


class MultiMarginLoss(_WeightedLoss):
    """The multi-class hinge loss (``F.multi_margin_loss``); ``weight`` (C,) is a buffer.

    Raises:
        ValueError: ``p`` is not 1 or 2, or ``weight`` is not 1-D.
    """

    def __init__(self, p: int = 1, margin: float = 1.0, weight=None, size_average=None, reduce=None,
                 reduction: str = "mean") -> None:
        super().__init__(weight, size_average, reduce, reduction)
        if p != 1 and p != 2:
            raise ValueError("only p == 1 and p == 2 supported")
        if weight is not None and weight.ndim != 1:
            raise ValueError(f"MultiMarginLoss: expected weight to be None or 1D tensor, got {weight.ndim}D "
                             f"instead")
        self.p = p
        self.margin = margin

    def forward(self, input, target):  # noqa: A002
        return _mc.multi_margin_loss(input, target, p=self.p, margin=self.margin, weight=self.weight,
                                     reduction=self.reduction)


class MultiLabelMarginLoss(_Loss):
    """The multi-label hinge loss over class-index targets ended by -1 (``F.multilabel_margin_loss``)."""

    def forward(self, input, target):  # noqa: A002
        return _mc.multilabel_margin_loss(input, target, reduction=self.reduction)


class MultiLabelSoftMarginLoss(_WeightedLoss):
    """Per-class logistic loss averaged over the classes (``F.multilabel_soft_margin_loss``)."""

    def forward(self, input, target):  # noqa: A002
        return _mc.multilabel_soft_margin_loss(input, target, weight=self.weight, reduction=self.reduction)
