"""Parameter-keyed sharding specs (ChunkShardingSpec) and their application as tensor parallelism."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ...nn import Linear, Module
from ..tensor import DTensor
from ..tensor.parallel.style import ColwiseParallel, RowwiseParallel
from ..tensor.placement_types import Replicate, Shard

__all__ = ["ChunkShardingSpec", "apply_param_specs"]

# [Note: Parameter specs as tensor parallelism]
# A ShardingPlan entry keyed by a parameter name maps to a ChunkShardingSpec: that parameter becomes a
# DTensor with Shard(dim) on the spec's mesh dim (torch.chunk pieces, as DTensor). A Linear's weight
# sharded on dim 0 makes the Linear column-wise (bias sharded with it; replicated input, output sharded on
# its last dim), on dim 1 row-wise (bias replicated; input sharded on its last dim, output all-reduced, or
# reduce-scattered on dim d when output_plan gives the module ChunkShardingSpec(d)). The autograd
# collectives keep forward and backward exact. Outputs are always local tensors, so every module behaves
# as listed in return_local_tensor.

_RANK_DEVICE = re.compile(r"^rank:(\d+)/(\w+)(:\d+)?$")


@dataclass
class ChunkShardingSpec:
    """Shard a tensor along ``dim`` into torch.chunk pieces over ``mesh_dim`` (name or index; None: the only
    dim of a 1-D mesh). ``placements``: optional ``"rank:N/device"`` strings, piece i on rank N; on a 1-D mesh
    they must list the mesh's ranks in mesh order."""

    dim: int
    placements: Optional[List[Any]] = None
    mesh_dim: Optional[Any] = None

    def __post_init__(self) -> None:
        if isinstance(self.dim, bool) or not isinstance(self.dim, int):
            raise TypeError(f"ChunkShardingSpec.dim must be an int, got {self.dim!r}")
        if self.placements is not None:
            if isinstance(self.placements, str) or not isinstance(self.placements, (list, tuple)):
                raise TypeError(f"ChunkShardingSpec.placements must be a list of 'rank:N/device' strings, "
                                f"got {self.placements!r}")
            for p in self.placements:
                if not isinstance(p, str) or not _RANK_DEVICE.match(p):
                    raise ValueError(f"ChunkShardingSpec placement {p!r}: expected 'rank:N/device' (e.g. 'rank:0/cpu')")
        md = self.mesh_dim
        if md is not None and (isinstance(md, bool) or not isinstance(md, (int, str))):
            raise TypeError(f"ChunkShardingSpec.mesh_dim must be a mesh dim name, an index or None, got {self.mesh_dim!r}")

    def resolve(self, mesh, key: str):
        """The 1-D mesh this spec shards over (checked against ``mesh``)."""
        if mesh is None:
            raise ValueError(f"ShardingPlan entry {key!r}: a ChunkShardingSpec needs a mesh (apply_sharding_plan(..., mesh=))")
        names = tuple(mesh.mesh_dim_names or ())
        md = self.mesh_dim
        if md is None:
            if mesh.ndim != 1:
                raise ValueError(f"ShardingPlan entry {key!r}: mesh_dim is required on the {mesh.ndim}-d mesh {mesh!r}")
            md = 0
        if isinstance(md, str):
            if md not in names:
                raise ValueError(f"ShardingPlan entry {key!r}: mesh_dim {md!r} is not a dim of the mesh (dims {names})")
            md = names.index(md)
        if not 0 <= md < mesh.ndim:
            raise ValueError(f"ShardingPlan entry {key!r}: mesh_dim {self.mesh_dim!r} is out of range for a "
                             f"{mesh.ndim}-d mesh")
        sub = mesh[names[md]] if mesh.ndim > 1 else mesh
        if self.placements is not None:
            ranks = [int(_RANK_DEVICE.match(p).group(1)) for p in self.placements]
            if ranks != [int(r) for r in sub.mesh.reshape(-1)]:
                raise ValueError(f"ShardingPlan entry {key!r}: placements name ranks {ranks}, but the pieces go to "
                                 f"the mesh dim's ranks in order {[int(r) for r in sub.mesh.reshape(-1)]}")
        return sub


def _find_param(module: Module, key: str):
    mod_name, _, pname = key.rpartition(".")
    try:
        owner = module.get_submodule(mod_name) if mod_name else module
    except (AttributeError, KeyError):
        return None, None, None
    if pname not in owner._parameters or owner._parameters[pname] is None:
        return None, None, None
    return mod_name, owner, pname


def apply_param_specs(module: Module, specs: Dict[str, ChunkShardingSpec], output_plan, mesh) -> None:
    """Shard the parameters named in ``specs`` and wrap their Linears; see [Note: Parameter specs as
    tensor parallelism]. Every check runs before anything changes."""
    from ..fsdp import FSDPModule

    output_plan = dict(output_plan or {})
    work = []
    for key, spec in specs.items():
        mod_name, owner, pname = _find_param(module, key)
        if owner is None:
            raise ValueError(f"ShardingPlan names parameter {key!r}, which {type(module).__name__} does not have "
                             "(use names from named_parameters())")
        if isinstance(owner, FSDPModule) or isinstance(owner._parameters[pname], DTensor):
            raise ValueError(f"ShardingPlan entry {key!r}: the parameter is already sharded (fully_shard or an earlier "
                             "plan owns it); apply tensor parallelism before fully_shard")
        sub = spec.resolve(mesh, key)
        p = owner._parameters[pname]
        dim = spec.dim % p.ndim if -p.ndim <= spec.dim < p.ndim else None
        if dim is None:
            raise ValueError(f"ShardingPlan entry {key!r}: dim {spec.dim} is out of range for shape {tuple(p.shape)}")
        n = sub.size(0)
        if p.shape[dim] % n:
            raise ValueError(f"ShardingPlan entry {key!r}: dim {dim} of shape {tuple(p.shape)} does not divide over "
                             f"{n} ranks")
        if not isinstance(owner, Linear) or pname != "weight":
            raise NotImplementedError(f"ShardingPlan entry {key!r}: parameter specs shard Linear weights (column-wise "
                                      "dim 0, row-wise dim 1)")
        out = output_plan.pop(mod_name, None)
        if out is not None and not isinstance(out, ChunkShardingSpec):
            raise TypeError(f"ShardingPlan.output_plan[{mod_name!r}] must be a ChunkShardingSpec, got {out!r}")
        if dim == 0:
            if out is not None and out.dim not in (-1, p.ndim - 1):
                raise NotImplementedError(f"ShardingPlan.output_plan[{mod_name!r}]: a column-wise Linear's output is "
                                          "sharded on its last dim (ChunkShardingSpec(dim=-1))")
            style = ColwiseParallel()
        else:
            style = RowwiseParallel(output_layouts=Shard(out.dim) if out is not None else Replicate())
        if mod_name + ".bias" in specs:
            raise ValueError(f"ShardingPlan entry {mod_name + '.bias'!r}: a Linear's bias follows its weight's spec; "
                             "name only the weight")
        work.append((owner, style, sub))
    if output_plan:
        key = sorted(output_plan)[0]
        raise ValueError(f"ShardingPlan.output_plan names module {key!r}, whose weight the plan does not shard "
                         "(output layouts apply to tensor-parallel Linears)")
    for owner, style, sub in work:
        style._apply(owner, sub)
