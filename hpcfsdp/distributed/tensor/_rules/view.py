"""Sharding rules of views that only reorder dims: transpose, t, T, mT, permute, movedim/moveaxis. A sharded dim
moves with its data, so the local piece is reordered the same way and no data moves between ranks."""
from __future__ import annotations

from hpcfsdp._array import wrap_dim
from hpcfsdp.distributed.tensor._dispatch import OpCall, local_args, register_rule, wrap
from hpcfsdp.distributed.tensor.placement_types import Shard


def _order(call: OpCall, nd: int) -> list[int]:
    """The source dim of each result dim."""
    name = call.entry.name
    args = call.args[1:]
    if name in ("t", "T") or (name == "mT" and nd >= 2):
        order = list(range(nd))
        if nd >= 2:
            order[-2], order[-1] = order[-1], order[-2]
        return order
    if name == "mT":
        return list(range(nd))
    if name == "transpose":
        d0 = wrap_dim(args[0] if args else call.kwargs["dim0"], nd)
        d1 = wrap_dim(args[1] if len(args) > 1 else call.kwargs["dim1"], nd)
        order = list(range(nd))
        order[d0], order[d1] = order[d1], order[d0]
        return order
    if name == "permute":
        dims = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
        dims = dims or call.kwargs.get("dims")
        return [wrap_dim(d, nd) for d in dims]
    raise AssertionError(name)  # pragma: no cover


def reorder(call: OpCall):
    d = call.dtensors[0]
    order = _order(call, d.ndim)
    where = {src: i for i, src in enumerate(order)}
    pl = tuple(Shard(where[p.dim]) if isinstance(p, Shard) else p for p in d._spec.placements)
    args, kwargs = local_args(call)
    out = call.compute(*args, **kwargs)
    return wrap(out, call.mesh, pl, tuple(d.shape[i] for i in order))


register_rule(reorder, "t", "T", "mT", "transpose", "permute")
