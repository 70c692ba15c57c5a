"""torch.distributed's process groups: the default group (see [Note: Default process group]) and new_group, their
ranks and backend names, and the translation of global ranks into group ranks that every collective does.

Part of distributed_c10d (which re-exports the public names); the other parts (_c10d_collectives, _c10d_rooted,
_c10d_p2p, _c10d_objects, _c10d_backends) build on this one and on _c10d_common.
"""

from __future__ import annotations

import datetime
from typing import Any

from hpcfsdp._logging import get_logger
from hpcfsdp.distributed import _mpi
from hpcfsdp.distributed import process_group as _pg
from hpcfsdp.distributed._mpi import get_mpi
from hpcfsdp.distributed.process_group import ProcessGroup

__all__ = ["init_process_group", "is_initialized", "destroy_process_group", "get_rank", "get_world_size",
           "get_backend", "get_global_rank", "get_group_rank", "get_process_group_ranks", "new_group", "group",
           "GroupMember"]

# [Note: Default process group]
# The default group wraps a duplicate of MPI.COMM_WORLD (or of the communicator given to
# init_process_group(comm=...)). It is created on first use, so scripts that never call
# init_process_group work under mpiexec. Ranks passed to these functions (src of broadcast,
# new_group(ranks)) are ranks of the default group, as in PyTorch ("global ranks").

_DEFAULT: ProcessGroup | None = None
_GROUPS: list[ProcessGroup] = []
_BACKENDS = {"mpi", "nccl", "gloo", "cpu:gloo,cuda:nccl", "cuda:nccl,cpu:gloo", "ucc"}
_BACKEND_NAMES: dict[int, str] = {}  # id(group) -> the backend name it was created with (see get_backend)


class _NonMember:
    """What new_group returns on ranks outside the new group (PyTorch's NON_GROUP_MEMBER)."""

    def __repr__(self) -> str:
        return "GroupMember.NON_GROUP_MEMBER"


class _WorldMeta(type):
    @property
    def WORLD(cls) -> ProcessGroup:  # noqa: N802 (PyTorch's name)
        return default_group()


class GroupMember(metaclass=_WorldMeta):
    """``GroupMember.WORLD`` (the default group) and ``GroupMember.NON_GROUP_MEMBER``."""

    NON_GROUP_MEMBER = _NonMember()


class group(metaclass=_WorldMeta):  # noqa: N801 (PyTorch's name)
    """``dist.group.WORLD``: the default process group."""


def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    timeout: datetime.timedelta | float | None = None,
    world_size: int = -1,
    rank: int = -1,
    store: Any = None,
    group_name: str = "",
    pg_options: Any = None,
    device_id: Any = None,
    *,
    comm: Any = None,
) -> None:
    """Create the default process group over ``comm`` (default MPI.COMM_WORLD), collectively.

    ``backend`` is accepted for PyTorch compatibility ("mpi", "nccl", "gloo", ...: all map to
    MPI). ``world_size``/``rank``, when given, must agree with MPI. ``timeout`` sets the
    collective watchdog (overrides HPCFSDP_COMM_TIMEOUT). ``device_id`` (an int CUDA ordinal,
    "cuda:N", "cpu" or an hp.device) binds this process to that device: a CUDA device becomes the
    current one; the group's ``bound_device_id`` records it. ``init_method``, ``store``,
    ``group_name`` and ``pg_options`` are accepted as PyTorch accepts them; MPI needs no rendezvous,
    so ``init_method``/``store`` only have their combinations checked.
    """
    global _DEFAULT
    if _DEFAULT is not None:
        raise RuntimeError("trying to initialize the default process group twice")
    _check_backend(backend)
    if init_method is not None and store is not None:
        raise ValueError("Cannot specify both init_method and store.")
    if store is not None and (world_size in (-1, None) or world_size <= 0 or rank in (-1, None) or rank < 0):
        raise ValueError(f"world_size ({world_size}) and rank ({rank}) must be given when using store")
    device = _bind_device(device_id)
    MPI = get_mpi()
    comm = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(f"comm={comm!r}: expected an mpi4py Intracomm")
    if world_size not in (-1, None) and world_size != comm.Get_size():
        raise ValueError(f"world_size={world_size} but the MPI communicator has {comm.Get_size()} ranks")
    if rank not in (-1, None) and rank != comm.Get_rank():
        raise ValueError(f"rank={rank} but this process is rank {comm.Get_rank()} of the MPI communicator")
    if comm == MPI.COMM_WORLD:  # the torchrun variables, local ones from the node split (collective)
        layout = _mpi.node_layout(comm)
        _mpi.export_rank_env(comm.Get_rank(), comm.Get_size(), layout["local_rank"], layout["local_size"])
    if timeout is not None:
        secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
        _pg.set_default_timeout(secs)
    _DEFAULT = ProcessGroup(comm, name=group_name or "default")
    _BACKEND_NAMES[id(_DEFAULT)] = backend.lower() if backend is not None else "mpi"
    _DEFAULT.bound_device_id = device
    log = get_logger("distributed")
    log.info("process group %r: %d ranks, MPI %s", _DEFAULT.name,
             comm.Get_size(), MPI.Get_library_version().splitlines()[0].strip(), extra={"job": True})
    log.debug("rank %d of %d on %s, device %s", comm.Get_rank(), comm.Get_size(), MPI.Get_processor_name(), device)


def _check_backend(backend) -> None:
    if backend is not None and (not isinstance(backend, str) or backend.lower() not in _BACKENDS):
        raise ValueError(f"backend={backend!r}: expected None or one of {sorted(_BACKENDS)} (all run on MPI)")


def _bind_device(device_id):
    """init_process_group's ``device_id`` as a device; a CUDA device becomes the current one."""
    if device_id is None:
        return None
    from hpcfsdp import _backend, accelerator

    if isinstance(device_id, bool):
        raise TypeError(f"device_id={device_id!r}: expected an int, a device string or an hp.device")
    dev = _backend.device("cuda", device_id) if isinstance(device_id, int) else _backend.device(device_id)
    if dev.type == "cuda":
        if dev.index is None:
            raise ValueError(f"device_id={device_id!r}: a CUDA device_id needs an index, e.g. 'cuda:0'")
        if not accelerator.is_available():
            raise RuntimeError(f"device_id={device_id!r}: no CUDA device is available to this process")
        accelerator.set_device_index(dev.index)
    elif dev.type != "cpu":
        raise ValueError(f"device_id={device_id!r}: expected a CPU or CUDA device")
    return dev


def default_group() -> ProcessGroup:
    global _DEFAULT
    if _DEFAULT is None:
        init_process_group()
    return _DEFAULT


def is_initialized() -> bool:
    return _DEFAULT is not None


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Free ``group``, or (default) every group and the default group."""
    global _DEFAULT
    if group is None:
        for g in _GROUPS:
            g.destroy()
        _GROUPS.clear()
        if _DEFAULT is not None:
            _DEFAULT.destroy()
        _DEFAULT = None
        _BACKEND_NAMES.clear()
        _pg.set_default_timeout(None)
        return
    check_group(group)
    group.destroy()
    _BACKEND_NAMES.pop(id(group), None)
    if group in _GROUPS:
        _GROUPS.remove(group)
    if group is _DEFAULT:
        _DEFAULT = None


def resolve_group(group: Any) -> ProcessGroup:
    if group is None:
        return default_group()
    check_group(group)
    return group


def check_group(group: Any) -> None:
    if group is GroupMember.NON_GROUP_MEMBER:
        raise ValueError("this rank is not a member of the group (new_group returned NON_GROUP_MEMBER)")
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group={group!r}: expected a ProcessGroup or None")


def get_rank(group: Any = None) -> int:
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return resolve_group(group).rank()


def get_world_size(group: Any = None) -> int:
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return resolve_group(group).size()


def get_backend(group: Any = None) -> str:
    """The backend name ``group`` was created with, lower case, as PyTorch reports it ("mpi" when none was
    named; a new_group without ``backend`` inherits the default group's). Every backend runs on MPI."""
    g = resolve_group(group)
    return _BACKEND_NAMES.get(id(g)) or _BACKEND_NAMES.get(id(default_group()), "mpi")


def world_of(g: ProcessGroup) -> tuple[int, ...]:
    """Ranks of ``g`` in the default group."""
    d = default_group()
    if d.world_ranks == tuple(range(d.size())):
        return g.world_ranks
    pos = {w: i for i, w in enumerate(d.world_ranks)}
    return tuple(pos[w] for w in g.world_ranks)


def get_process_group_ranks(group: Any) -> list[int]:
    return list(world_of(resolve_group(group)))


def get_global_rank(group: Any, group_rank: int) -> int:
    g = resolve_group(group)
    r = g._check_rank(group_rank, "get_global_rank: group_rank")
    return world_of(g)[r]


def get_group_rank(group: Any, global_rank: int) -> int:
    g = resolve_group(group)
    ranks = world_of(g)
    if global_rank not in ranks:
        raise ValueError(f"global rank {global_rank} is not part of {g!r} (ranks {list(ranks)})")
    return ranks.index(global_rank)


def new_group(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization=False,
              group_desc=None):
    """A ProcessGroup of ``ranks`` (default-group ranks). Collective: every rank of the default group
    calls it; ranks outside ``ranks`` get ``GroupMember.NON_GROUP_MEMBER``."""
    _check_backend(backend)
    d = default_group()
    if ranks is None:
        ranks = list(range(d.size()))
    ranks = list(ranks)
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < d.size():
            raise ValueError(f"new_group: rank {r!r} is outside the world of {d.size()} ranks (0..{d.size() - 1})")
    g = d.create_subgroup(sorted(ranks), name=group_desc)
    if g is None:
        return GroupMember.NON_GROUP_MEMBER
    _GROUPS.append(g)
    if backend is not None:
        _BACKEND_NAMES[id(g)] = backend.lower()
    return g


def global_to_group(g: ProcessGroup, src: int, what: str) -> int:
    ranks = world_of(g)
    if src not in ranks:
        raise ValueError(f"{what}={src} is not a rank of {g!r} (its ranks: {list(ranks)})")
    return ranks.index(src)


def to_group_rank(g, rank, group_rank, fn: str, name: str, default: int | None = None) -> int:
    """The group rank given as exactly one of a global ``rank`` and a ``group_rank`` (``default``: a global rank
    used when neither is given; without one, one must be)."""
    if rank is not None and group_rank is not None:
        raise ValueError(f"{fn}: give only one of {name}={rank!r} and group_{name}={group_rank!r}")
    if group_rank is not None:
        return g._check_rank(group_rank, f"{fn}: group_{name}")
    if rank is None:
        if default is None:
            raise ValueError(f"{fn}: give {name} (a global rank) or group_{name} (a rank of the group)")
        rank = default
    return global_to_group(g, rank, f"{fn}: {name}")
