"""ProcessGroup over one MPI communicator, ReduceOp, the collective counters and the raw-array collectives.

Raw-array API (what FSDP calls; arrays are C-contiguous NumPy or CuPy arrays of any shape, only
their element counts matter; ``op`` is a ``ReduceOp`` or its name; ``src`` is a rank *in the
group*; every call returns ``Work`` when ``async_op`` is true, else None after completion):

    pg.rank() -> int;  pg.size() -> int;  pg.comm (the duplicated mpi4py communicator)
    pg.world_ranks -> tuple[int, ...]   (world rank of every group rank; see [Note: The job's world])
    pg.all_gather_into(out_flat, in_flat, async_op=False)
        out_flat.size == in_flat.size * pg.size(), same dtype; rank r's input lands at
        out_flat[r*k:(r+1)*k]. in_flat may be exactly that slot of out_flat (in place).
    pg.reduce_scatter_into(out_flat, in_flat, op=ReduceOp.SUM, async_op=False)
        in_flat.size == out_flat.size * pg.size(); rank r gets op over ranks of in[r*k:(r+1)*k].
    pg.all_reduce_(arr, op=ReduceOp.SUM, async_op=False)        in place
    pg.broadcast_(arr, src=0, async_op=False)                    in place, src = group rank
    pg.barrier(async_op=False)
    pg.all_gather_object(obj) -> list;  pg.broadcast_object(obj, src=0) -> obj   (blocking;
        objects travel as tagged JSON (_buffers.encode_object): no pickle)
    From _rooted.py (the output only on dst, the input only on src; other ranks may pass None):
    pg.reduce_(arr, dst=0, op=ReduceOp.SUM, async_op=False)      in place on dst
    pg.gather_into(out_flat, in_flat, dst=0, async_op=False);  pg.scatter_into(out_flat, in_flat, src=0, ...)
    pg.all_to_all_into(out_flat, in_flat, out_counts=None, in_counts=None, async_op=False)
    pg.gather_object(obj, dst=0) -> list | None;  pg.scatter_object(objs, src=0) -> obj
    From _p2p.py: pg.isend(arr, dst, tag=0) -> Work;  pg.irecv(arr, src=None, tag=0) -> Work
        (result(): the sender's group rank);  pg.monitored_barrier(timeout_s, wait_all_ranks=False)
        pg.batch_isend_irecv([(is_send, arr, peer, tag), ...]) -> [Work]   (CUDA arrays on NCCL where the group is)
    pg.split(color, key=None, name=None) -> ProcessGroup | None   (collective; None for color None)
    pg.create_subgroup(ranks, name=None) -> ProcessGroup | None   (collective; group ranks)
    pg.destroy()
    Work.wait(timeout=None) -> True (re-raises the comm thread's exception);
    Work.is_completed(); Work.exception(); Work.result()

Async calls run on the communication thread in issue order (all groups share it); do not touch
their buffers until wait(). Issued inside ``_comm_thread.independent()``, async collectives that cross
nodes run staged, left in flight beside later ones (see [Note: Collectives left in flight] there). AVG = SUM then divide by the group size (floor division for integers).
float16/bfloat16 reductions use MPI.FLOAT16_T/BFLOAT16_T when usable, else float32 on the wire.

Counters: ``collective_counts()`` -> {kind: calls issued in this process}, ``collective_bytes()``,
``reset_collective_counts()``; ``pg.stats`` is the same Counter per group. Kinds: "all_gather",
"reduce_scatter", "all_reduce", "broadcast", "barrier", "all_gather_object", "broadcast_object", "reduce",
"gather", "scatter", "all_to_all", "gather_object", "scatter_object", "monitored_barrier" (``pg.stats`` also
counts point-to-point "send" and "recv"). Size-1 groups count too (they make no MPI call).
``recent_collectives()``: the last few issued.

Work (public here too), the communication thread and the hand-off of each call to it (inline or queued)
live in _comm_thread.py: see [Note: Communication thread], [Note: Progress and busy polling] and
[Note: Inline calls] there.

Failure (_failure.py): see [Note: Watchdog], [Note: Failure handling] and [Note: Debug mode]
(HPCFSDP_DEBUG=1).
"""

from __future__ import annotations

import collections
import enum
import weakref
from typing import Any, Callable

import numpy as np

from hpcfsdp import _backend, _settings
from hpcfsdp.distributed import _buffers as B
from hpcfsdp.distributed import _comm_thread as CT
from hpcfsdp.distributed import _failure as F
from hpcfsdp.distributed import _nccl
from hpcfsdp.distributed._hier import (
    _hier_all_gather,
    _hier_all_gather_staged,
    _hier_reduce_scatter,
    _hier_reduce_scatter_staged,
    _node_major,
    rsag_allreduce,
    rsag_allreduce_staged,
    use_rsag_allreduce,
)
from hpcfsdp.distributed._comm_thread import Work  # public here too
from hpcfsdp.distributed._failure import debug_enabled, recent_collectives  # public here too
from hpcfsdp.distributed._mpi import (comm_timeout, get_mpi, node_split_info, progress_mode, set_default_timeout,
                                      world_comm)
from hpcfsdp.distributed._p2p import PointToPoint
from hpcfsdp.distributed._rooted import RootedCollectives

__all__ = [
    "ReduceOp",
    "ProcessGroup",
    "Work",
    "collective_counts",
    "collective_bytes",
    "reset_collective_counts",
    "comm_timeout",
    "set_default_timeout",
    "progress_mode",
    "debug_enabled",
    "recent_collectives",
]


class ReduceOp(enum.Enum):
    """Reduction applied by all_reduce / reduce_scatter."""

    SUM = "SUM"  # elementwise sum
    AVG = "AVG"  # sum, then divide by the group size (floor division for integer dtypes)
    MAX = "MAX"  # elementwise maximum
    MIN = "MIN"  # elementwise minimum
    PRODUCT = "PRODUCT"  # elementwise product

    def __repr__(self) -> str:
        return f"<ReduceOp.{self.name}>"


def _as_op(op: Any, dtype: Any = None) -> ReduceOp:
    if not isinstance(op, ReduceOp):
        if not (isinstance(op, str) and op.upper() in ReduceOp.__members__):
            raise ValueError(f"op={op!r}: expected a ReduceOp (SUM, AVG, MAX, MIN, PRODUCT)")
        op = ReduceOp[op.upper()]
    if op is ReduceOp.AVG and dtype is not None and np.dtype(dtype) == np.bool_:
        raise TypeError("op=ReduceOp.AVG is not defined for bool arrays; expected SUM, MAX, MIN or PRODUCT")
    return op


# ---------------------------------------------------------------------------------------------
# counters

_COUNTS: collections.Counter = collections.Counter()
_BYTES: collections.Counter = collections.Counter()


def collective_counts() -> dict[str, int]:
    """Collectives issued by this process since the last reset, by kind."""
    return dict(_COUNTS)


def collective_bytes() -> dict[str, int]:
    """Bytes of the local input of the collectives issued since the last reset, by kind."""
    return dict(_BYTES)


def reset_collective_counts() -> None:
    _COUNTS.clear()
    _BYTES.clear()


# [Note: The job's world]
# world_ranks are ranks of the job's world: MPI.COMM_WORLD, until an elastic recovery shrinks the world to its
# survivors (hpcfsdp.distributed.elastic): _mpi.set_world(shrunk) then makes the shrunk communicator the world every
# later group's world_ranks refer to, as the new default group's ranks do. Every live group is kept (weakly) so
# that a recovery can revoke all of their communicators (see live_groups).
_LIVE: "weakref.WeakSet[ProcessGroup]" = weakref.WeakSet()


def live_groups() -> list:
    """Every ProcessGroup not yet destroyed or collected."""
    return [g for g in list(_LIVE) if g.comm is not None]


class ProcessGroup(RootedCollectives, PointToPoint):
    """A group of ranks over one (duplicated) MPI intracommunicator.

    ``ProcessGroup(comm)`` duplicates ``comm`` (collective over it) so that hpcfsdp traffic never
    matches user messages; ``dup=False`` adopts ``comm`` (the group frees it on ``destroy``).
    """

    def __init__(self, comm=None, *, dup: bool = True, name: str | None = None):
        MPI = get_mpi()
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(f"comm: expected an mpi4py Intracomm, got {comm!r}")
        self._mode = progress_mode()  # settings validated before the (collective) Dup
        hier_mode = _settings.get("HPCFSDP_COMM_HIERARCHY")
        self._allreduce_mode = _settings.get("HPCFSDP_COMM_ALLREDUCE")
        self._debug = debug_enabled()
        comm_timeout()
        self.comm = CT.call_sync("Comm.Dup", comm.Dup) if dup else comm
        self._seq = 0  # collectives issued on this group (history, debug checks, watchdog reports)
        # debug mode: fingerprints travel on a communicator of their own. See [Note: Debug mode]
        self._check_comm = CT.call_sync("Comm.Dup", self.comm.Dup) if self._debug else None
        self._rank = self.comm.Get_rank()
        self._size = self.comm.Get_size()
        wg = world_comm().Get_group()
        g = self.comm.Get_group()
        try:
            self.world_ranks: tuple[int, ...] = tuple(
                int(r) for r in MPI.Group.Translate_ranks(g, list(range(self._size)), wg)
            )
        finally:
            g.Free()
            wg.Free()
        self.name = name
        self.stats: collections.Counter = collections.Counter()
        self._hier = None  # (local comm, cross comm, perm) when node-aware: [Note: Node-aware collectives], _hier.py
        self._link = "inter"  # what a flat collective uses: "intra" when the group lies in one node
        self._staged = _settings.get("HPCFSDP_COMM_STAGED")
        self._gpu: _nccl.GpuPath | None = None  # how device arrays move, set at the first device collective
        if self._size > 1:
            hosts, split = CT.call_sync("node_split", lambda: node_split_info(self.comm))
            if hosts == 1:
                self._link = "intra"
            if split is not None and (hier_mode == "flat" or (hier_mode == "auto" and split[0].Get_size() == 1)):
                CT.call_sync("Comm.Free", lambda: (split[0].Free(), split[1].Free()))
                split = None
            if split is not None:
                perm = np.asarray(split[2], dtype=np.intp)
                self._hier = (split[0], split[1], perm, _node_major(perm, split[1].Get_size(), split[0].Get_size()))
        if self._size > 1:
            F.install_abort_hooks()
        _LIVE.add(self)

    def _comms(self) -> list:
        """Every MPI communicator this group holds (for an elastic recovery's revoke)."""
        out = [self.comm, self._check_comm] + (list(self._hier[:2]) if self._hier is not None else [])
        return [c for c in out if c is not None]

    _as_op = staticmethod(_as_op)  # for the mixins' methods

    # -- basic queries -----------------------------------------------------------------------
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def __repr__(self) -> str:
        ranks = list(self.world_ranks)
        if len(ranks) > 8:
            ranks = ranks[:8] + ["..."]
        nm = f"{self.name!r}, " if self.name else ""
        return f"ProcessGroup({nm}size={self._size}, rank={self._rank}, world_ranks={ranks})"

    def _gdesc(self) -> str:
        ranks = list(self.world_ranks)
        shown = ranks if len(ranks) <= 16 else ranks[:16] + ["..."]
        nm = f" {self.name!r}" if self.name else ""
        return f"group{nm} (size {self._size}, world ranks {shown})"

    def _note(self, kind: str, nbytes: int, count: int = -1, dtype: Any = None, op: str = "", root: int = -1,
              counted: bool = True) -> F.CollectiveRecord:
        """Count and record a collective about to be issued (after all local checks passed)."""
        if F.UNREPORTED:
            F.raise_unreported()
        if counted:
            self.stats[kind] += 1
            _COUNTS[kind] += 1
            _BYTES[kind] += int(nbytes)
        self._seq += 1
        entry = F.CollectiveRecord(self._seq, kind, count, dtype, op, root, self)
        F.HISTORY.append(entry)
        return entry

    def _check_alive(self) -> None:
        if self.comm is None:
            raise RuntimeError(f"{self!r} was destroyed")

    def _issue(self, desc, fn: Callable[[], Any], async_op: bool, trivial: Callable[[], Any] | None,
               meta: list):
        """Size-1 fast path inline when nothing is queued; else through the comm thread."""
        if trivial is not None:
            t = CT.COMM_THREAD
            if t is None or t.idle():
                trivial()
                return Work._completed(desc) if async_op else None
            fn = trivial
        elif self._debug:
            fn = F.debug_checked(self, fn, meta)
        return CT.submit(desc, fn, async_op, meta)

    def _nccl_for(self, a, meta) -> "_nccl.NcclGroup | None":
        """The group's NCCL communicator for device array ``a``, or None (host array, or another path); in
        debug mode the ranks' fingerprints are compared first. See [Note: GPU collectives] in _nccl.py."""
        if not B.is_cupy_array(a):
            return None
        ng = _nccl.gpu_path(self, a).nccl
        if ng is not None and self._debug:
            CT.call_sync("HPCFSDP_DEBUG fingerprint check", F.debug_checked(self, lambda: None, meta), meta)
        return ng

    @property
    def gpu_comm(self) -> tuple[str, str] | None:
        """(path, why) for device arrays once chosen: nccl, mpi or staged ([Note: GPU collectives])."""
        return None if self._gpu is None else (self._gpu.path, self._gpu.why)

    def _staged_ok(self, async_op: bool, *arrays) -> bool:
        """Whether a collective runs staged, left in flight: see [Note: Collectives left in flight] in
        _comm_thread.py. Only asynchronous ones issued inside ``CT.independent()`` on host arrays, and only
        across nodes (node-aware, or over a group spanning nodes): inside one node there is no second
        resource to overlap with, and a blocking call returns sooner than a polled request."""
        return (async_op and self._staged and (self._hier is not None or self._link == "inter") and CT._is_independent()
                and _backend.MPI_BUFFER_CHECK is None and not any(B.is_cupy_array(a) for a in arrays)
                and all(a.size for a in arrays))

    # -- collectives on raw arrays -----------------------------------------------------------
    def all_gather_into(self, out_flat, in_flat, async_op: bool = False):
        """Gather every rank's ``in_flat`` into ``out_flat`` (rank-major). See module docstring."""
        self._check_alive()
        B.check_buffer(in_flat, "all_gather_into: input")
        n, k = self._size, self._check_output("all_gather_into", out_flat, in_flat, gather=True)
        desc = lambda: (f"all_gather_into(out={B.describe(out_flat)}, in={B.describe(in_flat)}) "
                f"on {self._gdesc()}")
        meta = self._note("all_gather", in_flat.nbytes, k, in_flat.dtype)
        out1, in1 = out_flat.reshape(-1), in_flat.reshape(-1)
        if n == 1:  # the output is the input
            return self._issue(desc, None, async_op, lambda: B.copy_into(out1, in1), meta)
        rank, mode = self._rank, self._mode
        itemsize = in1.dtype.itemsize
        in_place = False
        if k > 0 and B.may_share(in1, out1):
            in_place = B.ptr(in1) == B.ptr(out1) + rank * k * itemsize
            if not in_place:  # MPI forbids aliased buffers: gather from a copy
                in1 = in1.copy()
        ng = self._nccl_for(in1, meta)
        if ng is not None:
            return _nccl.all_gather(ng, out1, in1, in_place, k, async_op, desc)
        ev = B.record_event(in1)  # after the copy: MPI reads it. See [Note: Device arrays]
        comm, hier = self.comm, self._hier
        if self._staged_ok(async_op, in1, out1):
            if hier is not None:
                src = out1[rank * k:(rank + 1) * k] if in_place else in1
                return self._issue(desc, lambda: CT.Staged(["inter", "intra"], _hier_all_gather_staged(
                    hier, src, out1, k)), async_op, None, meta)

            def staged():
                yield comm.Iallgather(get_mpi().IN_PLACE if in_place else B.byte_spec(in1), B.byte_spec(out1))

            return self._issue(desc, lambda: CT.Staged([self._link], staged()), async_op, None, meta)

        def fn():
            if ev is not None:
                ev.synchronize()
            if hier is not None and k > 0:
                staged = B.needs_staging(out1)
                if staged or not B.is_cupy_array(out1):
                    st = B.stager() if staged else None
                    hout = st.empty_host(out1, "recv") if staged else out1
                    src = out1[rank * k:(rank + 1) * k] if in_place else in1
                    hin = st.to_host(src, "send") if staged else src
                    _hier_all_gather(hier, hin, hout, k, mode)
                    if staged:
                        st.to_device(hout, out1)
                    return
            if B.needs_staging(out1):
                st = B.stager()
                hout = st.empty_host(out1, "recv")
                hin = st.to_host(out1[rank * k:(rank + 1) * k] if in_place else in1, "send")
                B.allgather_bytes(comm, hin, hout, False, k, mode)
                st.to_device(hout, out1)
            else:
                B.allgather_bytes(comm, in1, out1, in_place, k, mode)

        return self._issue(desc, fn, async_op, None, meta)

    def reduce_scatter_into(self, out_flat, in_flat, op: Any = ReduceOp.SUM, async_op: bool = False):
        """Reduce ``in_flat`` over the group and scatter equal pieces into ``out_flat``."""
        self._check_alive()
        B.check_buffer(in_flat, "reduce_scatter_into: input")
        op = _as_op(op, in_flat.dtype)
        n, k = self._size, self._check_output("reduce_scatter_into", out_flat, in_flat, gather=False)
        mpi_type, work_dtype = B.reduce_plan(in_flat.dtype)
        desc = lambda: (f"reduce_scatter_into(out={B.describe(out_flat)}, in={B.describe(in_flat)}, "
                f"op={op.name}) on {self._gdesc()}")
        meta = self._note("reduce_scatter", in_flat.nbytes, in_flat.size, in_flat.dtype, op.name)
        out1, in1 = out_flat.reshape(-1), in_flat.reshape(-1)
        if n == 1:  # the output is the input
            return self._issue(desc, None, async_op, lambda: B.copy_into(out1, in1), meta)
        if k > 0 and B.may_share(in1, out1) and B.overlaps(in1, out1):
            in1 = in1.copy()
        ng = self._nccl_for(in1, meta)
        if ng is not None:
            w = _nccl.reduce_scatter(ng, out1, in1, k, op.name, async_op, desc)
            if w is not NotImplemented:
                return w
        ev = B.record_event(in1)  # after the copy: MPI reads it. See [Note: Device arrays]
        comm, mode, hier = self.comm, self._mode, self._hier
        if work_dtype is None and self._staged_ok(async_op, in1, out1):
            mop = B.mpi_op_for(op.name)
            avg = op is ReduceOp.AVG

            def staged():
                if hier is not None:
                    yield from _hier_reduce_scatter_staged(hier, in1, out1, k, mpi_type, mop)
                else:
                    yield comm.Ireduce_scatter_block([in1, mpi_type], [out1, mpi_type], mop)
                B.finish_reduce(out1, out1, avg, n)

            stages = ["intra", "inter"] if hier is not None else [self._link]
            return self._issue(desc, lambda: CT.Staged(stages, staged()), async_op, None, meta)

        def fn():
            if ev is not None:
                ev.synchronize()
            staged = B.needs_staging(out1)
            st = B.stager() if staged else None
            src = st.to_host(in1, "send") if staged else in1
            dst = st.empty_host(out1, "recv") if staged else out1
            with B.device_stream(dst) as stream:
                if work_dtype is not None:
                    src_w = B.to_work_dtype(src, work_dtype, stream)
                    dst_w = B.array_module(dst).empty(dst.shape, work_dtype)
                else:
                    src_w, dst_w = src, dst
                if k > 0 and hier is not None and not B.is_cupy_array(dst_w):
                    _hier_reduce_scatter(hier, src_w, dst_w, k, mpi_type, B.mpi_op_for(op.name), mode)
                elif k > 0:
                    B.call_mpi(mode, comm.Reduce_scatter_block, comm.Ireduce_scatter_block,
                          [src_w, mpi_type], [dst_w, mpi_type], B.mpi_op_for(op.name))
                B.finish_reduce(dst_w, dst, op is ReduceOp.AVG, n)
                B.complete(stream)
            if staged:
                st.to_device(dst, out1)

        return self._issue(desc, fn, async_op, None, meta)

    def all_reduce_(self, arr, op: Any = ReduceOp.SUM, async_op: bool = False):
        """In-place all-reduce of ``arr`` over the group."""
        self._check_alive()
        B.check_buffer(arr, "all_reduce_: array", writable=True)
        op = _as_op(op, arr.dtype)
        mpi_type, work_dtype = B.reduce_plan(arr.dtype)
        desc = lambda: f"all_reduce_({B.describe(arr)}, op={op.name}) on {self._gdesc()}"
        meta = self._note("all_reduce", arr.nbytes, arr.size, arr.dtype, op.name)
        n = self._size
        if n == 1:
            return self._issue(desc, None, async_op, lambda: None, meta)
        a1 = arr.reshape(-1)
        ng = self._nccl_for(a1, meta)
        if ng is not None:
            w = _nccl.all_reduce(ng, a1, op.name, async_op, desc)
            if w is not NotImplemented:
                return w
        ev = B.record_event(arr)
        comm, mode = self.comm, self._mode
        rsag = use_rsag_allreduce(n, a1.nbytes, self._allreduce_mode)
        if work_dtype is None and self._staged_ok(async_op, a1):
            def staged():
                if rsag:
                    yield from rsag_allreduce_staged(comm, a1, mpi_type, B.mpi_op_for(op.name))
                else:
                    yield comm.Iallreduce(get_mpi().IN_PLACE, [a1, mpi_type], B.mpi_op_for(op.name))
                B.finish_reduce(a1, a1, op is ReduceOp.AVG, n)

            return self._issue(desc, lambda: CT.Staged([self._link], staged()), async_op, None, meta)

        def fn():
            MPI = get_mpi()
            if ev is not None:
                ev.synchronize()
            staged = B.needs_staging(a1)
            buf = B.stager().to_host(a1, "send") if staged else a1
            with B.device_stream(buf) as stream:
                w = B.to_work_dtype(buf, work_dtype, stream) if work_dtype is not None else buf
                if buf.size and rsag and not B.is_cupy_array(w):
                    rsag_allreduce(comm, w, mpi_type, B.mpi_op_for(op.name), mode)
                elif buf.size:
                    B.call_mpi(mode, comm.Allreduce, comm.Iallreduce, MPI.IN_PLACE, [w, mpi_type],
                          B.mpi_op_for(op.name))
                B.finish_reduce(w, buf, op is ReduceOp.AVG, n)
                B.complete(stream)
            if staged:
                B.stager().to_device(buf, a1)

        return self._issue(desc, fn, async_op, None, meta)

    def broadcast_(self, arr, src: int = 0, async_op: bool = False):
        """In-place broadcast of ``arr`` from group rank ``src``."""
        self._check_alive()
        B.check_buffer(arr, "broadcast_: array", writable=True)
        src = self._check_rank(src, "broadcast_: src")
        desc = lambda: f"broadcast_({B.describe(arr)}, src={src}) on {self._gdesc()}"
        meta = self._note("broadcast", arr.nbytes, arr.size, arr.dtype, root=src)
        if self._size == 1:
            return self._issue(desc, None, async_op, lambda: None, meta)
        ng = self._nccl_for(arr, meta)
        if ng is not None:
            return _nccl.broadcast(ng, arr.reshape(-1), src, async_op, desc)
        ev = B.record_event(arr)
        comm, mode = self.comm, self._mode

        def fn():
            if ev is not None:
                ev.synchronize()
            staged = B.needs_staging(arr)
            buf = B.stager().to_host(arr, "send") if staged else arr
            if buf.size:
                B.call_mpi(mode, comm.Bcast, comm.Ibcast, B.byte_spec(buf), src)
            if staged:
                B.stager().to_device(buf, arr)

        return self._issue(desc, fn, async_op, None, meta)

    def barrier(self, async_op: bool = False):
        self._check_alive()
        desc = lambda: f"barrier() on {self._gdesc()}"
        meta = self._note("barrier", 0)
        if self._size == 1:
            return self._issue(desc, None, async_op, lambda: None, meta)
        comm, mode = self.comm, self._mode
        return self._issue(desc, lambda: B.call_mpi(mode, comm.Barrier, comm.Ibarrier), async_op, None, meta)

    # -- objects (blocking) ------------------------------------------------------------------
    def all_gather_object(self, obj: Any) -> list:
        """Every rank's ``obj`` in group-rank order (tagged JSON on the wire; no pickle)."""
        self._check_alive()
        data = B.encode_object(obj)
        meta = self._note("all_gather_object", len(data))
        if self._size == 1:
            return [B.decode_object(data)]
        comm, n = self.comm, self._size

        def fn():  # sizes, then the bytes: buffer-based calls (mpi4py's comm.allgather would pickle)
            MPI = get_mpi()
            sizes = np.empty(n, np.int64)
            comm.Allgather([np.array([len(data)], np.int64), MPI.INT64_T], [sizes, MPI.INT64_T])
            displs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
            buf = np.empty(int(sizes.sum()), np.uint8)
            comm.Allgatherv([np.frombuffer(data, np.uint8), MPI.BYTE], [buf, (sizes, displs), MPI.BYTE])
            return [B.decode_object(buf[o:o + k].tobytes()) for o, k in zip(displs.tolist(), sizes.tolist())]

        return self._sync(lambda: f"all_gather_object on {self._gdesc()}", fn, meta)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``obj`` of group rank ``src`` on every rank (tagged JSON on the wire; no pickle)."""
        self._check_alive()
        src = self._check_rank(src, "broadcast_object: src")
        data = B.encode_object(obj) if self._rank == src else b""
        meta = self._note("broadcast_object", len(data), root=src)
        if self._size == 1:
            return B.decode_object(data)
        comm = self.comm

        def fn():
            MPI = get_mpi()
            nb = np.array([len(data)], np.int64)
            comm.Bcast([nb, MPI.INT64_T], src)
            buf = np.frombuffer(data, np.uint8).copy() if self._rank == src else np.empty(int(nb[0]), np.uint8)
            if nb[0]:
                comm.Bcast([buf, MPI.BYTE], src)
            return B.decode_object(buf.tobytes())

        return self._sync(lambda: f"broadcast_object on {self._gdesc()}", fn, meta)

    # -- communicators -----------------------------------------------------------------------
    def split(self, color: int | None, key: int | None = None, name: str | None = None):
        """Collective Comm.Split: a new ProcessGroup per color (None for ``color=None``)."""
        self._check_alive()
        MPI = get_mpi()
        c = MPI.UNDEFINED if color is None else int(color)
        k = self._rank if key is None else int(key)
        comm = self.comm
        meta = self._note("split", 0, counted=False)
        new = self._sync(f"Comm.Split on {self._gdesc()}", lambda: comm.Split(c, k), meta)
        if new == MPI.COMM_NULL:
            return None
        return ProcessGroup(new, dup=False, name=name)

    def create_subgroup(self, ranks, name: str | None = None):
        """Collective over this group: a ProcessGroup of ``ranks`` (group ranks) or None outside it."""
        ranks = [self._check_rank(r, "new_group: ranks") for r in ranks]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"new_group: ranks {ranks} contain duplicates")
        MPI = get_mpi()
        comm = self.comm

        def fn():
            g = comm.Get_group()
            sub = g.Incl(ranks)
            try:
                return comm.Create(sub)
            finally:
                sub.Free()
                g.Free()

        meta = self._note("create_subgroup", 0, len(ranks), counted=False)
        new = self._sync(f"Comm.Create on {self._gdesc()}", fn, meta)
        if new == MPI.COMM_NULL:
            return None
        return ProcessGroup(new, dup=False, name=name)

    def destroy(self) -> None:
        """Free the communicator (after everything issued on it has run)."""
        _nccl.destroy(self)
        comm, self.comm = self.comm, None
        check, self._check_comm = self._check_comm, None
        hier, self._hier = self._hier, None
        if comm is not None:
            MPI = get_mpi()
            if not MPI.Is_finalized():
                CT.call_sync("Comm.Free", comm.Free)
                if hier is not None:
                    CT.call_sync("Comm.Free", lambda: (hier[0].Free(), hier[1].Free()))
                if check is not None:
                    CT.call_sync("Comm.Free", check.Free)

    def _sync(self, desc, fn: Callable[[], Any], meta: list) -> Any:
        """A blocking collective returning a value (objects, communicator creation), checked in debug mode."""
        if self._debug and self._size > 1:
            fn = F.debug_checked(self, fn, meta)
        return CT.call_sync(desc, fn, meta)

    def _check_output(self, what: str, out_flat, in_flat, *, gather: bool) -> int:
        """Check ``out_flat`` against the already checked ``in_flat`` of a gather (output = size x input)
        or a scatter (input = size x output); return the element count of one rank's piece."""
        B.check_buffer(out_flat, f"{what}: output", writable=True)
        if in_flat.dtype != out_flat.dtype:
            raise TypeError(f"{what}: output dtype {out_flat.dtype} != input dtype {in_flat.dtype}")
        big, small = (out_flat, in_flat) if gather else (in_flat, out_flat)
        big_name, small_name = ("output", "input") if gather else ("input", "output")
        n, k = self._size, small.size
        if big.size != k * n:
            raise ValueError(
                f"{what}: {big_name} has {big.size} elements, expected {small_name} size {k} x "
                f"group size {n} = {k * n} ({self._gdesc()})"
            )
        B.check_same_kind(out_flat, in_flat, what)
        return k

    @property
    def hierarchical(self) -> bool:
        """Whether all-gather/reduce-scatter take the node-aware path ([Note: Node-aware collectives], _hier.py)."""
        return self._hier is not None

    def _check_rank(self, r: Any, what: str) -> int:
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)):
            raise TypeError(f"{what}={r!r}: expected an int rank")
        if not 0 <= int(r) < self._size:
            raise ValueError(f"{what}={r}: outside the {self._gdesc()}, expected 0 <= rank < {self._size}")
        return int(r)
