"""Neural-network building blocks: Module, Parameter, layers, functional, init and utils."""
from hpcfsdp.nn.parameter import Parameter  # noqa: I001  (Parameter first: modules import it)
from hpcfsdp.nn import functional, init
from hpcfsdp.nn.modules import (
    BatchNorm1d, BatchNorm2d, GELU, CrossEntropyLoss, Dropout, Embedding, Identity, LayerNorm, Linear, Module,
    ModuleDict, ModuleList, MSELoss, ReLU, Sequential, Tanh,
)
from hpcfsdp.nn import utils
from hpcfsdp.nn.modules import RMSNorm, SiLU  # noqa: E402
from hpcfsdp.nn.modules import (  # noqa: E402
    ELU, AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveAvgPool3d, AvgPool1d, AvgPool2d, AvgPool3d, BCELoss,
    BCEWithLogitsLoss, Conv1d, Conv2d, Conv3d, Dropout1d, Dropout2d, Dropout3d, Flatten, GroupNorm, Hardtanh, HuberLoss,
    KLDivLoss, L1Loss, LeakyReLU, LogSoftmax, MaxPool1d, MaxPool2d, MaxPool3d, Mish, NLLLoss, ParameterDict,
    ParameterList, ReLU6, Sigmoid, SmoothL1Loss, Softmax, Softplus, Unflatten,
)

__all__ = [
    "Parameter", "Module", "Linear", "Identity", "Embedding", "LayerNorm", "BatchNorm1d", "BatchNorm2d", "Dropout",
    "GELU", "ReLU", "Tanh",
    "Sequential", "ModuleList", "ModuleDict", "CrossEntropyLoss", "MSELoss", "functional", "init", "utils",
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
from hpcfsdp.nn.modules import (  # noqa: E402
    AdaptiveMaxPool1d, AdaptiveMaxPool2d, AdaptiveMaxPool3d, ConstantPad1d, ConstantPad2d, ConvTranspose1d,
    ConvTranspose2d, ConvTranspose3d, CosineSimilarity, InstanceNorm1d, InstanceNorm2d, PairwiseDistance,
    ReflectionPad1d, ReflectionPad2d, ReplicationPad1d, ReplicationPad2d, SyncBatchNorm, Upsample,
    UpsamplingBilinear2d, UpsamplingNearest2d, ZeroPad1d, ZeroPad2d,
)

__all__ += [
    "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d",
    "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "ZeroPad1d", "ZeroPad2d", "ConstantPad1d",
    "ConstantPad2d", "ReflectionPad1d", "ReflectionPad2d", "ReplicationPad1d", "ReplicationPad2d", "CosineSimilarity",
    "PairwiseDistance", "InstanceNorm1d", "InstanceNorm2d", "SyncBatchNorm",
]
# attention, transformer layers and more activations
from hpcfsdp.nn.modules import (  # noqa: E402
    CELU, GLU, SELU, Hardsigmoid, Hardswish, LogSigmoid, MultiheadAttention, PReLU, Softmax2d, Softmin, Softsign,
    Tanhshrink, Threshold, Transformer, TransformerDecoder, TransformerDecoderLayer, TransformerEncoder,
    TransformerEncoderLayer,
)

__all__ += [
    "MultiheadAttention", "Transformer", "TransformerEncoder", "TransformerDecoder", "TransformerEncoderLayer",
    "TransformerDecoderLayer", "PReLU", "SELU", "CELU", "GLU", "Hardswish", "Hardsigmoid", "Softsign", "Tanhshrink",
    "Threshold", "Softmin", "LogSigmoid", "Softmax2d",
]

# torch.nn.parallel: DistributedDataParallel (loads hpcfsdp.distributed only when one is built)
from hpcfsdp.nn import parallel  # noqa: E402

__all__ += ["parallel"]
