"""Differentiable collectives over one process group: the communication of tensor-parallel layers."""

from __future__ import annotations

from hpcfsdp._backend import array_module
from hpcfsdp._tensor import Tensor
from hpcfsdp.autograd.function import Function
from hpcfsdp.distributed.process_group import ReduceOp

__all__ = ["copy_to_group", "reduce_from_group", "gather_from_group", "scatter_to_group",
           "all_gather_along", "reduce_scatter_along"]

# [Note: Tensor-parallel autograd]
# Without DTensor op dispatch, a tensor-parallel layer computes on local pieces and puts its communication
# in autograd Functions whose backward is the adjoint of the forward, under the convention that every rank
# of the group computes the same loss from replicated activations (so a replicated activation's gradient is
# the same on every rank):
#   copy_to_group      forward identity           backward all-reduce (sum)   Replicate in, colwise
#   reduce_from_group  forward all-reduce (sum)   backward identity           Partial -> Replicate, rowwise
#   gather_from_group  forward all-gather(dim)    backward own slice          Shard(dim) -> Replicate
#   scatter_to_group   forward own slice          backward all-gather(dim)    Replicate -> Shard(dim)
#   all_gather_along   forward all-gather(dim)    backward reduce-scatter     Shard(dim) -> Replicate (seq. par.)
#   reduce_scatter_along forward reduce-scatter   backward all-gather(dim)    Partial -> Shard(dim) (seq. par.)
# Pieces along ``dim`` must be equal on every rank (the size divisible by the group size).


def _all_reduce(arr, group):
    out = array_module(arr).ascontiguousarray(arr).copy()
    group.all_reduce_(out, ReduceOp.SUM)
    return out


def _check_divisible(arr, dim, n, what):
    if arr.shape[dim] % n:
        raise ValueError(f"{what}: dim {dim} of size {arr.shape[dim]} does not divide over {n} ranks")


def _all_gather(arr, group, dim):
    xp = array_module(arr)
    n = group.size()
    moved = xp.ascontiguousarray(xp.moveaxis(arr, dim, 0))
    out = xp.empty((n * moved.shape[0],) + moved.shape[1:], arr.dtype)
    group.all_gather_into(out, moved)
    return xp.ascontiguousarray(xp.moveaxis(out, 0, dim))


def _slice(arr, group, dim):
    n, r = group.size(), group.rank()
    _check_divisible(arr, dim, n, "scatter to the tensor-parallel group")
    c = arr.shape[dim] // n
    xp = array_module(arr)
    return xp.ascontiguousarray(xp.take(arr, range(r * c, (r + 1) * c), axis=dim))


def _reduce_scatter(arr, group, dim):
    xp = array_module(arr)
    n = group.size()
    _check_divisible(arr, dim, n, "reduce-scatter over the tensor-parallel group")
    moved = xp.ascontiguousarray(xp.moveaxis(arr, dim, 0))
    out = xp.empty((moved.shape[0] // n,) + moved.shape[1:], arr.dtype)
    group.reduce_scatter_into(out, moved, ReduceOp.SUM)
    return xp.ascontiguousarray(xp.moveaxis(out, 0, dim))


class _CopyToGroup(Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return Tensor._wrap(x._data)

    @staticmethod
    def backward(ctx, g):
        return Tensor._wrap(_all_reduce(g._data, ctx.group)), None


class _ReduceFromGroup(Function):
    @staticmethod
    def forward(ctx, x, group):
        return Tensor._wrap(_all_reduce(x._data, group))

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherFromGroup(Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim % x._data.ndim
        return Tensor._wrap(_all_gather(x._data, group, ctx.dim))

    @staticmethod
    def backward(ctx, g):
        return Tensor._wrap(_slice(g._data, ctx.group, ctx.dim)), None, None


class _ScatterToGroup(Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim % x._data.ndim
        return Tensor._wrap(_slice(x._data, group, ctx.dim))

    @staticmethod
    def backward(ctx, g):
        return Tensor._wrap(_all_gather(g._data, ctx.group, ctx.dim)), None, None


class _AllGatherAlong(Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim % x._data.ndim
        return Tensor._wrap(_all_gather(x._data, group, ctx.dim))

    @staticmethod
    def backward(ctx, g):
        return Tensor._wrap(_reduce_scatter(g._data, ctx.group, ctx.dim)), None, None


class _ReduceScatterAlong(Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim % x._data.ndim
        return Tensor._wrap(_reduce_scatter(x._data, group, ctx.dim))

    @staticmethod
    def backward(ctx, g):
        return Tensor._wrap(_all_gather(g._data, ctx.group, ctx.dim)), None, None


def copy_to_group(x, group):
    """Identity forward, gradient summed over ``group`` (see [Note: Tensor-parallel autograd])."""
    return _CopyToGroup.apply(x, group)


def reduce_from_group(x, group):
    """Sum over ``group`` forward, identity backward."""
    return _ReduceFromGroup.apply(x, group)


def gather_from_group(x, group, dim: int = -1):
    """All-gather along ``dim`` forward; backward keeps this rank's slice of the gradient."""
    return _GatherFromGroup.apply(x, group, dim)


def scatter_to_group(x, group, dim: int = -1):
    """This rank's slice along ``dim`` forward; backward all-gathers the gradient."""
    return _ScatterToGroup.apply(x, group, dim)


def all_gather_along(x, group, dim: int = 1):
    """All-gather along ``dim`` forward; backward reduce-scatters the gradient (sequence parallelism)."""
    return _AllGatherAlong.apply(x, group, dim)


def reduce_scatter_along(x, group, dim: int = 1):
    """Reduce-scatter along ``dim`` forward; backward all-gathers the gradient (sequence parallelism)."""
    return _ReduceScatterAlong.apply(x, group, dim)
