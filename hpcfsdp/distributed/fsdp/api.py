"""FSDP1-style configuration objects: sharding strategy, prefetch, precision, offload, state-dict types."""

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

from ...nn.modules.batchnorm import _BatchNorm

__all__ = [
    "ShardingStrategy",
    "BackwardPrefetch",
    "MixedPrecision",
    "CPUOffload",
    "StateDictType",
    "StateDictConfig",
    "FullStateDictConfig",
    "LocalStateDictConfig",
    "ShardedStateDictConfig",
    "OptimStateDictConfig",
    "FullOptimStateDictConfig",
    "LocalOptimStateDictConfig",
    "ShardedOptimStateDictConfig",
    "StateDictSettings",
]


class ShardingStrategy(Enum):
    FULL_SHARD = auto()  # shard params, grads, optimizer state; reshard after forward (ZeRO-3)
    SHARD_GRAD_OP = auto()  # keep params unsharded between forward and backward (ZeRO-2)
    NO_SHARD = auto()  # replicate everything, all-reduce gradients (DDP)
    HYBRID_SHARD = auto()  # FULL_SHARD inside a node, replicate across nodes
    _HYBRID_SHARD_ZERO2 = auto()  # SHARD_GRAD_OP inside a node, replicate across nodes


class BackwardPrefetch(Enum):
    BACKWARD_PRE = auto()  # issue the next all-gather before the current gradient computation
    BACKWARD_POST = auto()  # issue it after the current gradient computation


@dataclass
class MixedPrecision:
    param_dtype: Any = None
    reduce_dtype: Any = None
    buffer_dtype: Any = None
    keep_low_precision_grads: bool = False
    cast_forward_inputs: bool = False
    cast_root_forward_inputs: bool = True
    # Modules of these classes keep full precision (their own FSDP unit, buffers uncast).
    _module_classes_to_ignore: Sequence[type] = (_BatchNorm,)


@dataclass
class CPUOffload:
    offload_params: bool = False


class StateDictType(Enum):
    FULL_STATE_DICT = auto()  # gathered full tensors
    LOCAL_STATE_DICT = auto()  # each rank's flat local pieces with their layout
    SHARDED_STATE_DICT = auto()  # DTensors, no communication


@dataclass
class StateDictConfig:
    offload_to_cpu: bool = False


@dataclass
class FullStateDictConfig(StateDictConfig):
    rank0_only: bool = False


@dataclass
class LocalStateDictConfig(StateDictConfig):
    pass


@dataclass
class ShardedStateDictConfig(StateDictConfig):
    _use_dtensor: bool = False


@dataclass
class OptimStateDictConfig:
    offload_to_cpu: bool = True


@dataclass
class FullOptimStateDictConfig(OptimStateDictConfig):
    rank0_only: bool = False


@dataclass
class LocalOptimStateDictConfig(OptimStateDictConfig):
    offload_to_cpu: bool = False


@dataclass
class ShardedOptimStateDictConfig(OptimStateDictConfig):
    _use_dtensor: bool = False


@dataclass
class StateDictSettings:
    state_dict_type: StateDictType
    state_dict_config: StateDictConfig
    optim_state_dict_config: OptimStateDictConfig
