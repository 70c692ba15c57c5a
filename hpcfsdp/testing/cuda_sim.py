"""A simulated CUDA device for tests: the part of CuPy hpcfsdp uses, computing with NumPy, enforcing CUDA's ordering rules."""
from __future__ import annotations

import bisect
import operator
import sys
import threading
import time
import types
import weakref

import ml_dtypes
import numpy as np

__all__ = ["CudaSimError", "ndarray", "install", "set_device_count", "is_pinned", "mpi_access", "cuda", "random",
           "asnumpy", "get_array_module", "get_default_memory_pool", "cupyx"]

# [Note: Simulated device]
# Every simulated array owns a buffer (shared by its views) on one device. Work is queued on streams;
# nothing is delayed (NumPy computes at once) but every write is recorded as *pending* on its buffer
# with (stream, sequence number, the Python stack that issued it). Ordering is tracked with vector
# clocks: each stream knows, per stream, up to which sequence number work is ordered before its next
# op (its own earlier ops, Stream.wait_event, the legacy null stream's implicit syncs); the host knows
# which work is complete (Stream/Event/Device.synchronize, blocking copies). A kernel reading a buffer
# whose pending write is neither on its stream nor ordered before it, an MPI call reading a device or
# pinned host buffer whose writes the host has not synchronised, and an array used on a device other
# than the thread's current one raise CudaSimError naming the op and the stack of the write.
# Like CuPy, implicit conversion to NumPy raises TypeError, and device arrays mixed with host arrays
# in an operation raise TypeError.

__version__ = "14.0.0+sim"


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


def _stack(skip=1, depth=12):
    out = []
    f = sys._getframe(skip)
    while f is not None and len(out) < depth:
        co = f.f_code
        if co.co_filename != __file__:
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


# ---------------------------------------------------------------------------------------------
# arrays

def _root(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _wrap(a, buf):
    x = object.__new__(ndarray)
    x._a = a
    x._buf = buf
    return x


class _Ctx:
    """One simulated kernel: unwraps arguments, checks reads, records writes, wraps results."""

    __slots__ = ("dev", "stream", "seq", "ins", "roots")

    def __init__(self, name):
        self.dev = _cur_dev()
        self.stream = get_current_stream(self.dev)
        self.ins = []
        self.roots = {}

    def un(self, x, host_ok=False):
        if isinstance(x, ndarray):
            self.ins.append(x)
            self.roots[id(_root(x._a))] = x._buf
            return x._a
        if isinstance(x, np.ndarray) and not host_ok and x.ndim:
            raise TypeError(f"Unsupported type {type(x)}: a NumPy array in a device operation "
                            "(copy it with cupy.asarray first)")
        if isinstance(x, (list, tuple)) and x and any(isinstance(e, (ndarray, list, tuple)) for e in x):
            return type(x)(self.un(e, host_ok) for e in x)
        return x

    def check(self, op):
        for x in self.ins:
            if x._buf.dev != self.dev:
                raise CudaSimError(
                    f"{op}: an array on device {x._buf.dev} used while the thread's current device is {self.dev} "
                    f"(an array belongs to one device; select it with cupy.cuda.Device({x._buf.dev})).\n"
                    f"At:\n{_stack()}")
            hit = x._buf.unordered(self.stream)
            if hit is not None:
                _fail(op, _desc(x), hit, f"{op} on stream {self.stream.id}")
        self.seq = self.stream._enqueue()

    def out(self, r, op):
        if isinstance(r, np.ndarray):
            buf = self.roots.get(id(_root(r)))
            if buf is None:
                buf = _Buf(self.dev)
                buf.write(self.stream, self.seq, op)
            return _wrap(r, buf)
        if isinstance(r, np.generic):
            buf = _Buf(self.dev)
            buf.write(self.stream, self.seq, op)
            return _wrap(np.asarray(r), buf)
        if isinstance(r, tuple):
            return tuple(self.out(e, op) for e in r)
        if isinstance(r, list):
            return [self.out(e, op) for e in r]
        return r

    def wrote(self, x, op):
        x._buf.write(self.stream, self.seq, op)


def _desc(x):
    return f"{np.dtype(x.dtype).name}{list(x.shape)} on cuda:{x._buf.dev}"


_VIEW_OPS = frozenset(["ndarray.reshape", "ndarray.view", "ndarray.transpose", "ndarray.swapaxes", "ndarray.squeeze",
                       "ndarray.ravel", "ndarray.__getitem__", "reshape", "transpose", "swapaxes", "squeeze",
                       "ravel", "moveaxis", "expand_dims", "broadcast_to", "atleast_1d", "atleast_2d"])


def _call(op, fn, args, kwargs, writes=(), host_ok=False):
    c = _Ctx(op)
    a = [c.un(x, host_ok) for x in args]
    kw = {k: c.un(v, host_ok) for k, v in kwargs.items()}
    outs = kwargs.get("out")
    outs = [o for o in (outs if isinstance(outs, tuple) else (outs,)) if isinstance(o, ndarray)] + list(writes)
    if op in _VIEW_OPS and not outs:  # a view is metadata: no kernel, no device or ordering rule
        r = fn(*a, **kw)
        if isinstance(r, np.ndarray) and id(_root(r)) in c.roots:
            return _wrap(r, c.roots[id(_root(r))])
        c.check(op)
        return c.out(r, op)
    c.check(op)
    r = fn(*a, **kw)
    for o in outs:
        c.wrote(o, op)
    if outs and r is not None and isinstance(r, np.ndarray) and any(r is o._a for o in outs):
        return next(o for o in outs if o._a is r)
    return c.out(r, op)


def _sync_read(x, op):
    """A blocking device-to-host read of ``x`` (get(), item(), float()): ordered on the current stream, then synced."""
    s = get_current_stream(x._buf.dev)
    hit = x._buf.unordered(s)
    if hit is not None:
        _fail(op, _desc(x), hit, f"{op} on stream {s.id}")
    s._enqueue()
    s.synchronize()
    return x._a


class ndarray:
    """A simulated device array (cupy.ndarray): NumPy data, a device, and pending writes."""

    __slots__ = ("_a", "_buf")
    __array_priority__ = 1000
    __hash__ = None

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        self._a = np.empty(shape, dtype, order=order)
        self._buf = _Buf(_cur_dev())

    # -- attributes ---------------------------------------------------------------------------
    shape = property(lambda s: s._a.shape)
    dtype = property(lambda s: s._a.dtype)
    ndim = property(lambda s: s._a.ndim)
    size = property(lambda s: s._a.size)
    nbytes = property(lambda s: s._a.nbytes)
    itemsize = property(lambda s: s._a.itemsize)
    strides = property(lambda s: s._a.strides)
    flags = property(lambda s: s._a.flags)
    device = property(lambda s: Device(s._buf.dev))

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self._a.__array_interface__["data"][0], device_id=self._buf.dev)

    @property
    def T(self):  # noqa: N802
        return _wrap(self._a.T, self._buf)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __repr__(self):
        return f"array({np.array2string(_sync_read(self, 'repr'))}, device={self._buf.dev})"

    # -- host transfers -----------------------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct "
                        "a NumPy array explicitly.")

    def get(self, stream=None, order="C", out=None, blocking=True):
        s = stream or get_current_stream(self._buf.dev)
        hit = self._buf.unordered(s)
        if hit is not None:
            _fail("ndarray.get (device-to-host copy)", _desc(self), hit, f"the copy on stream {s.id}")
        seq = s._enqueue()
        if out is None:
            out = np.array(self._a, order=order, copy=True)
        else:
            out[...] = self._a
        hb = _host_buf(out)
        if stream is not None and hb is not None:  # async copy into pinned memory: pending until synced
            hb.pending[s.id] = (seq, "ndarray.get(stream=...) into pinned memory", _stack())
        else:
            s.synchronize()
        return out

    def set(self, arr, stream=None):
        s = stream or get_current_stream(self._buf.dev)
        hb = _host_buf(arr)
        if hb is not None:
            hit = hb.unordered(s)
            if hit is not None:
                _fail("ndarray.set (host-to-device copy)", "a pinned host buffer", hit, f"the copy on stream {s.id}")
        seq = s._enqueue()
        self._a[...] = arr
        self._buf.pending[s.id] = (seq, "ndarray.set", _stack())
        if stream is None:
            s.synchronize()

    def item(self, *args):
        return _sync_read(self, "ndarray.item").item(*args)

    def tolist(self):
        return _sync_read(self, "ndarray.tolist").tolist()

    def __bool__(self):
        return bool(_sync_read(self, "bool(ndarray)"))

    def __float__(self):
        return float(_sync_read(self, "float(ndarray)"))

    def __int__(self):
        return int(_sync_read(self, "int(ndarray)"))

    def __index__(self):
        return operator.index(_sync_read(self, "index(ndarray)"))

    def __complex__(self):
        return complex(_sync_read(self, "complex(ndarray)"))

    @property
    def __cuda_array_interface__(self):
        mpi_access(self, "a consumer of __cuda_array_interface__ (MPI reading the device pointer)")
        return {"shape": self._a.shape, "typestr": self._a.dtype.str, "version": 3, "stream": None,
                "data": (self._a.__array_interface__["data"][0], False),
                "strides": None if self._a.flags.c_contiguous else self._a.strides}

    # -- views and kernels --------------------------------------------------------------------
    def __getitem__(self, idx):
        return _call("ndarray.__getitem__", operator.getitem, (self, idx), {}, host_ok=True)

    def __setitem__(self, idx, value):
        if isinstance(value, np.ndarray):
            hb = _host_buf(value)
            if hb is not None and hb.unordered(None) is not None:
                _fail("ndarray.__setitem__ (host-to-device copy)", "a pinned host buffer", hb.unordered(None),
                      "the copy")
        _call("ndarray.__setitem__", operator.setitem, (self, idx, value), {}, writes=(self,), host_ok=True)

    def fill(self, value):
        _call("ndarray.fill", lambda a, v: a.fill(v), (self, value), {}, writes=(self,))

    def __getattr__(self, name):
        if name.startswith("__"):  # no __array_interface__/__array_struct__: NumPy must not read device memory
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return attr
        writes = (self,) if name in _INPLACE_METHODS else ()
        return lambda *a, **k: _call(f"ndarray.{name}", getattr(np.ndarray, name), (self,) + a, k, writes=writes)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        f = _PRODUCTS["matmul"] if ufunc is np.matmul and method == "__call__" else getattr(ufunc, method)
        return _call(f"{ufunc.__name__}.{method}", f, inputs, kwargs)

    def __array_function__(self, func, types_, args, kwargs):
        return _call(func.__name__, _PRODUCTS.get(func.__name__, func), args, kwargs)

    def __reduce__(self):
        raise TypeError("simulated device arrays cannot be pickled")


_INPLACE_METHODS = frozenset(["sort", "partition", "put", "resize", "itemset", "setfield", "byteswap"])


_HALF = (np.dtype(ml_dtypes.bfloat16),)


def _half_exact(f):
    """``f`` for products (matmul, dot, einsum): bfloat16 in, bfloat16 out, as CuPy does (NumPy with
    ml_dtypes returns float32 from matmul and has no bfloat16 einsum): computed in float32, rounded once."""
    def g(*args, **kwargs):
        dts = [a.dtype for a in args if isinstance(a, np.ndarray)]
        if not any(d in _HALF for d in dts):
            return f(*args, **kwargs)
        res_dt = np.result_type(*dts)
        up = [a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype in _HALF else a for a in args]
        out = kwargs.pop("out", None)
        r = np.asarray(f(*up, **kwargs)).astype(res_dt)
        if out is not None:
            out[...] = r
            return out
        return r
    g.__name__ = getattr(f, "__name__", "product")
    return g


_PRODUCTS = {n: _half_exact(getattr(np, n)) for n in ["matmul", "dot", "einsum", "tensordot", "inner", "vdot"]}


def _binop(f):
    return lambda self, o: _call(f.__name__, f, (self, o), {})


def _rbinop(f):
    return lambda self, o: _call(f.__name__, f, (o, self), {})


def _ibinop(f):
    def fn(self, o):
        _call(f.__name__, f, (self, o), {}, writes=(self,))
        return self
    return fn


for _n in ["add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift",
           "rshift"]:
    _f = _PRODUCTS["matmul"] if _n == "matmul" else getattr(operator, _n + "_" if _n in ("and", "or") else _n)
    setattr(ndarray, f"__{_n}__", _binop(_f))
    setattr(ndarray, f"__r{_n}__", _rbinop(_f))
    setattr(ndarray, f"__i{_n}__", _ibinop(getattr(operator, "i" + _n)))
for _n in ["eq", "ne", "lt", "le", "gt", "ge"]:
    setattr(ndarray, f"__{_n}__", _binop(getattr(operator, _n)))
for _n in ["neg", "pos", "abs", "invert"]:
    setattr(ndarray, f"__{_n}__", (lambda f: lambda self: _call(f.__name__, f, (self,), {}))(getattr(operator, _n)))


# ---------------------------------------------------------------------------------------------
# MPI access (see [Note: Simulated device])

def mpi_access(x, op: str) -> None:
    """Check that MPI may read/write buffer ``x`` now: device arrays on the thread's current device with all
    writes synchronised by the host; pinned host buffers with their asynchronous copies synchronised."""
    if isinstance(x, ndarray):
        cur = _cur_dev()
        if x._buf.dev != cur:
            raise CudaSimError(
                f"{op}: MPI reads {_desc(x)} on a thread whose current device is cuda:{cur} (an array belongs to "
                f"one device: the thread must select cuda:{x._buf.dev}).\nAt:\n{_stack()}")
        hit = x._buf.unordered(None)
        if hit is not None:
            _fail(op, _desc(x), hit, "MPI read it (synchronise the stream, or an event recorded after the write)")
    elif isinstance(x, np.ndarray):
        hb = _host_buf(x)
        if hb is not None:
            hit = hb.unordered(None)
            if hit is not None:
                _fail(op, f"pinned host {x.dtype.name}{list(x.shape)}", hit, "MPI read it")


def mpi_wrote(x) -> None:
    """MPI (the host) wrote ``x``: nothing of it is pending any more."""
    if isinstance(x, ndarray):
        x._buf.host_write()


# ---------------------------------------------------------------------------------------------
# the cupy module surface

def _creator(name, writes_data=True):
    f = getattr(np, name)

    def create(*args, **kwargs):
        c = _Ctx(name)
        a = [c.un(x, True) for x in args]
        kw = {k: c.un(v, True) for k, v in kwargs.items()}
        c.ins = []  # *_like reads only shape and dtype
        c.roots = {}
        c.check(name)
        r = f(*a, **kw)
        if not writes_data:
            return _wrap(r, _Buf(c.dev))
        return c.out(r, name)
    create.__name__ = name
    return create


empty = _creator("empty", False)
empty_like = _creator("empty_like", False)
for _n in ["zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "arange", "linspace", "eye",
           "identity", "tri"]:
    globals()[_n] = _creator(_n)


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0):
    if isinstance(obj, ndarray):
        if obj._buf.dev != _cur_dev():  # peer copy: read on the source device's stream order
            src = _sync_read(obj, "cupy.array (peer copy)")
            obj = np.array(src, copy=True)
        else:
            if not copy and (dtype is None or np.dtype(dtype) == obj.dtype):
                return obj
            return _call("cupy.array", lambda a: np.array(a, dtype=dtype, copy=True, order=order, ndmin=ndmin),
                         (obj,), {})
    hb = _host_buf(obj) if isinstance(obj, np.ndarray) else None
    if hb is not None:
        hit = hb.unordered(None)
        if hit is not None:
            _fail("cupy.array (host-to-device copy)", "a pinned host buffer", hit, "the copy")
    if isinstance(obj, (list, tuple)) and any(isinstance(e, ndarray) for e in obj):
        return _module_getattr("stack")([asarray(e) for e in obj])
    c = _Ctx("cupy.array")
    c.check("cupy.array (host-to-device copy)")
    return c.out(np.array(obj, dtype=dtype, copy=True, order=order, ndmin=ndmin), "cupy.array (host-to-device copy)")


def asarray(a, dtype=None, order=None):
    return array(a, dtype=dtype, copy=False, order=order or "K")


def ascontiguousarray(a, dtype=None):
    a = asarray(a, dtype)
    return _call("ascontiguousarray", np.ascontiguousarray, (a,), {})


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    if isinstance(a, ndarray):
        return a.get(stream=stream, order=order, out=out)
    return np.asarray(a, order=order)


def get_array_module(*args):
    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else np


def from_dlpack(x):
    if isinstance(x, ndarray):
        return x
    return asarray(np.from_dlpack(x))


def _module_getattr(name):
    f = _PRODUCTS.get(name) or getattr(np, name)  # AttributeError for what NumPy lacks
    if isinstance(f, (type, np.dtype)) or not callable(f):
        return f

    def fn(*args, **kwargs):
        return _call(name, f, args, kwargs)
    fn.__name__ = name
    globals()[name] = fn
    return fn


__getattr__ = _module_getattr
bfloat16 = ml_dtypes.bfloat16


class _Pool:
    def used_bytes(self):
        return 0

    def total_bytes(self):
        return 0

    def free_all_blocks(self):
        pass


_POOL = _Pool()


def get_default_memory_pool():
    return _POOL


def get_default_pinned_memory_pool():
    return _POOL


# random: one generator per device
class RandomState:
    def __init__(self, seed=0):
        self._g = np.random.default_rng(seed)

    def _out(self, r, name):
        c = _Ctx(name)
        c.check(name)
        return c.out(np.asarray(r), name)

    def standard_normal(self, size=None, dtype=float):
        return self._out(self._g.standard_normal(size, dtype=dtype), "random.standard_normal")

    def random_sample(self, size=None, dtype=float):
        return self._out(self._g.random(size, dtype=dtype), "random.random_sample")

    def randint(self, low, high=None, size=None, dtype=int):
        return self._out(self._g.integers(low, high, size=size, dtype=dtype), "random.randint")

    def permutation(self, n):
        return self._out(self._g.permutation(n), "random.permutation")

    def uniform(self, low=0.0, high=1.0, size=None, dtype=float):
        return self._out(self._g.uniform(low, high, size).astype(dtype), "random.uniform")

    def normal(self, loc=0.0, scale=1.0, size=None, dtype=float):
        return self._out(self._g.normal(loc, scale, size).astype(dtype), "random.normal")


_RS: dict[int, RandomState] = {}


def _get_random_state():
    d = _cur_dev()
    if d not in _RS:
        _RS[d] = RandomState(d)
    return _RS[d]


def _seed(seed=None):
    _RS[_cur_dev()] = RandomState(seed)


random = types.ModuleType("cupy.random")
random.get_random_state = _get_random_state
random.seed = _seed
random.RandomState = RandomState
for _n in ["standard_normal", "random_sample", "randint", "permutation", "uniform", "normal"]:
    setattr(random, _n, (lambda n: lambda *a, **k: getattr(_get_random_state(), n)(*a, **k))(_n))

cuda = types.ModuleType("cupy.cuda")
cuda.Device, cuda.Stream, cuda.Event = Device, Stream, Event
cuda.get_current_stream, cuda.get_elapsed_time = get_current_stream, get_elapsed_time
cuda.alloc_pinned_memory, cuda.PinnedMemoryPointer = alloc_pinned_memory, PinnedMemoryPointer
cuda.runtime = _Runtime("cupy.cuda.runtime")
cuda.is_available = lambda: _N[0] > 0


# cupyx
def _scatter_add(a, slices, value):
    def f(x, s, v):
        np.add.at(x, s, v)
    _call("cupyx.scatter_add", f, (a, slices, value), {}, writes=(a,))


def _empty_pinned(shape, dtype=float, order="C"):
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return np.frombuffer(alloc_pinned_memory(n), np.uint8, n).view(dtype).reshape(shape, order=order)


def _zeros_pinned(shape, dtype=float, order="C"):
    a = _empty_pinned(shape, dtype, order)
    a[...] = 0
    return a


cupyx = types.ModuleType("cupyx")
cupyx.scatter_add, cupyx.empty_pinned, cupyx.zeros_pinned = _scatter_add, _empty_pinned, _zeros_pinned


def install() -> types.ModuleType:
    """Make ``import cupy`` / ``import cupyx`` give the simulation (idempotent); return the cupy module."""
    me = sys.modules[__name__]
    sys.modules["cupy"] = me
    sys.modules["cupy.cuda"] = cuda
    sys.modules["cupy.cuda.runtime"] = cuda.runtime
    sys.modules["cupy.random"] = random
    sys.modules["cupyx"] = cupyx
    return me
