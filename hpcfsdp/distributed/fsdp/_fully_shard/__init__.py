"""fully_shard: FSDP2 per-parameter sharding."""

from ._fsdp_api import (
    AllGather,
    Comm,
    CPUOffloadPolicy,
    DataParallelMeshDims,
    MixedPrecisionPolicy,
    OffloadPolicy,
    ReduceScatter,
)
from ._fsdp_quantized import QuantizedAllGather, QuantizedReduceScatter
from ._fsdp_residual import get_residual_state_dict, set_residual_state_dict
from ._fully_shard import (
    FSDPModule,
    UnshardHandle,
    disable_fsdp_module_new_init,
    fully_shard,
    get_cls_to_fsdp_cls,
    register_fsdp_forward_method,
    share_comm_ctx,
)

__all__ = [
    "AllGather", "Comm", "CPUOffloadPolicy", "DataParallelMeshDims", "MixedPrecisionPolicy", "OffloadPolicy",
    "ReduceScatter", "FSDPModule", "UnshardHandle", "disable_fsdp_module_new_init", "fully_shard",
    "get_cls_to_fsdp_cls", "register_fsdp_forward_method", "share_comm_ctx",
    "QuantizedAllGather", "QuantizedReduceScatter", "get_residual_state_dict", "set_residual_state_dict",
]
