"""The simulated ``cupy.cuda.nccl``: NCCL collectives as stream-ordered kernels between simulated GPUs (one per rank)."""
from __future__ import annotations

import itertools
import os
import threading
import types
import weakref

import ml_dtypes
import numpy as np

import hpcfsdp._settings as _settings  # a leaf

from . import _sim_runtime as _rt
from ._sim_buffers import AddressRanges, _fail

__all__ = ["nccl", "note_pointer"]

# [Note: Simulated NCCL]
# Each MPI process simulates its own GPUs, so a simulated NcclCommunicator spans processes: its members
# find each other over MPI.COMM_WORLD (the unique id names the world rank of the group's rank 0 and a
# counter; the others send it their world rank, it answers with the member list) and run every
# collective over a communicator of their own (Create_group, collective over the members only). A
# collective is a kernel on the stream it is given: when it is enqueued its input must be ordered
# before that stream (the RAW rule of the rest of the simulation), its output is recorded as written
# on that stream (a reader must wait on an event recorded after it), and the data moves at once over
# MPI (every member enqueues the same collectives in the same order, as NCCL requires). Buffers are
# found from the raw device pointers NCCL takes: ``ndarray.data`` registers the array's memory.
# Reductions gather every rank's input and reduce in float64 (float32 for the 16-bit types), rounded
# once. groupStart/groupEnd batch send/recv, as NCCL's grouped point-to-point: every send and receive of the
# group is posted at groupEnd and matched in issue order per peer (a send to the caller's own rank included),
# so their order cannot deadlock; a group one of whose calls failed is dropped at groupEnd, which raises (NCCL's
# group error). Outside a group a send returns only once its receive is posted (MPI_Ssend): an ncclSend holds
# its stream until the peer's ncclRecv runs, so two ranks sending to each other first hang, as on a GPU.

_CONST = {  # NCCL's public enums (nccl.h)
    "NCCL_INT8": 0, "NCCL_CHAR": 0, "NCCL_UINT8": 1, "NCCL_INT32": 2, "NCCL_INT": 2, "NCCL_UINT32": 3,
    "NCCL_INT64": 4, "NCCL_UINT64": 5, "NCCL_FLOAT16": 6, "NCCL_HALF": 6, "NCCL_FLOAT32": 7, "NCCL_FLOAT": 7,
    "NCCL_FLOAT64": 8, "NCCL_DOUBLE": 8, "NCCL_BFLOAT16": 9,
    "NCCL_SUM": 0, "NCCL_PROD": 1, "NCCL_MAX": 2, "NCCL_MIN": 3, "NCCL_AVG": 4,
}
_DTYPES = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64, 6: np.float16,
           7: np.float32, 8: np.float64, 9: ml_dtypes.bfloat16}
_VERSION = 23203
_rt.SIM_FILES.add(__file__)


class NcclError(RuntimeError):
    pass


def device_pci_bus_id(self, device) -> str:
    """cupy.cuda.runtime.deviceGetPCIBusId: each process simulates GPUs of its own (a PCI domain per process),
    unless HPCFSDP_CUDA_SIM_SHARED_GPUS makes the processes of a host share them (ranks sharing a GPU)."""
    _rt.Device(device)  # the ordinal check
    domain = 0 if _settings.get("HPCFSDP_CUDA_SIM_SHARED_GPUS") else os.getpid() & 0xFFFF
    return f"{domain:04X}:{int(device) + 1:02X}:00.0"


# ---------------------------------------------------------------------------------------------
# device pointers -> simulated buffers

_DEVICE = AddressRanges()  # a root NumPy array's memory -> (weakref of that root, its _Buf)


def note_pointer(root: np.ndarray, buf) -> None:
    """Remember that device memory ``root`` (a root NumPy array) belongs to simulated buffer ``buf``."""
    start = root.__array_interface__["data"][0]
    old = _DEVICE.get(start)
    if old is not None and old[0]() is root:
        return
    entry = (weakref.ref(root), buf)
    _DEVICE.add(start, start + root.nbytes, entry)  # replaces a dead root's entry at the same address
    weakref.finalize(root, _forget, start, entry)


def _forget(start, entry) -> None:
    if _DEVICE.get(start) is entry:  # not a newer array's that took the address since
        _DEVICE.remove(start)


def _memory(ptr: int, nbytes: int, what: str):
    """(uint8 view of ``nbytes`` device bytes at ``ptr``, its _Buf)."""
    hit = _DEVICE.find(ptr)
    root = hit[2][0]() if hit is not None else None
    if root is None or not root.flags.c_contiguous:
        raise _rt.CudaSimError(f"{what}: {ptr:#x} is not the address of a live simulated device array")
    off = ptr - root.__array_interface__["data"][0]
    if off + nbytes > root.nbytes:
        raise _rt.CudaSimError(f"{what}: {nbytes} bytes at {ptr:#x} run past the end of its device array "
                               f"({root.nbytes - off} bytes left)")
    return root.reshape(-1).view(np.uint8)[off:off + nbytes], hit[2][1]


def _stream(ptr: int, dev: int):
    if ptr == 0:
        return _rt._null(dev)
    with _rt._lock:
        for r in _rt._STREAMS.get(dev, ()):
            s = r()
            if s is not None and s.ptr == ptr:
                return s
    raise _rt.CudaSimError(f"NCCL: stream {ptr:#x} is not a stream of cuda:{dev}")


# ---------------------------------------------------------------------------------------------
# unique ids and communicators

_ids = itertools.count(1)
_MAGIC = b"hpcfsdp-sim-nccl"
_TAG0 = 29000


def _mpi():
    from mpi4py import MPI  # noqa: PLC0415

    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise _rt.CudaSimError("the simulated NCCL calls MPI from the issuing thread: it needs MPI_THREAD_MULTIPLE")
    return MPI


def get_unique_id() -> bytes:
    MPI = _mpi()
    uid = _MAGIC + np.array([MPI.COMM_WORLD.Get_rank(), next(_ids), os.getpid()], np.int64).tobytes()
    return uid.ljust(128, b"\0")


def _parse(uid) -> tuple[int, int]:
    if not isinstance(uid, bytes):  # CuPy's signature: NcclCommunicator(int ndev, bytes commId, int rank)
        raise TypeError(f"Argument 'commId' has incorrect type (expected bytes, got {type(uid).__name__})")
    b = uid
    if len(b) != 128 or not b.startswith(_MAGIC):
        raise NcclError("ncclInvalidArgument: not a unique id of the simulated NCCL")
    w, c, _ = np.frombuffer(b[len(_MAGIC):len(_MAGIC) + 24], np.int64)
    return int(w), int(c)


class NcclCommunicator:
    """ncclComm_t over the members' own MPI communicator, bound to the caller's current simulated GPU."""

    def __init__(self, ndev: int, commId, rank: int):
        MPI = _mpi()
        root, ctr = _parse(commId)
        W = MPI.COMM_WORLD
        tag = _TAG0 + ctr % 3000
        me = W.Get_rank()
        if not 0 <= rank < ndev:
            raise NcclError(f"ncclInvalidArgument: rank {rank} outside [0, {ndev})")
        if rank == 0:
            if me != root:
                raise NcclError("ncclInvalidUsage: rank 0 must be the process that made the unique id")
            members = [me] + [-1] * (ndev - 1)
            for _ in range(ndev - 1):
                msg = np.empty(2, np.int64)
                W.Recv([msg, MPI.INT64_T], source=MPI.ANY_SOURCE, tag=tag)
                members[int(msg[0])] = int(msg[1])
            arr = np.array(members, np.int64)
            for r in range(1, ndev):
                W.Send([arr, MPI.INT64_T], dest=members[r], tag=tag)
        else:
            W.Send([np.array([rank, me], np.int64), MPI.INT64_T], dest=root, tag=tag)
            arr = np.empty(ndev, np.int64)
            W.Recv([arr, MPI.INT64_T], source=root, tag=tag)
        g = W.Get_group()
        sub = g.Incl([int(x) for x in arr])
        try:
            self._comm = W.Create_group(sub, tag=tag)
        finally:
            sub.Free()
            g.Free()
        self._rank, self._size, self._dev = rank, ndev, _rt._cur_dev()
        self._aborted = False

    # -- queries -----------------------------------------------------------------------------
    def device_id(self):
        return self._dev

    def rank_id(self):
        return self._rank

    def size(self):
        return self._size

    def check_async_error(self):
        if self._aborted:
            raise NcclError("ncclInvalidUsage: the communicator was aborted")

    def abort(self):
        self._aborted = True

    def destroy(self):
        c, self._comm = self._comm, None
        if c is not None and not self._aborted:
            c.Free()

    # -- kernels -----------------------------------------------------------------------------
    def _kernel(self, op, stream_ptr, reads, writes):
        """Check and record one NCCL kernel: ``reads``/``writes`` are (ptr, nbytes); returns the views."""
        if self._comm is None or self._aborted:
            raise NcclError(f"ncclInvalidUsage: {op} on a destroyed or aborted communicator")
        s = _stream(stream_ptr, self._dev)
        what = f"NCCL {op}"
        ins = [_memory(p, n, what) for p, n in reads]
        outs = [_memory(p, n, what) for p, n in writes]
        for view, buf in ins + outs:
            if buf.dev != self._dev:
                raise _rt.CudaSimError(f"{what}: a buffer on cuda:{buf.dev} given to the communicator of "
                                       f"cuda:{self._dev}\nAt:\n{_rt._stack()}")
        for view, buf in ins:
            hit = buf.unordered(s)
            if hit is not None:
                _fail(what, f"a {view.nbytes}-byte NCCL input on cuda:{buf.dev}", hit,
                          f"{what} on stream {s.id}")
        seq = s._enqueue(what)  # one launch
        for _, buf in ins:
            if hasattr(buf, "read"):
                buf.read(s, seq, what)
        for _, buf in outs:
            buf.write(s, seq, what)
        return [v for v, _ in ins], [v for v, _ in outs]

    def _gather(self, src: np.ndarray) -> np.ndarray:
        MPI = _mpi()
        out = np.empty((self._size, src.nbytes), np.uint8)
        self._comm.Allgather([np.ascontiguousarray(src).reshape(-1), MPI.BYTE], [out, MPI.BYTE])
        return out

    def _reduce(self, src_bytes, count, datatype, op):
        dt = np.dtype(_DTYPES[datatype])
        every = self._gather(src_bytes).view(dt).reshape(self._size, count)
        floating = dt.kind == "f" or dt == np.dtype(ml_dtypes.bfloat16)
        x = every.astype((np.float32 if dt.itemsize == 2 else np.float64) if floating else dt)
        if op == 0:
            r = x.sum(0)
        elif op == 1:
            r = x.prod(0)
        elif op == 2:
            r = x.max(0)
        elif op == 3:
            r = x.min(0)
        elif op == 4:
            r = x.sum(0) / self._size if floating else x.sum(0) // self._size
        else:
            raise NcclError(f"ncclInvalidArgument: reduction op {op}")
        return np.ascontiguousarray(r.astype(dt)).view(np.uint8).reshape(-1)

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):  # noqa: N802 (CuPy's names)
        nb = count * np.dtype(_DTYPES[datatype]).itemsize
        (src,), (dst,) = self._kernel("allGather", stream, [(sendbuf, nb)], [(recvbuf, nb * self._size)])
        dst[...] = self._gather(src.copy()).reshape(-1)

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802
        nb = count * np.dtype(_DTYPES[datatype]).itemsize
        (src,), (dst,) = self._kernel("allReduce", stream, [(sendbuf, nb)], [(recvbuf, nb)])
        dst[...] = self._reduce(src.copy(), count, datatype, op)

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):  # noqa: N802
        nb = recvcount * np.dtype(_DTYPES[datatype]).itemsize
        (src,), (dst,) = self._kernel("reduceScatter", stream, [(sendbuf, nb * self._size)], [(recvbuf, nb)])
        full = self._reduce(src.copy(), recvcount * self._size, datatype, op)
        dst[...] = full[self._rank * nb:(self._rank + 1) * nb]

    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
        nb = count * np.dtype(_DTYPES[datatype]).itemsize
        writes = [(recvbuf, nb)] if self._rank == root else []
        (src,), outs = self._kernel("reduce", stream, [(sendbuf, nb)], writes)
        r = self._reduce(src.copy(), count, datatype, op)
        if outs:
            outs[0][...] = r

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        MPI = _mpi()
        nb = count * np.dtype(_DTYPES[datatype]).itemsize
        reads = [(sendbuff, nb)] if self._rank == root else []
        ins, (dst,) = self._kernel("broadcast", stream, reads, [(recvbuff, nb)])
        tmp = ins[0].copy() if ins else np.empty(nb, np.uint8)
        self._comm.Bcast([tmp, MPI.BYTE], root)
        dst[...] = tmp

    def bcast(self, buff, count, datatype, root, stream):
        self.broadcast(buff, buff, count, datatype, root, stream)

    def _p2p(self, op, buf, count, datatype, peer, stream):
        """Check and record one send or recv (CuPy's signature: ``(buf, count, datatype, peer, stream)``); its
        device bytes. A failure inside a group fails the group."""
        try:
            if datatype not in _DTYPES:
                raise NcclError(f"ncclInvalidArgument: {op}: datatype {datatype}")
            if not 0 <= peer < self._size:
                raise NcclError(f"ncclInvalidArgument: {op}: peer {peer} outside [0, {self._size})")
            nb = count * np.dtype(_DTYPES[datatype]).itemsize
            mem = [(buf, nb)]
            ins, outs = self._kernel(op, stream, mem if op == "send" else [], mem if op == "recv" else [])
            return (ins + outs)[0]
        except BaseException:
            if _GROUP.depth:
                _GROUP.failed = True
            raise

    def send(self, sendbuf, count, datatype, peer, stream):
        data = self._p2p("send", sendbuf, count, datatype, peer, stream).copy()
        if _GROUP.depth:
            _GROUP.ops.append((self, "send", data, peer, None))
        else:
            self._comm.Ssend([data, _mpi().BYTE], dest=peer, tag=7)

    def recv(self, recvbuf, count, datatype, peer, stream):
        dst = self._p2p("recv", recvbuf, count, datatype, peer, stream)
        if _GROUP.depth:
            _GROUP.ops.append((self, "recv", np.empty(dst.nbytes, np.uint8), peer, dst))
        else:
            tmp = np.empty(dst.nbytes, np.uint8)
            self._comm.Recv([tmp, _mpi().BYTE], source=peer, tag=7)
            dst[...] = tmp


class _Group(threading.local):
    depth = 0
    failed = False  # a call of the open group raised: groupEnd drops the group

    def __init__(self):
        self.ops = []


_GROUP = _Group()


def groupStart():  # noqa: N802
    _GROUP.depth += 1


def groupEnd():  # noqa: N802
    if _GROUP.depth == 0:
        raise NcclError("ncclInvalidUsage: groupEnd without groupStart")
    _GROUP.depth -= 1
    if _GROUP.depth:
        return
    MPI = _mpi()
    ops, _GROUP.ops = _GROUP.ops, []
    if _GROUP.failed:
        _GROUP.failed = False
        raise NcclError("ncclInvalidUsage: a call of this group failed; none of its operations were launched")
    reqs = [(c._comm.Isend if kind == "send" else c._comm.Irecv)([buf, MPI.BYTE], peer, 7)
            for c, kind, buf, peer, _ in ops]
    MPI.Request.Waitall(reqs)
    for _, kind, buf, _, dst in ops:
        if kind == "recv":
            dst[...] = buf


nccl = types.ModuleType("cupy.cuda.nccl")
for _k, _v in _CONST.items():
    setattr(nccl, _k, _v)
nccl.available = True
nccl.NcclError = NcclError
nccl.NcclCommunicator = NcclCommunicator
nccl.get_unique_id = get_unique_id
nccl.get_version = lambda: _VERSION
nccl.get_build_version = lambda: _VERSION
nccl.groupStart, nccl.groupEnd = groupStart, groupEnd
