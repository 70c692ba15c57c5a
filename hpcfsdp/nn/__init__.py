"""Neural-network building blocks: Module, Parameter, layers, functional, init and utils."""
from hpcfsdp.nn.parameter import Parameter  # noqa: I001  (Parameter first: modules import it)
from hpcfsdp.nn import functional, init
from hpcfsdp.nn.modules import (
    BatchNorm1d, BatchNorm2d, GELU, CrossEntropyLoss, Dropout, Embedding, Identity, LayerNorm, Linear, Module,
    ModuleDict, ModuleList, MSELoss, ReLU, Sequential, Tanh,
)
from hpcfsdp.nn import utils
from hpcfsdp.nn.modules import RMSNorm, SiLU  # noqa: E402

__all__ = [
    "Parameter", "Module", "Linear", "Identity", "Embedding", "LayerNorm", "BatchNorm1d", "BatchNorm2d", "Dropout",
    "GELU", "ReLU", "Tanh",
    "Sequential", "ModuleList", "ModuleDict", "CrossEntropyLoss", "MSELoss", "functional", "init", "utils",
]
__all__ += ["RMSNorm", "SiLU"]
