"""MPI under the simulated device: the ownership window of an MPI call over its buffers, and the hand-off of
what one host thread knows complete to another (see [Note: Simulated device] in cuda_sim)."""
from __future__ import annotations

import sys
import threading

import numpy as np

from . import _sim_runtime as _rt
from ._sim_buffers import _Buf, _fail, _fail_write, _host_buf
from ._sim_runtime import INFLIGHT, CudaSimError, _fmt, _lock, _stack, _where, agent_name

__all__ = ["begin", "begin_bufs", "end", "call", "Token", "INFLIGHT", "HANDOFF", "WINDOW", "open_here"]

SIM_FILES = _rt.SIM_FILES
SIM_FILES.add(__file__)

_tls = threading.local()


class Token:
    """One MPI call between its start and its completion: its own agent id (known complete by no one: any
    access ordered against it fails), the buffers it reads and writes, and what the starting thread knew."""

    __slots__ = ("key", "op", "reads", "writes", "known", "where")

    def __init__(self, op, reads, writes, known, where):
        self.key = next(_rt._ids)
        self.op, self.reads, self.writes, self.known, self.where = op, reads, writes, known, where


def _buf_of(x, op):
    """(the _Buf of device array / pinned host array ``x``, its description), or None (pageable host memory)."""
    b = getattr(x, "_buf", None)
    if isinstance(b, _Buf):
        cur = _rt._cur_dev()
        if b.dev != cur:
            raise CudaSimError(
                f"{op}: MPI accesses {_desc(x)} on a thread whose current device is cuda:{cur} (an array belongs "
                f"to one device: the thread must select cuda:{b.dev}).\nAt:\n{_stack()}")
        return b, _desc(x)
    if isinstance(x, np.ndarray):
        hb = _host_buf(x)
        if hb is not None:
            return hb, f"pinned host {x.dtype.name}{list(x.shape)}"
    return None


def _desc(x):
    return f"{np.dtype(x.dtype).name}{list(x.shape)} on cuda:{x._buf.dev}"


def begin(reads, writes, op: str) -> Token:
    """MPI call ``op`` starts reading arrays ``reads`` and writing arrays ``writes`` (device or pinned host
    arrays; pageable host arrays are ignored). The calling host thread must know complete every write to
    what it reads, and every read and write of what it writes; until ``end``, no one may read what it writes
    or write anything it touches (the ownership window). Raises CudaSimError naming the hazard."""
    rs = [b for b in (_buf_of(x, op) for x in reads) if b is not None]
    ws = [b for b in (_buf_of(x, op) for x in writes) if b is not None]
    return _begin(rs, ws, op)


def begin_bufs(reads, writes, op: str) -> Token:
    """``begin`` on _Buf objects (the caller checked devices)."""
    return _begin([(b, "a buffer") for b in reads], [(b, "a buffer") for b in writes], op)


def _begin(rs, ws, op) -> Token:
    with _lock:
        for b, desc in rs:
            hit = b.unordered(None)
            if hit is not None:
                _fail(op, desc, hit, "MPI read it (synchronise the stream, or an event recorded after the write)")
        for b, desc in ws:
            got = b.unordered_access(None)
            if got is not None:
                _fail_write(op, desc, got[0], got[1], "MPI wrote it")
        tok = Token(op, [b for b, _ in rs], [b for b, _ in ws], dict(_rt.host().vc), _where())
        entry = (1, op, tok.where, None)
        for b in tok.writes:
            b.pending.clear()
            b.reads.clear()
        for b in tok.writes:
            b.pending[tok.key] = entry
        for b in tok.reads:
            b.reads[tok.key] = entry
        INFLIGHT[tok.key] = tok
        _rt._AGENTS[tok.key] = "still in flight: MPI owns its buffers until the call completes"
    mine = getattr(_tls, "open", None)
    if mine is None:
        mine = _tls.open = set()
    mine.add(tok.key)
    return tok


def open_here() -> frozenset:
    """The MPI calls the calling thread started and has not completed (MPI itself reads their buffers)."""
    return frozenset(getattr(_tls, "open", ()))


def end(tok: Token) -> None:
    """MPI call ``tok`` completed, observed by the calling thread: its accesses become this thread's (ticked
    clock), known to others only through a hand-off."""
    with _lock:
        if INFLIGHT.pop(tok.key, None) is None:
            return
        _rt._AGENTS.pop(tok.key, None)
        h = _rt.host()
        h.learn(tok.known)  # the request came from the starting thread: it knew what that one knew
        t = h.tick()
        for table, bufs in (("pending", tok.writes), ("reads", tok.reads)):
            for b in bufs:
                d = getattr(b, table)
                e = d.pop(tok.key, None)
                if e is not None:
                    old = d.get(h.id)
                    if old is None or old[0] < t:
                        d[h.id] = (t, e[1], e[2], e[3])
    mine = getattr(_tls, "open", None)
    if mine is not None:
        mine.discard(tok.key)


# ---------------------------------------------------------------------------------------------
# mpi4py calls: which buffers a routine reads and which it writes

def _array(spec):
    if isinstance(spec, (list, tuple)):
        spec = spec[0] if spec else None
    if isinstance(spec, np.ndarray) or isinstance(getattr(spec, "_buf", None), _Buf):
        return spec
    return None


def _in_place(x) -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and x is mpi.IN_PLACE


def call(routine, args) -> Token:
    """``begin`` for mpi4py routine ``routine`` (e.g. comm.Allgather, comm.Ireduce_scatter_block) called with
    ``args``: the first buffer argument is sent (read), the second received (written); MPI_IN_PLACE makes
    the second read and written; Bcast's one buffer is read at its root and written elsewhere."""
    name = getattr(routine, "__name__", str(routine))
    op = f"MPI {name}"
    bufs = [_array(a) for a in args[:2]]
    if name in ("Bcast", "Ibcast"):
        root = args[1] if len(args) > 1 else 0
        me = routine.__self__.Get_rank()
        return begin([bufs[0]] if me == root else [], [bufs[0]] if me != root else [], op)
    send = bufs[0] if bufs else None
    recv = bufs[1] if len(bufs) > 1 else None
    if args and _in_place(args[0]):
        return begin([recv], [recv], op)
    return begin([send], [recv], op)


class _Window:
    """The hook _backend.MPI_WINDOW: ``call(routine, args) -> token`` before an MPI call, ``end(token)``
    once it completed; ``begin(reads, writes, op)`` for calls described by hand."""

    call = staticmethod(lambda routine, args: call(routine, args))
    begin = staticmethod(lambda reads, writes, op: begin(reads, writes, op))
    end = staticmethod(lambda tok: end(tok))


class _Handoff:
    """The hook _backend.THREAD_HANDOFF: ``publish()`` on the thread handing results over, ``acquire(snapshot)``
    on the thread taking them (Work completion / Work.wait)."""

    publish = staticmethod(_rt.publish)
    acquire = staticmethod(_rt.acquire)


WINDOW = _Window()
HANDOFF = _Handoff()


def describe_inflight() -> str:
    """The MPI calls in flight (for debugging a test)."""
    with _lock:
        return "\n".join(f"{agent_name(k)} started at:\n{_fmt(t.where)}" for k, t in INFLIGHT.items())
