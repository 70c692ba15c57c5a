"""Loss modules: CrossEntropyLoss and MSELoss."""
import hpcfsdp.nn.functional as F
from hpcfsdp.nn.modules.module import Module

__all__ = ["CrossEntropyLoss", "MSELoss"]

_REDUCTIONS = ("none", "mean", "sum")


def _check_reduction(reduction):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction; expected one of {_REDUCTIONS}")


class CrossEntropyLoss(Module):
    """Cross entropy between logits (N, C) and class indices (N,) (``F.cross_entropy`` with the stored options)."""

    def __init__(self, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
                 reduction: str = "mean", label_smoothing: float = 0.0) -> None:
        super().__init__()
        if size_average is not None or reduce is not None:
            raise ValueError("size_average and reduce are deprecated in PyTorch and not supported; use reduction=")
        _check_reduction(reduction)
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing

    def forward(self, input, target):
        return F.cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction, label_smoothing=self.label_smoothing)


class MSELoss(Module):
    """Mean (or sum, or none) of the squared differences."""

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__()
        if size_average is not None or reduce is not None:
            raise ValueError("size_average and reduce are deprecated in PyTorch and not supported; use reduction=")
        _check_reduction(reduction)
        self.reduction = reduction

    def forward(self, input, target):
        return F.mse_loss(input, target, reduction=self.reduction)
