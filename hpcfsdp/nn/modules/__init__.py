"""Layers and containers of hpcfsdp.nn (torch.nn.modules): every name here is re-exported by hpcfsdp.nn."""
from hpcfsdp.nn.modules.module import Module  # noqa: I001  (Module first: every layer builds on it)
from hpcfsdp.nn.modules.activation import (
    CELU, ELU, GELU, GLU, SELU, Hardsigmoid, Hardswish, Hardtanh, LeakyReLU, LogSigmoid, LogSoftmax, Mish, PReLU, ReLU,
    ReLU6, Sigmoid, SiLU, Softmax, Softmax2d, Softmin, Softplus, Softsign, Tanh, Tanhshrink, Threshold,
)
from hpcfsdp.nn.modules.activation_shrink import Hardshrink, RReLU, Softshrink
from hpcfsdp.nn.modules.attention import MultiheadAttention
from hpcfsdp.nn.modules.batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from hpcfsdp.nn.modules.bilinear import Bilinear
from hpcfsdp.nn.modules.channel_dropout import Dropout1d, Dropout2d, Dropout3d
from hpcfsdp.nn.modules.container import ModuleDict, ModuleList, Sequential
from hpcfsdp.nn.modules.conv import Conv1d, Conv2d, Conv3d
from hpcfsdp.nn.modules.conv_transpose import ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from hpcfsdp.nn.modules.distance import CosineSimilarity, PairwiseDistance
from hpcfsdp.nn.modules.dropout import AlphaDropout, Dropout, FeatureAlphaDropout
from hpcfsdp.nn.modules.embedding_bag import EmbeddingBag
from hpcfsdp.nn.modules.flatten import Flatten, Unflatten
from hpcfsdp.nn.modules.groupnorm import GroupNorm
from hpcfsdp.nn.modules.instancenorm import InstanceNorm1d, InstanceNorm2d, InstanceNorm3d
from hpcfsdp.nn.modules.linear import Identity, Linear
from hpcfsdp.nn.modules.loss import (
    BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, GaussianNLLLoss, HuberLoss, KLDivLoss, L1Loss, MSELoss, NLLLoss,
    PoissonNLLLoss, SmoothL1Loss,
)
from hpcfsdp.nn.modules.loss_margin import (
    CosineEmbeddingLoss, HingeEmbeddingLoss, MarginRankingLoss, MultiLabelMarginLoss, MultiLabelSoftMarginLoss,
    MultiMarginLoss, SoftMarginLoss, TripletMarginLoss, TripletMarginWithDistanceLoss,
)
from hpcfsdp.nn.modules.normalization import LayerNorm, RMSNorm
from hpcfsdp.nn.modules.padding import (
    CircularPad1d, CircularPad2d, CircularPad3d, ConstantPad1d, ConstantPad2d, ConstantPad3d, ReflectionPad1d,
    ReflectionPad2d, ReflectionPad3d, ReplicationPad1d, ReplicationPad2d, ReplicationPad3d, ZeroPad1d, ZeroPad2d,
    ZeroPad3d,
)
from hpcfsdp.nn.modules.param_container import ParameterDict, ParameterList
from hpcfsdp.nn.modules.pixelshuffle import ChannelShuffle, Fold, PixelShuffle, PixelUnshuffle, Unfold
from hpcfsdp.nn.modules.pooling import (
    AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveAvgPool3d, AdaptiveMaxPool1d, AdaptiveMaxPool2d, AdaptiveMaxPool3d,
    AvgPool1d, AvgPool2d, AvgPool3d, MaxPool1d, MaxPool2d, MaxPool3d,
)
from hpcfsdp.nn.modules.lp_unpool import (
    LocalResponseNorm, LPPool1d, LPPool2d, LPPool3d, MaxUnpool1d, MaxUnpool2d, MaxUnpool3d,
)
from hpcfsdp.nn.modules.rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase
from hpcfsdp.nn.modules.sparse import Embedding
from hpcfsdp.nn.modules.syncbatchnorm import SyncBatchNorm
from hpcfsdp.nn.modules.transformer import (
    Transformer, TransformerDecoder, TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer,
)
from hpcfsdp.nn.modules.upsampling import Upsample, UpsamplingBilinear2d, UpsamplingNearest2d

__all__ = [
    # the base class and containers
    "Module", "Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict",
    # linear, embedding, convolution, pooling, padding, resampling, reshaping
    "Identity", "Linear", "Embedding", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
    "ConvTranspose3d", "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d", "ZeroPad1d", "ZeroPad2d", "ConstantPad1d", "ConstantPad2d", "ReflectionPad1d",
    "ReflectionPad2d", "ReplicationPad1d", "ReplicationPad2d", "Upsample", "UpsamplingNearest2d",
    "UpsamplingBilinear2d", "Flatten", "Unflatten", "ConstantPad3d", "ZeroPad3d", "ReflectionPad3d", "ReplicationPad3d",
    "CircularPad1d", "CircularPad2d", "CircularPad3d", "EmbeddingBag", "Bilinear", "PixelShuffle", "PixelUnshuffle",
    "ChannelShuffle", "Fold", "Unfold", "LPPool1d", "LPPool2d", "LPPool3d", "MaxUnpool1d", "MaxUnpool2d",
    "MaxUnpool3d",
    # normalization and dropout
    "LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d", "SyncBatchNorm", "InstanceNorm1d",
    "InstanceNorm2d", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "BatchNorm3d", "InstanceNorm3d",
    "LocalResponseNorm", "AlphaDropout", "FeatureAlphaDropout",
    # activations (activation.py) and attention
    "ReLU", "Hardtanh", "ReLU6", "LeakyReLU", "Threshold", "ELU", "CELU", "SELU", "GELU", "SiLU", "Mish", "Sigmoid",
    "LogSigmoid", "Hardsigmoid", "Hardswish", "Tanh", "Tanhshrink", "Softsign", "Softplus", "PReLU", "GLU", "Softmax",
    "LogSoftmax", "Softmin", "Softmax2d", "Hardshrink", "Softshrink", "RReLU", "MultiheadAttention",
    # recurrent layers
    "RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell",
    # transformer layers
    "Transformer", "TransformerEncoder", "TransformerDecoder", "TransformerEncoderLayer", "TransformerDecoderLayer",
    # losses (loss.py) and distances
    "MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "CrossEntropyLoss", "NLLLoss", "BCELoss", "BCEWithLogitsLoss",
    "KLDivLoss", "PoissonNLLLoss", "GaussianNLLLoss", "MarginRankingLoss", "HingeEmbeddingLoss",
    "CosineEmbeddingLoss", "TripletMarginLoss", "TripletMarginWithDistanceLoss", "SoftMarginLoss", "MultiMarginLoss",
    "MultiLabelMarginLoss", "MultiLabelSoftMarginLoss", "CosineSimilarity", "PairwiseDistance",
]
