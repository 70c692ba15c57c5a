"""The simulated CUDA runtime: devices, streams, events, pending writes and pinned host memory (see cuda_sim)."""
from __future__ import annotations

import bisect
import sys
import threading
import time
import types
import weakref

import numpy as np

__all__ = ["CudaSimError", "Stream", "Event", "Device", "get_current_stream", "get_elapsed_time",
           "alloc_pinned_memory", "PinnedMemoryPointer", "is_pinned", "set_device_count", "SIM_FILES"]

# See [Note: Simulated device] in cuda_sim.py.


class CudaSimError(RuntimeError):
    """A CUDA ordering or device rule broken under the simulation."""


_lock = threading.RLock()
_tls = threading.local()
_N = [2]
_HOST: dict[int, int] = {}  # stream id -> seq the host knows complete
_STREAMS: dict[int, list] = {}  # device -> weak refs of its streams
_NULL: dict[int, "Stream"] = {}
_ids = iter(range(1, 1 << 62))


def set_device_count(n: int) -> None:
    """Number of simulated GPUs (default 2)."""
    _N[0] = int(n)


def _cur_dev() -> int:
    return getattr(_tls, "device", 0)


SIM_FILES = {__file__}  # frames of the simulation itself are left out of reported stacks


def _stack(skip=1, depth=12):
    out = []
    f = sys._getframe(skip)
    while f is not None and len(out) < depth:
        co = f.f_code
        if co.co_filename not in SIM_FILES:
            out.append(f'  File "{co.co_filename}", line {f.f_lineno}, in {co.co_name}')
        f = f.f_back
    return "\n".join(reversed(out))


def _merge(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if dst.get(k, 0) < v:
            dst[k] = v


# ---------------------------------------------------------------------------------------------
# streams, events, devices

class _StreamMeta(type):
    @property
    def null(cls):
        return _null(_cur_dev())


class Stream(metaclass=_StreamMeta):
    """A queue of device work (CuPy's cupy.cuda.Stream)."""

    def __init__(self, null=False, non_blocking=False, ptds=False, *, _device=None):
        self.device_id = _cur_dev() if _device is None else _device
        self.id = next(_ids)
        self.ptr = self.id
        self.seq = 0
        self.vc = {self.id: 0}
        self.is_null = null
        self.blocking = not non_blocking
        self._prev = []
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

    def _enqueue(self) -> int:
        with _lock:
            self._implicit()
            self.seq += 1
            self.vc[self.id] = self.seq
            return self.seq

    def ordered(self, sid: int, seq: int) -> bool:
        return sid == self.id or self.vc.get(sid, 0) >= seq or _HOST.get(sid, 0) >= seq

    def synchronize(self):
        with _lock:
            _merge(_HOST, self.vc)

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
            self.vc = dict(s.vc)
        self.t = time.perf_counter()

    def synchronize(self):
        with _lock:
            _merge(_HOST, self.vc)

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
        with _lock:
            for r in _STREAMS.get(self.id, ()):
                s = r()
                if s is not None:
                    _merge(_HOST, s.vc)

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
# buffers: pending writes

class _Buf:
    __slots__ = ("dev", "pending", "pinned", "__weakref__")

    def __init__(self, dev, pinned=False):
        self.dev = dev
        self.pending = {}  # stream id -> (seq, what, stack)
        self.pinned = pinned

    def write(self, stream: Stream, seq: int, what: str):
        self.pending[stream.id] = (seq, what, _stack())

    def host_write(self):
        self.pending.clear()

    def unordered(self, stream: Stream | None):
        """The first pending write not ordered before ``stream`` (None: before the host), else None."""
        with _lock:
            if stream is not None:
                stream._implicit()
            for sid, (seq, what, st) in list(self.pending.items()):
                if _HOST.get(sid, 0) >= seq:
                    del self.pending[sid]
                    continue
                if stream is not None and stream.ordered(sid, seq):
                    continue
                return sid, seq, what, st
        return None


def _fail(op: str, desc: str, hit, reader: str) -> None:
    sid, seq, what, st = hit
    raise CudaSimError(
        f"{op} reads {desc} while its write by {what} (stream {sid}, op #{seq}) is not synchronised "
        f"before {reader}.\nThe write was issued at:\n{st}\nThe read is at:\n{_stack()}")


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
