"""Sharding rules of views: those that only reorder dims (transpose, t, T, mT, permute, movedim/moveaxis: a
sharded dim moves with its data, so the local piece is reordered the same way and no data moves between ranks),
reshapes (See [Note: View placements]), expand/broadcast_to, split/chunk/tensor_split/unbind/narrow,
tril/triu/diagonal/diag, and the ops that move data along some dims (flip, fliplr, flipud, roll, rot90, diff,
msort: those dims gathered, every other shard kept; tile, trace, repeat_interleave, ravel gathered)."""
from __future__ import annotations

import inspect
import math

from hpcfsdp._array import wrap_dim
from hpcfsdp._tensor import Size, Tensor
from hpcfsdp.distributed.tensor._dispatch import OpCall, _is_dt, local_args, redistribute_local, register_rule, wrap, wrap_all
from hpcfsdp.distributed.tensor.placement_types import Partial, Replicate, Shard


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
    if name == "movedim":
        a = bound(call)
        src, dst = a["source"], a["destination"]
        src = [wrap_dim(x, nd) for x in (src if isinstance(src, (list, tuple)) else [src])]
        dst = [wrap_dim(x, nd) for x in (dst if isinstance(dst, (list, tuple)) else [dst])]
        order = [None] * nd
        for s_, t_ in zip(src, dst):
            order[t_] = s_
        rest = iter(k for k in range(nd) if k not in src)
        return [o if o is not None else next(rest) for o in order]
    raise AssertionError(name)  # pragma: no cover


def reorder(call: OpCall):
    d = call.dtensors[0]
    order = _order(call, d.ndim)
    where = {src: i for i, src in enumerate(order)}
    pl = tuple(Shard(where[p.dim]) if isinstance(p, Shard) else p for p in d._spec.placements)
    args, kwargs = local_args(call)
    out = call.compute(*args, **kwargs)
    return wrap(out, call.mesh, pl, tuple(d.shape[i] for i in order))


register_rule(reorder, "t", "T", "mT", "transpose", "permute", "movedim")


# -- shape-changing views -----------------------------------------------------------------------------------
# [Note: View placements]
# A reshape (view, reshape, flatten, unflatten, squeeze, unsqueeze, view_as, reshape_as) splits the input and
# output dims into groups of equal element counts. A sharded input dim stays local when it is its group's
# leading dim and the group's leading output dim is chunked exactly like it (the same dim, only size-1 dims
# around it added or removed; or both sizes divide evenly by the mesh dim, as PyTorch's view propagation asks,
# and ceil(S_out/w) * inner_out = ceil(S_in/w) * inner_in
# elements of the group on every rank): the result is Shard of that output dim. Any other sharded dim (a trailing dim of a group,
# an uneven split that would not line up, strided or nested shards) is gathered first (Replicate on that mesh
# dim). Partial stays Partial through every view here (they only select and move elements).
def bound(call: OpCall):
    """The call's arguments bound to its entry's signature, defaults applied."""
    e = call.entry
    fn = e.impl if e.impl is not None else getattr(e.function, "__hp_body__", e.function)
    ba = inspect.signature(fn).bind(*call.args, **call.kwargs)
    ba.apply_defaults()
    return ba.arguments


def gathered(d, dims=None, reduce_partial=False):
    """``d``'s placements with each Shard of a tensor dim in ``dims`` (all when None) made Replicate, and
    Partial reduced when ``reduce_partial``."""
    out = []
    for p in d._spec.placements:
        if isinstance(p, Shard) and (dims is None or p.dim in dims):
            out.append(Replicate())
        elif isinstance(p, Partial) and reduce_partial:
            out.append(Replicate())
        else:
            out.append(p)
    return tuple(out)


def _plain_shards(d) -> bool:
    pl = [p for p in d._spec.placements if isinstance(p, Shard)]
    return all(type(p) is Shard for p in pl) and len({p.dim for p in pl}) == len(pl)


def fallback(call: OpCall, reduce_partial=True, shard_back=None):
    """The op on the DTensor operands gathered to Replicate (Partial reduced when ``reduce_partial``): every
    tensor result Replicate, or the one result re-sharded as ``shard_back`` (placements) when given."""
    targets = [gathered(d, None, reduce_partial) for d in call.dtensors]
    args, kwargs = local_args(call, targets)
    out = call.compute(*args, **kwargs)
    if call.entry.inplace and out is args[0]:
        return call.args[0]
    pl = targets[0]
    res = wrap_all(out, call.mesh, pl)
    if shard_back is not None and _is_dt(res):
        res = res.redistribute(call.mesh, shard_back)
    return res


def _sizes(args):
    if len(args) == 1 and isinstance(args[0], (list, tuple, Size)):
        args = tuple(args[0])
    return [int(s) for s in args]


def _infer(shape, numel):
    shape = list(shape)
    if -1 in shape:
        k = shape.index(-1)
        rest = math.prod(s for i, s in enumerate(shape) if i != k)
        shape[k] = numel // rest if rest else 0
    return tuple(shape)


def _reshape_target(call: OpCall, shape):
    """The global output shape of a reshape-like call, or None when it is not a plain reshape (view(dtype))."""
    a = bound(call)
    name = call.entry.name
    nd = len(shape)
    numel = math.prod(shape)
    if name in ("view", "reshape"):
        s = a["shape"]
        if len(s) == 1 and not isinstance(s[0], (int, list, tuple, Size)):
            return None  # view(dtype)
        return _infer(_sizes(s), numel)
    if name in ("view_as", "reshape_as"):
        return tuple(a["other"].shape)
    if name == "flatten":
        if nd == 0:
            return (1,)
        s, e = wrap_dim(a["start_dim"], nd), wrap_dim(a["end_dim"], nd)
        return tuple(shape[:s]) + (math.prod(shape[s:e + 1]),) + tuple(shape[e + 1:])
    if name == "unflatten":
        dim = wrap_dim(a["dim"], nd)
        return tuple(shape[:dim]) + _infer(_sizes([a["sizes"]]), shape[dim]) + tuple(shape[dim + 1:])
    if name == "squeeze":
        dim = a["dim"]
        dims = range(nd) if dim is None else [wrap_dim(x, nd) for x in (dim if isinstance(dim, (list, tuple))
                                                                            else [dim])]
        return tuple(s for i, s in enumerate(shape) if not (i in dims and s == 1))
    if name == "unsqueeze":
        dim = wrap_dim(a["dim"], nd + 1)
        return tuple(shape[:dim]) + (1,) + tuple(shape[dim:])
    raise AssertionError(name)  # pragma: no cover


def _groups(src, dst):
    """Pairs (input dims, output dims) of equal element counts, in order; size-1 dims join the group before
    them (leading ones the first group)."""
    out, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        gi, gj = [], []
        pi = pj = 1
        while True:
            if gi and gj and pi == pj:  # balanced: take trailing size-1 dims, then close the group
                if j < len(dst) and dst[j] == 1:
                    gj.append(j)
                    j += 1
                elif i < len(src) and src[i] == 1:
                    gi.append(i)
                    i += 1
                else:
                    break
            elif i < len(src) and (pi <= pj or j == len(dst)):
                gi.append(i)
                pi *= src[i]
                i += 1
            elif j < len(dst):
                gj.append(j)
                pj *= dst[j]
                j += 1
            else:
                break
        out.append((gi, gj))
    return out


def reshape(call: OpCall):
    d = call.dtensors[0]
    shape = tuple(d.shape)
    target = _reshape_target(call, shape)
    if target is None or math.prod(target) != math.prod(shape):
        return fallback(call, reduce_partial=False)
    mesh = call.mesh
    out_pl = list(d._spec.placements)
    src_pl = list(d._spec.placements)
    groups = _groups(shape, target)
    plain = _plain_shards(d)
    for i, p in enumerate(d._spec.placements):
        if not isinstance(p, Shard):
            continue
        w = mesh.size(i)
        ok = None
        for gi, gj in groups:
            if p.dim in gi and gi and gj and plain:
                # the sharded dim must be the group's first non-trivial dim, the output its first of the group
                lead = next((k for k in gi if shape[k] != 1), gi[0])
                olead = next((k for k in gj if target[k] != 1), gj[0])
                if p.dim == lead:
                    inner_in = math.prod(shape[k] for k in gi if k > p.dim)
                    inner_out = math.prod(target[k] for k in gj if k > olead)
                    same = shape[p.dim] == target[olead] and inner_in == inner_out  # the dim itself, unchanged
                    even = shape[p.dim] % w == 0 and target[olead] % w == 0  # PyTorch's: even splits only
                    if same or (even and -(-shape[p.dim] // w) * inner_in == -(-target[olead] // w) * inner_out):
                        ok = olead
        if ok is None:
            src_pl[i] = Replicate()
            out_pl[i] = Replicate()
        else:
            out_pl[i] = Shard(ok)
    x = redistribute_local(d, src_pl)
    local_shape = list(target)
    for i, p in enumerate(out_pl):
        if isinstance(p, Shard):
            src_dim = src_pl[i].dim
            groups_for = next((gi, gj) for gi, gj in groups if src_dim in gi)
            inner_in = math.prod(shape[k] for k in groups_for[0] if k > src_dim)
            inner_out = math.prod(target[k] for k in groups_for[1] if k > p.dim)
            local_shape[p.dim] = x.shape[src_dim] * inner_in // inner_out if inner_out else 0
    out = x.view(*local_shape) if call.entry.name in ("view", "view_as") else x.reshape(*local_shape)
    return wrap(out, mesh, out_pl, target)


# -- broadcasting views -------------------------------------------------------------------------------------
def expand(call: OpCall):
    d = call.dtensors[0]
    a = bound(call)
    name = call.entry.name
    if name == "expand":
        sizes = _sizes(a["sizes"])
    elif name == "expand_as":
        sizes = list(a["other"].shape)
    else:
        sizes = _sizes([a["shape"]])
    lead = len(sizes) - d.ndim
    target = [d.shape[k - lead] if s == -1 else s for k, s in enumerate(sizes)]
    src_pl = [Replicate() if isinstance(p, Shard) and d.shape[p.dim] != target[p.dim + lead] else p
              for p in d._spec.placements]
    x = redistribute_local(d, src_pl)
    local = list(target)
    out_pl = []
    for p in src_pl:
        if isinstance(p, Shard):
            local[p.dim + lead] = x.shape[p.dim]
            out_pl.append(Shard(p.dim + lead))
        else:
            out_pl.append(p)
    return wrap(x.expand(*local), call.mesh, out_pl, target)


# -- splitting ----------------------------------------------------------------------------------------------
def split(call: OpCall):
    """split/chunk/tensor_split/unbind/narrow along a dim: local when the dim is not sharded (the other dims
    keep their shards), else that dim gathered first."""
    d = call.dtensors[0]
    a = bound(call)
    name = call.entry.name
    dim = wrap_dim(a.get("dim", 0), d.ndim)
    src_pl = gathered(d, {dim})
    if not _plain_shards(d):
        src_pl = gathered(d)
    args, kwargs = local_args(call, [src_pl] + [None] * (len(call.dtensors) - 1))
    out = call.compute(*args, **kwargs)
    gone = name == "unbind"
    out_pl = tuple(Shard(p.dim - (gone and p.dim > dim)) if isinstance(p, Shard) else p for p in src_pl)

    def one(t):
        shape = list(d.shape)
        if gone:
            del shape[dim]
        else:
            shape[dim] = t.shape[dim]
        return wrap(t, call.mesh, out_pl, shape)

    if isinstance(out, Tensor):
        return one(out)
    return tuple(one(t) for t in out)


# -- diagonals and triangles --------------------------------------------------------------------------------
def triangle(call: OpCall):
    """tril/triu: local when the last two dims are not sharded; diagonal: when dim1 and dim2 are not; diag
    gathered."""
    d = call.dtensors[0]
    name = call.entry.name
    nd = d.ndim
    if name == "diag" or not _plain_shards(d):
        return fallback(call, reduce_partial=False)
    if name == "diagonal":
        a = bound(call)
        mat = {wrap_dim(a["dim1"], nd), wrap_dim(a["dim2"], nd)}
    else:
        mat = {nd - 2, nd - 1}
    src_pl = gathered(d, mat)
    args, kwargs = local_args(call, [src_pl])
    out = call.compute(*args, **kwargs)
    if name != "diagonal":
        return wrap(out, call.mesh, src_pl, d.shape)
    keep = [k for k in range(nd) if k not in mat]
    out_pl = tuple(Shard(keep.index(p.dim)) if isinstance(p, Shard) else p for p in src_pl)
    shape = [d.shape[k] for k in keep] + [out.shape[-1]]
    return wrap(out, call.mesh, out_pl, shape)


def _moved_dims(call: OpCall, nd: int):
    """The dims along which flip/fliplr/flipud/roll/rot90/diff/msort move data, or None for all of them (roll
    without dims works on the flattened tensor)."""
    name = call.entry.name
    if name == "fliplr":
        return {1}
    if name in ("flipud", "msort"):
        return {0}
    a = bound(call)
    if name == "flip":
        dims = a["dims"][0] if len(a["dims"]) == 1 and isinstance(a["dims"][0], (list, tuple)) else a["dims"]
    elif name == "diff":
        dims = [a["dim"]]
    else:  # roll, rot90
        dims = a["dims"]
        if dims is None or (isinstance(dims, (list, tuple)) and not dims):
            return None
        dims = dims if isinstance(dims, (list, tuple)) else [dims]
    return {wrap_dim(int(k), nd) for k in dims}


def moved(call: OpCall):
    """An op that moves data along some dims: computed on local pieces with those dims gathered; the result keeps
    every other shard (its size along them is the input's) and a Partial input is reduced first."""
    d = call.dtensors[0]
    dims = _moved_dims(call, d.ndim)
    if dims is None or len(call.dtensors) > 1 or not _plain_shards(d):  # diff's prepend/append: all gathered
        return fallback(call)
    src = gathered(d, dims, reduce_partial=True)
    args, kwargs = local_args(call, [src])
    out = call.compute(*args, **kwargs)
    shape = list(out.shape)
    for p in src:
        if isinstance(p, Shard):
            shape[p.dim] = d.shape[p.dim]  # rot90 swaps only gathered dims: the others stay in place
    return wrap(out, call.mesh, src, tuple(shape))


register_rule(moved, "flip", "fliplr", "flipud", "roll", "rot90", "diff", "msort")
register_rule(fallback, "tile", "trace", "repeat_interleave", "ravel")
register_rule(reshape, "view", "reshape", "view_as", "reshape_as", "flatten", "unflatten", "squeeze", "unsqueeze")
register_rule(expand, "expand", "expand_as", "broadcast_to")
register_rule(split, "split", "chunk", "tensor_split", "unbind", "narrow")
register_rule(triangle, "tril", "triu", "diagonal", "diag")
