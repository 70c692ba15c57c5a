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

__all__ = [
    "Module", "Linear", "Identity", "Embedding", "LayerNorm", "BatchNorm1d", "BatchNorm2d", "Dropout", "GELU",
    "ReLU", "Tanh",
    "Sequential", "ModuleList", "ModuleDict", "CrossEntropyLoss", "MSELoss",
]
__all__ += ["RMSNorm", "SiLU"]
