"""Sharding plans: fully_shard units (chosen by planners) and tensor-parallel parameter specs, applied in one call."""

from ._tensor_parallel import ChunkShardingSpec
from .api import FullyShardSpec, ShardingPlan, ShardingPlanner, UnitStats, apply_sharding_plan
from .planners import MemoryBudgetPlanner, MemoryEstimate, ModuleClassPlanner, ParamCountPlanner

__all__ = [
    "ChunkShardingSpec",
    "ShardingPlan",
    "ShardingPlanner",
    "FullyShardSpec",
    "UnitStats",
    "ParamCountPlanner",
    "ModuleClassPlanner",
    "MemoryBudgetPlanner",
    "MemoryEstimate",
    "apply_sharding_plan",
]
