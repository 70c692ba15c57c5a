"""FSDP1-style configuration objects: sharding strategy, prefetch, precision, offload, state-dict types."""

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

from ...nn.modules.batchnorm import _BatchNorm

__all__ = [
    "ShardingStrategy",
    "BackwardPrefetch",
    "OptimStateKeyType",
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
    """How FullyShardedDataParallel distributes parameters, gradients and optimizer state.

    Members:
        FULL_SHARD: shard all three; free parameters after forward (ZeRO-3).
        SHARD_GRAD_OP: shard gradients and optimizer state; keep parameters gathered from forward to backward (ZeRO-2).
        NO_SHARD: replicate everything and all-reduce gradients (data parallel).
        HYBRID_SHARD: FULL_SHARD within a shard group (a node), replicated across groups.
    """
    FULL_SHARD = auto()  # shard params, grads, optimizer state; reshard after forward (ZeRO-3)
    SHARD_GRAD_OP = auto()  # keep params unsharded between forward and backward (ZeRO-2)
    NO_SHARD = auto()  # replicate everything, all-reduce gradients (DDP)
    HYBRID_SHARD = auto()  # FULL_SHARD inside a node, replicate across nodes
    _HYBRID_SHARD_ZERO2 = auto()  # SHARD_GRAD_OP inside a node, replicate across nodes


class OptimStateKeyType(Enum):
    """How FSDP1's rekey_optim_state_dict keys an optimizer state dict: by parameter name or by index."""
    PARAM_NAME = auto()
    PARAM_ID = auto()


class BackwardPrefetch(Enum):
    """When backward starts the all-gather of the next unit's parameters.

    Members:
        BACKWARD_PRE: before computing the current unit's gradients (most overlap, more memory).
        BACKWARD_POST: after computing them (less memory, less overlap).
    """
    BACKWARD_PRE = auto()  # issue the next all-gather before the current gradient computation
    BACKWARD_POST = auto()  # issue it after the current gradient computation


@dataclass
class MixedPrecision:
    """Dtypes of FullyShardedDataParallel's mixed-precision training.

    Attributes:
        param_dtype: dtype of the gathered parameters used in forward and backward (None: unchanged).
        reduce_dtype: dtype of the gradient reduction (None: ``param_dtype``).
        buffer_dtype: dtype floating buffers are cast to (None: unchanged).
        keep_low_precision_grads: leave gradients in the reduce dtype instead of upcasting them.
        cast_forward_inputs: cast each unit's floating forward inputs to ``param_dtype``.
        cast_root_forward_inputs: cast the root unit's floating forward inputs to ``param_dtype``.
    """
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
    """FullyShardedDataParallel's offload setting.

    Attributes:
        offload_params: keep sharded parameters, gradients and optimizer state in host memory.
    """
    offload_params: bool = False


class StateDictType(Enum):
    """What ``state_dict()`` of a FullyShardedDataParallel model returns.

    Members:
        FULL_STATE_DICT: full tensors, gathered across ranks.
        LOCAL_STATE_DICT: each rank's flat local pieces with their layout.
        SHARDED_STATE_DICT: DTensors holding each rank's shard, without communication.
    """
    FULL_STATE_DICT = auto()  # gathered full tensors
    LOCAL_STATE_DICT = auto()  # each rank's flat local pieces with their layout
    SHARDED_STATE_DICT = auto()  # DTensors, no communication


@dataclass
class StateDictConfig:
    """Options common to the model state-dict types.

    Attributes:
        offload_to_cpu: return host (NumPy-backed) tensors.
    """
    offload_to_cpu: bool = False


@dataclass
class FullStateDictConfig(StateDictConfig):
    """Options of FULL_STATE_DICT.

    Attributes:
        rank0_only: only rank 0 gets the values; the other ranks get an empty dict.
    """
    rank0_only: bool = False


@dataclass
class LocalStateDictConfig(StateDictConfig):
    """Options of LOCAL_STATE_DICT (those of ``StateDictConfig``)."""
    pass


@dataclass
class ShardedStateDictConfig(StateDictConfig):
    """Options of SHARDED_STATE_DICT (those of ``StateDictConfig``)."""
    _use_dtensor: bool = False


@dataclass
class OptimStateDictConfig:
    """Options common to the optimizer state-dict types.

    Attributes:
        offload_to_cpu: return host (NumPy-backed) tensors.
    """
    offload_to_cpu: bool = True


@dataclass
class FullOptimStateDictConfig(OptimStateDictConfig):
    """Options of the FULL optimizer state dict.

    Attributes:
        rank0_only: only rank 0 gets the values; the other ranks get an empty dict.
    """
    rank0_only: bool = False


@dataclass
class LocalOptimStateDictConfig(OptimStateDictConfig):
    """Options of the LOCAL optimizer state dict (no offload by default)."""
    offload_to_cpu: bool = False


@dataclass
class ShardedOptimStateDictConfig(OptimStateDictConfig):
    """Options of the SHARDED optimizer state dict."""
    _use_dtensor: bool = False


@dataclass
class StateDictSettings:
    """The state-dict settings of a FullyShardedDataParallel model, as ``set_state_dict_type`` returns them.

    Attributes:
        state_dict_type: the model state-dict type.
        state_dict_config: its options.
        optim_state_dict_config: the optimizer state dict's options.
    """
    state_dict_type: StateDictType
    state_dict_config: StateDictConfig
    optim_state_dict_config: OptimStateDictConfig
