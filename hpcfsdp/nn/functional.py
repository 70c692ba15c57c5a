"""Functional neural-network ops (PyTorch's torch.nn.functional): thin wrappers over fused autograd ops."""
import math

import numpy as np

from .._array import dtype_category as _category
from .._kernels import CTYPES, use_fused
from .._tensor import Tensor
from .._autocast import FP32, LOWER, autocast_op
from ..autograd import ops
from ._functional.activation import (
    celu, elu, glu, hardsigmoid, hardswish, hardtanh, leaky_relu, logsigmoid, mish, prelu, relu6, selu, softmin,
    softplus, softsign, tanhshrink, threshold,
)
from ._functional.activation_shrink import (
    celu_, elu_, hardshrink, hardtanh_, leaky_relu_, relu_, rrelu, rrelu_, selu_, softshrink, threshold_,
)
from ._functional.bilinear import bilinear
from ._functional.embedding_bag import embedding_bag, embedding_renorm_
from ._functional.fold import fold, unfold
from ._functional.gumbel import gumbel_softmax
from ._functional.loss_embedding import (
    cosine_embedding_loss, hinge_embedding_loss, margin_ranking_loss, soft_margin_loss, triplet_margin_loss,
    triplet_margin_with_distance_loss,
)
from ._functional.loss_likelihood import gaussian_nll_loss, poisson_nll_loss
from ._functional.loss_multiclass import multi_margin_loss, multilabel_margin_loss, multilabel_soft_margin_loss
from ._functional.lp_unpool import (
    adaptive_max_pool1d_with_indices, adaptive_max_pool2d_with_indices, adaptive_max_pool3d_with_indices, lp_pool1d,
    lp_pool2d, lp_pool3d, max_pool1d_with_indices, max_pool2d_with_indices, max_pool3d_with_indices, max_unpool1d,
    max_unpool2d, max_unpool3d,
)
from ._functional.shuffle import channel_shuffle, native_channel_shuffle, pixel_shuffle, pixel_unshuffle
from ._functional._common import dtensor_rule, elementwise, legacy_reduction
from ._functional.attention import multi_head_attention_forward
from ._functional.conv import conv1d, conv2d, conv3d, pad
from ._functional.conv_transpose import conv_transpose1d, conv_transpose2d, conv_transpose3d
from ._functional.distance import cosine_similarity, pairwise_distance, pdist
from ._functional.dropout import alpha_dropout, dropout1d, dropout2d, dropout3d, feature_alpha_dropout
from ._functional.loss import (
    binary_cross_entropy, binary_cross_entropy_with_logits, huber_loss, kl_div, l1_loss, nll_loss, smooth_l1_loss,
)
from ._functional.normalization import batch_norm, group_norm, instance_norm, local_response_norm, normalize
from ._functional.pooling import (
    adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d, adaptive_max_pool1d, adaptive_max_pool2d,
    adaptive_max_pool3d, avg_pool1d, avg_pool2d, avg_pool3d, max_pool1d, max_pool2d, max_pool3d,
)
from ._functional.resample import interpolate, upsample
from ._functional.sparse import one_hot

# The functions defined in this module, then those of nn/_functional/ by family (one file each).
__all__ = [
    "linear", "relu", "gelu", "tanh", "sigmoid", "softmax", "log_softmax", "cross_entropy", "nll_loss",
    "mse_loss", "layer_norm", "dropout", "embedding", "scaled_dot_product_attention", "silu", "rms_norm",
    # activation.py
    "leaky_relu", "elu", "softplus", "mish", "hardtanh", "relu6", "prelu", "selu", "celu", "glu", "hardswish",
    "hardsigmoid", "softsign", "tanhshrink", "threshold", "logsigmoid", "softmin",
    # attention.py, conv.py, conv_transpose.py, distance.py, dropout.py
    "multi_head_attention_forward", "conv1d", "conv2d", "conv3d", "pad", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "cosine_similarity", "pairwise_distance", "dropout1d", "dropout2d", "dropout3d",
    # loss.py
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
    # normalization.py, pooling.py, resample.py, sparse.py
    "group_norm", "instance_norm", "normalize", "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d",
    "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool1d",
    "adaptive_max_pool2d", "adaptive_max_pool3d", "interpolate", "upsample", "one_hot", "batch_norm",
    "local_response_norm", "pdist", "alpha_dropout", "feature_alpha_dropout",
    # activation_shrink.py, bilinear.py, embedding_bag.py, fold.py, gumbel.py, shuffle.py
    "hardshrink", "softshrink", "rrelu", "relu_", "elu_", "leaky_relu_", "hardtanh_", "threshold_", "selu_", "celu_",
    "rrelu_", "bilinear", "embedding_bag", "fold", "unfold", "gumbel_softmax", "pixel_shuffle", "pixel_unshuffle",
    "channel_shuffle", "native_channel_shuffle",
    # loss_embedding.py, loss_likelihood.py, loss_multiclass.py
    "margin_ranking_loss", "hinge_embedding_loss", "cosine_embedding_loss", "triplet_margin_loss",
    "triplet_margin_with_distance_loss", "soft_margin_loss", "poisson_nll_loss", "gaussian_nll_loss",
    "multi_margin_loss", "multilabel_margin_loss", "multilabel_soft_margin_loss",
    # lp_unpool.py
    "lp_pool1d", "lp_pool2d", "lp_pool3d", "max_pool1d_with_indices", "max_pool2d_with_indices",
    "max_pool3d_with_indices", "adaptive_max_pool1d_with_indices", "adaptive_max_pool2d_with_indices",
    "adaptive_max_pool3d_with_indices", "max_unpool1d", "max_unpool2d", "max_unpool3d",
]


def _check(x, name, argname="input"):
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}(): argument '{argname}' must be Tensor, not {type(x).__name__}")
    return x


def _float(x, name, argname="input"):
    _check(x, name, argname)
    if _category(x.dtype) != 2:
        raise RuntimeError(f"{name}(): expected a floating point {argname}, got dtype {x.dtype}")
    return x


@autocast_op(cpu=LOWER, cuda=LOWER)
@dtensor_rule
def linear(input, weight, bias=None):  # noqa: A002
    """y = input @ weight.T + bias."""
    _check(input, "linear")
    _check(weight, "linear", "weight")
    if input.dtype != weight.dtype:
        raise RuntimeError(f"linear(): mat1 and mat2 must have the same dtype, but got {input.dtype} and {weight.dtype}")
    if bias is None:
        return ops.Linear.apply(input, weight)
    return ops.Linear.apply(input, weight, bias)


@elementwise
def relu(input, inplace=False):  # noqa: A002
    """max(input, 0) elementwise.

    ``inplace`` is accepted for signature compatibility; the result is always a new tensor.
    """
    return ops.Relu.apply(_check(input, "relu"))


@elementwise
def gelu(input, approximate="none"):  # noqa: A002
    """GELU: exact x * Phi(x) (approximate='none') or the tanh approximation (approximate='tanh')."""
    _float(input, "gelu")
    if approximate == "none":
        return ops.Gelu.apply(input)
    if approximate == "tanh":
        return ops.GeluTanh.apply(input)
    raise ValueError(f"gelu(): approximate must be 'none' or 'tanh', got {approximate!r}")


def tanh(input):  # noqa: A002
    """Hyperbolic tangent, elementwise."""
    return _check(input, "tanh").tanh()


def sigmoid(input):  # noqa: A002
    """1 / (1 + exp(-input)), elementwise."""
    return _check(input, "sigmoid").sigmoid()


def silu(input, inplace=False):  # noqa: A002
    """x * sigmoid(x), composed of Tensor ops (a fused op would save one saved array per call)."""
    _float(input, "silu")
    return input * input.sigmoid()


def softmax(input, dim=None, _stacklevel=3, dtype=None):  # noqa: A002
    """exp(x) / sum(exp(x)) along ``dim``.

    Args:
        input: the tensor.
        dim: the dimension to normalize over; None picks PyTorch's legacy implicit dimension
            (0 for 0-, 1- and 3-dimensional input, else 1).
        dtype: if given, ``input`` is cast to it first.

    Returns:
        A tensor of ``input``'s shape whose slices along ``dim`` sum to 1.
    """
    _check(input, "softmax")
    if dim is None:
        dim = 0 if input.ndim in (0, 1, 3) else 1  # PyTorch's legacy implicit choice
    return input.softmax(dim, dtype=dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):  # noqa: A002
    """log(softmax(input, dim)), computed stably.

    Args:
        input: the tensor.
        dim: the dimension to normalize over; None picks PyTorch's legacy implicit dimension.
        dtype: if given, ``input`` is cast to it first.
    """
    _check(input, "log_softmax")
    if dim is None:
        dim = 0 if input.ndim in (0, 1, 3) else 1
    return input.log_softmax(dim, dtype=dtype)


_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction, name):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{name}(): reduction must be one of {_REDUCTIONS}, got {reduction!r}")


# cross_entropy on a DTensor input: set by hpcfsdp.distributed.tensor.parallel.loss (loss_parallel, and the
# gathered computation outside it); returns NotImplemented for a plain input.
_CROSS_ENTROPY_DTENSOR = [None]


@autocast_op(cpu=FP32, cuda=FP32)
def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,  # noqa: A002
                  reduction="mean", label_smoothing=0.0):
    """Cross entropy of logits (N, C) or (N, C, d1, ...) or (C,) against class indices or class probabilities."""
    if _CROSS_ENTROPY_DTENSOR[0] is not None and type(input) is not Tensor:
        out = _CROSS_ENTROPY_DTENSOR[0](input, target, weight, ignore_index, reduction, label_smoothing)
        if out is not NotImplemented:
            return out
    _float(input, "cross_entropy")
    _check(target, "cross_entropy", "target")
    _check_reduction(reduction, "cross_entropy")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy(): label_smoothing must be in [0, 1], got {label_smoothing}")
    x = input
    if x.ndim == 0:
        raise RuntimeError("cross_entropy(): input must have at least 1 dimension (classes)")
    c = x.shape[0] if x.ndim == 1 else x.shape[1]
    if weight is not None:
        _check(weight, "cross_entropy", "weight")
        if tuple(weight.shape) != (c,):
            raise RuntimeError(f"cross_entropy(): weight must be a 1-D tensor of {c} class weights, "
                               f"got shape {tuple(weight.shape)}")
    if _category(target.dtype) == 2:
        return _cross_entropy_probs(x, target, weight, reduction, label_smoothing)
    if target.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy(): target must hold integer class indices (int64) or float class "
                        f"probabilities, got dtype {target.dtype}")
    unbatched = x.ndim == 1
    if unbatched:
        x = x.unsqueeze(0)
        target = target.reshape(1)
    spatial = tuple(x.shape[2:])
    if tuple(target.shape) != (x.shape[0],) + spatial:
        raise ValueError(f"cross_entropy(): expected target of shape {(x.shape[0],) + spatial} for input of "
                         f"shape {tuple(input.shape)}, got {tuple(target.shape)}")
    if spatial:  # (N, C, d1, ...) -> (N * d1 * ..., C)
        nd = x.ndim
        x = x.permute(0, *range(2, nd), 1).reshape(-1, c)
    t = target._data.reshape(-1)
    w = weight._data if weight is not None else None
    out = ops.CrossEntropy.apply(x, t, w, int(ignore_index), reduction, float(label_smoothing))
    if reduction == "none":
        out = out.reshape(()) if unbatched else out.reshape((input.shape[0],) + spatial)
    return out


def _cross_entropy_probs(x, target, weight, reduction, label_smoothing):
    """Cross entropy with class-probability targets (same shape as the input)."""
    if target.shape != x.shape:
        raise RuntimeError(f"cross_entropy(): probability target must have the input's shape {tuple(x.shape)}, "
                           f"got {tuple(target.shape)}")
    cdim = 0 if x.ndim == 1 else 1
    c = x.shape[cdim]
    if label_smoothing > 0:
        target = target * (1 - label_smoothing) + label_smoothing / c
    logp = x.log_softmax(cdim)
    prod = logp * target
    if weight is not None:
        shape = [1] * x.ndim
        shape[cdim] = c
        prod = prod * weight.reshape(shape)
    loss = -prod.sum(cdim)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / float(loss.numel())  # mean over samples (and spatial positions)


@autocast_op(cpu=FP32, cuda=FP32)
@dtensor_rule
def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):  # noqa: A002
    """Squared error (input - target)^2, reduced.

    Args:
        input: predictions.
        target: targets, broadcastable to ``input`` (cast to ``input``'s dtype).
        size_average: deprecated; with ``reduce`` mapped onto ``reduction`` as PyTorch does (with its warning).
        reduce: deprecated, see ``size_average``.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        weight: optional, the input's shape: scales each squared error; the weighted mean divides by its sum.

    Raises:
        RuntimeError: the shapes do not broadcast.
        ValueError: ``reduction`` is not one of the three, or ``weight`` is not of the input's shape.
    """
    _check(input, "mse_loss")
    _check(target, "mse_loss", "target")
    reduction = legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, "mse_loss")
    if input.shape != target.shape:
        try:
            np.broadcast_shapes(tuple(input.shape), tuple(target.shape))
        except ValueError:
            raise RuntimeError(f"mse_loss(): input shape {tuple(input.shape)} and target shape "
                               f"{tuple(target.shape)} do not broadcast") from None
    if target.dtype != input.dtype:
        target = target.to(input.dtype)
    if weight is not None:
        if tuple(weight.shape) != tuple(input.shape):
            raise ValueError("Weights and input must have the same size.")
        d = input - target
        loss = d * d * weight
        if reduction == "none":
            return loss
        return loss.sum() if reduction == "sum" else loss.sum() / weight.sum()
    return ops.MseLoss.apply(input, target, reduction)


@autocast_op(cuda=FP32)
@dtensor_rule
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):  # noqa: A002
    """Normalize over the trailing ``normalized_shape`` dimensions to zero mean and unit variance.

    Computes (x - mean) / sqrt(var + eps) * weight + bias, with the biased variance.

    Args:
        input: floating tensor whose last dimensions equal ``normalized_shape``.
        normalized_shape: an int or a shape.
        weight: optional scale of shape ``normalized_shape``.
        bias: optional shift of shape ``normalized_shape``.
        eps: added to the variance.

    Raises:
        RuntimeError: a shape does not match ``normalized_shape``, or ``input`` is not floating.
    """
    _float(input, "layer_norm")
    ns = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) else tuple(normalized_shape)
    nd = len(ns)
    if tuple(input.shape[input.ndim - nd:]) != ns or nd > input.ndim:
        raise RuntimeError(f"layer_norm(): given normalized_shape={list(ns)}, expected input with shape "
                           f"[*, {', '.join(map(str, ns))}], but got input of size {list(input.shape)}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != ns:
            raise RuntimeError(f"layer_norm(): {name} of shape {tuple(p.shape)} does not match "
                               f"normalized_shape {ns}")
    return ops.LayerNorm.apply(input, nd, weight, bias, float(eps))


def rms_norm(input, normalized_shape, weight=None, eps=None):  # noqa: A002
    """x / sqrt(mean(x^2 over normalized_shape) + eps) * weight; eps None = the dtype's machine epsilon.

    On CPU composed of Tensor ops (square, mean, rsqrt, mul); on CuPy one fused op (ops.RmsNorm: one kernel each
    way, saving x and rstd), followed by the Tensor multiply when the weight's dtype is not the input's (the product
    then promotes, as PyTorch's).
    """
    _float(input, "rms_norm")
    ns = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) else tuple(normalized_shape)
    nd = len(ns)
    if nd > input.ndim or tuple(input.shape[input.ndim - nd:]) != ns:
        raise RuntimeError(f"rms_norm(): given normalized_shape={list(ns)}, expected input with shape "
                           f"[*, {', '.join(map(str, ns))}], but got input of size {list(input.shape)}")
    if weight is not None and tuple(weight.shape) != ns:
        raise RuntimeError(f"rms_norm(): weight of shape {tuple(weight.shape)} does not match normalized_shape {ns}")
    if eps is None:
        import ml_dtypes  # finfo that knows bfloat16

        eps = float(ml_dtypes.finfo(input.dtype).eps)
    if type(input) is Tensor and use_fused(input._data) and input._data.dtype in CTYPES and input.numel():
        if weight is None or weight.dtype == input.dtype:
            return ops.RmsNorm.apply(input, nd, weight, float(eps))
        return ops.RmsNorm.apply(input, nd, None, float(eps)) * weight
    dims = tuple(range(input.ndim - nd, input.ndim))
    y = input * ((input * input).mean(dims, keepdim=True) + float(eps)).rsqrt()
    return y * weight if weight is not None else y


@elementwise
def dropout(input, p=0.5, training=True, inplace=False):  # noqa: A002
    """Zero each element with probability ``p`` and scale the others by 1 / (1 - p), in training only.

    Args:
        input: the tensor.
        p: the drop probability, in [0, 1].
        training: when False (or ``p`` is 0) ``input`` is returned unchanged.
        inplace: accepted for signature compatibility; the result is a new tensor.

    Raises:
        ValueError: ``p`` is outside [0, 1].
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    _check(input, "dropout")
    if not training or p == 0.0:
        return input
    return ops.Dropout.apply(input, float(p))


@dtensor_rule
def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,  # noqa: A002
              sparse=False):
    """Rows of ``weight`` selected by integer indices ``input``."""
    _check(weight, "embedding", "weight")
    idx = input._data if isinstance(input, Tensor) else np.asarray(input)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"embedding(): indices must be an integer tensor (int64 or int32), got dtype {idx.dtype}")
    if weight.ndim != 2:
        raise RuntimeError(f"embedding(): weight must be 2-D (num_embeddings, embedding_dim), got {tuple(weight.shape)}")
    if padding_idx is not None and padding_idx < 0:
        padding_idx += weight.shape[0]
    if max_norm is not None:  # rows read are rescaled in place to at most max_norm, as PyTorch's
        embedding_renorm_(weight, idx, max_norm, norm_type)
    return ops.Embedding.apply(idx, weight, padding_idx)


@autocast_op(cpu=LOWER, cuda=LOWER)
@dtensor_rule
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """softmax(q @ k^T * scale + mask) @ v; bool masks mark allowed positions, float masks are added."""
    for argname, t in (("query", query), ("key", key), ("value", value)):
        _float(t, "scaled_dot_product_attention", argname)
    if query.shape[-1] != key.shape[-1]:
        raise RuntimeError(f"scaled_dot_product_attention(): query and key embedding sizes differ: "
                           f"{tuple(query.shape)} vs {tuple(key.shape)}")
    if key.shape[-2] != value.shape[-2]:
        raise RuntimeError(f"scaled_dot_product_attention(): key and value sequence lengths differ: "
                           f"{tuple(key.shape)} vs {tuple(value.shape)}")
    if is_causal and attn_mask is not None:
        raise RuntimeError("scaled_dot_product_attention(): explicit attn_mask should not be set when is_causal=True")
    mask = None
    if attn_mask is not None:
        mask = attn_mask._data if isinstance(attn_mask, Tensor) else attn_mask
        if mask.dtype != np.bool_ and mask.dtype != query.dtype:
            mask = mask.astype(query.dtype)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    if enable_gqa and query.ndim >= 3 and query.shape[-3] != key.shape[-3]:
        if key.shape[-3] != value.shape[-3] or query.shape[-3] % key.shape[-3] != 0:
            raise RuntimeError(f"scaled_dot_product_attention(): with enable_gqa=True the number of query heads "
                               f"({query.shape[-3]}) must be a multiple of the key/value heads (key "
                               f"{key.shape[-3]}, value {value.shape[-3]})")
        # each group of query heads shares one key/value head, as repeat_interleave along the head dim
        rep = query.shape[-3] // key.shape[-3]
        key = key.unsqueeze(-3).expand(*key.shape[:-2], rep, *key.shape[-2:]).reshape(query.shape[:-2] + key.shape[-2:])
        value = value.unsqueeze(-3).expand(*value.shape[:-2], rep, *value.shape[-2:]).reshape(
            query.shape[:-2] + value.shape[-2:])
    return ops.ScaledDotProductAttention.apply(query, key, value, mask, float(dropout_p), bool(is_causal),
                                                  float(scale))

