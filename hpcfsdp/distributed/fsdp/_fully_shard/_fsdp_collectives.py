"""FSDP's collectives: the default MPI AllGather / ReduceScatter, and one group's all-gather and gradient reduction.

[Note: One group's collectives]
All-gather: the group's flat sharded buffer (cast to param_dtype) is the input; ``foreach_all_gather``
allocates the output through the group's ``AllGather`` and issues it on the communication thread;
``foreach_all_gather_copy_out`` waits and copies every parameter out of the rank-major output.

Reduction: ``foreach_reduce`` packs the unsharded gradients rank-major into one buffer allocated through
the group's ``ReduceScatter`` (zero rows for parameters without a gradient), divides it by the pre-divide
factor, issues the reduce-scatter (then, for HSDP, the all-reduce across replicas) and returns a
``ReduceResult``. ``finish_reduce`` waits for it, runs the all-reduce hook, divides by the post-divide
factor and writes (or accumulates) the sharded gradients. The results in flight are queued in the state
context shared by every state of a root (``FSDPStateContext.reductions``), oldest first.

[Note: HSDP all-reduce]
With HPCFSDP_COMM_STAGED=1 FSDP's collectives run staged on the communication thread (see [Note:
Collectives left in flight] in _comm_thread.py; off by default, it measured slower here): the all-gathers and reduce-scatters use freshly allocated buffers, so they are issued
inside ``independent()``, and HSDP's cross-replica all-reduce of a unit is issued right after its
reduce-scatter, to start when that completed (``after``). While the slow link carries one unit's
all-reduce (or the cross-host stage of a node-aware collective), the next unit's reduce-scatter runs over
shared memory, and the next all-reduce follows on the link without a gap. The main thread waits only for
reduce-scatters before issuing another (``wait_reduce_input``: at most ``reduce_scatter_max_input_buffers``
inputs alive); the all-reduces are waited for at the end of backward, or when more than
``MAX_REDUCTIONS_IN_FLIGHT`` reductions are outstanding (their outputs are shard-sized).

[Note: Gradient divide factors]
The gradient of the data-parallel mean is the sum of the N per-rank gradients divided by N (N = shard
size x replicate size, or the user's ``set_gradient_divide_factor``). In float32 and bfloat16 the
collective divides (AVG; a pre-multiplied sum for a user factor) and nothing is done locally. In float16
the sum could overflow (or the divided values underflow), so the input is divided by a pre-factor and
the output by a post-factor whose product is N; the pre-factor is the largest power of two p with
p * p < N that divides N (about sqrt(N)), so both sides keep the magnitudes in range.
``set_force_sum_reduction_for_comms(True)`` makes the collectives plain sums: the division then happens
locally, after the reduction. These are PyTorch FSDP2's factors and ops.
"""

import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from .... import _backend, _settings
from .... import _kernels
from ...._kernels import fsdp as _fused_copy
from ...._tensor import Tensor
from ... import _comm_thread as CT
from ...process_group import ProcessGroup, ReduceOp
from ._fsdp_api import AllGather, ReduceScatter

__all__ = [
    "DefaultAllGather",
    "DefaultReduceScatter",
    "PremulSum",
    "AllGatherResult",
    "ReduceResult",
    "allocate_buffer",
    "exposed_comm_seconds",
    "foreach_all_gather",
    "foreach_all_gather_copy_out",
    "foreach_reduce",
    "finish_reduce",
    "wait_reduce_input",
    "raise_finite_errors",
    "get_gradient_divide_factors",
]

_exposed = [0.0]  # seconds the main thread spent waiting for FSDP's collectives (this process)


def exposed_comm_seconds(reset: bool = False) -> float:
    """Total time the main thread waited on FSDP all-gathers and reductions; optionally reset it."""
    value = _exposed[0]
    if reset:
        _exposed[0] = 0.0
    return value


def _wait(works) -> None:
    t0 = time.perf_counter()
    for w in works:
        if w is not None:
            w.wait()
    _exposed[0] += time.perf_counter() - t0


# -- default communication objects ------------------------------------------------------------------
# [Note: Comm buffers]
# FSDP asks its AllGather / ReduceScatter for the flat buffers it communicates in. On the CPU we
# hand out page-locked memory when CuPy is present (a later host-to-device copy of the gathered
# parameters, CPU offload, is then asynchronous) and plain NumPy memory otherwise; on a GPU the
# buffer is a CuPy array on the requested device. Staging for a non-CUDA-aware MPI uses the comm
# thread's own pinned buffers (_buffers.HostStager), so device buffers stay on the device.


def allocate_buffer(size: Sequence[int], *, dtype: Any, device: Any) -> Tensor:
    """An uninitialised Tensor of ``size`` on ``device`` suited to MPI (see [Note: Comm buffers])."""
    dt = _backend.to_dtype(dtype)
    dev = _backend.to_device(device)
    shape = tuple(int(s) for s in size)
    if dev.type == "cpu":
        return Tensor._wrap(_backend.pinned_empty(shape, dt))
    if dev.type == "cuda":
        cp = _backend.array_module(dev)
        with cp.cuda.Device(dev.index):
            return Tensor._wrap(cp.empty(shape, dt))
    raise ValueError(f"allocate: device {dev} cannot hold communication buffers; expected cpu or cuda")


def _array(x: Any, what: str):
    if isinstance(x, Tensor):
        return x._data
    if isinstance(x, np.ndarray) or _backend.is_cupy_array(x):
        return x
    raise TypeError(f"{what}: expected a Tensor or an array, got {type(x).__name__}")


def _group(group: Any) -> ProcessGroup:
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group={group!r}: expected a ProcessGroup")
    return group


@dataclass(frozen=True)
class PremulSum:
    """Reduction op: multiply every input by ``factor``, then sum (NCCL's premul-sum)."""

    factor: float

    def __repr__(self) -> str:
        return f"PremulSum({self.factor!r})"


class DefaultAllGather(AllGather):
    """All-gather over the group's MPI communicator on the communication thread."""

    def allocate(self, size: Sequence[int], *, dtype: Any, device: Any) -> Tensor:
        return allocate_buffer(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, async_op: bool = False):
        return _group(group).all_gather_into(
            _array(output_tensor, "all-gather output"), _array(input_tensor, "all-gather input"), async_op
        )


class DefaultReduceScatter(ReduceScatter):
    """Reduce-scatter over the group's MPI communicator on the communication thread.

    ``op`` is a ReduceOp or a ``PremulSum``; the latter scales ``input_tensor`` in place, then sums.
    """

    def allocate(self, size: Sequence[int], *, dtype: Any, device: Any) -> Tensor:
        return allocate_buffer(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any = ReduceOp.SUM,
                 async_op: bool = False):
        inp = _array(input_tensor, "reduce-scatter input")
        if isinstance(op, PremulSum):
            inp *= inp.dtype.type(op.factor)
            op = ReduceOp.SUM
        return _group(group).reduce_scatter_into(_array(output_tensor, "reduce-scatter output"), inp, op, async_op)


# -- all-gather --------------------------------------------------------------------------------------
@dataclass(slots=True)
class AllGatherResult:
    """An all-gather in flight: its Work, its rank-major output and the layouts to copy out with."""

    work: Any
    output: Any  # (world * total,) array
    layouts: list
    total: int  # elements per rank


def foreach_all_gather(all_gather_input, group: ProcessGroup, comm: AllGather, layouts: list, total: int,
                       device, dtype=None) -> AllGatherResult:
    """Issue the all-gather of one group's flat input (asynchronously), cast to ``dtype`` if given; see [Note: One
    group's collectives]. A cast with the default all-gather runs in place: the input is cast straight into this
    rank's piece of the output, as PyTorch's FSDP2 copies it in (a temporary fewer, and at world size 1 a copy)."""
    dtype = np.dtype(all_gather_input.dtype if dtype is None else dtype)
    if type(comm) is DefaultAllGather and all_gather_input.dtype != dtype:
        output = comm.allocate((group.size() * total,), dtype=dtype, device=device)
        out = _array(output, "all-gather output")
        mine = out[group.rank() * total:(group.rank() + 1) * total]
        mine[...] = all_gather_input  # the cast, in the same pass
        with CT.independent():
            work = comm(output, Tensor._wrap(mine), group, async_op=True)
        return AllGatherResult(work, out, layouts, total)
    if all_gather_input.dtype != dtype:
        all_gather_input = all_gather_input.astype(dtype)
    output = comm.allocate((group.size() * total,), dtype=all_gather_input.dtype, device=device)
    with CT.independent():  # fresh buffers: may run beside a reduction in flight
        work = comm(output, Tensor._wrap(all_gather_input), group, async_op=True)
    return AllGatherResult(work, _array(output, "all-gather output"), layouts, total)


def _fused_copies(params, layouts, total: int, arr):
    """The group's fused copies (one launch each way, hpcfsdp/_kernels/fsdp.cu) when ``arr`` is a CuPy array and
    every parameter is sharded on dim 0 with one piece per rank; else None (the per-parameter copies)."""
    if not layouts or not _kernels.use_fused(arr) or np.dtype(arr.dtype) not in _kernels.CTYPES or any(
            lay.bounds is not None or lay.shard_dim or p.shard_dim for p, lay in zip(params, layouts)):
        return None
    key = (tuple(id(lay) for lay in layouts), total)
    cache = layouts[0].__dict__.setdefault("_fused_copies", {})  # lives as long as the group's layouts
    copies = cache.get(key)
    if copies is None:
        copies = cache[key] = _fused_copy.GroupCopies(layouts, total, layouts[0].world)
    return copies


def foreach_all_gather_copy_out(result: AllGatherResult, fsdp_params: list) -> None:
    """Wait for ``result`` and give every parameter its full data, copied out of the gathered buffer."""
    _wait([result.work])
    out = result.output
    xp = _backend.array_module(out)
    if result.layouts and all(lay.world == 1 and lay.bounds is None and not lay.shard_dim and not p.shard_dim
                              for p, lay in zip(fsdp_params, result.layouts)):
        # one rank: each parameter's rows lie whole and in order in the output, so they are its views (no copy)
        for p, layout in zip(fsdp_params, result.layouts):
            p.set_unsharded_data(out[layout.offset:layout.offset + layout.numel].reshape(
                (layout.rows,) + layout.row_shape))
        return
    copies = _fused_copies(fsdp_params, result.layouts, result.total, out)
    if copies is not None:  # one launch for the group; the parameters are views of one buffer
        for p, layout, flat in zip(fsdp_params, result.layouts, copies.copy_out(out)):
            p.set_unsharded_data(flat.reshape((layout.rows,) + layout.row_shape))
        return
    for p, layout in zip(fsdp_params, result.layouts):
        p.set_unsharded_data(layout.gathered(out, result.total, xp, out.dtype))


# -- gradient reduction ------------------------------------------------------------------------------
def get_gradient_divide_factors(reduce_scatter_size: int, all_reduce_size: Optional[int], reduce_dtype,
                                factor: Optional[float] = None, force_sum_reduction_for_comms: bool = False):
    """(pre-divide factor, post-divide factor, reduce-scatter op, all-reduce op); see [Note: Gradient divide factors].

    ``all_reduce_size`` is the replicate group's size for HSDP, else None. A factor of None means no division.
    """
    overflow_risk = _backend.to_dtype(reduce_dtype) not in (_backend.float32, _backend.bfloat16)
    data_parallel_size = reduce_scatter_size * (all_reduce_size if all_reduce_size is not None else 1)
    if factor is None:
        factor = float(data_parallel_size)
    if not overflow_risk and not force_sum_reduction_for_comms:
        if factor == data_parallel_size:
            if data_parallel_size == 1:
                return None, None, ReduceOp.SUM, ReduceOp.SUM
            return None, None, ReduceOp.AVG, ReduceOp.AVG
        return None, None, PremulSum(1.0 / factor), ReduceOp.SUM
    if overflow_risk:
        pre = 1
        while factor % pre == 0 and factor / pre > pre:
            pre *= 2
        return float(pre), factor / pre, ReduceOp.SUM, ReduceOp.SUM
    return None, factor, ReduceOp.SUM, ReduceOp.SUM


def _divide_if_needed(arr, factor: Optional[float]) -> None:
    if factor is not None and factor != 1:
        arr /= arr.dtype.type(factor)


@dataclass(slots=True)
class ReduceResult:
    """A gradient reduction in flight; ``finish_reduce`` waits for it and writes the sharded gradients."""

    group: Any  # the FSDPParamGroup the gradients belong to
    works: list
    output: Any  # (total,) reduced flat gradient of this rank's shards
    params: list  # the FSDPParams in the buffer, in layout order
    layouts: list  # where each sits in ``output`` (ParamLayouts of this reduction's parameter set)
    had_grad: list  # per parameter: whether this rank had a gradient for it
    post_divide: Optional[float] = None
    hook: Any = None  # the all-reduce hook to run on ``output`` before the post-divide
    check_group: Optional[ProcessGroup] = None  # the ranks that share these gradients (HPCFSDP_CHECK_FINITE)
    step: int = 0  # the gradient synchronisation this reduction belongs to, the first being 1
    input_work: Any = None  # the reduce-scatter, whose completion frees its input buffer


def foreach_reduce(group, params: list, layouts: list, grads: list, total: int, reduce_scatter_group: ProcessGroup,
                   comm: ReduceScatter, reduce_dtype, device, divide_factor: Optional[float],
                   force_sum_reduction_for_comms: bool, all_reduce_group: Optional[ProcessGroup],
                   all_reduce_grads: bool, partial: Optional[Any]):
    """Pack ``grads`` (one per parameter, None for no gradient) and issue their reduction.

    Returns (ReduceResult or None, partial output): None and the accumulated reduce-scatter output for HSDP
    without all-reduce; see [Note: One group's collectives]."""
    pre, post, reduce_scatter_op, all_reduce_op = get_gradient_divide_factors(
        reduce_scatter_group.size(), all_reduce_group.size() if all_reduce_group is not None else None,
        reduce_dtype, divide_factor, force_sum_reduction_for_comms)
    world = reduce_scatter_group.size()
    group.reduce_steps += 1
    had_grad = [g is not None for g in grads]
    inp = _array(comm.allocate((world * total,), dtype=reduce_dtype, device=device), "reduce-scatter input")
    copies = _fused_copies(params, layouts, total, inp)
    datas = [None if g is None else g._data for g in grads]
    dts = {d.dtype for d in datas if d is not None}
    if copies is not None and len(dts) == 1 and (inp.dtype in dts or inp.dtype == np.float32) and \
            next(iter(dts)) in _kernels.CTYPES:  # one launch for the group
        xp = _backend.array_module(inp)
        copies.copy_in([d if d is None or d.flags.c_contiguous else xp.ascontiguousarray(d) for d in datas], inp)
        grads = ()
    for p, layout, g in zip(params, layouts, grads):
        if g is None:
            inp.reshape(world, total)[:, layout.offset:layout.offset + layout.numel] = 0
        else:
            layout.scatter_into(inp, total, p.to_front(g._data))
    _divide_if_needed(inp, pre)
    # a reduce-scatter over one rank is its input: the default one then runs in place (no buffer, no copy)
    out_t = Tensor._wrap(inp) if world == 1 and type(comm) is DefaultReduceScatter else \
        comm.allocate((total,), dtype=reduce_dtype, device=device)
    with CT.independent():  # fresh buffers: left in flight, see [Note: HSDP all-reduce]
        works = [comm(out_t, Tensor._wrap(inp), reduce_scatter_group, reduce_scatter_op, async_op=True)]
    input_work = works[0]
    out = _array(out_t, "reduce-scatter output")
    if all_reduce_group is not None:
        if not all_reduce_grads:
            _wait(works)
            return None, (out if partial is None else partial + out)
        if partial is not None:
            _wait(works)
            works = []
            out += partial
        quantized = getattr(comm, "all_reduce", None)  # QuantizedReduceScatter: the replicate hop quantized too
        if quantized is not None and _backend.array_module(out) is not np:  # its hops run at the call
            _wait(works)
            works = []
        with CT.independent(after=works[0] if works else None):  # reads the reduce-scatter's output
            if quantized is not None:
                works.append(quantized(out, all_reduce_group, all_reduce_op, async_op=True))
            else:
                works.append(all_reduce_group.all_reduce_(out, all_reduce_op, async_op=True))
    return ReduceResult(group, works, out, list(params), list(layouts), had_grad, post, None, reduce_scatter_group,
                        group.reduce_steps, input_work), None


def wait_reduce_input(result: ReduceResult) -> None:
    """Wait until ``result``'s reduce-scatter completed (its input buffer is free); its all-reduce may still run."""
    if result.input_work is not None:
        _wait([result.input_work])
        result.input_work = None


def finish_reduce(result: ReduceResult) -> None:
    """Wait for ``result``, post-divide, and write or accumulate the sharded gradients of its parameters.

    With HPCFSDP_CHECK_FINITE=1 a non-finite gradient writes none of them and is recorded, agreed by every
    rank, in ``result.group.finite_error``; see [Note: Agreed finite check]."""
    _wait(result.works)
    out = result.output
    group = result.group
    owed = getattr(group.reduce_scatter_comm, "pending", None)  # See [Note: Residual state]
    if owed:
        residual = owed.pop(out.size, None)
        if residual is not None:
            out += residual.astype(out.dtype)
    if result.hook is not None:
        result.hook(Tensor._wrap(out))
    _divide_if_needed(out, result.post_divide)
    grads = []  # (parameter index, FSDPParam, this rank's gradient shard)
    for i, (p, layout, had) in enumerate(zip(result.params, result.layouts, result.had_grad)):
        if not (had or group.reduce_scatter_unused_params):
            continue
        g = p.local_grad_from(out, layout)
        if group.offload:
            g = _backend.to_numpy(g)
        dtype = p.param_dtype if group.keep_low_precision_grads else p.dtype
        if g.dtype != dtype:
            g = g.astype(dtype)
        grads.append((i, p, g))
    if _settings.get("HPCFSDP_CHECK_FINITE"):
        err = _agreed_finite_check(grads, result)
        if err is not None:
            if group.finite_error is None:
                group.finite_error = err
            return
    for _, p, g in grads:
        sp = p.sharded_param
        if sp.grad is None and group.keep_low_precision_grads:
            sp._grad = p.sharded_grad(g)  # a low-precision grad of a full-precision parameter, on purpose
        elif sp.grad is None:
            sp.grad = p.sharded_grad(g)
        else:
            sp.grad._data += g


# [Note: Agreed finite check]
# A NaN in one rank's input reaches, after the reduce-scatter, only the shards whose sum it entered:
# a rank whose shard stayed finite (or is empty) cannot see it. So the per-rank verdict is combined
# before anyone acts: every rank counts the non-finite values of each parameter's shard and the
# counts are all-gathered over the reduce-scatter group (one small collective per reduction, on the
# communication thread in issue order, only when the check is on; HSDP replicas hold identical
# shards after their all-reduce, so the shard group decides for them too). Every rank then reaches
# the same verdict: a bad reduction writes no gradient, the error is kept on its param group, and
# the root raises it at the end of backward, after every reduction and every group's bookkeeping
# finished, so every rank raises the same FloatingPointError at the same point and a caller that
# catches it can zero the gradients and train on (no rank is left in a collective alone). Steps
# count gradient synchronisations from 1, as the trainer counts optimizer steps.


def _agreed_finite_check(grads: list, result: ReduceResult) -> Optional[FloatingPointError]:
    """The FloatingPointError every rank of ``result.check_group`` agrees on, or None when all is finite."""
    n = len(result.params)  # the same on every rank, whichever parameters got a gradient here
    counts = np.zeros(n, np.int64)
    for i, _, g in grads:
        if g.size:
            xp = _backend.array_module(g)
            counts[i] = int((~xp.isfinite(g)).sum())
    pg = result.check_group
    if pg is not None and pg.size() > 1 and n:
        table = np.empty(pg.size() * n, np.int64)
        pg.all_gather_into(table, counts)
        table = table.reshape(pg.size(), n)
        ranks = pg.world_ranks
    else:
        table, ranks = counts.reshape(1, -1), (None,)
    bad_params = np.flatnonzero(table.sum(axis=0))
    if not len(bad_params):
        return None
    i = int(bad_params[0])
    p = result.params[i]
    where = [(r, int(c)) for r, c in zip(ranks, table[:, i]) if c]
    total = sum(c for _, c in where)
    on = "" if ranks == (None,) else " in the shard(s) of rank(s) " + ", ".join(str(r) for r, _ in where)
    more = f" (and {len(bad_params) - 1} more parameter(s) of this group)" if len(bad_params) > 1 else ""
    return FloatingPointError(
        f"HPCFSDP_CHECK_FINITE: gradient of {p.fqn or p.name} has {total} non-finite value(s){on} at step "
        f"{result.step}{more}")


def raise_finite_errors(groups) -> None:
    """Raise (and clear) the first agreed non-finite gradient error recorded on ``groups``."""
    first = None
    for g in groups:
        if g is not None and g.finite_error is not None:
            first = first or g.finite_error
            g.finite_error = None
    if first is not None:
        raise first
