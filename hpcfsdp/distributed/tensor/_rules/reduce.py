"""Sharding rules of reductions, norms, scans, softmax, sorting, cat/stack and equal/allclose.

[Note: Reduction placements]
Per mesh dim, a reduction over dims D of a DTensor:
- Shard(k) with k not in D stays Shard, its dim shifted down by the dims of D before k when they are removed
  (keepdim=False); Replicate stays Replicate. Nothing moves.
- Shard(k) with k in D: the local result is the reduction of this rank's part, and the result is Partial:
  "sum" for sum/nansum/count_nonzero/mean (the local sum divided by the GLOBAL count, so uneven torch.chunk
  shards and empty ones give the exact mean; PyTorch writes Partial("avg") of the local mean, which is the
  same value for even shards), "max"/"min" for amax/amin and max()/min() without dim, "product" for prod,
  and _NormPartial(p) for the p-norms (Tensor.norm, linalg.vector_norm). A rank whose part is empty holds the
  reduction's identity. Nothing moves until the Partial is resolved (an all-reduce of the result's size).
- Partial input: kept by the linear ones (sum, mean of a Partial "sum"/"avg"), else reduced first.
Reductions that no Partial expresses (var/std, nanmean, logsumexp, max/min/argmax/argmin with their indices,
median/nanmedian/mode/kthvalue/quantile, all/any as a bool) and dim-wise ops (scans, softmax, sort/topk) gather
the dims they work along when sharded (redistributed to Replicate there) and keep every other placement: exact,
and the indices are global. all/any reduce their local answer at once (one all-reduce of the result).
cat/stack lay every operand out as the first one (Partial reduced unless all alike); stack shifts Shard dims at
or after the new dim; cat along a sharded dim gathers that dim. Stacking 0-d p-norm partials keeps the
_NormPartial, so ``vector_norm(stack([g.norm() for g in grads]))`` is the global total norm.
equal/allclose answer for the global tensors (one all-reduce of a flag over the mesh).
"""
from __future__ import annotations

import functools
import inspect
import math

import numpy as np

from hpcfsdp._array import wrap_dim
from hpcfsdp._backend import array_module
from hpcfsdp._tensor import Tensor
from hpcfsdp.distributed.process_group import ReduceOp
from hpcfsdp.distributed.tensor._dispatch import OpCall, local_args, no_rule, redistribute_local, register_rule, wrap
from hpcfsdp.distributed.tensor.placement_types import (Partial, Replicate, Shard, _InterleavedShard, _NormPartial,
                                                        _StridedShard)

# op -> the Partial reduce op a reduction over a sharded dim gives
_PARTIAL = {"sum": "sum", "nansum": "sum", "mean": "sum", "count_nonzero": "sum", "prod": "product",
            "amax": "max", "amin": "min", "max": "max", "min": "min"}
_LINEAR = {"sum", "mean"}  # keep a Partial "sum"/"avg" input
GATHERED = ("var", "std", "nanmean", "logsumexp", "argmax", "argmin", "median", "nanmedian", "mode", "kthvalue",
            "quantile", "nanquantile", "cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "softmax", "log_softmax", "sort",
            "argsort", "topk")


@functools.lru_cache(maxsize=None)
def _signature(entry):
    return inspect.signature(entry.impl)


def _bound(call: OpCall) -> dict:
    b = _signature(call.entry).bind(*call.args, **call.kwargs)
    b.apply_defaults()
    return b.arguments


def _dims(dim, ndim):
    """The reduced dims as a sorted tuple (None, () : all)."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(ndim))
    if isinstance(dim, (list, tuple)):
        return tuple(sorted({wrap_dim(d, max(ndim, 1)) for d in dim}))
    return (wrap_dim(dim, max(ndim, 1)),) if ndim else ()


def _shifted(p, dim):
    if isinstance(p, (_StridedShard, _InterleavedShard)):
        return type(p)(dim, p.split_factor)
    return Shard(dim)


def _resolved_input(d, keep_partial: bool):
    """Placements of ``d`` with Partials reduced (Replicate), unless ``keep_partial`` and they are linear."""
    out = []
    for p in d._spec.placements:
        linear = type(p) is Partial and p.reduce_op in ("sum", "avg")
        out.append(p if not isinstance(p, Partial) or (keep_partial and linear) else Replicate())
    return tuple(out)


def _out_placements(src, dims, keepdim, reduced_kind):
    """Result placements of a reduction over ``dims`` of a tensor laid out as ``src`` (See [Note: Reduction
    placements]); ``reduced_kind`` the placement a sharded reduced dim becomes."""
    out = []
    for p in src:
        if isinstance(p, Shard):
            if p.dim in dims:
                out.append(reduced_kind)
            else:
                out.append(_shifted(p, p.dim if keepdim else p.dim - sum(1 for d in dims if d < p.dim)))
        else:
            out.append(p)
    return tuple(out)


def _out_shape(shape, dims, keepdim):
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dims)


def _local_extent_empty(x, dims) -> bool:
    return any(x._data.shape[d] == 0 for d in dims)


def _identity_fill(x, dims, keepdim, value):
    """The reduction's identity in the local result's shape, linked to ``x`` in the graph (a zero gradient)."""
    base = x.sum(dims, keepdim) if dims else x.clone()
    base = base.to(x.dtype) * 0
    return base + value


def _extreme_identity(x, is_min):
    if x._data.dtype.kind == "f":
        return math.inf if is_min else -math.inf
    if x._data.dtype == np.bool_:
        return bool(is_min)
    info = np.iinfo(x._data.dtype)
    return int(info.max if is_min else info.min)


# -- reductions with a Partial result ------------------------------------------------------------------------
def reduction(call: OpCall):
    name = call.entry.name
    d = call.dtensors[0]
    a = _bound(call)
    if name in ("max", "min") and (a.get("other") is not None or isinstance(a.get("dim"), Tensor)):
        other = a["other"] if a.get("other") is not None else a["dim"]
        return d.minimum(other) if name == "min" else d.maximum(other)
    if name in ("max", "min") and a.get("dim") is not None:
        return gathered(call)
    if name == "amax" or name == "amin":
        dims = _dims(a["dim"], d.ndim)
    else:
        dims = _dims(a.get("dim"), d.ndim)
    keepdim = bool(a.get("keepdim", False))
    src = _resolved_input(d, name in _LINEAR)
    sharded = any(isinstance(p, Shard) and p.dim in dims for p in src)
    out_pl = _out_placements(src, dims, keepdim, Partial(_PARTIAL[name]))
    (x, *rest), kwargs = local_args(call, [src] + [None] * (len(call.dtensors) - 1))
    if name == "mean" and sharded:
        y = x if a.get("dtype") is None else x.to(a["dtype"])
        if not y.is_floating_point():
            call.compute(y, *rest, **kwargs)  # raises PyTorch's error
        count = math.prod(d.shape[k] for k in dims)
        out = y.sum(dims, keepdim) / count
    elif name in ("amax", "amin", "max", "min") and sharded and _local_extent_empty(x, dims):
        out = _identity_fill(x, dims, keepdim, _extreme_identity(x, name in ("amin", "min")))
    else:
        out = call.compute(x, *rest, **kwargs)
    shape = _out_shape(d.shape, dims, keepdim) if name != "count_nonzero" else _out_shape(d.shape, dims, False)
    if name == "count_nonzero":
        out_pl = _out_placements(src, dims, False, Partial("sum"))
    return wrap(out, call.mesh, out_pl, shape)


def all_any(call: OpCall):
    """all/any: the local answer over the local part, then (over sharded reduced dims) a min/max all-reduce
    of it (a bool result has no Partial here: it is reduced at once)."""
    d = call.dtensors[0]
    a = _bound(call)
    dims = _dims(a.get("dim"), d.ndim)
    keepdim = bool(a.get("keepdim", False))
    src = _resolved_input(d, False)
    (x, *_r), _ = local_args(call, [src])
    out = call.compute(x, a.get("dim"), keepdim)
    red = [i for i, p in enumerate(src) if isinstance(p, Shard) and p.dim in dims]
    if red:
        xp = array_module(out._data)
        buf = xp.array(out._data, dtype=np.uint8, order="C", copy=True)
        for i in red:
            call.mesh.get_group(i).all_reduce_(buf, ReduceOp.MIN if call.entry.name == "all" else ReduceOp.MAX)
        out = Tensor._wrap(buf.astype(np.bool_))
    pl = tuple(Replicate() if i in red else p for i, p in enumerate(_out_placements(src, dims, keepdim, None)))
    return wrap(out, call.mesh, pl, _out_shape(d.shape, dims, keepdim))


# -- norms ---------------------------------------------------------------------------------------------------
def _vector_ord(p, dim):
    """The vector-norm order of Tensor.norm(p, dim), or None where it is a matrix norm."""
    if isinstance(p, str):
        if p == "fro" and (dim is None or isinstance(dim, (int, np.integer)) or len(dim) <= 2):
            return 2.0
        return None
    return 2.0 if p is None else float(p)


def norm(call: OpCall):
    d = call.dtensors[0]
    a = _bound(call)
    ordv = _vector_ord(a["p"], a["dim"])
    if ordv is None:  # a matrix norm: over its two dims gathered
        return gathered(call, dims=_dims(a["dim"], d.ndim))
    dims = _dims(a["dim"], d.ndim)
    keepdim = bool(a["keepdim"])
    kind = _NormPartial(int(ordv) if ordv.is_integer() else ordv)
    # the p-norm of p-norm partials is their partial p-norm: (sum_i sum_r v_ri^p)^(1/p) regroups by rank
    src = tuple(p if p == kind else q for p, q in zip(d._spec.placements, _resolved_input(d, False)))
    sharded = any(isinstance(p, Shard) and p.dim in dims for p in src)
    out_pl = _out_placements(src, dims, keepdim, kind)
    (x, *_r), _ = local_args(call, [src])
    if sharded and _local_extent_empty(x, dims):
        ident = math.inf if ordv < 0 else 0.0  # -inf and negative orders: (sum v^p)^(1/p) of nothing is inf
        y = x if a["dtype"] is None else x.to(a["dtype"])
        out = _identity_fill(y.abs(), dims, keepdim, ident)
    else:
        out = call.compute(x, a["p"], a["dim"], keepdim, a["dtype"])
    return wrap(out, call.mesh, out_pl, _out_shape(d.shape, dims, keepdim))


# -- ops along dims gathered when sharded --------------------------------------------------------------------
def _along(call: OpCall, a: dict, ndim: int):
    """(dims the op works along, whether they are removed from the result)."""
    name = call.entry.name
    dim = a.get("dim")
    if name in ("argmax", "argmin") and dim is None:
        return tuple(range(ndim)), not a.get("keepdim", False)
    if name in ("median", "nanmedian", "quantile", "nanquantile") and dim is None:
        return tuple(range(ndim)), True
    if name in ("var", "std") and isinstance(dim, bool):
        return tuple(range(ndim)), not a.get("keepdim", False)
    if name in ("var", "std", "logsumexp", "nanmean", "max", "min", "argmax", "argmin"):
        return _dims(dim, ndim), not a.get("keepdim", False)
    if name in ("median", "nanmedian", "mode", "kthvalue", "quantile", "nanquantile"):
        return _dims(dim, ndim), not a.get("keepdim", False)
    return _dims(dim, ndim), False  # scans, softmax, sort, topk keep every dim


def gathered(call: OpCall, dims=None):
    """The op on local parts with the dims it works along gathered (See [Note: Reduction placements])."""
    d = call.dtensors[0]
    a = _bound(call)
    along, removed = _along(call, a, d.ndim)
    if dims is not None:
        along, removed = dims, not a.get("keepdim", False)
    src = tuple(Replicate() if isinstance(p, Partial) or (isinstance(p, Shard) and p.dim in along) else p
                for p in d._spec.placements)
    args, kwargs = local_args(call, [src] + [None] * (len(call.dtensors) - 1))
    out = call.compute(*args, **kwargs)
    kept = [k for k in range(d.ndim) if not (removed and k in along)]

    def place(o):
        if not isinstance(o, Tensor):
            return o
        offset = o.ndim - len(kept)  # quantile with a 1-D q: a leading dim
        pl, shape = [], list(o.shape)
        for p in src:
            if isinstance(p, Shard):
                j = kept.index(p.dim) + offset
                pl.append(_shifted(p, j))
                shape[j] = d.shape[p.dim]
            else:
                pl.append(p)
        return wrap(o, call.mesh, pl, shape)

    if isinstance(out, tuple):
        items = [place(o) for o in out]
        return tuple(items) if type(out) is tuple else type(out)(*items)
    return place(out)


def composite(call: OpCall):
    """var_mean/std_mean: the body, whose var/std/mean calls dispatch on the DTensor."""
    return call.entry.function.__hp_body__(*call.args, **call.kwargs)


# -- cat and stack ---------------------------------------------------------------------------------------------
def _tensors_arg(call):
    a = call.args[0] if call.args else call.kwargs["tensors"]
    dim = call.args[1] if len(call.args) > 1 else call.kwargs.get("dim", 0)
    return list(a), dim


def cat_stack(call: OpCall):
    name = call.entry.name
    tensors, dim = _tensors_arg(call)
    if not all(isinstance(t, Tensor) and t is not None and hasattr(t, "_spec") for t in tensors):
        raise RuntimeError(f"{name}: got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to "
                           "DTensor before calling distributed operators!")
    first = tensors[0]
    nd = first.ndim
    stack = name == "stack"
    d = wrap_dim(dim, nd + 1 if stack else max(nd, 1))
    pls = [t._spec.placements for t in tensors]
    target = []
    for i, p in enumerate(first._spec.placements):
        if isinstance(p, Partial):
            alike = all(q[i] == p for q in pls)
            linear = type(p) is Partial and p.reduce_op in ("sum", "avg")
            target.append(p if alike and (linear or isinstance(p, _NormPartial) or p.reduce_op in ("max", "min"))
                          else Replicate())
        elif isinstance(p, Shard) and not stack and p.dim == d:
            target.append(Replicate())
        else:
            target.append(p)
    target = tuple(target)
    locs = [redistribute_local(t, target) for t in tensors]
    out = call.compute(locs, d)
    if stack:
        pl = tuple(_shifted(p, p.dim + 1 if p.dim >= d else p.dim) if isinstance(p, Shard) else p for p in target)
        shape = list(first.shape)
        shape.insert(d, len(tensors))
    else:
        pl = target
        kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or tensors[:1]
        shape = list(kept[0].shape)
        shape[d] = sum(t.shape[d] for t in kept)
    return wrap(out, call.mesh, pl, shape)


# -- equal / allclose --------------------------------------------------------------------------------------------
def compare_global(call: OpCall):
    """equal/allclose of DTensors: the answer for the global tensors, the same bool on every rank."""
    ds = call.dtensors
    if len(ds) != 2 or not (call.args[0] is ds[0] and call.args[1] is ds[1]):
        no_rule(call)
    a, b = ds
    if tuple(a.shape) != tuple(b.shape):
        return False
    target = tuple(Replicate() if isinstance(p, Partial) else p for p in a._spec.placements)
    (x, y, *rest), kwargs = local_args(call, [target, target])
    ok = bool(call.compute(x, y, *rest, **kwargs))
    flag = np.array([1 if ok else 0], np.int64)
    mesh = call.mesh
    for i in range(mesh.ndim):
        if isinstance(target[i], Shard) and mesh.size(i) > 1:
            mesh.get_group(i).all_reduce_(flag, ReduceOp.MIN)
    return bool(flag[0])


register_rule(reduction, "sum", "nansum", "mean", "prod", "amax", "amin", "max", "min", "count_nonzero")
register_rule(all_any, "all", "any")
register_rule(norm, "norm")
register_rule(gathered, *GATHERED)
register_rule(composite, "var_mean", "std_mean")
register_rule(cat_stack, "cat", "stack")
register_rule(compare_global, "equal", "allclose")
