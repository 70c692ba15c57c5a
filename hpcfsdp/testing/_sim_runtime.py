"""The simulated CUDA runtime: devices, streams, events, what each host thread knows complete, the accesses
recorded on buffers and their hazard checks, and pinned host memory (see cuda_sim)."""
from __future__ import annotations

import bisect
import sys
import threading
import time
import types
import weakref

import numpy as np

__all__ = ["CudaSimError", "Stream", "Event", "Device", "get_current_stream", "get_elapsed_time",
           "alloc_pinned_memory", "PinnedMemoryPointer", "is_pinned", "set_device_count", "SIM_FILES",
           "publish", "acquire", "agent_name"]

# See [Note: Simulated device] in cuda_sim.py.


class CudaSimError(RuntimeError):
    """A CUDA ordering or device rule broken under the simulation."""


_lock = threading.RLock()
_tls = threading.local()
_N = [2]
_STREAMS: dict[int, list] = {}  # device -> weak refs of its streams
_NULL: dict[int, "Stream"] = {}
_ids = iter(range(1, 1 << 62))  # ids of agents: streams, host threads' clocks, MPI calls in flight
_AGENTS: dict[int, str] = {}  # agent id -> name, for the agents that are not streams
_DEV_SEQS: dict[int, dict] = {}  # device -> stream id -> its last op, streams gone included (Device.synchronize)


def set_device_count(n: int) -> None:
    """Number of simulated GPUs (default 2)."""
    _N[0] = int(n)


def _cur_dev() -> int:
    return getattr(_tls, "device", 0)


SIM_FILES = {__file__}  # frames of the simulation itself are left out of reported stacks


def _where(skip=2, depth=12) -> tuple:
    """The calling Python stack (outside the simulation), innermost last, as (code, last instruction) pairs:
    at most ``depth`` frames, from the first ``depth + 4`` (walking frames is what costs)."""
    out = []
    f = sys._getframe(skip)
    n = depth + 4
    while f is not None and n:
        co = f.f_code
        if co.co_filename not in SIM_FILES:
            out.append((co, f.f_lasti))  # the line number is found when formatted (f_lineno costs)
            if len(out) == depth:
                break
        f = f.f_back
        n -= 1
    out.reverse()
    return tuple(out)


_READ_DEPTH = 6  # frames kept of a read's stack (every kernel input is one: kept short for speed)


def _describe(x) -> str:
    """``x`` described for a message: a string as is, else a simulated array."""
    if isinstance(x, str):
        return x
    return f"{np.dtype(x.dtype).name}{list(x.shape)} on cuda:{x._buf.dev}"


def _line(co, lasti: int) -> int:
    for start, end, line in co.co_lines():
        if start <= lasti < end:
            return line if line is not None else co.co_firstlineno
    return co.co_firstlineno


def _fmt(where: tuple) -> str:
    return "\n".join(f'  File "{co.co_filename}", line {_line(co, i)}, in {co.co_name}' for co, i in where)


def _stack(skip=1, depth=12):
    return _fmt(_where(skip + 2, depth))


def _merge(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if dst.get(k, 0) < v:
            dst[k] = v


# ---------------------------------------------------------------------------------------------
# host threads: what each knows complete, and the hand-offs between them

class _Host:
    """What one host thread knows complete: agent id -> op number (a vector clock). Its own agent id is
    its clock, ticked when an MPI call completes on it; another thread learns what it knew only through
    a hand-off (publish/acquire), a stream or an event."""

    __slots__ = ("id", "vc", "ver")

    def __init__(self):
        self.id = next(_ids)
        self.vc = {self.id: 0}
        self.ver = 0  # bumped on every change: streams merge it only when it moved
        _AGENTS[self.id] = f"host thread {threading.current_thread().name!r}"

    def learn(self, vc: dict) -> None:
        _merge(self.vc, vc)
        self.ver += 1

    def tick(self) -> int:
        t = self.vc[self.id] + 1
        self.vc[self.id] = t
        self.ver += 1
        return t


def host() -> _Host:
    """The calling thread's knowledge."""
    h = getattr(_tls, "host", None)
    if h is None:
        h = _tls.host = _Host()
    return h


def publish() -> dict:
    """A snapshot of what the calling thread knows complete, for another thread to ``acquire``."""
    with _lock:
        return dict(host().vc)


def acquire(snapshot: dict) -> None:
    """The calling thread learns ``snapshot`` (it synchronised with the thread that published it)."""
    with _lock:
        host().learn(snapshot)


def agent_name(key: int) -> str:
    return _AGENTS.get(key) or f"stream {key}"


# ---------------------------------------------------------------------------------------------
# streams, events, devices

class _StreamMeta(type):
    @property
    def null(cls):
        return _null(_cur_dev())


class Stream(metaclass=_StreamMeta):
    """A queue of device work (CuPy's cupy.cuda.Stream)."""

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None, *, _device=None):
        self.device_id = _cur_dev() if _device is None else _device
        self.id = next(_ids)
        self.ptr = self.id
        self.seq = 0
        self.vc = {self.id: 0}
        self.is_null = null
        self.blocking = not non_blocking
        self._prev = []
        self._seen = {}  # host thread id -> the version of its knowledge merged here
        self._all = _DEV_SEQS.setdefault(self.device_id, {})
        with _lock:
            _STREAMS.setdefault(self.device_id, []).append(weakref.ref(self))

    def __repr__(self):
        return f"<sim Stream {self.id}{' (null)' if self.is_null else ''} on device {self.device_id}>"

    def _implicit(self) -> None:
        """The legacy null stream's implicit syncs: it waits for every blocking stream of its device, they for it."""
        if self.is_null:
            for r in _STREAMS.get(self.device_id, ()):
                s = r()
                if s is not None and s is not self and s.blocking:
                    _merge(self.vc, s.vc)
        elif self.blocking:
            _merge(self.vc, _null(self.device_id).vc)

    def _sync_in(self) -> None:
        """Before an op is enqueued (under _lock): the implicit syncs, and what the enqueuing thread knows
        complete is ordered before the op (and so before every later op of this stream)."""
        self._implicit()
        h = host()
        if self._seen.get(h.id) != h.ver:
            _merge(self.vc, h.vc)
            self._seen[h.id] = h.ver

    def _enqueue(self) -> int:
        with _lock:
            self._sync_in()
            self.seq += 1
            self.vc[self.id] = self.seq
            self._all[self.id] = self.seq
            return self.seq

    def ordered(self, sid: int, seq: int) -> bool:
        """Whether op ``seq`` of agent ``sid`` is ordered before this stream's next op (after ``_sync_in``)."""
        return sid == self.id or self.vc.get(sid, 0) >= seq

    def synchronize(self):
        with _lock:
            host().learn(self.vc)

    def wait_event(self, event):
        with _lock:
            _merge(self.vc, event.vc)

    def record(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    @property
    def done(self):
        self.synchronize()
        return True

    def use(self):
        _streams()[self.device_id] = self
        return self

    def __enter__(self):
        st = _streams()
        self._prev.append(st.get(self.device_id))
        st[self.device_id] = self
        return self

    def __exit__(self, *exc):
        prev = self._prev.pop()
        st = _streams()
        if prev is None:
            st.pop(self.device_id, None)
        else:
            st[self.device_id] = prev
        return False


def _null(dev: int) -> Stream:
    s = _NULL.get(dev)
    if s is None:
        with _lock:
            s = _NULL.get(dev)
            if s is None:
                s = _NULL[dev] = Stream(null=True, _device=dev)
    return s


def _streams() -> dict:
    st = getattr(_tls, "streams", None)
    if st is None:
        st = _tls.streams = {}
    return st


def get_current_stream(device_id=None):
    d = _cur_dev() if device_id is None else int(device_id)
    return _streams().get(d) or _null(d)


class Event:
    """A point in a stream (cupy.cuda.Event)."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.vc = {}
        self.t = None

    def record(self, stream=None):
        s = stream or get_current_stream()
        with _lock:
            s._sync_in()
            self.vc = dict(s.vc)
        self.t = time.perf_counter()

    def synchronize(self):
        with _lock:
            host().learn(self.vc)

    @property
    def done(self):
        self.synchronize()
        return True


def get_elapsed_time(start, end):
    return (end.t - start.t) * 1e3


class Device:
    """A GPU (cupy.cuda.Device): context manager and ``use()`` set the calling thread's current device."""

    def __init__(self, device=None):
        self.id = _cur_dev() if device is None else int(device)
        if not 0 <= self.id < _N[0]:
            raise CudaSimError(f"invalid device ordinal {self.id}: the simulation has {_N[0]} GPUs")
        self._prev = []

    def use(self):
        _tls.device = self.id

    def __enter__(self):
        self._prev.append(_cur_dev())
        _tls.device = self.id
        return self

    def __exit__(self, *exc):
        _tls.device = self._prev.pop()
        return False

    def synchronize(self):
        with _lock:  # every op of the device, on streams still alive or gone, is complete
            h = host()
            for r in _STREAMS.get(self.id, ()):
                s = r()
                if s is not None:
                    h.learn(s.vc)
            h.learn(_DEV_SEQS.get(self.id, {}))

    @property
    def compute_capability(self):
        return "90"

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return f"<CUDA Device {self.id} (simulated)>"


class _Runtime(types.ModuleType):
    class CUDARuntimeError(RuntimeError):
        pass

    def getDevice(self):  # noqa: N802 (CUDA's name)
        return _cur_dev()

    def setDevice(self, i):  # noqa: N802
        Device(i).use()

    def getDeviceCount(self):  # noqa: N802
        return _N[0]

    def getDeviceProperties(self, i):  # noqa: N802
        return {"name": b"Simulated GPU", "totalGlobalMem": 1 << 34, "multiProcessorCount": 1, "major": 9,
                "minor": 0}

    def memGetInfo(self):  # noqa: N802
        return (1 << 34, 1 << 34)

    def runtimeGetVersion(self):  # noqa: N802
        return 13000

    def driverGetVersion(self):  # noqa: N802
        return 13000


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

    def host_write(self):
        """The calling host thread wrote it at once (a blocking host op): an instantaneous MPI-style access."""
        from . import _sim_mpi  # noqa: PLC0415

        _sim_mpi.end(_sim_mpi.begin_bufs((), (self,), "a host write"))


def _agent(hit) -> str:
    key, seq = hit[0], hit[1]
    name = agent_name(key)
    return f"{name}, op #{seq}" if name.startswith("stream") else name


def _hazard(hit, base: str) -> str:
    from . import _sim_mpi  # noqa: PLC0415

    if hit[0] in _sim_mpi.INFLIGHT:
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


# pinned host memory: address ranges -> _Buf
_PIN_STARTS: list[int] = []
_PIN: dict[int, tuple[int, _Buf]] = {}


class PinnedMemoryPointer(np.ndarray):
    """Page-locked host memory (a uint8 ndarray here): np.frombuffer(mem) gives a host array over it."""

    @property
    def ptr(self):
        return self.__array_interface__["data"][0]


def _unpin(start):
    with _lock:
        i = bisect.bisect_left(_PIN_STARTS, start)
        if i < len(_PIN_STARTS) and _PIN_STARTS[i] == start:
            del _PIN_STARTS[i]
            _PIN.pop(start, None)


def alloc_pinned_memory(nbytes):
    raw = np.zeros(max(int(nbytes), 1), np.uint8)  # owns the memory (np.frombuffer(mem) keeps it, not mem)
    mem = raw.view(PinnedMemoryPointer)
    start = mem.ptr
    with _lock:
        bisect.insort(_PIN_STARTS, start)
        _PIN[start] = (start + mem.nbytes, _Buf(-1, pinned=True))
    weakref.finalize(raw, _unpin, start)
    return mem


def _host_buf(a):
    """The pinned buffer holding host array ``a``, or None (pageable memory)."""
    if not isinstance(a, np.ndarray) or a.size == 0:
        return None
    p = a.__array_interface__["data"][0]
    with _lock:
        i = bisect.bisect_right(_PIN_STARTS, p) - 1
        if i >= 0:
            end, buf = _PIN[_PIN_STARTS[i]]
            if p < end:
                return buf
    return None


def is_pinned(a) -> bool:
    """Whether host array ``a`` lies in pinned memory allocated through the simulation."""
    return _host_buf(a) is not None
