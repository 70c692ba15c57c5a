"""The primitive differentiable ops (autograd Functions on raw arrays), one module per family.

Each ``forward`` receives NumPy/CuPy arrays (Python scalars pass through) and saves on ``ctx`` only what its
``backward`` needs, right below it. ``backward`` must not write into the gradients it receives (See [Note: Gradient
ownership] in engine.py). The generic helpers several families use (the half-precision upcast, reduction dims, kernel
taps) live once in ``_common.py``; a family may use another's (pool the convolution's tap slices, loss the activations'
softplus). This package re-exports every op and every helper other modules use, so callers write ``ops.Name``.
"""
from ..._array import array_matmul, sum_to
from ..._backend import array_module
from .arithmetic import (Add, Atan2, Copysign, Div, FMaxMin, Hypot, LogAddExp, Maximum, Minimum, Mul, Pow, PowScalar,
                         RPowScalar, Remainder, Sub, Xlogy, xlogy_array)
from .unary import (Abs, Clamp, Cos, Erf, Exp, Log, Logit, NanToNum, Neg, Rounding, Rsqrt, Sigmoid, Sin, Special, Sqrt, Tanh, UNARY, Unary, erf,
                    normal_cdf)
from .reduce import Amax, Cumprod, Cumsum, Logcumsumexp, Logsumexp, MaxDim, Mean, Prod, Sum, Var, logcumsumexp_array
from .shape import (Cast, Cat, Clone, Contiguous, DiagEmbed, Diagonal, Expand, Flip, Permute, Repeat, Reshape, Roll,
                    Split, Stack, ToDevice)
from .index import (GetItem, IndexAdd, IndexPut, MaskedFill, Scatter, ScatterReduce, TakeAlong, Where, index_add,
                    segment_reduce)
from .linalg import Cholesky, Det, Einsum, ForwardOnly, Inv, Matmul, Slogdet, Solve, Svdvals, VectorNorm, einsum_plan
from .random import Sampled
from .activation import (Elu, Gelu, GeluTanh, Hardsigmoid, Hardswish, Hardtanh, LeakyRelu, LogSigmoid, LogSoftmax,
                         Mish, Prelu, Relu, ScaledElu, Softmax, Softplus, Threshold, softplus_array)
from .nn import Dropout, Embedding, LayerNorm, Linear, RmsNorm, Rotary
from .loss import BinaryCrossEntropy, BinaryCrossEntropyWithLogits, CrossEntropy, KlDiv, MseLoss, SmoothL1
from .attention import CAUSAL_BLOCK, ScaledDotProductAttention
from .conv import ConvNd, ConvTransposeNd, pad_zeros, tap_slices
from .pool import (AdaptiveAvgPoolNd, AdaptiveMaxPoolNd, AvgPoolNd, MaxPoolNd, adaptive_matrix, adaptive_windows,
                   avg_divisor)
from .resample import ResampleLinear, linear_weights, nearest_index
from .pad import PadConstant, PadGather, pad_indices
from .random import _random_keep  # noqa: F401  (also nn.functional's channel dropout)

# Array helpers under the names callers use: _backend.array_module and _array.array_matmul.
xp_of = array_module
mm = array_matmul

__all__ = ["Add", "Sub", "Mul", "Div", "Pow", "PowScalar", "RPowScalar", "Maximum", "Minimum", "Atan2", "Hypot",
           "Remainder", "LogAddExp", "Xlogy", "FMaxMin", "Copysign", "xlogy_array", "Neg", "Exp", "Log", "Sqrt", "Rsqrt", "Tanh", "Sigmoid", "Abs", "Clamp", "Cos", "Sin", "Erf",
           "Rounding", "Logit", "NanToNum", "Special", "Unary", "UNARY", "erf", "normal_cdf", "Sum", "Mean", "Amax", "MaxDim", "Var", "Prod",
           "Logsumexp", "Cumsum", "Cumprod", "Logcumsumexp", "logcumsumexp_array", "Reshape", "Permute", "Expand", "Split", "Cat", "Stack", "Roll", "Flip",
           "Repeat", "Diagonal", "DiagEmbed", "Clone", "Contiguous", "Cast", "ToDevice", "GetItem", "TakeAlong", "Scatter", "IndexAdd", "IndexPut", "ScatterReduce", "segment_reduce",
           "Where", "MaskedFill", "index_add", "Matmul", "Einsum", "einsum_plan", "VectorNorm", "Svdvals", "Det", "Slogdet",
           "Inv", "Solve", "Cholesky", "ForwardOnly", "Sampled", "Relu", "Softmax", "LogSoftmax", "Gelu", "GeluTanh",
           "LeakyRelu", "Elu", "Softplus", "Mish", "Hardtanh", "Prelu", "ScaledElu", "Hardswish", "Hardsigmoid",
           "Threshold", "LogSigmoid", "softplus_array", "Linear", "LayerNorm", "RmsNorm", "Rotary", "Embedding", "Dropout", "CrossEntropy",
           "MseLoss", "BinaryCrossEntropy", "BinaryCrossEntropyWithLogits", "SmoothL1", "KlDiv",
           "ScaledDotProductAttention", "CAUSAL_BLOCK", "ConvNd", "ConvTransposeNd", "tap_slices", "pad_zeros",
           "MaxPoolNd", "AvgPoolNd", "AdaptiveAvgPoolNd", "AdaptiveMaxPoolNd", "avg_divisor", "adaptive_matrix",
           "adaptive_windows", "ResampleLinear", "linear_weights", "nearest_index", "PadConstant", "PadGather",
           "pad_indices", "xp_of", "mm", "sum_to"]
