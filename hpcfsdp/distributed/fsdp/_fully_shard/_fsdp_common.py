"""Shared FSDP pieces: training/sharded state enums, mesh infos, the module registry."""

from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, Optional

__all__ = [
    "TrainingState",
    "ShardedState",
    "FSDPMeshInfo",
    "HSDPMeshInfo",
    "DDPMeshInfo",
    "check_transition",
    "get_module_fsdp_state",
    "registry",
]


class TrainingState(Enum):
    """What a parameter group (or state) is doing now; transitions are checked."""

    IDLE = auto()  # between passes
    FORWARD = auto()  # inside the module's forward
    PRE_BACKWARD = auto()  # gradient w.r.t. the module's outputs has arrived; module backward runs
    POST_BACKWARD = auto()  # gradients reduced, waiting for the end of backward


_ALLOWED = {
    TrainingState.IDLE: {TrainingState.FORWARD, TrainingState.PRE_BACKWARD, TrainingState.POST_BACKWARD},
    TrainingState.FORWARD: {TrainingState.IDLE, TrainingState.FORWARD, TrainingState.PRE_BACKWARD},
    TrainingState.PRE_BACKWARD: {TrainingState.PRE_BACKWARD, TrainingState.POST_BACKWARD, TrainingState.IDLE,
                                 TrainingState.FORWARD},
    TrainingState.POST_BACKWARD: {TrainingState.IDLE, TrainingState.PRE_BACKWARD, TrainingState.POST_BACKWARD},
}


def check_transition(old: TrainingState, new: TrainingState, what: str) -> TrainingState:
    if new not in _ALLOWED[old]:
        raise RuntimeError(f"FSDP {what}: invalid training-state transition {old.name} -> {new.name}")
    return new


class ShardedState(Enum):
    """Where a group's parameters live now."""

    SHARDED = auto()  # only this rank's shard; module attributes are the sharded DTensor parameters
    SHARDED_POST_FORWARD = auto()  # resharded onto the smaller post-forward group (int reshard_after_forward)
    UNSHARDING = auto()  # all-gather in flight; data not yet copied out
    UNSHARDED = auto()  # full parameters; module attributes are the unsharded parameters


@dataclass
class FSDPMeshInfo:
    """Sharding over one process group (FULL_SHARD and friends)."""

    mesh: Any
    shard_mesh_dim: Optional[int] = None
    shard_process_group: Any = None
    shard_world_size: int = 1
    shard_mesh_rank: int = 0
    is_spmd_mesh: bool = False
    # every mesh dim the shard group flattens, in mesh order (shard_mesh_dim is the first); see [Note: Flat layout]
    shard_mesh_dims: tuple = ()

    def __post_init__(self) -> None:
        if not self.shard_mesh_dims and self.shard_mesh_dim is not None:
            self.shard_mesh_dims = (self.shard_mesh_dim,)

    @property
    def shard_mesh_sizes(self) -> tuple:
        """Sizes of the mesh dims the shard group flattens (the nesting of the parameters' pieces)."""
        return tuple(self.mesh.size(d) for d in self.shard_mesh_dims) if len(self.shard_mesh_dims) > 1 else ()

    @property
    def is_hsdp(self) -> bool:
        return False


@dataclass
class HSDPMeshInfo(FSDPMeshInfo):
    """Shard inside one group, replicate (all-reduce) across another (HYBRID_SHARD)."""

    replicate_mesh_dim: Optional[int] = None
    replicate_process_group: Any = None
    replicate_world_size: int = 1
    replicate_mesh_rank: int = 0

    @property
    def is_hsdp(self) -> bool:
        return True


@dataclass
class DDPMeshInfo:
    """Replicate only (no shard dimension): gradients are all-reduced."""

    mesh: Any
    replicate_mesh_dim: Optional[int] = None
    replicate_process_group: Any = None
    replicate_world_size: int = 1
    replicate_mesh_rank: int = 0
    extra: dict = field(default_factory=dict)


_REGISTRY_ATTR = "_hpcfsdp_registry"


def registry(module: Any) -> dict:
    """The per-module registry of composable states (the analogue of torch's `_get_registry`)."""
    reg = module.__dict__.get(_REGISTRY_ATTR)
    if reg is None:
        reg = {}
        object.__setattr__(module, _REGISTRY_ATTR, reg)
    return reg


def get_module_fsdp_state(module: Any):
    return registry(module).get("fully_shard")
