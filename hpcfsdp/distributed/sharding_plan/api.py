"""ShardingPlan and ShardingPlanner for fully_shard units, and apply_sharding_plan."""

import abc
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional

from ...nn import Module, ModuleDict, ModuleList
from ..fsdp import FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from ._tensor_parallel import ChunkShardingSpec, apply_param_specs

__all__ = ["ShardingPlan", "ShardingPlanner", "FullyShardSpec", "UnitStats", "apply_sharding_plan"]

# [Note: Sharding plans for FSDP]
# PyTorch's ShardingPlan (torch.distributed._shard) maps parameter or module names to a ShardingSpec
# or a Sharder and builds ShardedTensors. hpcfsdp shards the FSDP way, so a plan maps the fully
# qualified name of a module ("" is the root) to a FullyShardSpec: that module becomes one
# ``fully_shard`` unit (one parameter group, one all-gather and one reduce-scatter per pass) with the
# spec's keyword arguments. A unit owns the parameters of its subtree that no deeper unit owns; the
# root is always a unit, so every parameter has exactly one owner. Planners emit units children
# first (post-order) with the root last, the order ``fully_shard`` must be applied in.
#
# A plan may also key parameters to a ChunkShardingSpec: tensor parallelism, applied before the
# fully_shard units (see [Note: Parameter specs as tensor parallelism]); ``output_plan`` then gives the
# output layout of those tensor-parallel Linears. Outputs are always local tensors, so every module
# behaves as if listed in ``return_local_tensor``; it is accepted and checked. A plan of parameter specs
# only does not fully_shard anything; with any FullyShardSpec the root is a unit as well.
#
# [Note: Tied parameters and units]
# A parameter held by several modules (GPT's token embedding is also its lm_head) must belong to one
# unit: FSDP replaces it by one sharded DTensor and gathers it with one group. Module m's owner is
# the deepest unit whose subtree contains m; every module holding a tied parameter must have the same
# owner. apply_sharding_plan checks this before sharding anything; the planners never pick a module
# as a unit when a parameter inside its subtree is also held outside it ("escaping").


def _fmt_bytes(n: float) -> str:
    """``12,416 B (12.1 KiB)``: exact and readable."""
    n = int(n)
    value, unit = float(n), "B"
    for u in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, u
    return f"{n:,} B" if unit == "B" else f"{n:,} B ({value:.1f} {unit})"


@dataclass(frozen=True)
class UnitStats:
    """What one unit holds: its module's class, its parameters (counted once) and their sizes.

    unsharded_bytes: bytes of the unit's parameters when gathered (sum of numel * itemsize).
    grad_bytes: bytes of the unsharded gradients of the unit's trainable parameters.
    """

    module_cls: str
    num_params: int
    unsharded_bytes: int
    grad_bytes: int


_SPEC_KWARGS = ("reshard_after_forward", "shard_placement_fn", "mp_policy", "offload_policy", "ignored_params")


@dataclass
class FullyShardSpec:
    """How one module is sharded: the keyword arguments of its ``fully_shard`` call, plus stats.

    A field left None is not passed, so ``fully_shard`` uses the value given to apply_sharding_plan
    (or its own default). ``stats`` describes the unit (filled by planners) and is not a kwarg.
    """

    reshard_after_forward: Optional[bool | int] = None  # see fully_shard; None: FSDP decides
    shard_placement_fn: Optional[Callable[[Any], Any]] = None  # param -> Shard(dim) or None (dim 0)
    mp_policy: Optional[MixedPrecisionPolicy] = None  # param/reduce dtypes of this unit
    offload_policy: Optional[OffloadPolicy] = None  # CPUOffloadPolicy keeps the shards on the host
    ignored_params: Optional[set] = None  # parameters this unit leaves unsharded
    stats: Optional[UnitStats] = None  # parameter count and bytes (filled by planners)

    def __post_init__(self) -> None:
        r = self.reshard_after_forward
        if r is not None and not isinstance(r, (bool, int)):
            raise TypeError(f"FullyShardSpec.reshard_after_forward must be a bool, an int or None, got {r!r}")
        if self.shard_placement_fn is not None and not callable(self.shard_placement_fn):
            raise TypeError(f"FullyShardSpec.shard_placement_fn must be callable, got {self.shard_placement_fn!r}")
        if self.mp_policy is not None and not isinstance(self.mp_policy, MixedPrecisionPolicy):
            raise TypeError(f"FullyShardSpec.mp_policy must be a MixedPrecisionPolicy, got {self.mp_policy!r}")
        if self.offload_policy is not None and not isinstance(self.offload_policy, OffloadPolicy):
            raise TypeError(f"FullyShardSpec.offload_policy must be an OffloadPolicy, got {self.offload_policy!r}")
        if self.stats is not None and not isinstance(self.stats, UnitStats):
            raise TypeError(f"FullyShardSpec.stats must be a UnitStats, got {type(self.stats).__name__}")

    def fully_shard_kwargs(self) -> Dict[str, Any]:
        """The kwargs this spec sets (fields that are not None, without ``stats``)."""
        return {k: getattr(self, k) for k in _SPEC_KWARGS if getattr(self, k) is not None}


@dataclass
class ShardingPlan:
    """How to shard a module: ``plan`` maps module FQNs ("" = root) to a FullyShardSpec each.

    Args:
        plan: ``{fqn: FullyShardSpec}``; each named module becomes a ``fully_shard`` unit. A mapping of
            fully_shard kwargs is accepted as a value and turned into a FullyShardSpec.
        output_plan: the layout of module outputs. FSDP outputs are always local full tensors, so only
            None or an empty dict is supported; see [Note: Sharding plans for FSDP].
        return_local_tensor: module FQNs whose outputs are returned as local tensors: implied for every
            module under FSDP; accepted and checked.
    """

    plan: Dict[str, FullyShardSpec]
    output_plan: Optional[Dict[str, Any]] = None
    return_local_tensor: Optional[List[str]] = None

    def __post_init__(self) -> None:
        if not isinstance(self.plan, Mapping):
            raise TypeError(f"ShardingPlan.plan must be a dict of module FQN -> FullyShardSpec, "
                            f"got {type(self.plan).__name__}")
        plan = {}
        for key, spec in self.plan.items():
            if not isinstance(key, str):
                raise TypeError(f"ShardingPlan.plan keys must be module FQNs (str), got {key!r}")
            if isinstance(spec, Mapping):
                bad = set(spec) - set(_SPEC_KWARGS) - {"stats"}
                if bad:
                    raise TypeError(f"ShardingPlan.plan[{key!r}] has unknown fully_shard kwargs {sorted(bad)}; "
                                    f"expected some of {list(_SPEC_KWARGS)}")
                spec = FullyShardSpec(**spec)
            if not isinstance(spec, (FullyShardSpec, ChunkShardingSpec)):
                raise TypeError(f"ShardingPlan.plan[{key!r}] must be a FullyShardSpec (module) or a "
                                f"ChunkShardingSpec (parameter), got {type(spec).__name__}")
            plan[key] = spec
        self.plan = plan
        if self.output_plan is not None and not isinstance(self.output_plan, Mapping):
            raise TypeError(f"ShardingPlan.output_plan must be a dict or None, got {type(self.output_plan).__name__}")
        rlt = self.return_local_tensor
        if rlt is not None:
            if isinstance(rlt, str) or not isinstance(rlt, (list, tuple)) or not all(isinstance(s, str) for s in rlt):
                raise TypeError(f"ShardingPlan.return_local_tensor must be a list of module FQNs or None, got {rlt!r}")

    def describe(self, module: Optional[Module] = None) -> str:
        """A table: unit FQN, class, parameter count and unsharded bytes per unit, then a total line.

        Units without stats are measured on ``module`` when given, else shown as ``?``.
        """
        keys = list(self.plan)
        stats = {k: s.stats for k, s in self.plan.items()}
        if module is not None and (any(s is None for s in stats.values()) or "" not in stats):
            stats = unit_stats(module, keys)
            keys = keys if "" in keys else keys + [""]  # the root is always a unit
        rows = [("unit", "class", "params", "unsharded bytes")]
        total_n = total_b = 0
        for key in keys:
            st = stats.get(key)
            name = key if key else "(root)"
            if st is None:
                rows.append((name, "?", "?", "?"))
                total_n = total_b = None
                continue
            rows.append((name, st.module_cls, f"{st.num_params:,}", f"{st.unsharded_bytes:,}"))
            if total_n is not None:
                total_n += st.num_params
                total_b += st.unsharded_bytes
        n_units = f"{len(keys)} unit" + ("s" if len(keys) != 1 else "")
        rows.append(("total", n_units, "?" if total_n is None else f"{total_n:,}",
                     "?" if total_b is None else f"{total_b:,}"))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = []
        for i, r in enumerate(rows):
            if i == len(rows) - 1:
                lines.append("  ".join("-" * w for w in widths))
            lines.append(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


class ShardingPlanner(abc.ABC):
    """Default ShardingPlanner interface: subclasses decide which modules become ``fully_shard`` units."""

    @abc.abstractmethod
    def build_plan(self, module: Module) -> ShardingPlan:
        """Given a Module, define how to shard it across ranks; returns a ShardingPlan."""


# ---------------------------------------------------------------------------------------- module tree
def _named_modules(module: Module) -> Dict[str, Module]:
    if not isinstance(module, Module):
        raise TypeError(f"expected an nn.Module, got {type(module).__name__}")
    return dict(module.named_modules())


def _post_order(module: Module) -> List[str]:
    """Module FQNs children before parents (each module once), the root last."""
    out, seen = [], set()

    def visit(m, fqn):
        if id(m) in seen:
            return
        seen.add(id(m))
        for name, child in m._modules.items():
            if child is not None:
                visit(child, f"{fqn}.{name}" if fqn else name)
        out.append(fqn)

    visit(module, "")
    return out


def _param_holders(module: Module) -> List[tuple]:
    """``[(param, [fqn of every module holding it directly]), ...]``, each parameter once, in module order."""
    index: Dict[int, int] = {}
    out: List[tuple] = []
    for fqn, m in module.named_modules():
        for p in m._parameters.values():
            if p is None:
                continue
            if id(p) in index:
                out[index[id(p)]][1].append(fqn)
            else:
                index[id(p)] = len(out)
                out.append((p, [fqn]))
    return out


def _inside(fqn: str, unit: str) -> bool:
    """Whether module ``fqn`` lies in the subtree of ``unit``."""
    return unit == "" or fqn == unit or fqn.startswith(unit + ".")


def _owner(fqn: str, units: List[str]) -> str:
    """The deepest unit whose subtree holds module ``fqn`` (``units`` includes "")."""
    return max((u for u in units if _inside(fqn, u)), key=lambda u: (u.count(".") + (u != ""), len(u)))


def _shown(fqn: str) -> str:
    return repr(fqn) if fqn else "'' (the root)"


def assign_params(module: Module, units: List[str], ignored: frozenset = frozenset()) -> Dict[str, list]:
    """``{unit: [params it owns]}`` for ``units`` plus the root; see [Note: Tied parameters and units].

    Raises ValueError naming both modules and both units when a tied parameter spans two units.
    """
    units = list(dict.fromkeys(list(units) + [""]))
    owned: Dict[str, list] = {u: [] for u in units}
    for p, holders in _param_holders(module):
        if id(p) in ignored:
            continue
        owners = [_owner(h, units) for h in holders]
        for h, o in zip(holders[1:], owners[1:]):
            if o != owners[0]:
                raise ValueError(
                    f"tied parameter of shape {tuple(p.shape)} is held by modules {_shown(holders[0])} and "
                    f"{_shown(h)}, which the plan puts in different units ({_shown(owners[0])} and {_shown(o)}); "
                    "FSDP needs a tied parameter inside one unit: make a common ancestor the unit instead")
        owned[owners[0]].append(p)
    return owned


def unit_stats(module: Module, units: List[str]) -> Dict[str, UnitStats]:
    """UnitStats of each unit of ``units`` (plus the root): what ``fully_shard`` would group there."""
    mods = _named_modules(module)
    for u in units:
        if u not in mods:
            raise ValueError(f"no module {u!r} in {type(module).__name__} (expected FQNs from named_modules())")
    stats = {}
    for u, params in assign_params(module, units).items():
        n = sum(p.numel() for p in params)
        b = sum(p.numel() * p.element_size() for p in params)
        g = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
        stats[u] = UnitStats(mods[u]._get_name(), int(n), int(b), int(g))
    return stats


def make_plan(module: Module, units: List[str]) -> ShardingPlan:
    """A ShardingPlan over ``units`` + root in post-order (root last), each spec empty but for its stats."""
    units = set(units) | {""}
    stats = unit_stats(module, list(units))
    order = [fqn for fqn in _post_order(module) if fqn in units]
    return ShardingPlan({fqn: FullyShardSpec(stats=stats[fqn]) for fqn in order})


# ------------------------------------------------------------------------------------------------ apply
_CONTAINERS = (ModuleList, ModuleDict)
_FULLY_SHARD_KWARGS = frozenset(inspect.signature(fully_shard).parameters) - {"module", "mesh"}


def apply_sharding_plan(module: Module, plan: ShardingPlan, mesh: Any = None, **fully_shard_kwargs) -> Module:
    """Apply ``fully_shard`` to every unit of ``plan``, deepest first and the root last; returns ``module``.

    Each unit gets ``fully_shard(unit, mesh=mesh, **{**fully_shard_kwargs, **spec.fully_shard_kwargs()})``.
    The root is a unit even when the plan omits it. Every check (keys name modules, no container units,
    tied parameters inside one unit, nothing already sharded) runs before any module is sharded.
    """
    if not isinstance(plan, ShardingPlan):
        raise TypeError(f"apply_sharding_plan expects a ShardingPlan, got {type(plan).__name__}")
    mods = _named_modules(module)
    bad = set(fully_shard_kwargs) - _FULLY_SHARD_KWARGS
    if bad:
        raise TypeError(f"apply_sharding_plan got unexpected fully_shard kwargs {sorted(bad)}; "
                        f"expected some of {sorted(_FULLY_SHARD_KWARGS)}")
    param_specs = {k: s for k, s in plan.plan.items() if isinstance(s, ChunkShardingSpec)}
    unit_specs = {k: s for k, s in plan.plan.items() if isinstance(s, FullyShardSpec)}
    if plan.output_plan and not param_specs:
        raise NotImplementedError(
            f"ShardingPlan.output_plan {sorted(plan.output_plan)} asks for sharded module outputs: that is tensor "
            "parallelism, which needs parameter ChunkShardingSpecs in the plan (see [Note: Sharding plans for FSDP])")
    for key in list(unit_specs) + list(plan.return_local_tensor or ()):
        if key not in mods:
            near = [n for n in mods if n and (key in n or n in key)][:5]
            raise ValueError(f"ShardingPlan names module {key!r}, which {type(module).__name__} does not have"
                             + (f" (similar names: {near})" if near else " (use FQNs from named_modules())"))
    for key in unit_specs:
        if key and isinstance(mods[key], _CONTAINERS):
            raise ValueError(f"ShardingPlan unit {key!r} is a {type(mods[key]).__name__}: it has no forward, so "
                             "FSDP's hooks would never gather its parameters; make its elements units instead")
    units = list(unit_specs)
    # tied parameters: ignored ones are never sharded, so they may cross units
    ignored = set(map(id, fully_shard_kwargs.get("ignored_params") or ()))
    for spec in unit_specs.values():
        ignored |= set(map(id, spec.ignored_params or ()))
    assign_params(module, units, frozenset(ignored))
    order = sorted(dict.fromkeys(units + [""]), key=lambda k: -(k.count(".") + (k != "")))
    if param_specs and not unit_specs:
        order = []  # tensor parallelism only: no fully_shard unit
    for key in order:
        if isinstance(mods[key], FSDPModule):
            raise RuntimeError(f"module {_shown(key)} is already sharded (fully_shard was applied to it)")
    if param_specs:
        apply_param_specs(module, param_specs, plan.output_plan, mesh)
        if not unit_specs:
            return module
    for key in order:
        spec = unit_specs.get(key)
        kwargs = {**fully_shard_kwargs, **(spec.fully_shard_kwargs() if spec is not None else {})}
        fully_shard(mods[key], mesh=mesh, **kwargs)
    return module
