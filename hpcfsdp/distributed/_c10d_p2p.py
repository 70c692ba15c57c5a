"""torch.distributed's point-to-point calls: send, recv, isend, irecv, P2POp and batch_isend_irecv (distributed_c10d
re-exports them). Peers are global ranks unless given as ``group_src``/``group_dst``/``group_peer``; for the order
in which messages match see [Note: Point-to-point] in _p2p.py."""

from __future__ import annotations

from hpcfsdp._tensor import Tensor
from hpcfsdp.distributed._c10d_common import as_array
from hpcfsdp.distributed._c10d_groups import get_global_rank, resolve_group, to_group_rank
from hpcfsdp.distributed.process_group import Work

__all__ = ["send", "recv", "isend", "irecv", "P2POp", "batch_isend_irecv"]


def isend(tensor, dst=None, group=None, tag=0, group_dst=None) -> Work:
    """Send ``tensor`` to global rank ``dst`` (or group rank ``group_dst``); the Work completes when it may be
    modified again. Sending to oneself is allowed (with a matching irecv)."""
    g = resolve_group(group)
    a = as_array(tensor, "isend: tensor")
    return g.isend(a, to_group_rank(g, dst, group_dst, "isend", "dst"), tag)


def irecv(tensor, src=None, group=None, tag=0, group_src=None) -> Work:
    """Receive into ``tensor`` from global rank ``src`` (or group rank ``group_src``; neither: any rank).
    ``work.result()`` is the sender's group rank."""
    g = resolve_group(group)
    a = as_array(tensor, "irecv: tensor", writable=True)
    gs = None if src is None and group_src is None else to_group_rank(g, src, group_src, "irecv", "src")
    return g.irecv(a, gs, tag)


def send(tensor, dst=None, group=None, tag=0, group_dst=None) -> None:
    """Send ``tensor`` to global rank ``dst`` (or group rank ``group_dst``) and wait until it is sent."""
    g = resolve_group(group)
    a = as_array(tensor, "send: tensor")
    gd = to_group_rank(g, dst, group_dst, "send", "dst")
    if gd == g.rank():
        raise ValueError("send: Invalid destination rank: destination rank should not be the same as the rank of "
                         f"the current process (group rank {gd}).")
    g.isend(a, gd, tag).wait()


def recv(tensor, src=None, group=None, tag=0, group_src=None) -> int:
    """Receive into ``tensor`` from global rank ``src`` (or group rank ``group_src``; neither: any rank) and
    return the sender's global rank."""
    g = resolve_group(group)
    w = irecv(tensor, src, g, tag, group_src)
    w.wait()
    sender = w.result()
    if src is None and group_src is None and sender == g.rank():
        raise ValueError("recv: Invalid source rank: source rank should not be the same as the rank of the current "
                         "process.")
    return get_global_rank(g, sender)


class P2POp:
    """One operation of ``batch_isend_irecv``: ``op`` (``isend`` or ``irecv``) on ``tensor`` with global rank
    ``peer`` (or group rank ``group_peer``) of ``group``."""

    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        if op is not isend and op is not irecv:
            raise ValueError("Invalid ``op``. Expected ``op`` to be of type ``torch.distributed.isend`` or "
                             f"``torch.distributed.irecv``, got {op!r}.")
        if not isinstance(tensor, Tensor):
            raise TypeError(f"P2POp: tensor must be a Tensor, got {type(tensor).__name__}")
        self.op = op
        self.tensor = tensor
        self.group = resolve_group(group)
        self.group_peer = to_group_rank(self.group, peer, group_peer, "P2POp", "peer")
        self.peer = get_global_rank(self.group, self.group_peer)
        self.tag = tag

    def __repr__(self) -> str:
        me = self.group.rank()
        s, d = (me, self.group_peer) if self.op is isend else (self.group_peer, me)
        return (f"P2POp({self.op.__name__} pg={self.group.name or 'default_pg'}, group_src={s}, group_dst={d}, "
                f"{tuple(self.tensor.shape)}, {self.tensor.dtype})")


def batch_isend_irecv(p2p_op_list) -> list[Work]:
    """Issue every operation of ``p2p_op_list`` (all on one group) and return a Work per operation. Their order
    does not matter for deadlock; messages between one pair of ranks in one direction match in list order.
    CUDA tensors go as one NCCL group where the group's GPU path is NCCL (tags ignored, as PyTorch's NCCL
    backend; if this is the group's first call on CUDA tensors, every rank of the group must make it), host
    tensors over MPI; one batch holds one kind. See [Note: GPU collectives] in _nccl.py."""
    if not isinstance(p2p_op_list, list) or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise ValueError("Invalid ``p2p_op_list``. Each op is expected to to be of type ``torch.distributed.P2POp``.")
    if not p2p_op_list:
        raise ValueError("batch_isend_irecv: p2p_op_list is empty")
    group = p2p_op_list[0].group
    if any(p.group is not group for p in p2p_op_list):
        raise ValueError("All ops need to use the same group.")
    ops = []
    for i, p in enumerate(p2p_op_list):
        a = as_array(p.tensor, f"batch_isend_irecv: op {i} ({p.op.__name__}): tensor", writable=p.op is irecv)
        ops.append((p.op is isend, a, p.group_peer, p.tag))
    return group.batch_isend_irecv(ops)
