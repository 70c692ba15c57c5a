"""torch.distributed's rooted collectives: broadcast, reduce, gather and scatter, whose source or destination is one
rank (a global rank, or ``group_src``/``group_dst`` in the group); distributed_c10d re-exports them. The list
argument is given on the root only (PyTorch's rule)."""

from __future__ import annotations

from hpcfsdp.distributed._buffers import array_module
from hpcfsdp.distributed._c10d_common import as_array, check_root_list, copy_out, finish, tensor_arrays
from hpcfsdp.distributed._c10d_groups import global_to_group, resolve_group, to_group_rank
from hpcfsdp.distributed.process_group import ReduceOp

__all__ = ["broadcast", "reduce", "gather", "scatter"]


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    """Broadcast ``tensor`` from default-group rank ``src`` (or ``group_src`` within ``group``)."""
    g = resolve_group(group)
    a = as_array(tensor, "broadcast: tensor", writable=True)
    if (src is None) == (group_src is None):
        raise ValueError(f"broadcast: give exactly one of src={src!r} and group_src={group_src!r}")
    gs = g._check_rank(group_src, "broadcast: group_src") if group_src is not None else \
        global_to_group(g, src, "broadcast: src")
    return g.broadcast_(a, gs, async_op)


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None):
    """Reduce ``tensor`` over ``group`` into global rank ``dst``'s (or group rank ``group_dst``'s) ``tensor``;
    the other ranks' tensors are left unchanged."""
    g = resolve_group(group)
    a = as_array(tensor, "reduce: tensor", writable=True)
    return g.reduce_(a, to_group_rank(g, dst, group_dst, "reduce", "dst"), op, async_op)


def gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None):
    """Fill ``gather_list[r]`` on rank ``dst`` (default global rank 0) with group rank r's ``tensor``."""
    g = resolve_group(group)
    inp = as_array(tensor, "gather: tensor")
    gd = to_group_rank(g, dst, group_dst, "gather", "dst", default=0)
    root = g.rank() == gd
    check_root_list("gather", "gather_list", gather_list, root, "destination")
    if not root:
        return g.gather_into(None, inp, gd, async_op)
    outs = tensor_arrays("gather", "gather_list", gather_list, g.size(), inp, writable=True)
    flat = array_module(inp).empty(inp.size * g.size(), inp.dtype)
    return finish(g.gather_into(flat, inp, gd, async_op=True), lambda: copy_out(flat, outs), async_op)


def scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None):
    """Fill every rank's ``tensor`` with ``scatter_list[r]`` of rank ``src`` (default global rank 0)."""
    g = resolve_group(group)
    out = as_array(tensor, "scatter: tensor", writable=True)
    gs = to_group_rank(g, src, group_src, "scatter", "src", default=0)
    root = g.rank() == gs
    check_root_list("scatter", "scatter_list", scatter_list, root, "source")
    if not root:
        return g.scatter_into(out, None, gs, async_op)
    ins = tensor_arrays("scatter", "scatter_list", scatter_list, g.size(), out)
    flat = array_module(out).concatenate([a.reshape(-1) for a in ins])
    return g.scatter_into(out, flat, gs, async_op)
