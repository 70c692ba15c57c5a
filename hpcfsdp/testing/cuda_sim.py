"""A simulated CUDA device for tests: the part of CuPy hpcfsdp uses, computing with NumPy, enforcing CUDA's ordering rules."""
from __future__ import annotations

import ctypes
import importlib.machinery
import operator
import sys
import types

import ml_dtypes
import numpy as np

import hpcfsdp._settings as _settings  # a leaf
from . import _sim_cublas, _sim_nccl
from . import _sim_counters as _ctr
from . import _sim_mpi, _sim_pool
from . import _sim_dlpack as _dlpack
from . import _sim_ops
from . import _sim_runtime as _rt
from . import _sim_surface as _gate
from ._cupy_surface import purge_real_cupy, surface
from . import _sim_random
from ._sim_random import RandomState, random
from ._sim_surface import Flags, SimModule, ndarray_attr_error
from ._sim_counters import Counts, counting
from ._sim_pool import device_peak_bytes, reset_device_peak
from ._sim_buffers import PinnedMemoryPointer, _fail, _host_buf, alloc_pinned_memory, is_pinned
from ._sim_runtime import (SIM_FILES, CudaSimError, Device, Event, Stream, _cur_dev, _stack, get_current_stream,
                           get_elapsed_time, set_device_count)

__all__ = ["CudaSimError", "ndarray", "install", "set_device_count", "is_pinned", "mpi_access", "cuda", "random",
           "asnumpy", "get_array_module", "get_default_memory_pool", "cupyx", "RandomState", "linalg", "counting",
           "Counts", "device_peak_bytes", "reset_device_peak"]

# [Note: Simulated device]
# Every simulated array owns a buffer (shared by its views) on one device. Work is queued on streams;
# nothing is delayed (NumPy computes at once) but every access is recorded on its buffer: per agent,
# its last write and its last read, with (agent, op number, the Python stack that issued it). Agents
# are streams, MPI calls in flight, and host threads (whose clock ticks when an MPI call completes on
# them). Ordering is tracked with vector clocks: each stream knows, per agent, up to which op work is
# ordered before its next op (its own earlier ops, Stream.wait_event, the legacy null stream's implicit
# syncs, and what the enqueuing thread knew complete); each host thread knows what it saw complete
# (Stream/Event/Device.synchronize, blocking copies, the MPI calls it completed) and what was handed to
# it: the product hands knowledge between threads only where it hands results over (_backend's
# THREAD_HANDOFF at a Work's issue, completion and wait), so a synchronize on the communication thread
# counts for the main thread only through Work.wait(). The hazards, each named in its CudaSimError with
# the stacks of both accesses:
#   read-after-write   a kernel or copy reads a buffer whose write is neither on its stream nor ordered before it;
#   write-after-read   a kernel, copy or MPI call overwrites a buffer another agent's read is not ordered before;
#   write-after-write  two writes of one buffer by different agents, unordered;
#   MPI ownership window  between the start of an MPI call and its completion (_backend's MPI_WINDOW brackets
#                      call_mpi and the point-to-point requests) MPI reads its inputs and writes its outputs:
#                      any read of an output, or write of an input or output, raises; MPI's writes land at
#                      completion and are known to the thread that completed it (others: after a hand-off);
#                      an MPI call itself needs its inputs' writes, and its outputs' reads and writes, known
#                      complete by its host thread;
#   memory-pool reuse  CuPy's pool gives a freed block to the next allocation of its size on the stream it was
#                      allocated on, with the accesses the freeing thread did not know complete (see
#                      [Note: Simulated memory pool] in _sim_pool.py): the new array's first access raises
#                      unless they are ordered before it.
# An array used on a device other than the thread's current one raises too. Buffers are tracked whole
# (a write of one slice orders against a read of another). _sim_runtime.py holds the streams and threads'
# knowledge, _sim_buffers.py the buffers and their checks (_Buf ``read``/``write``/``check_write``/
# ``unordered``) and pinned memory, _sim_mpi.py the MPI window and hand-offs, _sim_pool.py the pool.
# Like CuPy, implicit conversion to NumPy raises TypeError, and device arrays mixed with host arrays
# in an operation raise TypeError. Only the installed CuPy's names, ndarray attributes and dtype loops
# exist (see [Note: The real CuPy surface] in _cupy_surface.py). The device counts its launches, host syncs and
# pool memory for tests (see [Note: Simulated device counts] in _sim_counters.py).

__version__ = "14.0.0+sim"
SIM_FILES.add(__file__)

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

    def check(self, op, pure=(), launch=True):
        """Check devices, enqueue the kernel (counted as a launch unless ``launch`` is false), check and record its
        reads (not of ``pure``: arrays it only writes)."""
        for x in self.ins:
            if x._buf.dev != self.dev:
                raise CudaSimError(
                    f"{op}: an array on device {x._buf.dev} used while the thread's current device is {self.dev} "
                    f"(an array belongs to one device; select it with cupy.cuda.Device({x._buf.dev})).\n"
                    f"At:\n{_stack()}")
        self.seq = self.stream._enqueue(op if launch else None)
        for x in self.ins:  # read-after-write checked, the read recorded (write-after-read)
            if not any(x is p for p in pure):
                x._buf.read(self.stream, self.seq, op, x)

    def out(self, r, op):
        if isinstance(r, np.ndarray):
            buf = self.roots.get(id(_root(r)))
            if buf is not None:
                return _wrap(r, buf)
            x = _wrap(r, _sim_pool.alloc(self.dev, _root(r).nbytes, self.stream))
            x._buf.write(self.stream, self.seq, op, x)  # a reused pool block may still be in use
            return x
        if isinstance(r, np.generic):
            x = _wrap(np.asarray(r), _sim_pool.alloc(self.dev, r.itemsize, self.stream))
            x._buf.write(self.stream, self.seq, op, x)
            return x
        if isinstance(r, tuple):
            return tuple(self.out(e, op) for e in r)
        if isinstance(r, list):
            return [self.out(e, op) for e in r]
        return r

    def wrote(self, x, op):
        x._buf.write(self.stream, self.seq, op, x)


def _desc(x):
    return f"{np.dtype(x.dtype).name}{list(x.shape)} on cuda:{x._buf.dev}"


_VIEW_OPS = frozenset(["ndarray.reshape", "ndarray.view", "ndarray.transpose", "ndarray.swapaxes", "ndarray.squeeze",
                       "ndarray.ravel", "ndarray.__getitem__", "reshape", "transpose", "swapaxes", "squeeze",
                       "ravel", "moveaxis", "expand_dims", "broadcast_to", "atleast_1d", "atleast_2d"])


def _call(op, fn, args, kwargs, writes=(), host_ok=False, launch=True):
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
    c.check(op, _pure_outputs(op, args, kwargs, outs, writes), launch=False)
    for o in outs:  # before computing: a refused write leaves the data as it was
        o._buf.check_write(c.stream, op, o)
    r = fn(*a, **kw)
    for o in outs:
        c.wrote(o, op)
    if launch and _ctr.OPEN is not None and (outs or _fresh(r, c.roots)):  # returning an input is no kernel
        _ctr.launch(op)
    if outs and r is not None and isinstance(r, np.ndarray) and any(r is o._a for o in outs):
        return next(o for o in outs if o._a is r)
    return c.out(r, op)


def _fresh(r, roots) -> bool:
    """Whether NumPy result ``r`` holds an array that is no input nor a view of one (a kernel made it)."""
    if isinstance(r, np.ndarray):
        return id(_root(r)) not in roots
    if isinstance(r, (tuple, list)):
        return any(_fresh(e, roots) for e in r)
    return isinstance(r, np.generic)


_PURE_WRITES = frozenset(["ndarray.__setitem__", "ndarray.fill"])  # their target (args[0]) is written, not read


def _pure_outputs(op, args, kwargs, outs, writes):
    """The arrays a kernel writes without reading them: ``out=`` arrays that are no input, and the target of
    an assignment or fill."""
    if not outs:
        return ()
    pure = list(writes) if op in _PURE_WRITES else []
    srcs = {id(x) for x in (args[1:] if pure else args) if isinstance(x, ndarray)}
    srcs.update(id(v) for k, v in kwargs.items() if k != "out" and isinstance(v, ndarray))
    return pure + [o for o in outs[:len(outs) - len(writes)] if id(o) not in srcs]


def _sync_read(x, op, counted=True):
    """A blocking device-to-host read of ``x`` (get(), item(), float()): ordered on the current stream, then synced
    (one host sync of kind ``op`` where ``counted``)."""
    s = get_current_stream(x._buf.dev)
    x._buf.read(s, s._enqueue(None), op, x)
    if counted:
        _ctr.host_sync(op)
    s._wait()
    return x._a


class ndarray:
    """A simulated device array (cupy.ndarray): NumPy data, a device, and pending writes."""

    __slots__ = ("_a", "_buf")
    __array_priority__ = 1000
    __hash__ = None

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        self._a = np.empty(shape, dtype, order=order)
        self._buf = _sim_pool.alloc(_cur_dev(), self._a.nbytes)

    # -- attributes ---------------------------------------------------------------------------
    shape = property(lambda s: s._a.shape)
    dtype = property(lambda s: s._a.dtype)
    ndim = property(lambda s: s._a.ndim)
    size = property(lambda s: s._a.size)
    nbytes = property(lambda s: s._a.nbytes)
    itemsize = property(lambda s: s._a.itemsize)
    strides = property(lambda s: s._a.strides)
    flags = property(lambda s: Flags(s._a.flags.c_contiguous, s._a.flags.f_contiguous, s._a.base is None))
    device = property(lambda s: Device(s._buf.dev))

    @property
    def data(self):
        _sim_nccl.note_pointer(_root(self._a), self._buf)  # raw pointers lead back here (NCCL takes them)
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
        return self._get(stream, order, out, "ndarray.get")

    def _get(self, stream, order, out, kind):
        s = stream or get_current_stream(self._buf.dev)
        seq = s._enqueue(None)
        self._buf.read(s, seq, "ndarray.get (device-to-host copy)", self)
        hb = _host_buf(out)
        if hb is not None:  # the copy writes pinned memory on the stream
            hb.write(s, seq, "ndarray.get(stream=...) into pinned memory", "a pinned host buffer")
        if out is None:
            out = np.array(self._a, order=order, copy=True)
        else:
            out[...] = self._a
        if stream is None or hb is None:  # async only into pinned memory: pending until synced
            _ctr.host_sync(kind)
            s._wait()
        return out

    def set(self, arr, stream=None):
        s = stream or get_current_stream(self._buf.dev)
        hb = _host_buf(arr)
        seq = s._enqueue(None)
        if hb is not None:
            hb.read(s, seq, "ndarray.set (host-to-device copy)", "a pinned host buffer")
        self._buf.write(s, seq, "ndarray.set", self)
        self._a[...] = arr
        if stream is None or hb is None:  # async only from pinned memory on a stream
            _ctr.host_sync("ndarray.set")
        if stream is None:
            s._wait()

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

    def __dlpack_device__(self):
        return (2, self._buf.dev)  # (kDLCUDA, device)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack export as CuPy's: stream=-1, the consumer orders its reads itself (MPI reads from the host, so
        every write must be synchronised, as for __cuda_array_interface__); else ``stream`` (None or 1: the legacy
        default stream) waits for this device's current stream."""
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"__dlpack__: the array is on {self.__dlpack_device__()}, not on {tuple(dl_device)}")
        if stream == -1:
            mpi_access(self, "a consumer of __dlpack__(stream=-1) (MPI reading the device pointer)")
        elif stream in (None, 1, 2):
            with Device(self._buf.dev):
                Stream.null.wait_event(get_current_stream().record())
        else:
            raise ValueError(f"__dlpack__: stream={stream!r}: the simulation takes -1, None, 1 or 2")
        return _dlpack.export(self._a if not copy else self._a.copy(), self._buf.dev, max_version)

    # -- views and kernels --------------------------------------------------------------------
    def __getitem__(self, idx):
        return _call("ndarray.__getitem__", operator.getitem, (self, idx), {}, host_ok=True)

    def __setitem__(self, idx, value):
        upload = isinstance(value, np.ndarray)
        if upload:
            hb = _host_buf(value)
            if hb is not None and hb.unordered(None) is not None:
                _fail("ndarray.__setitem__ (host-to-device copy)", "a pinned host buffer", hb.unordered(None),
                      "the copy")
            if hb is None:
                _ctr.host_sync("ndarray.__setitem__ (pageable upload)")
        _call("ndarray.__setitem__", operator.setitem, (self, idx, value), {}, writes=(self,), host_ok=True,
              launch=not upload)

    def fill(self, value):
        _call("ndarray.fill", lambda a, v: a.fill(v), (self, value), {}, writes=(self,))

    def __getattr__(self, name):
        if name.startswith("__"):  # no __array_interface__/__array_struct__: NumPy must not read device memory
            raise AttributeError(name)
        if name not in surface().ndarray:
            raise ndarray_attr_error(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return attr
        writes = (self,) if name in _INPLACE_METHODS else ()
        red = _REDUCTIONS.get(name)

        def method(*a, **k):
            if red:
                _gate.check_reduction(red, self._a.dtype, k.get("dtype"))
            return _call(f"ndarray.{name}", getattr(np.ndarray, name), (self,) + a, k, writes=writes)
        return method

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        name = ufunc.__name__
        if method == "__call__" and ufunc is not np.matmul:  # as CuPy: its own ufunc of that name
            if name not in surface().ufuncs:
                raise TypeError(f"operand type(s) all returned NotImplemented from __array_ufunc__({ufunc!r}, "
                                f"{method!r}, ...): CuPy {surface().version} has no ufunc cupy.{name}")
            out = kwargs.get("out")
            return _ufunc(name, f"{name}.{method}", ufunc, inputs, kwargs, out=out[0] if out else None)
        if method == "reduce" and name in ("add", "multiply"):  # CuPy: sum / prod
            _gate.check_reduction("sum" if name == "add" else "prod", inputs[0].dtype, kwargs.get("dtype"))
        f = _PRODUCTS["matmul"] if ufunc is np.matmul and method == "__call__" else getattr(ufunc, method)
        return _call(f"{ufunc.__name__}.{method}", f, inputs, kwargs)

    def __array_function__(self, func, types_, args, kwargs):
        red = _REDUCTIONS.get(func.__name__)
        if red and args and isinstance(args[0], ndarray):
            _gate.check_reduction(red, args[0].dtype, kwargs.get("dtype"))
        return _call(func.__name__, _PRODUCTS.get(func.__name__, func), args, kwargs)

    def __reduce__(self):
        raise TypeError("simulated device arrays cannot be pickled")


_INPLACE_METHODS = frozenset(["sort", "partition", "put", "resize", "itemset", "setfield", "byteswap"])
_REDUCTIONS = {"sum": "sum", "prod": "prod", "max": "max", "amax": "max", "min": "min", "amin": "min"}


def _ufunc(u, op, fn, args, kwargs, writes=(), out=None):
    """CuPy's ufunc ``u``: the loop CuPy picks for these dtypes (TypeError where it has none, see
    _sim_surface.resolve), computed by NumPy, the result in the loop's output dtype."""
    loop = _gate.resolve(u, args[:_gate.nin(u)], kwargs.get("dtype"))
    if out is None and len(args) > _gate.nin(u):
        out = args[_gate.nin(u)]
    if out is None:
        out = kwargs.get("out")
    if isinstance(out, ndarray):
        _gate.check_out(u, loop, out.dtype, kwargs.get("casting", "same_kind"))
    r = _call(op, fn, args, kwargs, writes=writes)
    if out is None and isinstance(r, ndarray) and r._a.dtype != loop[1][0]:
        r._a = r._a.astype(loop[1][0])
    return r


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


_sim_ops.wire(ndarray, _call, _ufunc, _PRODUCTS["matmul"])
_sim_random.wire(_Ctx)  # cupy.random's draws are kernels too


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
        hit = x._buf.unordered(None, _sim_mpi.open_here())  # (the MPI calls this thread is inside access it)
        if hit is not None:
            _fail(op, _desc(x), hit, "MPI read it (synchronise the stream, or an event recorded after the write)")
    elif isinstance(x, np.ndarray):
        hb = _host_buf(x)
        if hb is not None:
            hit = hb.unordered(None, _sim_mpi.open_here())
            if hit is not None:
                _fail(op, f"pinned host {x.dtype.name}{list(x.shape)}", hit, "MPI read it")


def mpi_wrote(x) -> None:
    """MPI wrote ``x`` at once, on the calling thread (a blocking call): see _sim_mpi.begin/end for the general case."""
    _sim_mpi.end(_sim_mpi.begin((), (x,), "MPI"))


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
        c.check(name, launch=writes_data)  # empty only allocates
        r = f(*a, **kw)
        if not writes_data:
            return _wrap(r, _sim_pool.alloc(c.dev, r.nbytes, c.stream))
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
        if obj._buf.dev != _cur_dev():  # peer copy: read on the source device's stream order (one copy, no sync)
            src = np.array(_sync_read(obj, "cupy.array (peer copy)", counted=False), copy=True)
            c = _Ctx("cupy.array")
            c.check("cupy.array (peer copy)")
            return c.out(np.array(src, dtype=dtype, copy=True, order=order, ndmin=ndmin), "cupy.array (peer copy)")
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
    if hb is None:
        _ctr.host_sync("cupy.array (pageable upload)")
    c = _Ctx("cupy.array")
    c.check("cupy.array (host-to-device copy)", launch=False)
    return c.out(np.array(obj, dtype=dtype, copy=True, order=order, ndmin=ndmin), "cupy.array (host-to-device copy)")


def asarray(a, dtype=None, order=None):
    return array(a, dtype=dtype, copy=False, order=order or "K")


def ascontiguousarray(a, dtype=None):
    a = asarray(a, dtype)
    return _call("ascontiguousarray", np.ascontiguousarray, (a,), {})


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    if isinstance(a, ndarray):
        return a._get(stream, order, out, "cupy.asnumpy")
    return np.asarray(a, order=order)


def get_array_module(*args):
    return _CUPY if any(isinstance(a, ndarray) for a in args) else np


def from_dlpack(x):
    if isinstance(x, ndarray):
        return x
    return asarray(np.from_dlpack(x))


def _module_getattr(name):
    """cupy.<name> for a name the installed CuPy has: NumPy's function as a kernel (its ufuncs and reductions
    held to CuPy's dtype loops), else NumPy's constant or type; AttributeError as CuPy for any other name."""
    if name not in surface().modules["cupy"]:
        raise AttributeError(f"module 'cupy' has no attribute '{name}'")
    f = _PRODUCTS.get(name) or getattr(np, name)  # AttributeError for what NumPy lacks
    if isinstance(f, (type, np.dtype)) or not callable(f):
        return f
    red = _REDUCTIONS.get(name)

    if name in surface().ufuncs:
        def fn(*args, **kwargs):
            return _ufunc(name, name, f, args, kwargs)
    else:
        def fn(*args, **kwargs):
            if red and args and isinstance(args[0], ndarray):
                _gate.check_reduction(red, args[0].dtype, kwargs.get("dtype"))
            return _call(name, f, args, kwargs)
    fn.__name__ = name
    globals()[name] = fn
    return fn


__getattr__ = _module_getattr
linalg = SimModule("cupy.linalg", fallback=lambda n: getattr(np.linalg, n))  # its functions dispatch on ndarray


_POOL = _sim_pool.MemoryPool()  # see [Note: Simulated memory pool] in _sim_pool.py
_PINNED_POOL = _sim_pool.PinnedMemoryPool()


def get_default_memory_pool():
    return _POOL


def get_default_pinned_memory_pool():
    return _PINNED_POOL


cuda = SimModule("cupy.cuda")
cuda.Device, cuda.Stream, cuda.Event = Device, Stream, Event
cuda.get_current_stream, cuda.get_elapsed_time = get_current_stream, get_elapsed_time
cuda.alloc_pinned_memory, cuda.PinnedMemoryPointer = alloc_pinned_memory, PinnedMemoryPointer
_rt._Runtime.deviceGetPCIBusId = _sim_nccl.device_pci_bus_id  # noqa: N815 (CUDA's name)
cuda.runtime = SimModule("cupy.cuda.runtime", impl=_rt._Runtime("cupy.cuda.runtime"))
cuda.nccl = SimModule("cupy.cuda.nccl", impl=_sim_nccl.nccl)
cuda.cublas = SimModule("cupy.cuda.cublas", impl=_sim_cublas.cublas)
cuda.get_cublas_handle = _sim_cublas.device_handle


def _pointer_attributes(ptr):
    """cupy.cuda.runtime.pointerGetAttributes: type memoryTypeHost (1) for the simulation's pinned memory, else
    memoryTypeUnregistered (0) (simulated device memory is host memory too)."""
    probe = np.ctypeslib.as_array((ctypes.c_uint8 * 1).from_address(int(ptr)))
    pinned = _host_buf(probe) is not None
    return types.SimpleNamespace(type=1 if pinned else 0, device=_cur_dev(), hostPointer=int(ptr),
                                 devicePointer=int(ptr) if pinned else 0)


cuda.runtime.pointerGetAttributes = _pointer_attributes
cuda.is_available = lambda: _rt._N[0] > 0


# cupyx
def _scatter_add(a, slices, value):
    _gate.check_scatter_add(a.dtype)

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


cupyx = SimModule("cupyx")
cupyx.scatter_add, cupyx.empty_pinned, cupyx.zeros_pinned = _scatter_add, _empty_pinned, _zeros_pinned


_CUPY = SimModule("cupy", impl=sys.modules[__name__])  # `cupy` as installed: only the real CuPy's names
_CUPY.__file__, _CUPY.__spec__ = __file__, importlib.machinery.ModuleSpec("cupy", None, origin=__file__)


def install() -> types.ModuleType:
    """Make ``import cupy`` / ``import cupyx`` give the simulation (idempotent); return the cupy module.

    Reads the installed CuPy's surface first (RuntimeError naming the extra to install where CuPy is not
    importable), then takes every cupy name of sys.modules. HPCFSDP_CUDA_SIM_RECORD=<dir> records the cupy names
    the process uses (python -m hpcfsdp.testing.cupy_names <dir> checks them)."""
    _CUPY.__version__ = surface().version + "+sim"
    purge_real_cupy()
    sys.modules.update({"cupy": _CUPY, "cupy.cuda": cuda, "cupy.cuda.runtime": cuda.runtime, "cupy.random": random,
                        "cupy.linalg": linalg, "cupyx": cupyx})
    sys.modules["cupy.cuda.nccl"] = cuda.nccl
    rec = _settings.get("HPCFSDP_CUDA_SIM_RECORD")
    if rec:
        _gate.start_recording(rec)
        ndarray.__getattribute__ = _sim_ops.recording_getattribute
    return _CUPY


from . import _sim_kernels  # noqa: E402 (cupy.RawModule: hpcfsdp's fused kernels run as their twins)
from ._sim_kernels import RawModule  # noqa: E402,F401

_sim_kernels.wire(ndarray, _Ctx)
