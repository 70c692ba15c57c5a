"""torch.distributed's rooted collectives, all-to-all, point-to-point, object gather/scatter and backend queries.

Re-exported by distributed_c10d (and ``hpcfsdp.distributed``); the same conventions hold: ranks are global
ranks (ranks of the default group) unless named ``group_*``, tensors are modified in place, and a call
returns a Work with ``async_op=True``, else None once done. Bad input raises before any communication:
TypeError for a non-Tensor, ValueError for wrong list lengths, sizes, dtypes or ranks (PyTorch's backends
raise RuntimeError for some of these), as the rest of distributed_c10d does. Point-to-point ordering:
see [Note: Point-to-point] in _p2p.py.
"""

from __future__ import annotations

import os

from hpcfsdp._tensor import Tensor
from hpcfsdp.distributed import _p2p
from hpcfsdp.distributed._buffers import array_module, check_same_kind
from hpcfsdp.distributed.process_group import ReduceOp, Work

__all__ = [
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


def _c10d():
    """distributed_c10d (the default group, the Tensor checks). It imports this module to re-export its names,
    so it is imported here on use."""
    from hpcfsdp.distributed import distributed_c10d

    return distributed_c10d


def _peer(g, rank, group_rank, fn: str, name: str, default: int | None = None) -> int:
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
    return _c10d()._global_to_group(g, rank, f"{fn}: {name}")


def _finish(work: Work, post, async_op: bool):
    """``work`` followed by ``post`` (copies out of a flat buffer) when waited for."""
    tw = _c10d()._ThenWork(work, post)
    if async_op:
        return tw
    tw.wait()
    return None


def _tensors(fn: str, name: str, lst, n: int, ref, *, writable: bool = False, same_size: bool = True) -> list:
    """The arrays of ``lst``: a list of ``n`` contiguous Tensors of ``ref``'s dtype and device (and its element
    count with ``same_size``)."""
    if not isinstance(lst, (list, tuple)):
        raise TypeError(f"{fn}: {name} must be a list of Tensors, got {type(lst).__name__}")
    if len(lst) != n:
        raise ValueError(f"{fn}: {name} has {len(lst)} entries, expected the group size {n}")
    arrs = []
    for i, t in enumerate(lst):
        a = _c10d()._arr(t, f"{fn}: {name}[{i}]", writable=writable)
        if a.dtype != ref.dtype:
            raise ValueError(f"{fn}: tensors of different dtypes: {name}[{i}] is {a.dtype.name}, expected "
                             f"{ref.dtype.name}")
        if same_size and a.size != ref.size:
            raise ValueError(f"{fn}: {name}[{i}] has {a.size} elements {list(a.shape)}, expected {ref.size} like "
                             f"the tensor {list(ref.shape)}")
        check_same_kind(a, ref, f"{fn}: {name}[{i}]")
        arrs.append(a)
    return arrs


def _root_list(fn: str, name: str, lst, here: bool, role: str) -> None:
    """PyTorch's rule: ``lst`` is given on the root rank (``here``) and only there."""
    if here and not lst:
        raise ValueError(f"{fn}: Argument ``{name}`` must be specified on {role} rank.")
    if not here and lst:
        raise ValueError(f"{fn}: Argument ``{name}`` must NOT be specified on non-{role} ranks.")


# -- collectives ------------------------------------------------------------------------------------

def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None):
    """Reduce ``tensor`` over ``group`` into global rank ``dst``'s (or group rank ``group_dst``'s) ``tensor``;
    the other ranks' tensors are left unchanged."""
    c = _c10d()
    g = c._resolve(group)
    a = c._arr(tensor, "reduce: tensor", writable=True)
    return g.reduce_(a, _peer(g, dst, group_dst, "reduce", "dst"), op, async_op)


def gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None):
    """Fill ``gather_list[r]`` on rank ``dst`` (default global rank 0) with group rank r's ``tensor``."""
    c = _c10d()
    g = c._resolve(group)
    inp = c._arr(tensor, "gather: tensor")
    gd = _peer(g, dst, group_dst, "gather", "dst", default=0)
    root = g.rank() == gd
    _root_list("gather", "gather_list", gather_list, root, "destination")
    if not root:
        return g.gather_into(None, inp, gd, async_op)
    outs = _tensors("gather", "gather_list", gather_list, g.size(), inp, writable=True)
    flat = array_module(inp).empty(inp.size * g.size(), inp.dtype)

    def post():
        k = inp.size
        for r, o in enumerate(outs):
            o[...] = flat[r * k:(r + 1) * k].reshape(o.shape)

    return _finish(g.gather_into(flat, inp, gd, async_op=True), post, async_op)


def scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None):
    """Fill every rank's ``tensor`` with ``scatter_list[r]`` of rank ``src`` (default global rank 0)."""
    c = _c10d()
    g = c._resolve(group)
    out = c._arr(tensor, "scatter: tensor", writable=True)
    gs = _peer(g, src, group_src, "scatter", "src", default=0)
    root = g.rank() == gs
    _root_list("scatter", "scatter_list", scatter_list, root, "source")
    if not root:
        return g.scatter_into(out, None, gs, async_op)
    ins = _tensors("scatter", "scatter_list", scatter_list, g.size(), out)
    flat = array_module(out).concatenate([a.reshape(-1) for a in ins])
    return g.scatter_into(out, flat, gs, async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``input_list[r]`` over ``group`` into group rank r's ``output``."""
    c = _c10d()
    g = c._resolve(group)
    out = c._arr(output, "reduce_scatter: output", writable=True)
    ins = _tensors("reduce_scatter", "input_list", input_list, g.size(), out)
    flat = array_module(out).concatenate([a.reshape(-1) for a in ins])
    return g.reduce_scatter_into(out, flat, op, async_op)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    """Send ``input_tensor_list[r]`` to group rank r, receive group rank r's tensor for this rank into
    ``output_tensor_list[r]`` (sizes may differ per rank; the ranks must agree on them)."""
    c = _c10d()
    g = c._resolve(group)
    n = g.size()
    if not isinstance(input_tensor_list, (list, tuple)):
        raise TypeError(f"all_to_all: input_tensor_list must be a list of Tensors, got {type(input_tensor_list).__name__}")
    if len(input_tensor_list) != n:
        raise ValueError(f"all_to_all: input_tensor_list has {len(input_tensor_list)} entries, expected the group "
                         f"size {n}")
    ref = c._arr(input_tensor_list[0], "all_to_all: input_tensor_list[0]")
    ins = _tensors("all_to_all", "input_tensor_list", input_tensor_list, n, ref, same_size=False)
    outs = _tensors("all_to_all", "output_tensor_list", output_tensor_list, n, ref, writable=True, same_size=False)
    xp = array_module(ref)
    flat_in = xp.concatenate([a.reshape(-1) for a in ins])
    flat_out = xp.empty(sum(o.size for o in outs), ref.dtype)

    def post():
        off = 0
        for o in outs:
            o[...] = flat_out[off:off + o.size].reshape(o.shape)
            off += o.size

    w = g.all_to_all_into(flat_out, flat_in, [o.size for o in outs], [a.size for a in ins], async_op=True)
    return _finish(w, post, async_op)


def _splits(fn: str, name: str, sizes, rows: int, n: int) -> list[int] | None:
    """Split sizes of dim 0 (None: equal pieces, ``rows`` must divide by ``n``)."""
    if sizes is None or len(sizes) == 0:
        if rows % n:
            raise ValueError(f"{fn}: dim 0 of the {name.split('_')[0]} ({rows}) must divide equally by the group size "
                             f"{n} when {name} is not given")
        return None
    sizes = list(sizes)
    if len(sizes) != n:
        raise ValueError(f"{fn}: {name}={sizes}: Number of tensor splits not equal to group size {n}")
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in sizes):
        raise ValueError(f"{fn}: {name}={sizes}: expected non-negative ints")
    if sum(sizes) != rows:
        raise ValueError(f"{fn}: {name}={sizes}: Split sizes doesn't match total dim 0 size {rows}")
    return sizes


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,  # noqa: A002
                      async_op=False):
    """Split ``input`` on dim 0 (``input_split_sizes`` rows per rank, default equal), send piece r to group
    rank r and concatenate the pieces received, in rank order, into ``output`` (``output_split_sizes``)."""
    c = _c10d()
    g = c._resolve(group)
    n = g.size()
    out = c._arr(output, "all_to_all_single: output", writable=True)
    inp = c._arr(input, "all_to_all_single: input")
    if out.dtype != inp.dtype:
        raise ValueError(f"all_to_all_single: tensors of different dtypes: output {out.dtype.name}, "
                         f"input {inp.dtype.name}")
    if out.ndim == 0 or inp.ndim == 0:
        raise ValueError("all_to_all_single: output and input need a dim 0 to split (got a 0-dim tensor)")
    s_in = _splits("all_to_all_single", "input_split_sizes", input_split_sizes, inp.shape[0], n)
    s_out = _splits("all_to_all_single", "output_split_sizes", output_split_sizes, out.shape[0], n)
    if s_in is None and s_out is None:
        return g.all_to_all_into(out, inp, None, None, async_op)
    row_in = inp.size // inp.shape[0] if inp.shape[0] else 0
    row_out = out.size // out.shape[0] if out.shape[0] else 0
    in_counts = [s * row_in for s in s_in] if s_in is not None else None
    out_counts = [s * row_out for s in s_out] if s_out is not None else None
    return g.all_to_all_into(out, inp, out_counts, in_counts, async_op)


# -- point-to-point ---------------------------------------------------------------------------------

def isend(tensor, dst=None, group=None, tag=0, group_dst=None) -> Work:
    """Send ``tensor`` to global rank ``dst`` (or group rank ``group_dst``); the Work completes when it may be
    modified again. Sending to oneself is allowed (with a matching irecv)."""
    c = _c10d()
    g = c._resolve(group)
    a = c._arr(tensor, "isend: tensor")
    return g.isend(a, _peer(g, dst, group_dst, "isend", "dst"), tag)


def irecv(tensor, src=None, group=None, tag=0, group_src=None) -> Work:
    """Receive into ``tensor`` from global rank ``src`` (or group rank ``group_src``; neither: any rank).
    ``work.result()`` is the sender's group rank."""
    c = _c10d()
    g = c._resolve(group)
    a = c._arr(tensor, "irecv: tensor", writable=True)
    gs = None if src is None and group_src is None else _peer(g, src, group_src, "irecv", "src")
    return g.irecv(a, gs, tag)


def send(tensor, dst=None, group=None, tag=0, group_dst=None) -> None:
    """Send ``tensor`` to global rank ``dst`` (or group rank ``group_dst``) and wait until it is sent."""
    c = _c10d()
    g = c._resolve(group)
    a = c._arr(tensor, "send: tensor")
    gd = _peer(g, dst, group_dst, "send", "dst")
    if gd == g.rank():
        raise ValueError("send: Invalid destination rank: destination rank should not be the same as the rank of "
                         f"the current process (group rank {gd}).")
    g.isend(a, gd, tag).wait()


def recv(tensor, src=None, group=None, tag=0, group_src=None) -> int:
    """Receive into ``tensor`` from global rank ``src`` (or group rank ``group_src``; neither: any rank) and
    return the sender's global rank."""
    c = _c10d()
    g = c._resolve(group)
    w = irecv(tensor, src, g, tag, group_src)
    w.wait()
    sender = w.result()
    if src is None and group_src is None and sender == g.rank():
        raise ValueError("recv: Invalid source rank: source rank should not be the same as the rank of the current "
                         "process.")
    return c.get_global_rank(g, sender)


class P2POp:
    """One operation of ``batch_isend_irecv``: ``op`` (``isend`` or ``irecv``) on ``tensor`` with global rank
    ``peer`` (or group rank ``group_peer``) of ``group``."""

    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        if op is not isend and op is not irecv:
            raise ValueError("Invalid ``op``. Expected ``op`` to be of type ``torch.distributed.isend`` or "
                             f"``torch.distributed.irecv``, got {op!r}.")
        if not isinstance(tensor, Tensor):
            raise TypeError(f"P2POp: tensor must be a Tensor, got {type(tensor).__name__}")
        c = _c10d()
        self.op = op
        self.tensor = tensor
        self.group = c._resolve(group)
        self.group_peer = _peer(self.group, peer, group_peer, "P2POp", "peer")
        self.peer = c.get_global_rank(self.group, self.group_peer)
        self.tag = tag

    def __repr__(self) -> str:
        me = self.group.rank()
        s, d = (me, self.group_peer) if self.op is isend else (self.group_peer, me)
        return (f"P2POp({self.op.__name__} pg={self.group.name or 'default_pg'}, group_src={s}, group_dst={d}, "
                f"{tuple(self.tensor.shape)}, {self.tensor.dtype})")


def batch_isend_irecv(p2p_op_list) -> list[Work]:
    """Issue every operation of ``p2p_op_list`` (all on one group) and return their Works. Their order does not
    matter for deadlock (each is nonblocking); messages between one pair of ranks in one direction match in
    list order."""
    if not isinstance(p2p_op_list, list) or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise ValueError("Invalid ``p2p_op_list``. Each op is expected to to be of type ``torch.distributed.P2POp``.")
    if not p2p_op_list:
        raise ValueError("batch_isend_irecv: p2p_op_list is empty")
    group = p2p_op_list[0].group
    if any(p.group is not group for p in p2p_op_list):
        raise ValueError("All ops need to use the same group.")
    works = []
    for p in p2p_op_list:
        key = "group_dst" if p.op is isend else "group_src"
        works.append(p.op(p.tensor, group=p.group, tag=p.tag, **{key: p.group_peer}))
    return works


# -- objects --------------------------------------------------------------------------------------

def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None) -> None:
    """Fill ``object_gather_list[r]`` on rank ``dst`` (default global rank 0) with group rank r's ``obj``
    (tagged JSON on the wire, no pickle; see [Note: Objects without pickle] in _buffers.py)."""
    c = _c10d()
    g = c._resolve(group)
    gd = _peer(g, dst, group_dst, "gather_object", "dst", default=0)
    root = g.rank() == gd
    _root_list("gather_object", "object_gather_list", object_gather_list, root, "destination")
    if root and (not isinstance(object_gather_list, list) or len(object_gather_list) != g.size()):
        n = len(object_gather_list) if isinstance(object_gather_list, (list, tuple)) else \
            type(object_gather_list).__name__
        raise ValueError(f"gather_object: object_gather_list has {n} entries, expected a list of the group size "
                         f"{g.size()}")
    got = g.gather_object(obj, gd)
    if root:
        object_gather_list[:] = got


def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=None, group=None,
                        group_src=None) -> None:
    """Set ``scatter_object_output_list[0]`` on group rank r to ``scatter_object_input_list[r]`` of rank ``src``
    (default global rank 0); tagged JSON on the wire, no pickle."""
    c = _c10d()
    g = c._resolve(group)
    gs = _peer(g, src, group_src, "scatter_object_list", "src", default=0)
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise ValueError("scatter_object_list: Expected argument scatter_object_output_list to be a list of size at "
                         "least 1.")
    root = g.rank() == gs
    if root and scatter_object_input_list is None:
        raise ValueError("scatter_object_list: source rank must provide non-None scatter_object_input_list")
    objs = list(scatter_object_input_list) if root else None
    if root and len(objs) != g.size():
        raise ValueError(f"scatter_object_list: scatter_object_input_list has {len(objs)} entries, expected the "
                         f"group size {g.size()}")
    scatter_object_output_list[0] = g.scatter_object(objs, gs)


# -- barrier, backends, launcher ----------------------------------------------------------------------

def monitored_barrier(group=None, timeout=None, wait_all_ranks=False) -> None:
    """A barrier whose group rank 0 raises RuntimeError naming the ranks that did not reach it within ``timeout``
    (a timedelta or seconds; None: the group timeout, HPCFSDP_COMM_TIMEOUT), the first one or, with
    ``wait_all_ranks``, all; the ranks that did reach it raise too. Works whatever the backend name (PyTorch:
    Gloo only)."""
    g = _c10d()._resolve(group)
    g.monitored_barrier(_p2p.monitored_timeout(timeout), bool(wait_all_ranks))


def is_nccl_available() -> bool:
    """Whether CuPy loads the NCCL library (``cupy.cuda.nccl.available``; PyTorch: built with NCCL), GPU or not.
    Where it is, CUDA arrays of groups whose ranks each have a GPU move over NCCL ([Note: GPU collectives] in
    _nccl.py); ``init_process_group`` takes every backend name either way."""
    try:
        from cupy.cuda import nccl  # noqa: PLC0415
    except Exception:  # no CuPy, or a broken CUDA install
        return False
    return bool(getattr(nccl, "available", False))


def is_gloo_available() -> bool:
    """True: the name "gloo" works everywhere PyTorch takes it (``init_process_group("gloo")``,
    ``get_default_backend_for_device("cpu")``, ``monitored_barrier``), running on MPI."""
    return True


def is_torchelastic_launched() -> bool:
    """Whether torchelastic (torchrun) started this process: TORCHELASTIC_RUN_ID is set. ``hpcfsdp launch``,
    mpiexec and srun do not set it."""
    return os.getenv("TORCHELASTIC_RUN_ID") is not None


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """This process's rank on its node, from LOCAL_RANK (which hpcfsdp sets from the MPI launcher's variables),
    else ``fallback_rank``; RuntimeError when neither is there."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError(
        "LOCAL_RANK is not in the environment. Consider passing fallback_rank to allow `get_node_local_rank` to "
        "work, assuming you are not running in a multi-device context and want the code to run locally instead.")

