"""FSDP: fully sharded data parallel (FSDP2 fully_shard and the FSDP1 configuration API)."""

from ._fully_shard import (
    AllGather,
    Comm,
    CPUOffloadPolicy,
    DataParallelMeshDims,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    QuantizedAllGather,
    QuantizedReduceScatter,
    ReduceScatter,
    UnshardHandle,
    disable_fsdp_module_new_init,
    fully_shard,
    get_cls_to_fsdp_cls,
    get_residual_state_dict,
    register_fsdp_forward_method,
    set_residual_state_dict,
    share_comm_ctx,
)
from ._fully_shard._fsdp_param_group import exposed_comm_seconds
from .fully_sharded_data_parallel import FSDP, FullyShardedDataParallel
from .api import (
    BackwardPrefetch,
    CPUOffload,
    FullOptimStateDictConfig,
    FullStateDictConfig,
    LocalOptimStateDictConfig,
    LocalStateDictConfig,
    MixedPrecision,
    OptimStateDictConfig,
    OptimStateKeyType,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictConfig,
    StateDictSettings,
    StateDictType,
)

__all__ = [
    "FSDP", "FullyShardedDataParallel",
    "AllGather", "Comm", "CPUOffloadPolicy", "DataParallelMeshDims", "FSDPModule", "MixedPrecisionPolicy",
    "OffloadPolicy", "ReduceScatter", "UnshardHandle", "disable_fsdp_module_new_init", "fully_shard",
    "get_cls_to_fsdp_cls", "register_fsdp_forward_method", "share_comm_ctx",
    "BackwardPrefetch", "CPUOffload", "FullOptimStateDictConfig", "FullStateDictConfig",
    "LocalOptimStateDictConfig", "LocalStateDictConfig", "MixedPrecision", "OptimStateDictConfig",
    "OptimStateKeyType",
    "ShardedOptimStateDictConfig", "ShardedStateDictConfig", "ShardingStrategy", "StateDictConfig",
    "StateDictSettings", "StateDictType",
    "exposed_comm_seconds",  # not PyTorch's: seconds the main thread waited on FSDP communication
    "QuantizedAllGather", "QuantizedReduceScatter",  # not PyTorch's: ZeRO++-style quantized collectives
    "get_residual_state_dict", "set_residual_state_dict",  # not PyTorch's: their error-feedback state
]
