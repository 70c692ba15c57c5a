"""Sharding plans: which modules become fully_shard units, chosen by planners, applied in one call."""

from .api import FullyShardSpec, ShardingPlan, ShardingPlanner, UnitStats, apply_sharding_plan
from .planners import MemoryBudgetPlanner, MemoryEstimate, ModuleClassPlanner, ParamCountPlanner

__all__ = [
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
