"""Distributed tensors: DTensor, Shard, Replicate, Partial, distribute_tensor and distribute_module."""

from hpcfsdp.distributed.device_mesh import DeviceMesh, init_device_mesh
from hpcfsdp.distributed.tensor._distribute_module import distribute_module
from hpcfsdp.distributed.tensor._dtensor import DTensor, DTensorSpec, distribute_tensor
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
