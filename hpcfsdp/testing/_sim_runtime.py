"""The simulated CUDA runtime: devices, streams, events and what each host thread knows complete (see cuda_sim);
the buffers and their hazard checks are in _sim_buffers, re-exported here."""
from __future__ import annotations

import sys
import threading
import time
import types
import weakref

import numpy as np

from . import _sim_counters as _ctr  # a leaf

__all__ = ["CudaSimError", "Stream", "Event", "Device", "get_current_stream", "get_elapsed_time",
           "set_device_count", "SIM_FILES",
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
INFLIGHT: dict[int, "object"] = {}  # agent id of an MPI call in flight -> its _sim_mpi.Token (_sim_mpi keeps it)
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

    def _enqueue(self, op="kernel") -> int:
        """Queue one op; its number. ``op`` names it as a launch, None for a host transfer (see [Note: Simulated
        device counts] in _sim_counters)."""
        with _lock:
            self._sync_in()
            self.seq += 1
            self.vc[self.id] = self.seq
            self._all[self.id] = self.seq
            if op is not None and _ctr.OPEN is not None:
                _ctr.launch(op)
            return self.seq

    def ordered(self, sid: int, seq: int) -> bool:
        """Whether op ``seq`` of agent ``sid`` is ordered before this stream's next op (after ``_sync_in``)."""
        return sid == self.id or self.vc.get(sid, 0) >= seq

    def _wait(self):
        """The host waits for the stream's work (uncounted: the simulation's own step inside a counted call)."""
        with _lock:
            host().learn(self.vc)

    def synchronize(self):
        _ctr.host_sync("Stream.synchronize")
        self._wait()

    def wait_event(self, event):
        with _lock:
            _merge(self.vc, event.vc)

    def record(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    @property
    def done(self):  # a query (cudaStreamQuery): it does not wait, so it is no host sync
        self._wait()
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
        _ctr.host_sync("Event.synchronize")
        with _lock:
            host().learn(self.vc)

    @property
    def done(self):  # a query (cudaEventQuery): it does not wait, so it is no host sync
        with _lock:
            host().learn(self.vc)
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
        _ctr.host_sync("Device.synchronize")
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
