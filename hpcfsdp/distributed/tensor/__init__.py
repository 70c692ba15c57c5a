"""Distributed tensors: DTensor, Shard, Replicate, distribute_tensor (the subset FSDP needs)."""

from hpcfsdp.distributed.device_mesh import DeviceMesh, init_device_mesh
from hpcfsdp.distributed.tensor._dtensor import DTensor, DTensorSpec, distribute_tensor
from hpcfsdp.distributed.tensor.placement_types import Placement, Replicate, Shard

__all__ = [
    "DTensor",
    "DTensorSpec",
    "DeviceMesh",
    "Placement",
    "Replicate",
    "Shard",
    "distribute_tensor",
    "init_device_mesh",
]
