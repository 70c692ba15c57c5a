"""fully_shard's argument checks and set-up: default mesh, mesh infos, managed modules and parameters."""

from typing import Any, Iterable

from ....nn import Module, ModuleDict, ModuleList
from ... import device_mesh as _dm
from ._fsdp_api import DataParallelMeshDims
from ._fsdp_common import DDPMeshInfo, FSDPMeshInfo, HSDPMeshInfo, get_module_fsdp_state

__all__ = [
    "validate_module",
    "get_root_modules",
    "validate_mesh",
    "init_default_mesh",
    "get_mesh_info",
    "get_post_forward_mesh_info",
    "get_managed_modules_and_params",
    "get_device_from_mesh",
]


def validate_module(module: Any) -> None:
    if not isinstance(module, Module):
        raise ValueError(f"fully_shard expects an nn.Module, got {type(module).__name__}")
    if isinstance(module, (ModuleList, ModuleDict)) and type(module).forward is Module.forward:
        raise ValueError(f"fully_shard does not support containers that do not implement forward: {module}")


def get_root_modules(modules) -> list:
    """The modules of ``modules`` that are not inside another one of them (in the given order)."""
    inner = set()
    for m in modules:
        for sub in m.modules():
            if sub is not m:
                inner.add(id(sub))
    return [m for m in modules if id(m) not in inner]


_default_meshes: dict = {}


def init_default_mesh(device_type: str = "cpu"):
    """A 1-D mesh over the default process group's ranks (created once per device type)."""
    mesh = _default_meshes.get(device_type)
    if mesh is None:
        from ... import distributed_c10d as c10d

        # unnamed, as PyTorch's default: it compares equal to init_device_mesh(device_type, (world,))
        mesh = _dm.init_device_mesh(device_type, (c10d.get_world_size(),))
        _default_meshes[device_type] = mesh
    return mesh


def validate_mesh(mesh: Any, dp_mesh_dims: DataParallelMeshDims | None) -> None:
    if not isinstance(mesh, _dm.DeviceMesh):
        raise ValueError(f"fully_shard expects a DeviceMesh for mesh=, got {type(mesh).__name__}")
    if dp_mesh_dims is None:
        if mesh.ndim not in (1, 2):
            raise ValueError(
                f"fully_shard expects a 1D mesh (shard) or a 2D mesh (replicate, shard), got a {mesh.ndim}D mesh; "
                "pass dp_mesh_dims=DataParallelMeshDims(...) to name the data-parallel dims of an N-D mesh"
            )
        if mesh.ndim == 2 and mesh.mesh_dim_names is None:  # PyTorch asserts (AssertionError), in these words
            raise AssertionError("Please init the 2D mesh for HSDP with mesh_dim_names specified")
        return
    if not isinstance(dp_mesh_dims, DataParallelMeshDims):
        raise TypeError(f"dp_mesh_dims must be a DataParallelMeshDims, got {type(dp_mesh_dims).__name__}")
    names = tuple(mesh.mesh_dim_names or ())
    for name in dp_mesh_dims.shard_names + dp_mesh_dims.replicate_names:
        if name not in names:
            raise ValueError(f"dp_mesh_dims names mesh dim {name!r}, but the mesh has dims {names}")
    overlap = set(dp_mesh_dims.shard_names) & set(dp_mesh_dims.replicate_names)
    if overlap:
        raise ValueError(f"mesh dims {sorted(overlap)} are named as both shard and replicate dims")


def _dim_group(mesh, names: tuple[str, ...]):
    """(process group, size, rank) of the mesh dims ``names`` flattened into one group, ranked in mesh order
    (row-major over those dims: the order in which DTensor nests Shard placements on them)."""
    sub = mesh[names[0]] if len(names) == 1 else mesh[names]._flatten()
    return sub.get_group(0), sub.size(), sub.get_local_rank(0)


def get_mesh_info(mesh: Any, dp_mesh_dims: DataParallelMeshDims | None):
    if dp_mesh_dims is None:
        if mesh.ndim == 1:
            pg = mesh.get_group(0)
            return FSDPMeshInfo(mesh, 0, pg, pg.size(), pg.rank())
        shard_pg, rep_pg = mesh.get_group(1), mesh.get_group(0)
        return HSDPMeshInfo(mesh, 1, shard_pg, shard_pg.size(), shard_pg.rank(),
                            replicate_mesh_dim=0, replicate_process_group=rep_pg,
                            replicate_world_size=rep_pg.size(), replicate_mesh_rank=rep_pg.rank())
    names = tuple(mesh.mesh_dim_names)
    dp = set(dp_mesh_dims.shard_names + dp_mesh_dims.replicate_names)
    spmd = any(n not in dp for n in names)
    if not dp_mesh_dims.shard_names:
        pg, size, rank = _dim_group(mesh, dp_mesh_dims.replicate_names)
        return DDPMeshInfo(mesh, names.index(dp_mesh_dims.replicate_names[0]), pg, size, rank)
    shard_names = tuple(sorted(dp_mesh_dims.shard_names, key=names.index))
    shard_group, shard_size, shard_rank = _dim_group(mesh, shard_names)
    shard_mesh_dims = tuple(names.index(n) for n in shard_names)
    if not dp_mesh_dims.replicate_names:
        return FSDPMeshInfo(mesh, shard_mesh_dims[0], shard_group, shard_size, shard_rank, is_spmd_mesh=spmd,
                            shard_mesh_dims=shard_mesh_dims)
    replicate_group, replicate_size, replicate_rank = _dim_group(mesh, dp_mesh_dims.replicate_names)
    return HSDPMeshInfo(mesh, shard_mesh_dims[0], shard_group, shard_size, shard_rank, is_spmd_mesh=spmd,
                        shard_mesh_dims=shard_mesh_dims,
                        replicate_mesh_dim=names.index(dp_mesh_dims.replicate_names[0]),
                        replicate_process_group=replicate_group, replicate_world_size=replicate_size,
                        replicate_mesh_rank=replicate_rank)


_post_forward_groups: dict = {}


def get_post_forward_mesh_info(reshard_after_forward: Any, mesh_info: FSDPMeshInfo):
    """The group parameters are resharded onto after forward: the shard group (True), none (False),
    or a smaller group of ``reshard_after_forward`` consecutive shard ranks (int), e.g. one node."""
    if not isinstance(reshard_after_forward, (bool, int)):
        raise ValueError(
            "reshard_after_forward should be a bool or an int representing the group size to reshard to, "
            f"not {reshard_after_forward!r}"
        )
    size = mesh_info.shard_world_size
    if not isinstance(reshard_after_forward, bool):
        k = reshard_after_forward
        if k < 1 or k > size or size % k:
            raise ValueError(f"If passing reshard_after_forward as an int, it should be a factor of {size}, not {k}")
        if k == 1:
            reshard_after_forward = False
        elif k == size:
            reshard_after_forward = True
        else:
            parent = mesh_info.shard_process_group
            key = (id(parent), k)
            pg = _post_forward_groups.get(key)
            if pg is None:
                pg = parent.split(parent.rank() // k, parent.rank())
                _post_forward_groups[key] = pg
            return FSDPMeshInfo(mesh_info.mesh, None, pg, pg.size(), pg.rank())
    return mesh_info if reshard_after_forward else None


def get_device_from_mesh(mesh) -> str:
    """The compute device of a mesh: cpu, or this rank's current CUDA device (chosen by init_device_mesh)."""
    from .... import _backend

    return str(_backend.to_device(getattr(mesh, "device_type", "cpu")))


def get_managed_modules_and_params(root_modules: Iterable[Module], ignored_params: set | None):
    """Modules this fully_shard call manages (its roots' subtrees, stopping at modules already sharded)
    and their parameters: a list of (param, [(module, attr name), ...]) without duplicates (tied weights
    share one entry that lists every module using it)."""
    ignored = set(map(id, ignored_params or ()))
    managed, seen_mod = [], set()

    def visit(m, is_root):
        if id(m) in seen_mod:
            return
        if not is_root and get_module_fsdp_state(m) is not None:
            return
        seen_mod.add(id(m))
        managed.append(m)
        for child in m._modules.values():
            if child is not None:
                visit(child, False)

    for r in root_modules:
        visit(r, True)
    params, index = [], {}
    for m in managed:
        for name, p in m._parameters.items():
            if p is None or id(p) in ignored:
                continue
            if id(p) in index:
                params[index[id(p)]][1].append((m, name))
            else:
                index[id(p)] = len(params)
                params.append((p, [(m, name)]))
    return managed, params


def check_param_devices(params, device: str) -> None:
    want = "cuda" if device.startswith("cuda") else device
    for p, infos in params:
        have = p.device.type
        if have not in (want, "meta"):
            m, name = infos[0]
            raise ValueError(
                f"fully_shard on a {want!r} mesh: parameter {type(m).__name__}.{name} is on {str(p.device)!r}; "
                f"move the module to {want!r} (or build it on 'meta') first"
            )
