"""Rooted collectives (reduce, gather, scatter), all-to-all and object gather/scatter on raw arrays: a ProcessGroup mixin."""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcfsdp.distributed import _buffers as B
from hpcfsdp.distributed._mpi import get_mpi

__all__ = ["RootedCollectives"]

# [Note: All-to-all sizes]
# MPI_Alltoallv needs every pair of ranks to agree on the size of each message; a rank receiving more than
# it expects fails with MPI_ERR_TRUNCATE while the others carry on, and one receiving less computes on a
# partly filled buffer. With explicit sizes (all_to_all's lists, all_to_all_single's split sizes) the ranks
# therefore first exchange the element counts (one MPI_Alltoall of n int64) and agree on the outcome (one
# MPI_Allreduce of one int64): every rank raises the same ValueError naming the first disagreeing pair, or
# all go on. With equal pieces (no sizes given) there is no exchange: every rank checks locally that its
# input and output have the same size, a multiple of the group size; ranks whose sizes differ from one
# another then fail in MPI (a truncation error on a rank receiving too much).


def _v_spec(buf, counts, itemsize: int):
    """[uint8 view, (byte counts, byte displacements), MPI.BYTE] of ``buf`` cut into ``counts`` elements."""
    c = np.asarray(counts, np.int64) * itemsize
    d = np.concatenate([[0], np.cumsum(c)[:-1]]).astype(np.int64)
    flat = buf.reshape(-1)
    b = flat.view(np.uint8) if flat.dtype.itemsize else flat
    return [b, (c, d), get_mpi().BYTE]


def _counts(counts, n: int, total: int, what: str) -> list[int]:
    """``counts`` checked against the group size ``n`` and the array's ``total`` elements (None: equal pieces)."""
    if counts is None:
        if total % n:
            raise ValueError(f"all_to_all_into: no {what} given, and the array's {total} elements do not divide "
                             f"equally over the group size {n}")
        return [total // n] * n
    if not isinstance(counts, (list, tuple, np.ndarray)) or len(counts) != n:
        got = len(counts) if isinstance(counts, (list, tuple, np.ndarray)) else type(counts).__name__
        raise ValueError(f"all_to_all_into: {what} has {got} entries, expected the group size {n}")
    out = []
    for c in counts:
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 0:
            raise ValueError(f"all_to_all_into: {what}={list(counts)} must be non-negative ints")
        out.append(int(c))
    if sum(out) != total:
        raise ValueError(f"all_to_all_into: {what}={out} sum to {sum(out)}, but the array has {total} elements")
    return out


class RootedCollectives:
    """ProcessGroup's reduce_, gather_into, scatter_into, all_to_all_into, gather_object and scatter_object.

    Raw arrays as in process_group's docstring; ``dst``/``src`` are group ranks. Uses the group's ``comm``,
    ``_rank``, ``_size``, ``_mode``, ``_note``, ``_issue``, ``_sync``, ``_check_alive``, ``_check_rank``,
    ``_check_output``, ``_gdesc`` and ``_as_op``.
    """

    def reduce_(self, arr, dst: int = 0, op: Any = "SUM", async_op: bool = False):
        """Reduce ``arr`` over the group into group rank ``dst``'s ``arr`` (in place); other ranks' ``arr``
        are left unchanged."""
        self._check_alive()
        B.check_buffer(arr, "reduce_: array", writable=True)
        op = self._as_op(op, arr.dtype)
        dst = self._check_rank(dst, "reduce_: dst")
        mpi_type, work_dtype = B.reduce_plan(arr.dtype)
        desc = lambda: f"reduce_({B.describe(arr)}, dst={dst}, op={op.name}) on {self._gdesc()}"
        meta = self._note("reduce", arr.nbytes, arr.size, arr.dtype, op.name, root=dst)
        n = self._size
        if n == 1:
            return self._issue(desc, None, async_op, lambda: None, meta)
        ev = B.record_event(arr)
        a1 = arr.reshape(-1)
        comm, mode, root = self.comm, self._mode, self._rank == dst

        def fn():
            MPI = get_mpi()
            if ev is not None:
                ev.synchronize()
            staged = B.needs_staging(a1)
            buf = B.stager().to_host(a1, "send") if staged else a1
            with B.device_stream(buf) as stream:
                w = B.to_work_dtype(buf, work_dtype, stream) if work_dtype is not None else buf
                if buf.size:
                    spec = [w, mpi_type]
                    B.call_mpi(mode, comm.Reduce, comm.Ireduce, MPI.IN_PLACE if root else spec,
                               spec if root else None, B.mpi_op_for(op.name), dst)
                if root:
                    B.finish_reduce(w, buf, op.name == "AVG", n)
                B.complete(stream)
            if staged and root:
                B.stager().to_device(buf, a1)

        return self._issue(desc, fn, async_op, None, meta)

    def gather_into(self, out_flat, in_flat, dst: int = 0, async_op: bool = False):
        """Gather every rank's ``in_flat`` into group rank ``dst``'s ``out_flat`` (rank-major, ``size`` times
        the input's elements); ``out_flat`` is ignored (may be None) on the other ranks."""
        self._check_alive()
        B.check_buffer(in_flat, "gather_into: input")
        dst = self._check_rank(dst, "gather_into: dst")
        root = self._rank == dst
        k = self._check_output("gather_into", out_flat, in_flat, gather=True) if root else in_flat.size
        desc = lambda: (f"gather_into(out={B.describe(out_flat) if root else None}, in={B.describe(in_flat)}, "
                        f"dst={dst}) on {self._gdesc()}")
        meta = self._note("gather", in_flat.nbytes, k, in_flat.dtype, root=dst)
        in1 = in_flat.reshape(-1)
        out1 = out_flat.reshape(-1) if root else None
        if self._size == 1:
            return self._issue(desc, None, async_op, lambda: B.copy_into(out1, in1), meta)
        if root and k and B.may_share(in1, out1) and B.overlaps(in1, out1):
            in1 = in1.copy()  # MPI forbids aliased buffers
        ev = B.record_event(in1)
        comm, mode = self.comm, self._mode

        def fn():
            if ev is not None:
                ev.synchronize()
            if k == 0:
                return
            staged = B.needs_staging(in1)
            st = B.stager() if staged else None
            src = st.to_host(in1, "send") if staged else in1
            dbuf = (st.empty_host(out1, "recv") if staged else out1) if root else None
            B.call_mpi(mode, comm.Gather, comm.Igather, B.byte_spec(src), B.byte_spec(dbuf) if root else None, dst)
            if staged and root:
                st.to_device(dbuf, out1)

        return self._issue(desc, fn, async_op, None, meta)

    def scatter_into(self, out_flat, in_flat, src: int = 0, async_op: bool = False):
        """Give rank r the r-th equal piece of group rank ``src``'s ``in_flat`` in ``out_flat``; ``in_flat`` is
        ignored (may be None) on the other ranks."""
        self._check_alive()
        src = self._check_rank(src, "scatter_into: src")
        root = self._rank == src
        if root:
            B.check_buffer(in_flat, "scatter_into: input")
            k = self._check_output("scatter_into", out_flat, in_flat, gather=False)
        else:
            B.check_buffer(out_flat, "scatter_into: output", writable=True)
            k = out_flat.size
        desc = lambda: (f"scatter_into(out={B.describe(out_flat)}, in={B.describe(in_flat) if root else None}, "
                        f"src={src}) on {self._gdesc()}")
        meta = self._note("scatter", out_flat.nbytes, k, out_flat.dtype, root=src)
        out1 = out_flat.reshape(-1)
        in1 = in_flat.reshape(-1) if root else None
        if self._size == 1:
            return self._issue(desc, None, async_op, lambda: B.copy_into(out1, in1), meta)
        if root and k and B.may_share(in1, out1) and B.overlaps(in1, out1):
            in1 = in1.copy()
        ev = B.record_event(in1 if root else out1)
        comm, mode = self.comm, self._mode

        def fn():
            if ev is not None:
                ev.synchronize()
            if k == 0:
                return
            staged = B.needs_staging(out1)
            st = B.stager() if staged else None
            sbuf = (st.to_host(in1, "send") if staged else in1) if root else None
            dbuf = st.empty_host(out1, "recv") if staged else out1
            B.call_mpi(mode, comm.Scatter, comm.Iscatter, B.byte_spec(sbuf) if root else None, B.byte_spec(dbuf), src)
            if staged:
                st.to_device(dbuf, out1)

        return self._issue(desc, fn, async_op, None, meta)

    def all_to_all_into(self, out_flat, in_flat, out_counts=None, in_counts=None, async_op: bool = False):
        """Send ``in_flat``'s r-th piece to rank r and put rank r's piece for this rank at ``out_flat``'s r-th
        piece. Pieces are ``in_counts``/``out_counts`` elements (lists of group-size ints), or equal (None: both
        arrays the same size, a multiple of the group size). See [Note: All-to-all sizes]."""
        self._check_alive()
        B.check_buffer(in_flat, "all_to_all_into: input")
        B.check_buffer(out_flat, "all_to_all_into: output", writable=True)
        if in_flat.dtype != out_flat.dtype:
            raise TypeError(f"all_to_all_into: output dtype {out_flat.dtype} != input dtype {in_flat.dtype}")
        B.check_same_kind(out_flat, in_flat, "all_to_all_into")
        n = self._size
        equal = out_counts is None and in_counts is None
        if equal:
            if in_flat.size % n or in_flat.size != out_flat.size:
                raise ValueError(
                    f"all_to_all_into: without counts the input ({in_flat.size} elements) and the output "
                    f"({out_flat.size}) must have the same size, a multiple of the group size {n} ({self._gdesc()})")
            in_counts = out_counts = [in_flat.size // n] * n
        else:
            in_counts = _counts(in_counts, n, in_flat.size, "in_counts")
            out_counts = _counts(out_counts, n, out_flat.size, "out_counts")
            if n == 1 and in_flat.size != out_flat.size:
                raise ValueError(f"all_to_all_into: the only rank sends {in_flat.size} elements to itself but "
                                 f"expects {out_flat.size}")
        desc = lambda: (f"all_to_all_into(out={B.describe(out_flat)}, in={B.describe(in_flat)}) on {self._gdesc()}")
        meta = self._note("all_to_all", in_flat.nbytes, -1, in_flat.dtype)
        out1, in1 = out_flat.reshape(-1), in_flat.reshape(-1)
        if n == 1:
            return self._issue(desc, None, async_op, lambda: B.copy_into(out1, in1), meta)
        if in1.size and out1.size and B.may_share(in1, out1) and B.overlaps(in1, out1):
            in1 = in1.copy()
        ev = B.record_event(in1)
        comm, mode, rank, item = self.comm, self._mode, self._rank, in1.dtype.itemsize

        def fn():
            MPI = get_mpi()
            if ev is not None:
                ev.synchronize()
            if not equal:  # See [Note: All-to-all sizes]
                got = np.empty(n, np.int64)
                comm.Alltoall([np.asarray(in_counts, np.int64), MPI.INT64_T], [got, MPI.INT64_T])
                bad = np.flatnonzero(got != np.asarray(out_counts, np.int64))
                first = np.array([rank if bad.size else n], np.int64)
                comm.Allreduce(MPI.IN_PLACE, [first, MPI.INT64_T], MPI.MIN)
                if first[0] < n:
                    q = int(first[0])
                    info = np.array([bad[0], got[bad[0]], out_counts[bad[0]]] if rank == q else [0, 0, 0], np.int64)
                    comm.Bcast([info, MPI.INT64_T], q)
                    p, sent, want = (int(x) for x in info)
                    raise ValueError(
                        f"all_to_all: the ranks' split sizes disagree: group rank {p} sends {sent} elements to group "
                        f"rank {q}, which expects {want} ({self._gdesc()})")
            if not (in1.size or out1.size):
                return
            staged = B.needs_staging(out1)
            st = B.stager() if staged else None
            sbuf = st.to_host(in1, "send") if staged else in1
            dbuf = st.empty_host(out1, "recv") if staged else out1
            if equal:
                B.call_mpi(mode, comm.Alltoall, comm.Ialltoall, B.byte_spec(sbuf), B.byte_spec(dbuf))
            else:
                B.call_mpi(mode, comm.Alltoallv, comm.Ialltoallv, _v_spec(sbuf, in_counts, item),
                           _v_spec(dbuf, out_counts, item))
            if staged:
                st.to_device(dbuf, out1)

        return self._issue(desc, fn, async_op, None, meta)

    # -- objects (blocking) ------------------------------------------------------------------
    def gather_object(self, obj: Any, dst: int = 0) -> list | None:
        """Every rank's ``obj`` in group-rank order on group rank ``dst`` (None elsewhere); tagged JSON on the
        wire, no pickle (see [Note: Objects without pickle] in _buffers.py)."""
        self._check_alive()
        dst = self._check_rank(dst, "gather_object: dst")
        data = B.encode_object(obj)
        meta = self._note("gather_object", len(data), root=dst)
        if self._size == 1:
            return [B.decode_object(data)]
        comm, n, root = self.comm, self._size, self._rank == dst

        def fn():  # sizes, then the bytes: buffer-based calls (mpi4py's comm.gather would pickle)
            MPI = get_mpi()
            sizes = np.empty(n, np.int64) if root else None
            comm.Gather([np.array([len(data)], np.int64), MPI.INT64_T], [sizes, MPI.INT64_T] if root else None, dst)
            mine = [np.frombuffer(data, np.uint8), MPI.BYTE]
            if not root:
                comm.Gatherv(mine, None, dst)
                return None
            displs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
            buf = np.empty(int(sizes.sum()), np.uint8)
            comm.Gatherv(mine, [buf, (sizes, displs), MPI.BYTE], dst)
            return [B.decode_object(buf[o:o + k].tobytes()) for o, k in zip(displs.tolist(), sizes.tolist())]

        return self._sync(lambda: f"gather_object(dst={dst}) on {self._gdesc()}", fn, meta)

    def scatter_object(self, objs: list | None, src: int = 0) -> Any:
        """Group rank r gets ``objs[r]`` of group rank ``src`` (``objs`` is ignored elsewhere); tagged JSON on the
        wire, no pickle."""
        self._check_alive()
        src = self._check_rank(src, "scatter_object: src")
        n, root = self._size, self._rank == src
        datas: list[bytes] = []
        if root:
            if not isinstance(objs, (list, tuple)) or len(objs) != n:
                got = len(objs) if isinstance(objs, (list, tuple)) else type(objs).__name__
                raise ValueError(f"scatter_object: the source rank's list has {got} entries, expected the group "
                                 f"size {n}")
            datas = [B.encode_object(o) for o in objs]
        meta = self._note("scatter_object", sum(len(d) for d in datas), root=src)
        if n == 1:
            return B.decode_object(datas[0])
        comm = self.comm

        def fn():
            MPI = get_mpi()
            sizes = np.array([len(d) for d in datas], np.int64) if root else None
            mine = np.empty(1, np.int64)
            comm.Scatter([sizes, MPI.INT64_T] if root else None, [mine, MPI.INT64_T], src)
            buf = np.empty(int(mine[0]), np.uint8)
            if root:
                displs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
                allb = np.frombuffer(b"".join(datas), np.uint8)
                comm.Scatterv([allb, (sizes, displs), MPI.BYTE], [buf, MPI.BYTE], src)
            else:
                comm.Scatterv(None, [buf, MPI.BYTE], src)
            return B.decode_object(buf.tobytes())

        return self._sync(lambda: f"scatter_object(src={src}) on {self._gdesc()}", fn, meta)
