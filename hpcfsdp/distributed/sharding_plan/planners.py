"""Concrete ShardingPlanners: by parameter count, by module class, by a per-rank memory budget."""

import math
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional

from ...nn import Module
from .. import distributed_c10d as c10d
from ..fsdp.wrap import ModuleWrapPolicy, select_units, size_based_auto_wrap_policy
from .api import (
    _CONTAINERS,
    ShardingPlan,
    ShardingPlanner,
    _fmt_bytes,
    _named_modules,
    _param_holders,
    _shown,
    make_plan,
    unit_stats,
)

__all__ = ["ParamCountPlanner", "ModuleClassPlanner", "MemoryBudgetPlanner", "MemoryEstimate"]


def _escaping(module: Module) -> set:
    """FQNs of modules whose subtree holds a parameter that a module outside it holds too.

    Such a module cannot be a unit; see [Note: Tied parameters and units]."""
    out = set()
    for _, holders in _param_holders(module):
        if len(holders) < 2:
            continue
        ancestors = [{a for a in _prefixes(h)} for h in holders]
        out |= set.union(*ancestors) - set.intersection(*ancestors)
    return out


def _prefixes(fqn: str) -> List[str]:
    """``"a.b.c"`` -> ``["", "a", "a.b", "a.b.c"]``."""
    parts = fqn.split(".") if fqn else []
    return [""] + [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _fqns(module: Module) -> Dict[int, str]:
    return {id(m): fqn for fqn, m in module.named_modules()}


class ParamCountPlanner(ShardingPlanner):
    """Units by size, bottom-up like ``size_based_auto_wrap_policy``: a module becomes a unit once the
    parameters below it that no deeper unit took reach ``min_num_params``. Containers (ModuleList,
    ModuleDict) and modules whose tied parameters escape their subtree are never units."""

    def __init__(self, min_num_params: int = int(1e8)):
        if isinstance(min_num_params, bool) or not isinstance(min_num_params, int) or min_num_params < 1:
            raise ValueError(f"ParamCountPlanner: min_num_params must be a positive int, got {min_num_params!r}")
        self.min_num_params = min_num_params

    def build_plan(self, module: Module) -> ShardingPlan:
        _named_modules(module)
        fqns, escaping = _fqns(module), _escaping(module)

        def policy(m, recurse: bool, nonwrapped_numel: int) -> bool:
            if not recurse and fqns[id(m)] in escaping:
                return False
            return size_based_auto_wrap_policy(m, recurse, nonwrapped_numel, min_num_params=self.min_num_params)

        return make_plan(module, [fqns[id(m)] for m in select_units(module, policy)])

    def __repr__(self) -> str:
        return f"ParamCountPlanner(min_num_params={self.min_num_params})"


class ModuleClassPlanner(ShardingPlanner):
    """Every instance of ``module_classes`` (below the root) is a unit, like ``ModuleWrapPolicy``.

    build_plan raises ValueError when such an instance shares a tied parameter with a module outside it.
    """

    def __init__(self, module_classes: Iterable[type] | type):
        classes = (module_classes,) if isinstance(module_classes, type) else tuple(module_classes)
        if not classes:
            raise ValueError("ModuleClassPlanner: module_classes must name at least one Module class, got none")
        for c in classes:
            if not (isinstance(c, type) and issubclass(c, Module)):
                raise TypeError(f"ModuleClassPlanner expects Module classes, got {c!r}")
            if issubclass(c, _CONTAINERS):
                raise ValueError(f"ModuleClassPlanner: {c.__name__} is a container without forward; it cannot be "
                                 "a fully_shard unit (name the class of its elements)")
        self.module_classes = classes

    def build_plan(self, module: Module) -> ShardingPlan:
        _named_modules(module)
        fqns = _fqns(module)
        return make_plan(module, [fqns[id(m)] for m in select_units(module, ModuleWrapPolicy(self.module_classes))])

    def __repr__(self) -> str:
        return f"ModuleClassPlanner({[c.__name__ for c in self.module_classes]})"


# [Note: Memory model]
# MemoryBudgetPlanner estimates one rank's peak memory for parameters, gradients and optimizer state
# when a module is trained under FSDP with a given set of units, over W ranks (the shard dimension):
#
#   sharded state   S = sum over params of shard_bytes(p) * (1 + (1 + k) * trainable(p))
#                   (the parameter shard, its gradient shard and k optimizer states of the same size;
#                   k = optimizer_state_factor, 2 for Adam/AdamW: exp_avg and exp_avg_sq), where
#                   shard_bytes(p) = ceil(rows / W) * row_numel * itemsize, FSDP's padded dim-0 shard;
#   unit u at work  (1 + prefetch) * B(u) + G(u): the unit's gathered parameters B(u) (numel * itemsize),
#                   as many more gathered for the prefetched units (taken to be as large as u), and
#                   the unit's unsharded gradients G(u) (its trainable parameters' bytes);
#   required        S + max over units of ((1 + prefetch) * B(u) + G(u)).
#
# A unit fits when S + (1 + prefetch) * B(u) + G(u) <= budget; a plan fits when every unit does.
# With all parameters trainable S = (2 + k) * total_bytes / W up to padding. The estimate leaves out
# activations, communication buffers (the all-gather output before it is copied into the parameters,
# reductions still in flight) and the root unit staying gathered from its forward to its backward
# when reshard_after_forward is left to FSDP; keep headroom for them. With CPUOffloadPolicy the
# sharded state lives on the host.
#
# The planner works top-down: the root starts as the only unit; a unit that does not fit is split by
# making units of its largest "candidates" (children with parameters, looking through containers and
# through children whose tied parameters escape them) until what stays in the unit fits; candidates
# as large as the smallest one taken are taken too, so equal siblings (transformer blocks) stay alike.
# Each new unit is checked the same way; a unit whose parameters all went to its children is dropped.
# When even all candidates taken leave too much (a leaf module, or a module whose own or tied
# parameters are too large), no plan can fit: ValueError.


@dataclass(frozen=True)
class MemoryEstimate:
    """One rank's estimated memory for a plan; see [Note: Memory model]."""

    budget_bytes: int
    world_size: int
    sharded_state_bytes: int  # S
    unit_bytes: Dict[str, int]  # (1 + prefetch) * B(u) + G(u) per unit
    largest_unit: str  # the unit with the largest working set
    required_bytes: int  # S + max unit_bytes

    @property
    def fits(self) -> bool:
        return self.required_bytes <= self.budget_bytes


class MemoryBudgetPlanner(ShardingPlanner):
    """The finest reasonable units such that every unit fits ``budget_bytes`` per rank.

    Args:
        budget_bytes: per-rank bytes for parameters, gradients and optimizer state (see [Note: Memory model]).
        world_size: ranks the parameters are sharded over; None: ``hpcfsdp.distributed.get_world_size()``
            when the plan is built. For HSDP, the size of the shard dimension.
        optimizer_state_factor: optimizer state per parameter, in parameter sizes (2.0 for Adam/AdamW,
            1.0 for SGD with momentum, 0.0 for plain SGD).
        prefetch: how many units are gathered ahead of the one at work.
    """

    def __init__(self, budget_bytes: int, world_size: Optional[int] = None, optimizer_state_factor: float = 2.0,
                 prefetch: int = 1):
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, float)) or not budget_bytes > 0 \
                or not math.isfinite(budget_bytes):
            raise ValueError(f"MemoryBudgetPlanner: budget_bytes must be a positive number, got {budget_bytes!r}")
        if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int)
                                       or world_size < 1):
            raise ValueError(f"MemoryBudgetPlanner: world_size must be a positive int or None, got {world_size!r}")
        if isinstance(optimizer_state_factor, bool) or not isinstance(optimizer_state_factor, (int, float)) \
                or not optimizer_state_factor >= 0 or not math.isfinite(optimizer_state_factor):
            raise ValueError("MemoryBudgetPlanner: optimizer_state_factor must be a number >= 0, "
                             f"got {optimizer_state_factor!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"MemoryBudgetPlanner: prefetch must be an int >= 0, got {prefetch!r}")
        self.budget_bytes = int(budget_bytes)
        self.world_size = world_size
        self.optimizer_state_factor = float(optimizer_state_factor)
        self.prefetch = prefetch

    def __repr__(self) -> str:
        return (f"MemoryBudgetPlanner(budget_bytes={self.budget_bytes}, world_size={self.world_size}, "
                f"optimizer_state_factor={self.optimizer_state_factor}, prefetch={self.prefetch})")

    # -- the model ----------------------------------------------------------------------------------
    def _world(self) -> int:
        return self.world_size if self.world_size is not None else c10d.get_world_size()

    def _sharded_state(self, params, world: int) -> int:
        total = 0.0
        for p in params:
            shape = tuple(p.shape)
            rows, row_numel = (shape[0], math.prod(shape[1:])) if shape else (1, 1)
            shard = math.ceil(rows / world) * row_numel * p.element_size()
            total += shard * (1 + (1 + self.optimizer_state_factor) * bool(p.requires_grad))
        return math.ceil(total)

    def _working(self, nbytes: int, gbytes: int) -> int:
        return (1 + self.prefetch) * nbytes + gbytes

    def estimate(self, module: Module, plan: ShardingPlan) -> MemoryEstimate:
        """The [Note: Memory model] numbers of ``plan`` on ``module``."""
        world = self._world()
        stats = unit_stats(module, list(plan.plan))
        s = self._sharded_state([p for p, _ in _param_holders(module)], world)
        unit = {u: self._working(st.unsharded_bytes, st.grad_bytes) for u, st in stats.items()}
        largest = max(unit, key=lambda u: unit[u])
        return MemoryEstimate(self.budget_bytes, world, s, unit, largest, s + unit[largest])

    # -- the planner --------------------------------------------------------------------------------
    def build_plan(self, module: Module) -> ShardingPlan:
        mods = _named_modules(module)
        world = self._world()
        holders = _param_holders(module)
        info = {id(p): (p.numel() * p.element_size(), p.numel() * p.element_size() * bool(p.requires_grad))
                for p, _ in holders}
        s = self._sharded_state([p for p, _ in holders], world)
        budget = self.budget_bytes
        subtree: Dict[str, set] = {}  # fqn -> ids of the parameters in its subtree
        for p, hs in holders:
            for h in hs:
                for a in _prefixes(h):
                    subtree.setdefault(a, set()).add(id(p))
        escaping = _escaping(module)

        def size(ids) -> tuple:
            return sum(info[i][0] for i in ids), sum(info[i][1] for i in ids)

        def need(ids) -> int:
            return s + self._working(*size(ids))

        def candidates(fqn: str) -> List[str]:
            out = []
            for name, child in mods[fqn]._modules.items():
                cf = f"{fqn}.{name}" if fqn else name
                if child is None or not subtree.get(cf) or mods.get(cf) is not child:
                    continue
                if isinstance(child, _CONTAINERS) or cf in escaping:
                    out.extend(candidates(cf))
                else:
                    out.append(cf)
            return out

        if s > budget:
            raise ValueError(
                f"MemoryBudgetPlanner: no plan fits budget_bytes={_fmt_bytes(budget)}: the sharded parameters, "
                f"gradients and optimizer state of {_shown('')} ({module._get_name()}) alone need "
                f"{_fmt_bytes(s)} per rank over {world} ranks; use more ranks or a larger budget")
        units: Dict[str, set] = {"": set(subtree.get("", ()))}
        queue = [""]
        while queue:
            u = queue.pop(0)
            own = units[u]
            if need(own) <= budget:
                continue
            cands = sorted(candidates(u), key=lambda c: -size(subtree[c])[0])  # stable: module order on ties
            rest, k = set(own), None
            for i, c in enumerate(cands):
                rest -= subtree[c]
                if need(rest) <= budget:
                    k = i
                    break
            if k is None:
                what = ("a leaf module" if not cands else
                        "what stays after splitting off all its children (its own or tied parameters)")
                raise ValueError(
                    f"MemoryBudgetPlanner: no plan fits budget_bytes={_fmt_bytes(budget)} per rank: module "
                    f"{_shown(u)} ({mods[u]._get_name()}) needs {_fmt_bytes(need(rest))} as a unit "
                    f"(sharded state {_fmt_bytes(s)} + {1 + self.prefetch} x {_fmt_bytes(size(rest)[0])} gathered "
                    f"+ {_fmt_bytes(size(rest)[1])} gradients, world_size={world}) and {what} cannot be split "
                    "further; use a larger budget, more ranks or a finer module")
            threshold = size(subtree[cands[k]])[0]
            for c in candidates(u):  # module order
                if size(subtree[c])[0] >= threshold:
                    units[c] = set(subtree[c])
                    own -= subtree[c]
                    queue.append(c)
        # a unit left without parameters of its own (all split off to its children) is no unit at all
        plan = make_plan(module, [u for u, own in units.items() if u and own])
        assert all(s + self._working(sp.stats.unsharded_bytes, sp.stats.grad_bytes) <= budget
                   for sp in plan.plan.values())
        return plan
