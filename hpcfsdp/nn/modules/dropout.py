"""Dropout: zero elements with probability p in training mode, scale the rest by 1/(1-p); and alpha dropout."""
import hpcfsdp.nn.functional as F
from hpcfsdp.nn.modules.module import Module

__all__ = ["Dropout", "AlphaDropout", "FeatureAlphaDropout"]


class Dropout(Module):
    """Dropout layer: in training mode, zero each element with probability ``p`` and scale the rest by 1 / (1 - p).

    In eval mode the input passes through unchanged.

    Args:
        p: the drop probability, in [0, 1].
        inplace: accepted for signature compatibility; the output is a new tensor.

    Raises:
        ValueError: ``p`` is outside [0, 1].
    """
    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self.inplace = inplace

    def forward(self, input):
        return F.dropout(input, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class AlphaDropout(Dropout):
    """Alpha dropout (``F.alpha_dropout``): keeps the zero mean and unit variance of SELU activations."""

    def forward(self, input):  # noqa: A002
        return F.alpha_dropout(input, self.p, self.training)


class FeatureAlphaDropout(Dropout):
    """Alpha dropout of whole channels (``F.feature_alpha_dropout``)."""

    def forward(self, input):  # noqa: A002
        return F.feature_alpha_dropout(input, self.p, self.training)
