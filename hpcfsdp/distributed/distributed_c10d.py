"""torch.distributed-style functional collectives on Tensors over MPI process groups."""

from __future__ import annotations

import datetime
from typing import Any

from hpcfsdp._logging import get_logger
from hpcfsdp._tensor import Tensor
from hpcfsdp._backend import is_meta_array
from hpcfsdp.distributed import _mpi
from hpcfsdp.distributed import process_group as _pg
from hpcfsdp.distributed._buffers import array_module
from hpcfsdp.distributed._c10d_more import (
    P2POp,
    all_to_all,
    all_to_all_single,
    batch_isend_irecv,
    gather,
    gather_object,
    get_node_local_rank,
    irecv,
    is_gloo_available,
    is_nccl_available,
    is_torchelastic_launched,
    isend,
    monitored_barrier,
    recv,
    reduce,
    reduce_scatter,
    scatter,
    scatter_object_list,
    send,
)
from hpcfsdp.distributed._mpi import get_mpi
from hpcfsdp.distributed.process_group import ProcessGroup, ReduceOp, Work

__all__ = [
    "init_process_group",
    "is_initialized",
    "is_available",
    "is_mpi_available",
    "destroy_process_group",
    "get_rank",
    "get_world_size",
    "get_backend",
    "get_default_backend_for_device",
    "get_global_rank",
    "get_group_rank",
    "get_process_group_ranks",
    "new_group",
    "barrier",
    "all_reduce",
    "all_gather_into_tensor",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "broadcast",
    "all_gather",
    "all_gather_object",
    "broadcast_object_list",
    "group",
    "GroupMember",
    # _c10d_more.py
    "reduce",
    "gather",
    "scatter",
    "reduce_scatter",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
    "isend",
    "irecv",
    "P2POp",
    "batch_isend_irecv",
    "gather_object",
    "scatter_object_list",
    "monitored_barrier",
    "is_nccl_available",
    "is_gloo_available",
    "is_torchelastic_launched",
    "get_node_local_rank",
]

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
        return _default_group()


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


def get_default_backend_for_device(device) -> str:
    """PyTorch's default backend name for ``device``: "gloo" for "cpu", "nccl" for "cuda".

    The names are PyTorch's, so that ported scripts branching on them take the same branch;
    ``init_process_group`` accepts either: host arrays go over MPI, CUDA arrays over NCCL where every
    rank has its own GPU, else CUDA-aware MPI or host staging (HPCFSDP_GPU_COMM, [Note: GPU collectives]
    in _nccl.py), and ``get_backend()`` then reports the name given. Other device types have no
    backend: ValueError, as PyTorch.
    """
    from hpcfsdp import _backend

    try:
        dev = _backend.device("cuda", device) if isinstance(device, int) else _backend.device(device)
    except (TypeError, ValueError):
        raise ValueError(f"Default backend not registered for device : {device}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"Default backend not registered for device : {device}")
    return "nccl" if dev.type == "cuda" else "gloo"


def _default_group() -> ProcessGroup:
    global _DEFAULT
    if _DEFAULT is None:
        init_process_group()
    return _DEFAULT


def is_initialized() -> bool:
    return _DEFAULT is not None


def is_available() -> bool:
    return True


def is_mpi_available() -> bool:
    return True


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
    _check_group(group)
    group.destroy()
    _BACKEND_NAMES.pop(id(group), None)
    if group in _GROUPS:
        _GROUPS.remove(group)
    if group is _DEFAULT:
        _DEFAULT = None


def _resolve(group: Any) -> ProcessGroup:
    if group is None:
        return _default_group()
    _check_group(group)
    return group


def _check_group(group: Any) -> None:
    if group is GroupMember.NON_GROUP_MEMBER:
        raise ValueError("this rank is not a member of the group (new_group returned NON_GROUP_MEMBER)")
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group={group!r}: expected a ProcessGroup or None")


def get_rank(group: Any = None) -> int:
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return _resolve(group).rank()


def get_world_size(group: Any = None) -> int:
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return _resolve(group).size()


def get_backend(group: Any = None) -> str:
    """The backend name ``group`` was created with, lower case, as PyTorch reports it ("mpi" when none was
    named; a new_group without ``backend`` inherits the default group's). Every backend runs on MPI."""
    g = _resolve(group)
    return _BACKEND_NAMES.get(id(g)) or _BACKEND_NAMES.get(id(_default_group()), "mpi")


def _world_of(g: ProcessGroup) -> tuple[int, ...]:
    """Ranks of ``g`` in the default group."""
    d = _default_group()
    if d.world_ranks == tuple(range(d.size())):
        return g.world_ranks
    pos = {w: i for i, w in enumerate(d.world_ranks)}
    return tuple(pos[w] for w in g.world_ranks)


def get_process_group_ranks(group: Any) -> list[int]:
    return list(_world_of(_resolve(group)))


def get_global_rank(group: Any, group_rank: int) -> int:
    g = _resolve(group)
    r = g._check_rank(group_rank, "get_global_rank: group_rank")
    return _world_of(g)[r]


def get_group_rank(group: Any, global_rank: int) -> int:
    g = _resolve(group)
    ranks = _world_of(g)
    if global_rank not in ranks:
        raise ValueError(f"global rank {global_rank} is not part of {g!r} (ranks {list(ranks)})")
    return ranks.index(global_rank)


def new_group(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization=False,
              group_desc=None):
    """A ProcessGroup of ``ranks`` (default-group ranks). Collective: every rank of the default group
    calls it; ranks outside ``ranks`` get ``GroupMember.NON_GROUP_MEMBER``."""
    _check_backend(backend)
    d = _default_group()
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


# -- Tensor checks ------------------------------------------------------------------------------

def _arr(t: Any, what: str, *, writable: bool = False):
    if not isinstance(t, Tensor):
        raise TypeError(f"{what}: expected a hpcfsdp Tensor, got {type(t).__module__}.{type(t).__qualname__}")
    a = t._data
    if is_meta_array(a):
        raise RuntimeError(f"{what}: a meta tensor has no data to communicate")
    if not a.flags.c_contiguous:
        raise ValueError(f"{what}: expected a contiguous tensor, got shape {tuple(a.shape)} strides {a.strides}")
    return a


def _global_to_group(g: ProcessGroup, src: int, what: str) -> int:
    ranks = _world_of(g)
    if src not in ranks:
        raise ValueError(f"{what}={src} is not a rank of {g!r} (its ranks: {list(ranks)})")
    return ranks.index(src)


class _ThenWork(Work):
    """Work that runs ``post`` (on the waiting thread) once ``inner`` completed."""

    __slots__ = ("_inner", "_post", "_posted")

    def __init__(self, inner: Work, post):
        super().__init__(inner._desc)
        self._inner, self._post, self._posted = inner, post, False

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def exception(self):
        return self._inner.exception()

    def wait(self, timeout=None) -> bool:
        self._inner.wait(timeout)
        if not self._posted:
            self._posted = True
            self._post()
        return True


# -- collectives ----------------------------------------------------------------------------------

def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``tensor`` over ``group`` in place."""
    return _resolve(group).all_reduce_(_arr(tensor, "all_reduce: tensor", writable=True), op, async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """Gather every rank's ``input_tensor`` into ``output_tensor`` (concatenated or stacked on dim 0)."""
    g = _resolve(group)
    out = _arr(output_tensor, "all_gather_into_tensor: output_tensor", writable=True)
    inp = _arr(input_tensor, "all_gather_into_tensor: input_tensor")
    return g.all_gather_into(out, inp, async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):  # noqa: A002
    """Reduce ``input`` over ``group`` and give rank r the r-th equal piece (dim 0) in ``output``."""
    g = _resolve(group)
    out = _arr(output, "reduce_scatter_tensor: output", writable=True)
    inp = _arr(input, "reduce_scatter_tensor: input")
    return g.reduce_scatter_into(out, inp, op, async_op)


def reduce_scatter_single(output, input, op=ReduceOp.SUM, group=None, async_op=False):  # noqa: A002
    """PyTorch's newer name of ``reduce_scatter_tensor`` (its FSDP1 communication hooks call it)."""
    return reduce_scatter_tensor(output, input, op=op, group=group, async_op=async_op)


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    """Broadcast ``tensor`` from default-group rank ``src`` (or ``group_src`` within ``group``)."""
    g = _resolve(group)
    a = _arr(tensor, "broadcast: tensor", writable=True)
    if (src is None) == (group_src is None):
        raise ValueError(f"broadcast: give exactly one of src={src!r} and group_src={group_src!r}")
    gs = g._check_rank(group_src, "broadcast: group_src") if group_src is not None else \
        _global_to_group(g, src, "broadcast: src")
    return g.broadcast_(a, gs, async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """Fill ``tensor_list[r]`` with rank r's ``tensor``."""
    g = _resolve(group)
    inp = _arr(tensor, "all_gather: tensor")
    if not isinstance(tensor_list, (list, tuple)) or len(tensor_list) != g.size():
        n = len(tensor_list) if isinstance(tensor_list, (list, tuple)) else type(tensor_list).__name__
        raise ValueError(f"all_gather: tensor_list has {n} entries, expected the group size {g.size()}")
    outs = []
    for i, t in enumerate(tensor_list):
        o = t._data if isinstance(t, Tensor) else None
        if o is None:
            raise TypeError(f"all_gather: tensor_list[{i}] is a {type(t).__name__}, expected a Tensor")
        if o.size != inp.size or o.dtype != inp.dtype:
            raise ValueError(
                f"all_gather: tensor_list[{i}] is {o.dtype.name}{list(o.shape)}, expected "
                f"{inp.dtype.name} with {inp.size} elements like the input {inp.dtype.name}{list(inp.shape)}"
            )
        outs.append(o)
    flat = array_module(inp).empty(inp.size * g.size(), inp.dtype)

    def post():
        k = inp.size
        for r, o in enumerate(outs):
            o[...] = flat[r * k:(r + 1) * k].reshape(o.shape)

    w = g.all_gather_into(flat, inp, async_op=True)
    tw = _ThenWork(w, post)
    if async_op:
        return tw
    tw.wait()
    return None


def all_gather_object(object_list, obj, group=None):
    """Fill ``object_list[r]`` with rank r's ``obj`` (tagged JSON on the wire, no pickle)."""
    g = _resolve(group)
    if not isinstance(object_list, list) or len(object_list) != g.size():
        n = len(object_list) if isinstance(object_list, list) else type(object_list).__name__
        raise ValueError(f"all_gather_object: object_list has {n} entries, expected the group size {g.size()}")
    object_list[:] = g.all_gather_object(obj)


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """Replace ``object_list``'s items on every rank by those of rank ``src`` (default 0)."""
    g = _resolve(group)
    if not isinstance(object_list, list):
        raise TypeError(f"broadcast_object_list: object_list must be a list, got {type(object_list).__name__}")
    if src is not None and group_src is not None:
        raise ValueError(f"broadcast_object_list: give only one of src={src!r} and group_src={group_src!r}")
    if group_src is not None:
        gs = g._check_rank(group_src, "broadcast_object_list: group_src")
    else:
        gs = _global_to_group(g, 0 if src is None else src, "broadcast_object_list: src")
    got = g.broadcast_object(list(object_list) if g.rank() == gs else None, gs)
    if len(got) != len(object_list):
        raise ValueError(
            f"broadcast_object_list: src sent {len(got)} objects but this rank's list has {len(object_list)}"
        )
    object_list[:] = got


def barrier(group=None, async_op=False, device_ids=None):
    return _resolve(group).barrier(async_op)
