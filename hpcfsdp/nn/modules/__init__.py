"""Layers and containers of hpcfsdp.nn."""
from hpcfsdp.nn.modules.activation import GELU, ReLU, Tanh
from hpcfsdp.nn.modules.batchnorm import BatchNorm1d, BatchNorm2d
from hpcfsdp.nn.modules.container import ModuleDict, ModuleList, Sequential
from hpcfsdp.nn.modules.dropout import Dropout
from hpcfsdp.nn.modules.linear import Identity, Linear
from hpcfsdp.nn.modules.loss import CrossEntropyLoss, MSELoss
from hpcfsdp.nn.modules.module import Module
from hpcfsdp.nn.modules.normalization import LayerNorm
from hpcfsdp.nn.modules.sparse import Embedding

from hpcfsdp.nn.modules.activation import SiLU  # noqa: E402
from hpcfsdp.nn.modules.normalization import RMSNorm  # noqa: E402
from hpcfsdp.nn.modules.activation_more import (  # noqa: E402
    ELU, Hardtanh, LeakyReLU, LogSoftmax, Mish, ReLU6, Sigmoid, Softmax, Softplus,
)
from hpcfsdp.nn.modules.channel_dropout import Dropout1d, Dropout2d, Dropout3d  # noqa: E402
from hpcfsdp.nn.modules.conv import Conv1d, Conv2d, Conv3d  # noqa: E402
from hpcfsdp.nn.modules.flatten import Flatten, Unflatten  # noqa: E402
from hpcfsdp.nn.modules.groupnorm import GroupNorm  # noqa: E402
from hpcfsdp.nn.modules.loss_more import (  # noqa: E402
    BCELoss, BCEWithLogitsLoss, HuberLoss, KLDivLoss, L1Loss, NLLLoss, SmoothL1Loss,
)
from hpcfsdp.nn.modules.param_container import ParameterDict, ParameterList  # noqa: E402
from hpcfsdp.nn.modules.pooling import (  # noqa: E402
    AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveAvgPool3d, AvgPool1d, AvgPool2d, AvgPool3d, MaxPool1d, MaxPool2d,
    MaxPool3d,
)

__all__ = [
    "Module", "Linear", "Identity", "Embedding", "LayerNorm", "BatchNorm1d", "BatchNorm2d", "Dropout", "GELU",
    "ReLU", "Tanh",
    "Sequential", "ModuleList", "ModuleDict", "CrossEntropyLoss", "MSELoss",
]
__all__ += ["RMSNorm", "SiLU"]
# convolution, pooling, reshaping, channel dropout, group norm, more losses and activations, parameter containers
__all__ += [
    "Conv1d", "Conv2d", "Conv3d", "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "Flatten", "Unflatten", "Dropout1d", "Dropout2d",
    "Dropout3d", "GroupNorm", "NLLLoss", "BCELoss", "BCEWithLogitsLoss", "L1Loss", "SmoothL1Loss", "HuberLoss",
    "KLDivLoss", "Softmax", "LogSoftmax", "Sigmoid", "LeakyReLU", "ELU", "Softplus", "Mish", "Hardtanh", "ReLU6",
    "ParameterList", "ParameterDict",
]

# transposed convolution, resampling, adaptive max pooling, padding, distances, instance and synchronised batch norm
from hpcfsdp.nn.modules.conv_transpose import ConvTranspose1d, ConvTranspose2d, ConvTranspose3d  # noqa: E402
from hpcfsdp.nn.modules.distance import CosineSimilarity, PairwiseDistance  # noqa: E402
from hpcfsdp.nn.modules.instancenorm import InstanceNorm1d, InstanceNorm2d  # noqa: E402
from hpcfsdp.nn.modules.padding import (  # noqa: E402
    ConstantPad1d, ConstantPad2d, ReflectionPad1d, ReflectionPad2d, ReplicationPad1d, ReplicationPad2d, ZeroPad1d,
    ZeroPad2d,
)
from hpcfsdp.nn.modules.pooling import AdaptiveMaxPool1d, AdaptiveMaxPool2d, AdaptiveMaxPool3d  # noqa: E402
from hpcfsdp.nn.modules.syncbatchnorm import SyncBatchNorm  # noqa: E402
from hpcfsdp.nn.modules.upsampling import Upsample, UpsamplingBilinear2d, UpsamplingNearest2d  # noqa: E402

__all__ += [
    "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d",
    "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "ZeroPad1d", "ZeroPad2d", "ConstantPad1d",
    "ConstantPad2d", "ReflectionPad1d", "ReflectionPad2d", "ReplicationPad1d", "ReplicationPad2d", "CosineSimilarity",
    "PairwiseDistance", "InstanceNorm1d", "InstanceNorm2d", "SyncBatchNorm",
]
# attention, transformer layers and more activations
from hpcfsdp.nn.modules.activation_extra import (  # noqa: E402
    CELU, GLU, SELU, Hardsigmoid, Hardswish, LogSigmoid, PReLU, Softmax2d, Softmin, Softsign, Tanhshrink, Threshold,
)
from hpcfsdp.nn.modules.attention import MultiheadAttention  # noqa: E402
from hpcfsdp.nn.modules.transformer import (  # noqa: E402
    Transformer, TransformerDecoder, TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer,
)

__all__ += [
    "MultiheadAttention", "Transformer", "TransformerEncoder", "TransformerDecoder", "TransformerEncoderLayer",
    "TransformerDecoderLayer", "PReLU", "SELU", "CELU", "GLU", "Hardswish", "Hardsigmoid", "Softsign", "Tanhshrink",
    "Threshold", "Softmin", "LogSigmoid", "Softmax2d",
]
