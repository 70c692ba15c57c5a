"""torch.distributed's collectives over every rank of a group: reductions, gathers, all-to-all and barriers
(distributed_c10d re-exports them). Tensors are modified in place; a call returns a Work with ``async_op=True``,
else None once done."""

from __future__ import annotations

from hpcfsdp._tensor import Tensor
from hpcfsdp.distributed import _p2p
from hpcfsdp.distributed._buffers import array_module
from hpcfsdp.distributed._c10d_common import as_array, copy_out, finish, tensor_arrays
from hpcfsdp.distributed._c10d_groups import resolve_group
from hpcfsdp.distributed.process_group import ReduceOp

__all__ = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce_scatter_single", "all_gather",
           "reduce_scatter", "all_to_all", "all_to_all_single", "barrier", "monitored_barrier"]


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``tensor`` over ``group`` in place."""
    return resolve_group(group).all_reduce_(as_array(tensor, "all_reduce: tensor", writable=True), op, async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """Gather every rank's ``input_tensor`` into ``output_tensor`` (concatenated or stacked on dim 0)."""
    g = resolve_group(group)
    out = as_array(output_tensor, "all_gather_into_tensor: output_tensor", writable=True)
    inp = as_array(input_tensor, "all_gather_into_tensor: input_tensor")
    return g.all_gather_into(out, inp, async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):  # noqa: A002
    """Reduce ``input`` over ``group`` and give rank r the r-th equal piece (dim 0) in ``output``."""
    g = resolve_group(group)
    out = as_array(output, "reduce_scatter_tensor: output", writable=True)
    inp = as_array(input, "reduce_scatter_tensor: input")
    return g.reduce_scatter_into(out, inp, op, async_op)


def reduce_scatter_single(output, input, op=ReduceOp.SUM, group=None, async_op=False):  # noqa: A002
    """PyTorch's newer name of ``reduce_scatter_tensor`` (its FSDP1 communication hooks call it)."""
    return reduce_scatter_tensor(output, input, op=op, group=group, async_op=async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """Fill ``tensor_list[r]`` with rank r's ``tensor``."""
    g = resolve_group(group)
    inp = as_array(tensor, "all_gather: tensor")
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
    return finish(g.all_gather_into(flat, inp, async_op=True), lambda: copy_out(flat, outs), async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``input_list[r]`` over ``group`` into group rank r's ``output``."""
    g = resolve_group(group)
    out = as_array(output, "reduce_scatter: output", writable=True)
    ins = tensor_arrays("reduce_scatter", "input_list", input_list, g.size(), out)
    flat = array_module(out).concatenate([a.reshape(-1) for a in ins])
    return g.reduce_scatter_into(out, flat, op, async_op)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    """Send ``input_tensor_list[r]`` to group rank r, receive group rank r's tensor for this rank into
    ``output_tensor_list[r]`` (sizes may differ per rank; the ranks must agree on them)."""
    g = resolve_group(group)
    n = g.size()
    if not isinstance(input_tensor_list, (list, tuple)):
        raise TypeError(f"all_to_all: input_tensor_list must be a list of Tensors, got {type(input_tensor_list).__name__}")
    if len(input_tensor_list) != n:
        raise ValueError(f"all_to_all: input_tensor_list has {len(input_tensor_list)} entries, expected the group "
                         f"size {n}")
    ref = as_array(input_tensor_list[0], "all_to_all: input_tensor_list[0]")
    ins = tensor_arrays("all_to_all", "input_tensor_list", input_tensor_list, n, ref, same_size=False)
    outs = tensor_arrays("all_to_all", "output_tensor_list", output_tensor_list, n, ref, writable=True, same_size=False)
    xp = array_module(ref)
    flat_in = xp.concatenate([a.reshape(-1) for a in ins])
    flat_out = xp.empty(sum(o.size for o in outs), ref.dtype)
    w = g.all_to_all_into(flat_out, flat_in, [o.size for o in outs], [a.size for a in ins], async_op=True)
    return finish(w, lambda: copy_out(flat_out, outs), async_op)


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
    g = resolve_group(group)
    n = g.size()
    out = as_array(output, "all_to_all_single: output", writable=True)
    inp = as_array(input, "all_to_all_single: input")
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


def barrier(group=None, async_op=False, device_ids=None):
    return resolve_group(group).barrier(async_op)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False) -> None:
    """A barrier whose group rank 0 raises RuntimeError naming the ranks that did not reach it within ``timeout``
    (a timedelta or seconds; None: the group timeout, HPCFSDP_COMM_TIMEOUT), the first one or, with
    ``wait_all_ranks``, all; the ranks that did reach it raise too. Works whatever the backend name (PyTorch:
    Gloo only)."""
    g = resolve_group(group)
    g.monitored_barrier(_p2p.monitored_timeout(timeout), bool(wait_all_ranks))
