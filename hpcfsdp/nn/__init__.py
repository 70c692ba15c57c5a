"""Neural-network building blocks: Module, Parameter, Buffer, layers, functional, init and utils."""
from hpcfsdp.nn.parameter import Buffer, Parameter  # noqa: I001  (Parameter first: modules import it)
from hpcfsdp.nn import functional, init
from hpcfsdp.nn._functional import torch_functions as _torch_functions  # noqa: F401  (torch.dropout, ... in the registry)
from hpcfsdp.nn import modules as _modules
from hpcfsdp.nn.modules import *  # noqa: F403  (every layer, as torch.nn re-exports torch.nn.modules)
from hpcfsdp.nn import utils

# torch.nn.parallel: DistributedDataParallel (loads hpcfsdp.distributed only when one is built)
from hpcfsdp.nn import parallel

__all__ = ["Buffer", "Parameter", "functional", "init", "utils", "parallel"]
__all__ += _modules.__all__
