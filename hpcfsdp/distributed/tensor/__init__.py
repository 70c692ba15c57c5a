"""Distributed tensors: DTensor, Shard, Replicate, Partial, distribute_tensor and distribute_module."""

from hpcfsdp.distributed.device_mesh import DeviceMesh, init_device_mesh
from hpcfsdp.distributed.tensor._distribute_module import distribute_module
from hpcfsdp.distributed.tensor._dtensor import DTensor, DTensorSpec, _local_ranges, distribute_tensor
from hpcfsdp.distributed.tensor._rules import random as _random_rules
from hpcfsdp.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

__all__ = [
    "DTensor",
    "DTensorSpec",
    "DeviceMesh",
    "Partial",
    "Placement",
    "Replicate",
    "Shard",
    "distribute_module",
    "distribute_tensor",
    "init_device_mesh",
]

_random_rules._LOCAL_RANGES[0] = _local_ranges  # the local pieces of random fills (See _rules/random.py)
