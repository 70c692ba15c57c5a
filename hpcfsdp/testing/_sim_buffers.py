"""The simulated device's buffers: the accesses recorded on them, the hazard checks and their messages, and
pinned host memory (see [Note: Simulated device] in cuda_sim)."""
from __future__ import annotations

import bisect
import weakref

import numpy as np

from . import _sim_runtime as _rt
from ._sim_runtime import _READ_DEPTH, CudaSimError, Stream, _describe, _fmt, _lock, _stack, _where, agent_name, host

__all__ = ["alloc_pinned_memory", "PinnedMemoryPointer", "is_pinned"]

_rt.SIM_FILES.add(__file__)


# ---------------------------------------------------------------------------------------------
# buffers: the accesses not yet known ordered, and the hazard checks

# An entry: agent id -> (op number, what, where issued, reuse note or None). Agents are streams, host
# threads' clocks (an MPI call that completed there) and MPI calls in flight (no one knows them complete).

class _Buf:
    """The memory behind a simulated array and its views (or a pinned host allocation): per agent, its
    last write and its last read not yet cleared. ``read``/``write`` check and record one access of a
    stream's op; they raise CudaSimError naming the hazard."""

    __slots__ = ("dev", "pending", "reads", "pinned", "home", "size", "pool", "__weakref__")

    def __init__(self, dev, pinned=False):
        self.dev = dev
        self.pending = {}  # writes
        self.reads = {}
        self.pinned = pinned
        self.home = 0  # the stream it was allocated on, its rounded size and its pool (see _sim_pool)
        self.size = 0
        self.pool = None

    def __del__(self):
        p = self.pool
        if p is not None:
            p._release(self)

    # -- checks: the first access not ordered before ``stream``'s next op (None: before the calling host
    # thread, which must know it complete)
    def _first(self, entries: dict, stream, skip=()):
        if stream is None:
            vc = host().vc
            for k, e in entries.items():
                if vc.get(k, 0) < e[0] and k not in skip:
                    return k, e
            return None
        sid, vc = stream.id, stream.vc
        for k, e in entries.items():
            if k != sid and vc.get(k, 0) < e[0] and k not in skip:
                return k, e
        return None

    def unordered(self, stream, skip=()):
        """The first pending write not ordered before ``stream`` (None: known complete by the calling host
        thread), as (agent, op number, what, where, reuse), else None."""
        with _lock:
            if stream is not None:
                stream._sync_in()
            hit = self._first(self.pending, stream, skip)
        return None if hit is None else (hit[0],) + hit[1]

    def unordered_access(self, stream, skip=()):
        """For a write: (hit, "read" | "write") for the first read or write not ordered before ``stream``."""
        with _lock:
            if stream is not None:
                stream._sync_in()
            hit = self._first(self.pending, stream, skip)
            if hit is not None:
                return (hit[0],) + hit[1], "write"
            hit = self._first(self.reads, stream, skip)
            if hit is not None:
                return (hit[0],) + hit[1], "read"
        return None

    # -- recording
    def read(self, stream: Stream, seq: int, what: str, desc="a device buffer") -> None:
        """Op ``seq`` of ``stream`` (already enqueued) reads this buffer: raise on a read-after-write.
        ``desc`` names the buffer in the message (a string, or the simulated array)."""
        with _lock:
            stream._sync_in()
            hit = self._first(self.pending, stream)
            if hit is not None:
                _fail(what, desc, (hit[0],) + hit[1], f"{what} on stream {stream.id}")
            old = self.reads.get(stream.id)
            if old is None or old[0] < seq:
                self.reads[stream.id] = (seq, what, _where(2, _READ_DEPTH), None)

    def check_write(self, stream: Stream, what: str, desc="a device buffer") -> None:
        """Raise unless a write by ``stream``'s next op is ordered after every read and write of this buffer."""
        with _lock:
            stream._sync_in()
            hit = self._first(self.pending, stream)
            kind = "write"
            if hit is None:
                hit, kind = self._first(self.reads, stream), "read"
            if hit is not None:
                _fail_write(what, desc, (hit[0],) + hit[1], kind, f"{what} on stream {stream.id}")

    def write(self, stream: Stream, seq: int, what: str, desc="a device buffer") -> None:
        """Op ``seq`` of ``stream`` writes this buffer: raise on a write-after-write or write-after-read;
        then every earlier access is ordered before this write and is forgotten."""
        with _lock:
            self.check_write(stream, what, desc)
            self.pending.clear()
            self.reads.clear()
            self.pending[stream.id] = (seq, what, _where(), None)


def _agent(hit) -> str:
    key, seq = hit[0], hit[1]
    name = agent_name(key)
    return f"{name}, op #{seq}" if name.startswith("stream") else name


def _hazard(hit, base: str) -> str:
    if hit[0] in _rt.INFLIGHT:
        return "MPI ownership window"
    if hit[4] is not None:
        return "memory-pool reuse"
    return base


def _issued(hit, access: str) -> str:
    where = hit[3] if isinstance(hit[3], str) else _fmt(hit[3])
    note = ""
    if hit[4] is not None:  # (rounded size, allocation stream, where the block was freed): see _sim_pool
        size, home, freed = hit[4]
        note = (f"\nThe array lies on a {size}-byte block of {agent_name(home)}'s arena in CuPy's memory pool, "
                f"freed by another array while this {access} was pending and reused at once on the allocation "
                f"stream (order the other stream's work before the free: wait an event recorded after it on the "
                f"allocation stream, or synchronise). The block was freed at:\n{_fmt(freed) or '  (unknown)'}")
    return f"{note}\nThe {access} was issued at:\n{where}"


def _fail(op: str, desc, hit, reader: str) -> None:
    """Raise for a read by ``op`` of ``desc`` (a string, or the array) while write ``hit`` (from ``unordered``)
    is not ordered before it."""
    desc = _describe(desc)
    hz = _hazard(hit, "read-after-write")
    raise CudaSimError(
        f"{hz}: {op} reads {desc} while its write by {hit[2]} ({_agent(hit)}) is not synchronised "
        f"before {reader}.{_issued(hit, 'write')}\nThe read is at:\n{_stack()}")


def _fail_write(op: str, desc, hit, kind: str, writer: str) -> None:
    """Raise for a write by ``op`` of ``desc`` (a string, or the array) while the read or write ``hit`` (``kind``)
    is not ordered before it."""
    desc = _describe(desc)
    hz = _hazard(hit, "write-after-read" if kind == "read" else "write-after-write")
    raise CudaSimError(
        f"{hz}: {op} writes {desc} while its {kind} by {hit[2]} ({_agent(hit)}) is not ordered before "
        f"{writer} (wait an event recorded after it, or synchronise).{_issued(hit, kind)}\n"
        f"The write is at:\n{_stack()}")


class AddressRanges:
    """Disjoint address ranges [start, end) -> a value, found from any address inside (pinned host memory here;
    device arrays behind the raw pointers NCCL takes in _sim_nccl)."""

    def __init__(self):
        self._starts: list[int] = []
        self._ranges: dict[int, tuple[int, object]] = {}

    def add(self, start: int, end: int, value) -> None:
        with _lock:
            if start not in self._ranges:
                bisect.insort(self._starts, start)
            self._ranges[start] = (end, value)

    def get(self, start: int):
        """The value of the range starting exactly at ``start``, else None."""
        hit = self._ranges.get(start)
        return None if hit is None else hit[1]

    def remove(self, start: int) -> None:
        with _lock:
            i = bisect.bisect_left(self._starts, start)
            if i < len(self._starts) and self._starts[i] == start:
                del self._starts[i]
                self._ranges.pop(start, None)

    def find(self, address: int):
        """(start, end, value) of the range holding ``address``, else None."""
        with _lock:
            i = bisect.bisect_right(self._starts, address) - 1
            if i >= 0:
                start = self._starts[i]
                end, value = self._ranges[start]
                if address < end:
                    return start, end, value
        return None


_PINNED = AddressRanges()  # pinned host memory -> its _Buf


class PinnedMemoryPointer(np.ndarray):
    """Page-locked host memory (a uint8 ndarray here): np.frombuffer(mem) gives a host array over it."""

    @property
    def ptr(self):
        return self.__array_interface__["data"][0]


def alloc_pinned_memory(nbytes):
    raw = np.zeros(max(int(nbytes), 1), np.uint8)  # owns the memory (np.frombuffer(mem) keeps it, not mem)
    mem = raw.view(PinnedMemoryPointer)
    start = mem.ptr
    _PINNED.add(start, start + mem.nbytes, _Buf(-1, pinned=True))
    weakref.finalize(raw, _PINNED.remove, start)
    return mem


def _host_buf(a):
    """The pinned buffer holding host array ``a``, or None (pageable memory)."""
    if not isinstance(a, np.ndarray) or a.size == 0:
        return None
    hit = _PINNED.find(a.__array_interface__["data"][0])
    return None if hit is None else hit[2]


def is_pinned(a) -> bool:
    """Whether host array ``a`` lies in pinned memory allocated through the simulation."""
    return _host_buf(a) is not None
