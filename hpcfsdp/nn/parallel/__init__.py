"""torch.nn.parallel: DistributedDataParallel, a full replica per rank with gradients averaged during backward.

Light at import time: hpcfsdp.distributed (and mpi4py) load when a DistributedDataParallel is built.
"""
from hpcfsdp.nn.parallel.distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
