"""Quantized FSDP collectives (ZeRO++'s qwZ and qgZ), as seed 001's AllGather / ReduceScatter: set per unit with
``set_custom_all_gather`` / ``set_custom_reduce_scatter``.

[Note: Quantized all-gather]
Across hosts, each rank quantizes its flat shard (int8 or fp8 e4m3, a float32 scale per block; See [Note: Quantized
payloads] in hpcfsdp/_kernels/quantize.py), the payloads are all-gathered as bytes, and every rank dequantizes all
of them, its own included, into the unsharded parameters: every rank computes with the same weights, while the
sharded master copy (what the optimizer steps) stays in full precision. Only the communicated copy is rounded.
A group on one host (HSDP's shard group) has no slow link: it gathers in full precision.

[Note: Quantized gradient reduction]
The reduction of a group spanning several hosts runs in two hops. Inside each host, a full-precision
reduce-scatter over the host's ranks leaves the rank with local index j the host's sum of the chunks of every
host's j-th rank (H chunks of k elements). Across hosts, the ranks with local index j exchange those chunks
quantized (int8, or int4 two per byte, a float32 scale per block) with one all-to-all, and each sums the H
payloads it receives in float32: the slow links carry codes and scales only. With ``error_feedback`` a rank
keeps what its quantization rounded away (per unit: one instance belongs to one FSDP unit) and adds it to the
next step's chunks, so the applied gradients' running sum follows the true one within one quantization step.
A group on one host has no slow hop: its reduce-scatter stays in full precision. HSDP's replicate all-reduce
(across hosts) is quantized too (``all_reduce``): an all-to-all of the quantized chunks, float32 sums, and an
all-gather of the quantized sums that every replica dequantizes alike (so the replicas stay equal), each of
the two roundings with its own error feedback.

[Note: Hops on the communication thread]
On host arrays a quantized reduction is one Work of the communication thread: its hops and the quantize and
sum arithmetic between them run there, calling MPI directly (the thread owns MPI, and it runs Works in
issue order, so every rank's hops meet in the same order), while the main thread goes on with backward; the
input is copied (permuted, in float32) when the call is made, so the caller may reuse it at once. HSDP's
replicate hop is the next Work, reading the reduce-scatter's output after it. On device arrays, or without
the thread, the hops run at the call through the groups' own collectives.
"""
from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np

from .... import _backend
from ... import _buffers as B
from ... import _comm_thread as CT
from ...._kernels import quantize as Q
from ...process_group import ProcessGroup, ReduceOp
from ._fsdp_api import AllGather, ReduceScatter
from ._fsdp_collectives import PremulSum, _array, _group, allocate_buffer

__all__ = ["QuantizedAllGather", "QuantizedReduceScatter"]


class _Done:
    """The work of a collective whose completion ``finish`` performs (once) on wait."""

    def __init__(self, inner, finish):
        self._inner, self._finish = inner, finish

    def wait(self, timeout=None):
        if self._finish is not None:
            if self._inner is not None:
                self._inner.wait()
            finish, self._finish = self._finish, None
            finish()
        return True

    def is_completed(self) -> bool:
        return self._finish is None


# the groups' collectives the raw path stands for: replaced (bench's compute-only fakes), the hops use them
_GROUP_CALLS = {name: getattr(ProcessGroup, name) for name in ("reduce_scatter_into", "all_to_all_into",
                                                                "all_gather_into")}


class _Hops:
    """How a quantized collective's hops reach MPI (See [Note: Hops on the communication thread]): on host
    arrays, as one Work of the communication thread calling MPI itself; otherwise through the groups'
    own blocking collectives, now."""

    def __init__(self, xp):
        self._raw = (xp is np and CT.comm_thread() is not None and _backend.MPI_BUFFER_CHECK is None
                     and all(getattr(ProcessGroup, name, None) is fn for name, fn in _GROUP_CALLS.items()))

    def issue(self, desc, run, async_op, notes):
        """Run ``run`` (the hops and the arithmetic between them); ``notes``: (group, kind, bytes) counted."""
        if not self._raw:
            run()
            return _Done(None, None)
        for pg, kind, nbytes in notes:
            pg._check_alive()
            pg._note(kind, nbytes)
        work = CT.execute(desc, run, True)
        if not async_op:
            work.wait()
        return work

    def reduce_scatter(self, pg, dst, src):
        if not self._raw:
            return pg.reduce_scatter_into(dst, src, ReduceOp.SUM)
        from ..._mpi import get_mpi

        MPI = get_mpi()
        B.call_mpi(pg._mode, pg.comm.Reduce_scatter_block, pg.comm.Ireduce_scatter_block,
                   [src, MPI.FLOAT], [dst, MPI.FLOAT], MPI.SUM)

    def all_to_all(self, pg, dst, src):
        if not self._raw:
            return pg.all_to_all_into(dst, src)
        B.call_mpi(pg._mode, pg.comm.Alltoall, pg.comm.Ialltoall, B.byte_spec(src), B.byte_spec(dst))

    def all_gather(self, pg, dst, src):
        if not self._raw:
            return pg.all_gather_into(dst, src)
        B.call_mpi(pg._mode, pg.comm.Allgather, pg.comm.Iallgather, B.byte_spec(src), B.byte_spec(dst))


def _node_layout(g):
    from ... import _mpi

    # collective, on the communication thread like every other call on this communicator
    return CT.call_sync("node_layout", lambda: _mpi.node_layout(g.comm))


def _spans_hosts(g, cache) -> bool:
    """Whether group ``g`` has ranks on more than one host (collective on its first call; ``cache`` keeps it)."""
    hit = cache.get(id(g))
    if hit is None or hit[0] is not g:
        hit = cache[id(g)] = (g, g.size() > 1 and _node_layout(g)["num_nodes"] > 1)
    return hit[1]


def _block(block_size) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 2 or block_size % 2:
        raise ValueError(f"block_size={block_size!r}: expected an even integer >= 2")
    return block_size


class QuantizedAllGather(AllGather):
    """All-gather of block-quantized shards (See [Note: Quantized all-gather]).

    Args:
        dtype: ``"int8"`` or ``"fp8"`` (float8 e4m3 codes).
        block_size: elements per scale (default 256).
    """

    def __init__(self, dtype: str = "int8", block_size: int = 256):
        if dtype not in ("int8", "fp8"):
            raise ValueError(f"QuantizedAllGather: dtype={dtype!r}: expected 'int8' or 'fp8'")
        self.dtype, self.block_size = dtype, _block(block_size)
        self._hosts = {}  # id(group) -> (group, whether it spans hosts)

    def __repr__(self) -> str:
        return f"QuantizedAllGather(dtype={self.dtype!r}, block_size={self.block_size})"

    def allocate(self, size: Sequence[int], *, dtype: Any, device: Any):
        return allocate_buffer(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, async_op: bool = False):
        g = _group(group)
        out, inp = _array(output_tensor, "all-gather output"), _array(input_tensor, "all-gather input")
        k, world = inp.size, g.size()
        if out.size != world * k:
            raise ValueError(f"QuantizedAllGather: output has {out.size} elements, expected {world} x {k}")
        if not _spans_hosts(g, self._hosts):  # no slow link to spare: the full-precision gather
            return g.all_gather_into(out.reshape(-1), inp.reshape(-1), async_op=async_op)
        kind, block = self.dtype, self.block_size
        nbytes = Q.payload_bytes(kind, k, block)
        send = Q.quantize(inp.reshape(-1), kind, block, out=_backend.array_module(inp).empty(nbytes, np.uint8))
        recv = _backend.array_module(inp).empty(world * nbytes, np.uint8)
        work = g.all_gather_into(recv, send, async_op=True)

        def finish():  # every rank's payload, one call (one launch on a GPU)
            Q.dequantize(recv, kind, k, block, out.dtype, out=out.reshape(-1), rows=world)

        done = _Done(work, finish)
        if not async_op:
            done.wait()
        return done


class QuantizedReduceScatter(ReduceScatter):
    """Gradient reduce-scatter whose cross-host hop is block-quantized (See [Note: Quantized gradient reduction]).

    Args:
        dtype: ``"int8"`` or ``"int4"`` (two codes per byte).
        block_size: elements per scale (default 256).
        error_feedback: keep the rounding residual and add it to the next step's gradient (default True).
    """

    def __init__(self, dtype: str = "int8", block_size: int = 256, error_feedback: bool = True):
        if dtype not in ("int8", "int4"):
            raise ValueError(f"QuantizedReduceScatter: dtype={dtype!r}: expected 'int8' or 'int4'")
        self.dtype, self.block_size, self.error_feedback = dtype, _block(block_size), bool(error_feedback)
        self._topology = {}  # id(group) -> (group, local group, cross group, permutation) or (group, None, ...)
        # (hop, k) -> this rank's float32 residual of what it quantized there, k the reduced output's size
        # ("rs": rows sent across hosts; "ar", "ar-sum": the replicate hop's rows and sum)
        self.residuals = {}
        self._hop = {}  # (hop, k) -> (the group that exchanged, the divisor its op applied after the sum)
        self._owner = None  # weakref to the FSDP parameter group served
        self.pending = {}  # k -> residual owed to this rank's next reduced output (See [Note: Residual state])

    def __repr__(self) -> str:
        return (f"QuantizedReduceScatter(dtype={self.dtype!r}, block_size={self.block_size}, "
                f"error_feedback={self.error_feedback})")

    def allocate(self, size: Sequence[int], *, dtype: Any, device: Any):
        return allocate_buffer(size, dtype=dtype, device=device)

    def _bind(self, group) -> None:
        """Serve FSDP parameter group ``group``: the residuals are that unit's (set_custom_reduce_scatter)."""
        owner = self._owner() if self._owner is not None else None
        if owner is not None and owner is not group and self.error_feedback:
            raise ValueError("this QuantizedReduceScatter already reduces another FSDP unit's gradients and keeps "
                             "that unit's error-feedback residual: give each unit its own instance")
        self._owner = weakref.ref(group)

    def _hops(self, g):
        """(local group, cross group, permutation into (local index, host) order), or None on one host."""
        hit = self._topology.get(id(g))
        if hit is not None and hit[0] is g:
            return hit[1]
        lay = _node_layout(g)
        hosts = lay["num_nodes"]
        hops = None
        if hosts > 1:
            node_of = np.asarray(lay["node_of_rank"])
            per = np.bincount(node_of, minlength=hosts)
            if (per != per[0]).any():
                raise ValueError(f"QuantizedReduceScatter: the group has {per.tolist()} ranks on its {hosts} hosts; "
                                 "it needs the same number on every host")
            local_index = np.zeros(g.size(), np.int64)
            for h in range(hosts):
                mine = np.flatnonzero(node_of == h)
                local_index[mine] = np.arange(mine.size)
            me = g.rank()
            local = g.split(int(node_of[me]), key=me, name="quantized-rs-local")
            cross = g.split(int(local_index[me]), key=int(node_of[me]), name="quantized-rs-cross")
            order = np.lexsort((node_of, local_index))  # by local index, then host
            hops = (local, cross, order)
        self._topology[id(g)] = (g, hops)
        return hops

    def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any = ReduceOp.SUM,
                 async_op: bool = False):
        g = _group(group)
        out, inp = _array(output_tensor, "reduce-scatter output"), _array(input_tensor, "reduce-scatter input")
        world = g.size()
        k = out.size
        if inp.size != world * k:
            raise ValueError(f"QuantizedReduceScatter: input has {inp.size} elements, expected {world} x {k}")
        if isinstance(op, PremulSum):
            inp *= inp.dtype.type(op.factor)
            op = ReduceOp.SUM
        if op not in (ReduceOp.SUM, ReduceOp.AVG):
            raise ValueError(f"QuantizedReduceScatter: op {op!r}: quantized reductions sum (SUM, AVG, PremulSum)")
        hops = self._hops(g) if world > 1 else None
        if hops is None:
            return g.reduce_scatter_into(out, inp, op, async_op)
        local, cross, order = hops
        xp = _backend.array_module(inp)
        hosts, key = cross.size(), ("rs", k)
        self._hop[key] = (cross, world if op is ReduceOp.AVG else 1)
        # read now: the caller may reuse the input once this returns (a copy, as the buffered default's)
        src = xp.ascontiguousarray(inp.reshape(world, k)[order], dtype=np.float32).reshape(-1)
        mid = xp.empty(hosts * k, np.float32)
        io = _Hops(xp)

        def run():
            io.reduce_scatter(local, mid, src)
            total = self._exchange(mid.reshape(hosts, k), cross, key, io)
            if op is ReduceOp.AVG:
                total /= np.float32(world)
            out[...] = total.astype(out.dtype).reshape(out.shape)

        payload = hosts * Q.payload_bytes(self.dtype, k, self.block_size)
        return io.issue(f"quantized reduce-scatter of {k} elements per rank ({self.dtype})", run, async_op,
                        [(local, "reduce_scatter", src.nbytes), (cross, "all_to_all", payload)])

    def _quantize_rows(self, rows, key):
        """Payloads of the rows of float32 ``rows``, a buffer of the caller's (error feedback: the residual of
        ``key`` added into it first, the new one kept, written over the old)."""
        xp = _backend.array_module(rows)
        kind, block = self.dtype, self.block_size
        k = rows.shape[1]
        res = None
        if self.error_feedback:
            res = self.residuals.get(key)
            if res is not None and res.shape == rows.shape:
                rows += res
            else:
                res = xp.empty(rows.shape, np.float32)
        send = xp.empty((rows.shape[0], Q.payload_bytes(kind, k, block)), np.uint8)
        Q.quantize(rows, kind, block, out=send, residual=res, rows=rows.shape[0])  # one launch on a GPU
        if res is not None:
            self.residuals[key] = res
        return send

    def _exchange(self, chunks, cross, key, io):
        """Row h of float32 ``chunks`` (a buffer of the caller's) to rank h of ``cross``, quantized; the float32
        sum of the rows received."""
        xp = _backend.array_module(chunks)
        kind, block = self.dtype, self.block_size
        k = chunks.shape[1]
        send = self._quantize_rows(chunks, key)
        recv = xp.empty_like(send)
        io.all_to_all(cross, recv.reshape(-1), send.reshape(-1))
        return Q.dequantize_sum(recv, kind, k, block, recv.shape[0])

    def all_reduce(self, arr, group, op=ReduceOp.SUM, async_op: bool = False):
        """HSDP's replicate all-reduce of ``arr`` in place, quantized (See [Note: Quantized gradient reduction])."""
        g = _group(group)
        n = g.size()
        if op not in (ReduceOp.SUM, ReduceOp.AVG):
            raise ValueError(f"QuantizedReduceScatter.all_reduce: op {op!r}: quantized reductions sum (SUM, AVG)")
        if n == 1:
            return _Done(None, None)
        xp = _backend.array_module(arr)
        flat = arr.reshape(-1)
        c = -(-flat.size // n)  # chunk per rank, the last ones padded with zeros
        self._hop[("ar", flat.size)] = (g, n if op is ReduceOp.AVG else 1)
        io = _Hops(xp)

        def run():
            rows = xp.zeros((n, c), np.float32)
            rows.reshape(-1)[:flat.size] = flat
            mine = self._exchange(rows, g, ("ar", flat.size), io)
            payload = self._quantize_rows(mine.reshape(1, c), ("ar-sum", flat.size))
            gathered = xp.empty((n, payload.shape[1]), np.uint8)
            io.all_gather(g, gathered.reshape(-1), payload.reshape(-1))
            whole = Q.dequantize(gathered, self.dtype, c, self.block_size, np.float32, rows=n).reshape(n, c)
            if op is ReduceOp.AVG:
                whole /= np.float32(n)
            flat[...] = whole.reshape(-1)[:flat.size].astype(flat.dtype)

        payload = Q.payload_bytes(self.dtype, c, self.block_size)
        return io.issue(f"quantized all-reduce of {flat.size} elements ({self.dtype})", run, async_op,
                        [(g, "all_to_all", n * payload), (g, "all_gather", payload)])

    def take_residual(self, k: int, xp=None):
        """The float32 residual (k,) owed to this rank's reduced output of size ``k``, in that output's units
        (before FSDP's post-divide), with the hops' residuals moved into it (collective over the hops' groups;
        See [Note: Residual state]). It stays owed: the next reduction of size ``k`` adds it."""
        xp = np if xp is None else xp
        owed = self.pending.get(k)
        owed = xp.zeros(k, np.float32) if owed is None else owed
        rs, ar = self.residuals.pop(("rs", k), None), self.residuals.pop(("ar", k), None)
        if rs is not None:  # row h is owed to the rank of host h with this rank's local index
            cross, div = self._hop[("rs", k)]
            got = xp.empty_like(rs)
            cross.all_to_all_into(got.reshape(-1), xp.ascontiguousarray(rs).reshape(-1))
            part = got.sum(axis=0) / np.float32(div)
        if ar is not None:  # the replicate hop: row r to replica r, which adds its sum's residual
            g, div = self._hop[("ar", k)]
            n, c = ar.shape
            got = xp.empty_like(ar)
            g.all_to_all_into(got.reshape(-1), ar.reshape(-1))
            mine = got.sum(axis=0) + self.residuals.pop(("ar-sum", k)).reshape(-1)
            whole = xp.empty((n, c), np.float32)
            g.all_gather_into(whole.reshape(-1), mine)
            if rs is not None:  # every replica's reduce-scatter residual enters the replicate sum
                g.all_reduce_(part, ReduceOp.SUM)
                whole.reshape(-1)[:k] += part
            owed = owed + whole.reshape(-1)[:k] / np.float32(div)
        elif rs is not None:
            owed = owed + part
        self.pending[k] = owed
        return owed
