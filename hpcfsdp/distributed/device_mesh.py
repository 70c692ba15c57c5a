"""DeviceMesh: an n-d array of ranks whose every dimension is an MPI communicator (Comm.Split)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from hpcfsdp.distributed import _comm_thread as CT
from hpcfsdp.distributed._c10d_groups import default_group
from hpcfsdp.distributed._mpi import node_comm
from hpcfsdp.distributed.process_group import ProcessGroup

__all__ = ["DeviceMesh", "init_device_mesh"]

# [Note: Mesh layout]
# init_device_mesh lays ranks out row-major, ``mesh = arange(world).reshape(mesh_shape)``, as
# PyTorch does: the last dimension holds consecutive ranks. Launchers number ranks node-major
# (Slurm's block distribution, mpiexec's default fill), so with a (replicate, shard) mesh whose
# shard size divides the ranks per node, every shard group lies inside one node and the
# replicate groups cross nodes: reduce-scatters stay on the fast intra-node links and only the
# smaller all-reduce of the shards goes over the network (HYBRID_SHARD).
# ``init_device_mesh(..., node_local_dim=name_or_index)`` checks this (collective): it raises
# ValueError when some group along that dimension spans two nodes, naming the ranks and nodes.
# Nodes come from Split_type(COMM_TYPE_SHARED) or HPCFSDP_RANKS_PER_NODE (see _mpi.node_comm).
#
# Each dimension's groups are made once, on the root mesh, with one Comm.Split of the default
# group per dimension (color = the rank's coordinates in the other dimensions). Sub-meshes
# (``mesh["shard"]``, ``mesh[("rep", "shard")]``) reuse the root's communicators: slicing
# creates no communicator and is local. ``_flatten()`` creates one communicator (collective).


class DeviceMesh:
    """An n-d array of default-group ranks with one ProcessGroup per dimension.

    ``DeviceMesh(device_type, mesh, *, mesh_dim_names=None)`` is collective over the default group
    (every rank calls it with the same arguments); ranks absent from ``mesh`` get a mesh whose
    ``get_coordinate()`` is None.
    """

    def __init__(self, device_type: str, mesh: Any, *, mesh_dim_names: Sequence[str] | None = None,
                 _init_backend: bool = True, _root: "DeviceMesh | None" = None,
                 _dims: tuple[int, ...] | None = None):
        if device_type not in ("cpu", "cuda"):
            raise ValueError(f"device_type={device_type!r}: expected 'cpu' or 'cuda'")
        arr = np.asarray(mesh.cpu().numpy() if hasattr(mesh, "numpy") and hasattr(mesh, "cpu") else mesh)
        if arr.ndim == 0 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"mesh: expected a non-empty n-d array of integer ranks, got {mesh!r}")
        arr = arr.astype(np.int64)
        self.device_type = device_type
        self.mesh = arr
        self.mesh_dim_names = _check_names(mesh_dim_names, arr.ndim)
        self._world = default_group()
        me = self._world.rank()
        if _root is None:
            hits = np.argwhere(arr == me)
            self._coord = tuple(int(x) for x in hits[0]) if len(hits) else None  # root coordinates
            flat = arr.reshape(-1)
            if len(set(flat.tolist())) != flat.size:
                raise ValueError(f"mesh: ranks must be unique, got {arr.tolist()}")
            if flat.min() < 0 or flat.max() >= self._world.size():
                raise ValueError(
                    f"mesh: ranks {arr.tolist()} must lie in 0..{self._world.size() - 1} (the world size "
                    f"is {self._world.size()})"
                )
            self._root, self._dims = self, tuple(range(arr.ndim))
            self._groups: list[ProcessGroup | None] = []
            self._flat_cache: dict[tuple[int, ...], ProcessGroup | None] = {}
            if _init_backend:
                for d in range(arr.ndim):
                    self._groups.append(self._split_dim(d))
        else:
            self._root, self._dims, self._coord = _root, tuple(_dims), _root._coord

    # -- construction helpers -----------------------------------------------------------------
    def _split_dim(self, d: int) -> ProcessGroup | None:
        """Collective over the default group: the communicator along root dimension ``d``."""
        if self._coord is None:
            color = None
        else:
            others = [c for i, c in enumerate(self._coord) if i != d]
            other_shape = [s for i, s in enumerate(self.mesh.shape) if i != d]
            color = int(np.ravel_multi_index(others, other_shape)) if others else 0
        name = self.mesh_dim_names[d] if self.mesh_dim_names else f"mesh_dim_{d}"
        key = self._coord[d] if self._coord is not None else 0
        return self._world.split(color, key, name=name)

    # -- shape -------------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return self.mesh.ndim

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.mesh.shape)

    def size(self, mesh_dim: int | str | None = None) -> int:
        if mesh_dim is None:
            return int(self.mesh.size)
        return int(self.mesh.shape[self._dim_index(mesh_dim)])

    def _dim_index(self, mesh_dim: int | str) -> int:
        if isinstance(mesh_dim, str):
            if not self.mesh_dim_names or mesh_dim not in self.mesh_dim_names:
                raise KeyError(f"mesh dimension {mesh_dim!r} not found; this mesh's dimensions are "
                               f"{self.mesh_dim_names}")
            return self.mesh_dim_names.index(mesh_dim)
        if isinstance(mesh_dim, bool) or not isinstance(mesh_dim, (int, np.integer)):
            raise TypeError(f"mesh_dim={mesh_dim!r}: expected an int or a dimension name")
        if not -self.ndim <= mesh_dim < self.ndim:
            raise IndexError(f"mesh_dim={mesh_dim} out of range for a {self.ndim}-d mesh")
        return int(mesh_dim) % self.ndim

    # -- ranks and groups ----------------------------------------------------------------------
    def get_rank(self) -> int:
        return self._world.rank()

    def get_coordinate(self) -> list[int] | None:
        if self._coord is None:
            return None
        return [self._coord[d] for d in self._dims] if self._root is not self else list(self._coord)

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        if mesh_dim is None:
            if self.ndim != 1:
                raise RuntimeError(f"get_local_rank: give mesh_dim for a {self.ndim}-d mesh {self.mesh_dim_names}")
            mesh_dim = 0
        coord = self.get_coordinate()
        if coord is None:
            raise RuntimeError(f"rank {self.get_rank()} is not part of {self!r}")
        return coord[self._dim_index(mesh_dim)]

    def get_group(self, mesh_dim: int | str | None = None) -> ProcessGroup:
        if mesh_dim is None:
            if self.ndim != 1:
                raise RuntimeError(
                    f"get_group: this mesh has {self.ndim} dimensions {self.mesh_dim_names}; give mesh_dim"
                )
            mesh_dim = 0
        root_dim = self._dims[self._dim_index(mesh_dim)]
        g = self._root._groups[root_dim] if self._root._groups else None
        if g is None:
            raise RuntimeError(f"rank {self.get_rank()} is not part of {self!r} (or it was built "
                               "with _init_backend=False)")
        return g

    def get_all_groups(self) -> list[ProcessGroup]:
        return [self.get_group(i) for i in range(self.ndim)]

    def __getitem__(self, names: str | Sequence[str]) -> "DeviceMesh":
        """The sub-mesh of the named dimensions through this rank (local: reuses communicators)."""
        if not self.mesh_dim_names:
            raise KeyError("this mesh has no mesh_dim_names; name the dimensions to slice it")
        names_t = (names,) if isinstance(names, str) else tuple(names)
        if not names_t:
            raise KeyError("give at least one mesh dimension name")
        if len(set(names_t)) != len(names_t):
            raise KeyError(f"duplicate mesh dimension names in {names_t}")
        idx = [self._dim_index(n) for n in names_t]
        if self._coord is None:
            raise RuntimeError(f"rank {self.get_rank()} is not part of {self!r}")
        coord = self.get_coordinate()
        sl = tuple(slice(None) if i in idx else coord[i] for i in range(self.ndim))
        sub = self.mesh[sl]
        kept = [i for i in range(self.ndim) if i in idx]
        sub = np.transpose(sub, [kept.index(i) for i in idx])
        return DeviceMesh(self.device_type, sub, mesh_dim_names=names_t, _root=self._root,
                          _dims=tuple(self._dims[i] for i in idx))

    def _flatten(self, mesh_dim_name: str | None = None) -> "DeviceMesh":
        """A 1-d mesh over all ranks of this (sub-)mesh (collective over the default group)."""
        root = self._root
        key = tuple(sorted(self._dims))
        if key not in root._flat_cache:
            rest = [d for d in range(root.ndim) if d not in key]
            if root._coord is None:
                color, k = None, 0
            else:
                color = int(np.ravel_multi_index([root._coord[d] for d in rest],
                                                 [root.mesh.shape[d] for d in rest])) if rest else 0
                k = int(np.ravel_multi_index([root._coord[d] for d in self._dims],
                                             [root.mesh.shape[d] for d in self._dims]))
            name = mesh_dim_name or "_".join(self.mesh_dim_names or [f"d{d}" for d in self._dims])
            root._flat_cache[key] = self._world.split(color, k, name=name)
        name = mesh_dim_name or "_".join(self.mesh_dim_names or [f"d{d}" for d in self._dims])
        flat = DeviceMesh(self.device_type, self.mesh.reshape(-1), mesh_dim_names=(name,), _root=None,
                          _init_backend=False)
        flat._groups = [root._flat_cache[key]]
        return flat

    # -- misc ----------------------------------------------------------------------------------
    def __repr__(self) -> str:
        names = f", mesh_dim_names={self.mesh_dim_names}" if self.mesh_dim_names else ""
        return f"DeviceMesh('{self.device_type}', {self.mesh.tolist()}{names})"

    def __eq__(self, other: Any) -> bool:
        if self is other:
            return True
        return (isinstance(other, DeviceMesh) and self.device_type == other.device_type
                and self.mesh.shape == other.mesh.shape and bool(np.array_equal(self.mesh, other.mesh))
                and self.mesh_dim_names == other.mesh_dim_names)

    def __hash__(self) -> int:
        return hash((self.device_type, self.mesh.shape, tuple(self.mesh.reshape(-1).tolist()), self.mesh_dim_names))


def _check_names(names: Sequence[str] | None, ndim: int) -> tuple[str, ...] | None:
    if names is None:
        return None
    if isinstance(names, str):
        names = (names,)
    names = tuple(names)
    if len(names) != ndim:
        raise ValueError(f"mesh_dim_names={names} has {len(names)} names for a {ndim}-d mesh")
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"mesh_dim_names: expected strings, got {n!r}")
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"mesh_dim_names={names}: duplicate names {dup}")
    return names


def init_device_mesh(device_type: str, mesh_shape: Sequence[int], *, mesh_dim_names: Sequence[str] | None = None,
                     node_local_dim: int | str | None = None) -> DeviceMesh:
    """A row-major mesh of all default-group ranks (collective). See [Note: Mesh layout].

    For ``device_type="cuda"`` each rank selects GPU ``node_local_rank % gpus_per_node``.
    ``node_local_dim`` (hpcfsdp extension): a dimension whose groups must lie inside one node.
    """
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device_type={device_type!r}: expected 'cpu' or 'cuda'")
    shape = tuple(mesh_shape) if isinstance(mesh_shape, (tuple, list)) else (mesh_shape,)
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s <= 0:
            raise ValueError(f"mesh_shape={shape}: expected positive integers")
    names = _check_names(mesh_dim_names, len(shape))
    world = default_group()
    n = world.size()
    if math.prod(shape) != n:
        raise ValueError(
            f"mesh_shape={shape} has {math.prod(shape)} ranks but the world size is {n}; "
            f"the product of mesh_shape must equal the world size"
        )
    if device_type == "cuda":
        _select_gpu(world)
    mesh = DeviceMesh(device_type, np.arange(n).reshape(shape), mesh_dim_names=names)
    if node_local_dim is not None:
        _check_node_local(mesh, node_local_dim, world)
    return mesh


def _select_gpu(world: ProcessGroup) -> None:
    from hpcfsdp import _backend

    if not _backend.cupy_available():
        raise RuntimeError(f"init_device_mesh('cuda', ...): device 'cuda' {_backend.cupy_unavailable_reason()}")
    cupy = _backend._try_cupy()

    _, local = CT.call_sync("node_comm", lambda: _node_index_noobj(world))
    ngpu = cupy.cuda.runtime.getDeviceCount()
    if ngpu <= 0:
        raise RuntimeError("init_device_mesh('cuda', ...): no CUDA device is visible")
    cupy.cuda.Device(local % ngpu).use()


def _node_index_noobj(world: ProcessGroup) -> tuple[None, int]:
    nc = node_comm(world.comm)
    try:
        return None, nc.Get_rank()
    finally:
        nc.Free()


def _check_node_local(mesh: DeviceMesh, dim: int | str, world: ProcessGroup) -> None:

    def leader_of():
        nc = node_comm(world.comm)
        try:
            return nc.bcast(world.rank(), root=0)
        finally:
            nc.Free()

    leader = CT.call_sync("node_comm", leader_of)
    leaders = world.all_gather_object(leader)
    order = sorted(set(leaders))
    node_of = [order.index(x) for x in leaders]
    d = mesh._dim_index(dim)
    lines = np.moveaxis(mesh.mesh, d, -1).reshape(-1, mesh.mesh.shape[d])
    for line in lines:
        nodes = sorted({node_of[r] for r in line.tolist()})
        if len(nodes) > 1:
            name = mesh.mesh_dim_names[d] if mesh.mesh_dim_names else d
            raise ValueError(
                f"mesh dimension {name!r} (size {mesh.mesh.shape[d]}) would span nodes {nodes}: its group of "
                f"ranks {line.tolist()} is not inside one node. Make that dimension's size divide the ranks "
                f"per node and number ranks node-major"
            )
