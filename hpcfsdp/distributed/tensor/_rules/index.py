"""Sharding rules of indexing: ``__getitem__``, ``__setitem__``, gather, index_select, take, masked_select,
nonzero, unique.

[Note: Index placements]
Basic indexing (ints, slices, None, Ellipsis) is local on every dim that is not sharded and on a sharded dim
taken whole (``:``); the sharded dim keeps its shard at its place in the result. An int or a partial slice of
a sharded dim gathers that dim first (its result dim is Replicate, as PyTorch's), so ``a[2:6]`` of a Shard(0)
tensor is the global rows 2..5 on every rank. Advanced indexing (tensor indices, which must be DTensors or
one-element tensors beside a sharded DTensor) gathers everything. Partial stays Partial through selection.
``__setitem__`` writes the local piece where the index leaves the sharded dims whole and the value is a
number; otherwise the whole target is gathered, written, and its piece stored back (outside autograd, as
hpcfsdp's setitem). gather/index_select along an unsharded dim with a Replicate index (gather: an index
sharded as the input on equal-sized dims) are local; take, masked_select, nonzero and unique gather.
"""
from __future__ import annotations

from hpcfsdp._tensor import Tensor
from hpcfsdp._tensor_methods._common import check_inplace
from hpcfsdp.autograd.grad_mode import is_grad_enabled, no_grad
from hpcfsdp.distributed.tensor._dispatch import OpCall, _is_dt, _move, _with, local_args, register_rule, wrap
from hpcfsdp.distributed.tensor._rules.view import bound, fallback, gathered
from hpcfsdp.distributed.tensor.placement_types import Partial, Replicate, Shard


def _basic(idx, nd):
    """(per input dim its index item, the result dim of each kept input dim) of a basic index, or None when the
    index is advanced (tensors, lists, bools)."""
    items = list(idx) if isinstance(idx, tuple) else [idx]
    for it in items:
        if not (it is None or it is Ellipsis or isinstance(it, slice) or
                (isinstance(it, int) and not isinstance(it, bool))):
            return None
    real = sum(1 for it in items if it is not None and it is not Ellipsis)
    if sum(1 for it in items if it is Ellipsis) > 1 or real > nd:
        return None
    full, where = [], {}
    k = out = 0
    for it in items:
        if it is Ellipsis:
            for _ in range(nd - real):
                full.append(slice(None))
                where[k] = out
                k += 1
                out += 1
        elif it is None:
            out += 1
        else:
            full.append(it)
            if isinstance(it, slice):
                where[k] = out
                out += 1
            k += 1
    while k < nd:
        full.append(slice(None))
        where[k] = out
        k += 1
        out += 1
    return full, where


def _whole(it, n) -> bool:
    return isinstance(it, slice) and it.indices(n) == (0, n, 1)


def _local_index(idx, whole_dims, nd):
    """``idx`` with the sharded dims taken whole spelled ``slice(None)`` (their local piece is shorter)."""
    items = list(idx) if isinstance(idx, tuple) else [idx]
    out, k = [], 0
    real = sum(1 for it in items if it is not None and it is not Ellipsis)
    for it in items:
        if it is Ellipsis:
            out.append(it)
            k += nd - real
        elif it is None:
            out.append(it)
        else:
            out.append(slice(None) if k in whole_dims else it)
            k += 1
    return tuple(out)


def getitem(call: OpCall):
    d = call.args[0]
    idx = call.args[1] if len(call.args) > 1 else call.kwargs["idx"]
    if d is not call.dtensors[0] or len(call.dtensors) > 1:
        return fallback(call, reduce_partial=False)
    basic = _basic(idx, d.ndim)
    if basic is None:
        return fallback(call, reduce_partial=False)
    full, where = basic
    cut = {p.dim for p in d._spec.placements if isinstance(p, Shard) and not _whole(full[p.dim], d.shape[p.dim])}
    if any(type(p) is not Shard for p in d._spec.placements if isinstance(p, Shard)):
        cut = {p.dim for p in d._spec.placements if isinstance(p, Shard)}
    src_pl = gathered(d, cut)
    whole = {p.dim for p in src_pl if isinstance(p, Shard)}
    args, _ = local_args(call, [src_pl])
    out = args[0][_local_index(idx, whole, d.ndim)]
    shape = _result_shape(d.shape, idx)
    out_pl = tuple(Shard(where[p.dim]) if isinstance(p, Shard) else p for p in src_pl)
    return wrap(out, call.mesh, out_pl, shape)


def _result_shape(shape, idx):
    import numpy as np

    return np.broadcast_to(np.empty((), dtype=np.int8), tuple(shape))[idx].shape


def setitem(call: OpCall):
    d = call.args[0]
    a = bound(call)
    idx, value = a["idx"], a["value"]
    if d is not call.dtensors[0]:
        raise RuntimeError("__setitem__: a DTensor value written into a plain tensor; use value.full_tensor()")
    check_inplace(d)
    if isinstance(value, Tensor) and is_grad_enabled() and value.requires_grad:
        raise RuntimeError("hpcfsdp does not record setitem of a tensor that requires grad; use torch-style "
                           "out-of-place ops (e.g. hp.where / hp.cat) or run under hp.no_grad()")
    if any(isinstance(p, Partial) for p in d._spec.placements):
        raise RuntimeError(f"__setitem__ on a Partial DTensor ({list(d._spec.placements)}): redistribute it first")
    if all(isinstance(p, Replicate) for p in d._spec.placements):
        args, _ = local_args(call, [None] + [gathered(v) for v in call.dtensors[1:]])
        with no_grad():
            args[0]._data[_index_arrays(args[1])] = args[2]._data if isinstance(args[2], Tensor) else args[2]
        return None
    basic = _basic(idx, d.ndim)
    shards = [p for p in d._spec.placements if isinstance(p, Shard)]
    if (basic is not None and not isinstance(value, Tensor) and all(type(p) is Shard for p in shards)
            and all(_whole(basic[0][p.dim], d.shape[p.dim]) for p in shards)):
        d._data[_local_index(idx, {p.dim for p in shards}, d.ndim)] = value
        return None
    with no_grad():
        full = d.full_tensor()._data.copy()
        ix = tuple(_gather_index(t) for t in idx) if isinstance(idx, tuple) else _gather_index(idx)
        full[ix] = _gather_index(value) if isinstance(value, Tensor) else value
        d._data[...] = _move(full, _with(d._spec, [Replicate()] * d._spec.mesh.ndim), d._spec)  # this rank's piece
    return None


def _gather_index(t):
    if _is_dt(t):
        return t.full_tensor()._data
    if isinstance(t, Tensor):
        return t._data
    return t


def _index_arrays(idx):
    if isinstance(idx, tuple):
        return tuple(i._data if isinstance(i, Tensor) else i for i in idx)
    return idx._data if isinstance(idx, Tensor) else idx


def select_along(call: OpCall):
    """gather/index_select: local along an unsharded dim (see [Note: Index placements]), else gathered."""
    a = bound(call)
    src = a["self"]
    index = a["index"]
    name = call.entry.name
    if src is not call.dtensors[0] or not _is_dt(index):
        return fallback(call, reduce_partial=True)
    dim = a["dim"] + src.ndim if a["dim"] < 0 else a["dim"]
    sp, ip = src._spec.placements, index._spec.placements
    if any(isinstance(p, Partial) for p in (*sp, *ip)) or any(
            isinstance(p, Shard) and type(p) is not Shard for p in (*sp, *ip)):
        return fallback(call, reduce_partial=True)
    if name == "index_select":
        ok = all(not (isinstance(p, Shard) and p.dim == dim) for p in sp) and all(isinstance(p, Replicate)
                                                                                     for p in ip)
        idx_pl = ip
    else:
        ok = src.ndim == index.ndim and all(
            (isinstance(p, Replicate) and isinstance(q, Replicate)) or
            (isinstance(p, Shard) and q == p and p.dim != dim and src.shape[p.dim] == index.shape[p.dim])
            for p, q in zip(sp, ip))
        idx_pl = ip
    if not ok:
        return fallback(call, reduce_partial=True)
    args, kwargs = local_args(call, [sp, idx_pl] if call.dtensors[1] is index else None)
    out = call.compute(*args, **kwargs)
    if name == "index_select":
        shape = list(src.shape)
        shape[dim] = index.numel()
        return wrap(out, call.mesh, sp, shape)
    return wrap(out, call.mesh, sp, index.shape)


register_rule(getitem, "__getitem__")
register_rule(setitem, "__setitem__")
register_rule(select_along, "gather", "index_select")
register_rule(lambda call: fallback(call, reduce_partial=True), "take", "masked_select", "nonzero", "unique",
              "unique_consecutive", "histogram")
