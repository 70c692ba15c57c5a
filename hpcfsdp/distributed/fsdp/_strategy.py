"""ShardingStrategy mapped onto fully_shard: which mesh, which data-parallel dims, which resharding."""


from ..device_mesh import init_device_mesh
from ._fully_shard import DataParallelMeshDims
from .api import ShardingStrategy

__all__ = ["strategy_mesh", "strategy_kwargs", "node_size"]


def node_size(world: int) -> int:
    """Ranks per node: HPCFSDP_RANKS_PER_NODE, else MPI's shared-memory split (equal on every node)."""
    from .. import _mpi

    layout = _mpi.node_layout()
    k = layout["local_size"]
    if world != k * layout["num_nodes"] or not layout["node_major"]:
        raise ValueError(f"HYBRID_SHARD needs the same number of ranks on every node; {world} ranks on "
                         f"{layout['num_nodes']} nodes, {k} on this one, node-major numbering (set HPCFSDP_RANKS_PER_NODE to override)")
    return k


def strategy_mesh(strategy: ShardingStrategy, device_type: str = "cpu", device_mesh=None):
    """The mesh and dp_mesh_dims for ``strategy``; validates a user-given mesh against it."""
    from ..distributed_c10d import get_world_size

    if not isinstance(strategy, ShardingStrategy):
        raise TypeError(f"sharding_strategy must be a ShardingStrategy, got {strategy!r}")
    hybrid = strategy in (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)
    if device_mesh is not None:
        if hybrid and device_mesh.ndim != 2:
            raise ValueError(f"{strategy.name} needs a 2-D (replicate, shard) device_mesh, got a "
                             f"{device_mesh.ndim}-D mesh of shape {tuple(device_mesh.shape)}")
        if hybrid:
            from ..device_mesh import _check_node_local
            from .._c10d_groups import default_group

            _check_node_local(device_mesh, 1, default_group())  # shard groups must stay inside a node
        if not hybrid and device_mesh.ndim != 1:
            raise ValueError(f"{strategy.name} needs a 1-D device_mesh, got a {device_mesh.ndim}-D mesh of shape "
                             f"{tuple(device_mesh.shape)}; use HYBRID_SHARD for a 2-D mesh")
        mesh = device_mesh
    else:
        world = get_world_size()
        if hybrid:
            k = node_size(world)
            mesh = init_device_mesh(device_type, (world // k, k), mesh_dim_names=("replicate", "shard"),
                                    node_local_dim="shard")
        elif strategy == ShardingStrategy.NO_SHARD:
            mesh = init_device_mesh(device_type, (world,), mesh_dim_names=("replicate",))
        else:
            mesh = init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))
    dims = None
    if strategy == ShardingStrategy.NO_SHARD:
        if not mesh.mesh_dim_names:
            raise ValueError("NO_SHARD with a user device_mesh needs mesh_dim_names, e.g. "
                             "init_device_mesh('cpu', (world,), mesh_dim_names=('replicate',))")
        dims = DataParallelMeshDims(replicate=mesh.mesh_dim_names[0])
    return mesh, dims


def strategy_kwargs(strategy: ShardingStrategy) -> dict:
    """fully_shard keyword arguments of ``strategy`` (besides the mesh). FULL_SHARD / HYBRID_SHARD pass None:
    every unit frees its parameters after forward except the root, which keeps them for the backward that
    follows at once (PyTorch's FSDP1: one all-gather fewer per iteration)."""
    keep = strategy in (ShardingStrategy.SHARD_GRAD_OP, ShardingStrategy._HYBRID_SHARD_ZERO2,
                        ShardingStrategy.NO_SHARD)
    return {"reshard_after_forward": False if keep else None}
