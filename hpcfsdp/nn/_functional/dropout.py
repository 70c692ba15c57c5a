"""Channel and alpha dropout of torch.nn.functional: dropout1d, dropout2d, dropout3d, alpha_dropout,
feature_alpha_dropout (dropout itself is in nn/functional.py)."""
import warnings

from ..._tensor import Tensor
from ...autograd.ops import _random_keep
from ._common import check_tensor

__all__ = ["dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"]


def _feature_dropout(input, p, training, mask_shape, name):  # noqa: A002
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    check_tensor(input, name)
    if not training or p == 0.0:
        return input
    keep = _random_keep(tuple(mask_shape), float(p), input._data)
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    mask = keep.astype(input.dtype)
    mask *= input.dtype.type(scale)
    return input * Tensor._wrap(mask)


def dropout1d(input, p=0.5, training=True, inplace=False):  # noqa: A002
    """Zero whole channels of (N, C, L) or (C, L) with probability ``p``, scaling the rest by 1 / (1 - p).

    Raises:
        RuntimeError: the input is not 2-D or 3-D.
        ValueError: ``p`` is outside [0, 1].
    """
    if input.ndim not in (2, 3):
        raise RuntimeError(f"dropout1d: Expected 2D or 3D input, but received a {input.ndim}D input. Note that "
                           "dropout1d exists to provide channel-wise dropout on inputs with 1 spatial dimension, a "
                           "channel dimension, and an optional batch dimension (i.e. 2D or 3D inputs).")
    shape = tuple(input.shape[:-1]) + (1,)
    return _feature_dropout(input, p, training, shape, "dropout1d")


def dropout2d(input, p=0.5, training=True, inplace=False):  # noqa: A002
    """Zero whole channels of (N, C, H, W) with probability ``p``, scaling the rest by 1 / (1 - p).

    As PyTorch, a 3-D input is taken as (N, C, L) (with a warning), and other ranks than 3 and 4 warn and
    drop along dims 0 and 1.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if input.ndim not in (3, 4):
        warnings.warn(f"dropout2d: Received a {input.ndim}-D input to dropout2d, which is deprecated and will result "
                      "in an error in a future release. To retain the behavior and silence this warning, please use "
                      "dropout instead.", stacklevel=2)
    if input.ndim == 3:
        warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D dropout behavior "
                      "is desired - input is interpreted as shape (N, C, L), where C is the channel dim. To maintain "
                      "the 1D channel-wise dropout behavior, please switch to using dropout1d instead.", stacklevel=2)
    shape = tuple(input.shape[:2]) + (1,) * (input.ndim - 2)
    return _feature_dropout(input, p, training, shape, "dropout2d")


def dropout3d(input, p=0.5, training=True, inplace=False):  # noqa: A002
    """Zero whole channels of (N, C, D, H, W) or (C, D, H, W) with probability ``p``, scaling the rest by 1 / (1 - p)."""
    if input.ndim not in (4, 5):
        warnings.warn(f"dropout3d: Received a {input.ndim}-D input to dropout3d, which is deprecated and will result "
                      "in an error in a future release. To retain the behavior and silence this warning, please use "
                      "dropout instead.", stacklevel=2)
    lead = 1 if input.ndim == 4 else 2
    shape = tuple(input.shape[:lead]) + (1,) * (input.ndim - lead)
    return _feature_dropout(input, p, training, shape, "dropout3d")


ALPHA_DROPOUT_ALPHA = 1.7580993408473766  # -SELU_SCALE * SELU_ALPHA: the value SELU saturates to


def _alpha_dropout(input, p, training, mask_shape, name):  # noqa: A002
    """PyTorch's alpha dropout: dropped elements are set to the SELU saturation -alpha, then all are affinely
    transformed by a, b so that the mean and variance are kept: kept a x + alpha a p, dropped alpha a (p - 1)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    check_tensor(input, name)
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return input * 0.0
    alpha = ALPHA_DROPOUT_ALPHA
    a = 1.0 / ((alpha * alpha * p + 1) * (1 - p)) ** 0.5
    keep = _random_keep(tuple(mask_shape), float(p), input._data).astype(input.dtype)
    b = (keep - 1) * (alpha * a) + alpha * a * p
    keep *= input.dtype.type(a)
    return input * Tensor._wrap(keep) + Tensor._wrap(b.astype(input.dtype, copy=False))


def alpha_dropout(input, p=0.5, training=False, inplace=False):  # noqa: A002
    """Alpha dropout (for SELU networks): each element dropped with probability ``p``, keeping zero mean and
    unit variance. ``inplace`` is accepted; the result is a new tensor.

    Raises:
        ValueError: ``p`` outside [0, 1].
    """
    return _alpha_dropout(input, p, training, tuple(input.shape), "alpha_dropout")


def feature_alpha_dropout(input, p=0.5, training=False, inplace=False):  # noqa: A002
    """Alpha dropout of whole channels of (N, C, *): one draw per (sample, channel).

    Raises:
        ValueError: ``p`` outside [0, 1].
    """
    check_tensor(input, "feature_alpha_dropout")
    shape = tuple(input.shape[:2]) + (1,) * (input.ndim - 2) if input.ndim >= 2 else tuple(input.shape)
    return _alpha_dropout(input, p, training, shape, "feature_alpha_dropout")
