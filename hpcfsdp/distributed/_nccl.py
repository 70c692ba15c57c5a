"""How collectives move CuPy arrays (NCCL, CUDA-aware MPI or staged), and the NCCL path itself."""

from __future__ import annotations

import socket
import sys
import threading
import time
from typing import Any, Callable

import numpy as np

from hpcfsdp import _backend, _settings
from hpcfsdp.distributed import _comm_thread as CT
from hpcfsdp.distributed._mpi import comm_timeout, cuda_aware, get_mpi

__all__ = ["GpuPath", "gpu_path", "nccl_status", "NcclWork", "all_gather", "reduce_scatter", "all_reduce",
           "broadcast", "batch_send_recv", "destroy", "auto_choice_text"]

# [Note: GPU collectives]
# A process group moves CuPy arrays one of three ways, chosen once, at the group's first collective on
# device arrays (a point every rank of the group reaches, so the choice is collective), by HPCFSDP_GPU_COMM:
#   nccl    NCCL on a stream of its own: one NcclCommunicator per group (rank 0's unique id broadcast over the
#           group's MPI communicator) on the group's GPU, and one non-blocking stream of the highest priority
#           per GPU. A collective records an event on the caller's current stream (after its last write of
#           the input), makes the NCCL stream wait on it, runs NCCL there and records a done event. Work.wait()
#           makes the caller's current stream wait on the done event: no host synchronisation and no hop
#           through the communication thread; a blocking call does that wait at once (stream-ordered, as
#           PyTorch's NCCL backend). An asynchronous Work keeps its arrays until wait() (or, never waited,
#           until the watchdog sees it done): CuPy's pool hands a freed block to the next allocation on the
#           stream that allocated it, which would otherwise overwrite memory NCCL still uses; after wait()
#           (and at once for a blocking call) the caller's stream is ordered after the collective, so
#           holding them longer would only keep FSDP's unsharded parameters alive.
#   mpi     the device pointer to a CUDA-aware MPI, on the communication thread ([Note: Device arrays]).
#   staged  device -> pinned host -> MPI -> device, on the communication thread.
# auto: nccl where cupy.cuda.nccl is available and every rank of the group drives a GPU of its own (host
# name and PCI bus id, gathered over the group); else mpi where cuda_aware() says so; else staged. Asking for
# nccl where two ranks share a GPU raises naming the GPU (NCCL refuses a GPU twice in one communicator);
# auto falls back and records why (``pg.gpu_comm``; ``hpcfsdp info``). MPI stays for the bootstrap, host
# arrays, objects, checkpoints and the watchdog. What NCCL lacks takes the group's fallback path: rooted
# collectives (gather, scatter, reduce, all_to_all), point-to-point outside batch_isend_irecv (below), bool
# reductions and int16.
# Point-to-point: batch_isend_irecv of CUDA arrays, on a group whose path is nccl, is one ncclGroupStart ...
# ncclGroupEnd of ncclSend/ncclRecv on the NCCL stream, stream-ordered as a collective (one ready event, one
# done event; a Work per op, all done with that event, each keeping its array until wait(): the list the MPI
# path returns, where PyTorch's NCCL backend returns one coalesced Work). Inside the group NCCL matches the
# whole batch at once, so the order of sends and receives in the list cannot deadlock, and a send to oneself
# with its receive in the same batch works. As PyTorch's NCCL backend: tags are ignored; every
# op names its peer (no receive from any source); a receive's result() is its peer's group rank; each dtype
# goes as its NCCL type (bytes for those NCCL lacks). NCCL checks no sizes: a send and its receive must have
# the same byte count; only what one rank can see is checked (its sends to itself against its receives from
# itself, in order), and one batch is all CUDA or all host arrays (ValueError otherwise; a host batch goes
# over MPI op by op). The group's path is chosen at its first device call, collectively: a batch that is that
# call needs every rank of the group (PyTorch's rule for its NCCL backend too); later batches may involve any
# subset. A size-1 group copies each send into its receive on the caller's stream. Plain isend/irecv/send/recv
# of CUDA arrays stay on MPI ([Note: Point-to-point] in _p2p.py, the group's fallback path): they take tags,
# receives from any source and any order of posting between separately issued calls, which NCCL's do not
# (outside a group an ncclSend holds its stream until the peer's ncclRecv runs: rank 0 sending then receiving
# while rank 1 does the same can hang). Batched and plain messages travel on different channels (NCCL and
# MPI): they never match each other, and no order is kept between them.
# AVG: NCCL's own for floating dtypes; for integers a SUM and then a floor division on the NCCL stream (the
# MPI path's meaning). Watchdog: a daemon thread polls the pending NCCL Works; one still running after
# HPCFSDP_COMM_TIMEOUT seconds, or an asynchronous NCCL error, aborts the communicator, and the group's
# next call (or that Work's wait) raises naming the collective.

_NCCL_TYPES = {"float16": "NCCL_FLOAT16", "bfloat16": "NCCL_BFLOAT16", "float32": "NCCL_FLOAT32",
               "float64": "NCCL_FLOAT64", "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32",
               "int64": "NCCL_INT64", "uint32": "NCCL_UINT32", "uint64": "NCCL_UINT64"}
_NCCL_OPS = {"SUM": "NCCL_SUM", "AVG": "NCCL_AVG", "MAX": "NCCL_MAX", "MIN": "NCCL_MIN", "PRODUCT": "NCCL_PROD"}
_ID_BYTES = 256  # host name + PCI bus id of a rank's GPU, on the wire while choosing


class GpuPath:
    """How one process group moves device arrays: ``path`` in nccl / mpi / staged, and ``why``."""

    __slots__ = ("path", "why", "nccl")

    def __init__(self, path: str, why: str, nccl: "NcclGroup | None" = None):
        self.path, self.why, self.nccl = path, why, nccl

    def __repr__(self) -> str:
        return f"GpuPath({self.path!r}, {self.why!r})"


def nccl_status() -> tuple[Any, str]:
    """(cupy.cuda.nccl or None, why): whether NCCL can be used by this process."""
    if not _backend.cupy_available():
        return None, f"device 'cuda' {_backend.cupy_unavailable_reason()}"
    try:
        from cupy.cuda import nccl  # noqa: PLC0415
    except Exception as e:
        return None, f"cupy.cuda.nccl is not importable ({type(e).__name__}: {e})"
    if not getattr(nccl, "available", False):
        return None, ("CuPy was loaded without the NCCL library (install nvidia-nccl-cu13 or nvidia-nccl-cu12 "
                      "beside CuPy: the cuda12/cuda13 extras do)")
    return nccl, f"NCCL {nccl.get_version()}"


def auto_choice_text() -> str:
    """What HPCFSDP_GPU_COMM=auto picks here, for ``hpcfsdp info`` (one process: it cannot see the others)."""
    setting = _settings.get("HPCFSDP_GPU_COMM")
    nccl, why = nccl_status()
    aware, how = cuda_aware()
    fallback = "mpi (CUDA-aware: " + how + ")" if aware else "staged (the MPI is not CUDA-aware: " + how + ")"
    if setting != "auto":
        return f"{setting} (HPCFSDP_GPU_COMM={setting})"
    if nccl is None:
        return f"{fallback}; not nccl: {why}"
    return f"nccl ({why}) where every rank of a group has its own GPU, else {fallback}"


def gpu_path(pg, a) -> GpuPath:
    """The group's path for device array ``a``; chosen (collectively) at the group's first device collective."""
    gp = pg._gpu
    if gp is None:
        gp = pg._gpu = _choose(pg, int(a.device.id))
    elif gp.nccl is not None and gp.nccl.device_id != int(a.device.id):
        raise RuntimeError(
            f"{pg._gdesc()} runs NCCL on cuda:{gp.nccl.device_id} (its first device collective was there); "
            f"got an array on cuda:{int(a.device.id)}: keep a group's collectives on one GPU per rank")
    return gp


def _fallback(why_not_nccl: str) -> GpuPath:
    aware, how = cuda_aware()
    if aware:
        return GpuPath("mpi", f"CUDA-aware MPI ({how}); not nccl: {why_not_nccl}")
    return GpuPath("staged", f"staged through pinned host memory (the MPI is not CUDA-aware: {how}); "
                             f"not nccl: {why_not_nccl}")


def _choose(pg, dev: int) -> GpuPath:
    setting = _settings.get("HPCFSDP_GPU_COMM")
    if setting == "staged":
        return GpuPath("staged", "HPCFSDP_GPU_COMM=staged")
    if setting == "mpi":
        aware, how = cuda_aware()
        if not aware:
            raise RuntimeError(f"HPCFSDP_GPU_COMM=mpi needs a CUDA-aware MPI, and this one is not ({how}); set "
                               "HPCFSDP_CUDA_AWARE=1 if it is, or use HPCFSDP_GPU_COMM=nccl, staged or auto")
        return GpuPath("mpi", f"HPCFSDP_GPU_COMM=mpi (CUDA-aware: {how})")
    nccl, why = nccl_status()
    ids = _gpu_ids(pg, dev)  # collective over the group, whatever this rank's NCCL: every rank takes it
    shared = _first_shared(ids)
    if setting == "nccl":
        if nccl is None:
            raise RuntimeError(f"HPCFSDP_GPU_COMM=nccl on {pg._gdesc()}: {why}")
        if shared is not None:
            gpu, ranks = shared
            raise RuntimeError(
                f"HPCFSDP_GPU_COMM=nccl on {pg._gdesc()}: group ranks {ranks} share the GPU {gpu}; NCCL needs "
                "a GPU per rank (select one per local rank, e.g. cupy.cuda.Device(local_rank).use()), or use "
                "HPCFSDP_GPU_COMM=auto to fall back to MPI")
        return GpuPath("nccl", f"HPCFSDP_GPU_COMM=nccl ({why})", NcclGroup(pg, dev, nccl))
    if nccl is None:
        return _fallback(why)
    if shared is not None:
        gpu, ranks = shared
        return _fallback(f"group ranks {ranks} share the GPU {gpu}")
    return GpuPath("nccl", f"every rank has its own GPU ({why})", NcclGroup(pg, dev, nccl))


def _gpu_ids(pg, dev: int) -> list[str]:
    cp = sys.modules["cupy"]
    me = f"{socket.gethostname()}|{cp.cuda.runtime.deviceGetPCIBusId(dev)}".encode()[:_ID_BYTES]
    mine = np.zeros(_ID_BYTES, np.uint8)
    mine[:len(me)] = np.frombuffer(me, np.uint8)
    every = np.zeros((pg.size(), _ID_BYTES), np.uint8)
    MPI = get_mpi()
    CT.call_sync(f"GPU identities on {pg._gdesc()}", lambda: pg.comm.Allgather([mine, MPI.BYTE], [every, MPI.BYTE]))
    return [bytes(row).rstrip(b"\0").decode(errors="replace") for row in every]


def _first_shared(ids: list[str]):
    seen: dict[str, list[int]] = {}
    for r, g in enumerate(ids):
        seen.setdefault(g, []).append(r)
    for g, ranks in seen.items():
        if len(ranks) > 1:
            host, _, bus = g.partition("|")
            return f"{bus} on {host}", ranks
    return None


# ---------------------------------------------------------------------------------------------
# the NCCL path

_STREAMS: dict[int, Any] = {}  # device -> the NCCL stream of this process on that GPU
_LOCK = threading.Lock()


def _nccl_stream(dev: int):
    s = _STREAMS.get(dev)
    if s is None:
        cp = sys.modules["cupy"]
        with cp.cuda.Device(dev):
            # CUDA clamps a priority outside the device's range to its greatest (CuPy has no
            # cudaDeviceGetStreamPriorityRange): the highest priority, as PyTorch's NCCL streams
            s = cp.cuda.Stream(non_blocking=True, priority=-(1 << 20))
        _STREAMS[dev] = s
    return s


class NcclGroup:
    """The NCCL communicator of one process group on one GPU."""

    def __init__(self, pg, dev: int, nccl):
        MPI = get_mpi()
        uid = np.zeros(128, np.uint8)  # NCCL_UNIQUE_ID_BYTES
        if pg.rank() == 0:
            uid[:] = np.frombuffer(bytes(nccl.get_unique_id()), np.uint8)
        CT.call_sync(f"NCCL unique id on {pg._gdesc()}", lambda: pg.comm.Bcast([uid, MPI.BYTE], 0))
        cp = sys.modules["cupy"]
        self.nccl, self.device_id, self.size, self.rank = nccl, dev, pg.size(), pg.rank()
        self.desc = pg._gdesc()
        with cp.cuda.Device(dev):
            self.comm = nccl.NcclCommunicator(pg.size(), uid.tobytes(), pg.rank())
        self.stream = _nccl_stream(dev)
        self.failed: str | None = None

    def check(self) -> None:
        if self.failed is not None:
            raise RuntimeError(self.failed)

    def _launch(self, launch: Callable[[Any, Any], None]):
        """Run ``launch(comm, stream)`` on the NCCL stream after the caller's current stream (inside the group's
        device): (the caller's stream, the done event recorded after it)."""
        cp = sys.modules["cupy"]
        cur = cp.cuda.get_current_stream()
        ready = cp.cuda.Event(disable_timing=True)
        ready.record(cur)
        self.stream.wait_event(ready)
        with self.stream:
            launch(self.comm, self.stream)
        done = cp.cuda.Event(disable_timing=True)
        done.record(self.stream)
        return cur, done

    def run(self, desc, async_op: bool, keep: tuple, launch: Callable[[Any, Any], None]) -> "NcclWork | None":
        """Enqueue ``launch(comm, stream)`` on the NCCL stream after the caller's current stream; see the Note."""
        self.check()
        cp = sys.modules["cupy"]
        with cp.cuda.Device(self.device_id):
            cur, done = self._launch(launch)
            work = NcclWork(desc, done, self, keep if async_op else ())
            _watch(work)
            if not async_op:
                cur.wait_event(done)
                work.desc  # noqa: B018 (the watchdog keeps the Work: format the description, drop its arrays)
                return None
        return work

    def run_batch(self, items: list, launch: Callable[[Any, Any], None]) -> "list[NcclWork]":
        """Like ``run`` (asynchronous) for a batch launched as one: a Work per ``(desc, keep, result)`` of
        ``items``, all completing with the batch's done event."""
        self.check()
        cp = sys.modules["cupy"]
        with cp.cuda.Device(self.device_id):
            _, done = self._launch(launch)
            works = [NcclWork(desc, done, self, keep, result) for desc, keep, result in items]
            for work in works:
                _watch(work)
        return works

    def destroy(self) -> None:
        comm, self.comm = self.comm, None
        if comm is not None:
            try:
                if self.failed is None:
                    self.stream.synchronize()  # nothing of ours still runs on the communicator
                comm.destroy()
            except Exception:  # an aborted communicator
                pass

    def abort(self, why: str) -> None:
        self.failed = why
        comm = self.comm
        if comm is not None:
            try:
                comm.abort()
            except Exception:
                pass
            self.comm = None


class _EventFlag:
    """A threading.Event-like view of a CUDA event (what the failure reports read as ``done``)."""

    __slots__ = ("event",)

    def __init__(self, event):
        self.event = event

    def is_set(self) -> bool:
        return bool(self.event.done)

    def wait(self, timeout: float | None = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        while not self.event.done:
            if end is not None and time.monotonic() >= end:
                return False
            time.sleep(0.0005)
        return True

    def set(self) -> None:
        pass


class NcclWork(CT.Work):
    """A collective on the NCCL stream: ``wait()`` orders the caller's current stream after it (no host wait)."""

    __slots__ = ("_event", "_group", "_keep")

    def __init__(self, desc, event, group: NcclGroup, keep: tuple, result: Any = None):
        super().__init__(desc)
        self._event, self._group, self._keep = event, group, keep
        self._done = _EventFlag(event)
        self._result = result  # a batched receive's: the sender's group rank, as the MPI path's irecv

    def is_completed(self) -> bool:
        if self._group.failed is not None:
            return True
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._group.failed is None and self._done.is_set()

    def exception(self) -> BaseException | None:
        return RuntimeError(self._group.failed) if self._group.failed is not None else None

    def wait(self, timeout=None) -> bool:
        """Make the calling thread's current stream wait for this collective; raise if NCCL failed."""
        self._group.check()
        cp = sys.modules["cupy"]
        with cp.cuda.Device(self._group.device_id):
            cp.cuda.get_current_stream().wait_event(self._event)
        self._keep = ()  # the caller's stream is ordered after the collective: its pool may reuse the arrays
        self.desc  # noqa: B018 (formats the lazy description, which holds the arrays too)
        return True

    def synchronize(self) -> None:
        """Block the host until the collective has run (PyTorch's Work.synchronize)."""
        self._group.check()
        self._event.synchronize()

    def __repr__(self) -> str:
        return f"NcclWork({self.desc}, {'completed' if self.is_completed() else 'pending'})"


# the pending NCCL Works: their arrays stay referenced until done; the watchdog polls them
_PENDING: list[tuple[NcclWork, float]] = []
_WATCHDOG: list[threading.Thread] = []


def _watch(work: NcclWork) -> None:
    """Keep ``work`` (and its arrays) until the watchdog thread sees its done event complete. The issuing
    thread never queries events here: a query is a host synchronisation point, and on the simulated device
    it would make this thread know every earlier collective complete, hiding a missing wait()."""
    now = time.monotonic()
    with _LOCK:
        _PENDING.append((work, now))
        if not _WATCHDOG:
            t = threading.Thread(target=_watchdog_loop, name="hpcfsdp-nccl-watchdog", daemon=True)
            _WATCHDOG.append(t)
            t.start()


def _watchdog_loop() -> None:
    while True:
        time.sleep(0.5)
        limit = comm_timeout()
        with _LOCK:
            items = list(_PENDING)
        for work, t0 in items:
            g = work._group
            if g.failed is not None or work._done.is_set():
                continue
            err = None
            try:
                if g.comm is not None:
                    g.comm.check_async_error()
            except Exception as e:  # NcclError
                err = f"NCCL reported an asynchronous error during {work.desc}: {e}"
            if err is None and 0 < limit <= time.monotonic() - t0:
                err = (f"NCCL collective timed out after {limit:g} s (HPCFSDP_COMM_TIMEOUT): {work.desc}. Another "
                       "rank did not join this collective (or joined a different one); the NCCL communicator of "
                       f"{g.desc} was aborted")
            if err is not None:
                print(f"hpcfsdp: {err}", file=sys.stderr, flush=True)
                g.abort(err)
        with _LOCK:
            _PENDING[:] = [(w, t) for w, t in _PENDING if not (w._done.is_set() or w._group.failed)]


def _type(nccl, dtype) -> int | None:
    name = _NCCL_TYPES.get(np.dtype(dtype).name)
    return None if name is None else getattr(nccl, name)


def _reduce_args(g: NcclGroup, dtype, op: str):
    """(NCCL type, NCCL op, floor-divide after) for a reduction, or None where NCCL cannot do it."""
    dt = np.dtype(dtype)
    t = _type(g.nccl, dt)
    if t is None or dt == np.bool_:
        return None
    integer = np.issubdtype(dt, np.integer)
    if op == "AVG" and integer:
        return t, g.nccl.NCCL_SUM, True
    return t, getattr(g.nccl, _NCCL_OPS[op]), False


def all_gather(g: NcclGroup, out1, in1, in_place: bool, k: int, async_op: bool, desc):
    """out1[r*k:(r+1)*k] = rank r's in1 (bytes; in place where in1 is that slot)."""
    nb = k * in1.dtype.itemsize
    src = out1[g.rank * k:(g.rank + 1) * k] if in_place else in1
    u8 = g.nccl.NCCL_UINT8
    return g.run(desc, async_op, (out1, in1),
                 lambda c, s: c.allGather(src.data.ptr, out1.data.ptr, nb, u8, s.ptr) if nb else None)


def reduce_scatter(g: NcclGroup, out1, in1, k: int, op: str, async_op: bool, desc):
    """out1 = op over ranks of in1[rank*k:(rank+1)*k]; None where NCCL cannot (the caller falls back)."""
    args = _reduce_args(g, in1.dtype, op)
    if args is None:
        return NotImplemented
    t, nop, floor = args
    n = g.size

    def launch(c, s):
        if k:
            c.reduceScatter(in1.data.ptr, out1.data.ptr, k, t, nop, s.ptr)
            if floor:
                sys.modules["cupy"].floor_divide(out1, n, out=out1)
    return g.run(desc, async_op, (out1, in1), launch)


def all_reduce(g: NcclGroup, a1, op: str, async_op: bool, desc):
    args = _reduce_args(g, a1.dtype, op)
    if args is None:
        return NotImplemented
    t, nop, floor = args
    n = g.size

    def launch(c, s):
        if a1.size:
            c.allReduce(a1.data.ptr, a1.data.ptr, a1.size, t, nop, s.ptr)
            if floor:
                sys.modules["cupy"].floor_divide(a1, n, out=a1)
    return g.run(desc, async_op, (a1,), launch)


def broadcast(g: NcclGroup, a1, src: int, async_op: bool, desc):
    nb = a1.nbytes
    u8 = g.nccl.NCCL_UINT8
    return g.run(desc, async_op, (a1,),
                 lambda c, s: c.broadcast(a1.data.ptr, a1.data.ptr, nb, u8, src, s.ptr) if nb else None)


def _p2p_type(nccl, a) -> tuple[int, int]:
    """(NCCL type, count) of a point-to-point message of ``a``: its own type where NCCL has it, else bytes."""
    t = _type(nccl, a.dtype)
    return (nccl.NCCL_UINT8, a.nbytes) if t is None else (t, a.size)


def batch_send_recv(g: NcclGroup, ops: list, descs: list) -> "list[NcclWork]":
    """``ops``: ``(is_send, flat array, peer group rank)``, all in one ncclGroupStart/ncclGroupEnd on the NCCL
    stream; a Work per op (``descs``: their descriptions). See [Note: GPU collectives] (point-to-point)."""
    nccl = g.nccl
    calls = [(is_send, a.data.ptr) + _p2p_type(nccl, a) + (peer,) for is_send, a, peer in ops if a.nbytes]

    def launch(c, s):
        nccl.groupStart()
        try:
            for is_send, p, t, count, peer in calls:
                (c.send if is_send else c.recv)(p, count, t, peer, s.ptr)
        except BaseException:
            try:
                nccl.groupEnd()  # balanced; NCCL drops a group one of whose calls failed
            except Exception:
                pass
            raise
        nccl.groupEnd()
    return g.run_batch([(d, (a,), None if is_send else peer) for (is_send, a, peer), d in zip(ops, descs)], launch)


def destroy(pg) -> None:
    gp, pg._gpu = pg._gpu, None
    if gp is not None and gp.nccl is not None:
        gp.nccl.destroy()
