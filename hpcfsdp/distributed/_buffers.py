"""Arrays as MPI buffers: byte specs, reduction types, device-stream sync and host staging."""

from __future__ import annotations

import base64 as _b64
import contextlib
import functools
import json as _json
import sys
import threading
import time
from typing import Any

import numpy as np

from hpcfsdp import _backend, _settings
from hpcfsdp._backend import array_module, is_cupy_array, to_numpy
from hpcfsdp._tensor import Tensor
from hpcfsdp.distributed._mpi import cuda_aware, get_mpi, half_types

__all__ = [
    "INT_MAX",
    "is_cupy_array",
    "is_array",
    "array_module",
    "describe",
    "check_buffer",
    "byte_spec",
    "reduce_plan",
    "mpi_op_for",
    "record_event",
    "needs_staging",
    "device_stream",
    "complete",
    "to_work_dtype",
    "HostStager",
    "stager",
    "progress",
    "call_mpi",
    "allgather_bytes",
    "finish_reduce",
    "ptr",
    "copy_into",
    "overlaps",
    "may_share",
    "check_same_kind",
    "encode_object",
    "decode_object",
    "KINDS",
    "FP_LEN",
    "dtype_name",
    "fingerprint",
    "describe_fingerprint",
    "fingerprint_mismatch",
]

INT_MAX = 2**31 - 1

# [Note: Message sizes]
# mpi4py >= 4 passes counts as MPI_Count and calls the MPI-4 large-count routines (MPI_Bcast_c,
# MPI_Allgather_c, ...) when a count does not fit in a C int; this was verified with a
# 2**31 + 8 byte Bcast between two ranks on MPICH 5. With an MPI-3 library there are no such
# routines: we raise a clear error naming the size instead of letting a count overflow.
#
# [Note: Half precision on the wire]
# Gathers and broadcasts move bytes: every dtype, float16 and bfloat16 included, is sent as
# MPI.BYTE with count = nbytes, so no MPI datatype is needed for them. Reductions need a typed
# buffer: float16 uses MPI.FLOAT16_T and bfloat16 MPI.BFLOAT16_T when the library has them
# (mpi4py may expose MPI.BFLOAT16_T as DATATYPE_NULL: checked in _mpi.half_types); otherwise the
# comm thread converts to float32, reduces, and rounds back once (one rounding instead of one
# per reduction step, so the fallback is at least as accurate as the native type).


def is_array(a: Any) -> bool:
    return isinstance(a, np.ndarray) or is_cupy_array(a)


def describe(a: Any) -> str:
    """'float32[1024] (cpu)'-style description of an array for error messages."""
    dev = "cuda:%d" % a.device.id if is_cupy_array(a) else "cpu"
    shape = ",".join(str(s) for s in a.shape)
    return f"{np.dtype(a.dtype).name}[{shape}] ({dev})"


def check_buffer(a: Any, name: str, *, writable: bool = False) -> None:
    """Raise TypeError/ValueError unless ``a`` is a C-contiguous NumPy or CuPy array."""
    if not is_array(a):
        tname = type(a).__module__ + "." + type(a).__qualname__
        if tname.startswith("cupy"):
            raise RuntimeError(f"{name}: got a CuPy array but CuPy is not importable here")
        raise TypeError(f"{name}: expected a numpy.ndarray or cupy.ndarray, got {tname}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array, got strides {a.strides} for {describe(a)}")
    if writable and isinstance(a, np.ndarray) and not a.flags.writeable:  # CuPy arrays have no read-only flag
        raise ValueError(f"{name}: expected a writable array, got a read-only {describe(a)}")
    if a.dtype == object:
        raise TypeError(f"{name}: object arrays cannot be communicated")


def _check_count(count: int, what: str) -> None:
    if count > INT_MAX and get_mpi().Get_version() < (4, 0):
        raise RuntimeError(
            f"{what}: {count} elements exceed 2**31-1 and this MPI library implements MPI "
            f"{'%d.%d' % get_mpi().Get_version()} without large-count routines; use an MPI-4 library"
        )


def byte_spec(a: Any):
    """[flat uint8 view, MPI.BYTE] for gathers and broadcasts. See [Note: Half precision on the wire]."""
    MPI = get_mpi()
    flat = a.reshape(-1)
    b = flat.view(np.uint8) if flat.dtype.itemsize else flat
    _check_count(b.size, "byte buffer")
    return [b, MPI.BYTE]


_INT_TYPES = {
    np.dtype(np.int8): "INT8_T",
    np.dtype(np.int16): "INT16_T",
    np.dtype(np.int32): "INT32_T",
    np.dtype(np.int64): "INT64_T",
    np.dtype(np.uint8): "UINT8_T",
    np.dtype(np.uint16): "UINT16_T",
    np.dtype(np.uint32): "UINT32_T",
    np.dtype(np.uint64): "UINT64_T",
    np.dtype(np.float32): "FLOAT",
    np.dtype(np.float64): "DOUBLE",
    np.dtype(np.bool_): "C_BOOL",
    np.dtype(np.complex64): "C_FLOAT_COMPLEX",
    np.dtype(np.complex128): "C_DOUBLE_COMPLEX",
}


def _half_name(dtype: np.dtype) -> str | None:
    if dtype == np.float16:
        return "float16"
    if dtype.name == "bfloat16":
        return "bfloat16"
    return None


_PLANS: dict = {}


def reduce_plan(dtype: Any, *, force_fallback: bool = False):
    """(MPI datatype, work dtype or None) for reducing arrays of ``dtype``.

    work dtype None: reduce the array as is. float32: convert to float32, reduce, round back.
    """
    key = (dtype, force_fallback, half_types)  # half_types: tests may patch it
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _reduce_plan(np.dtype(dtype), force_fallback)
    return plan


def _reduce_plan(dtype: np.dtype, force_fallback: bool):
    MPI = get_mpi()
    half = _half_name(dtype)
    if half is not None:
        t = None if force_fallback else half_types()[half]
        if t is not None:
            return t, None
        return MPI.FLOAT, np.dtype(np.float32)
    name = _INT_TYPES.get(dtype)
    if name is None:
        raise TypeError(f"cannot reduce arrays of dtype {dtype.name}: no MPI datatype for it")
    return getattr(MPI, name), None


def mpi_op_for(op_name: str):
    """MPI.Op for 'SUM' / 'AVG' (a SUM followed by a division) / 'MAX' / 'MIN' / 'PRODUCT'."""
    MPI = get_mpi()
    return {"SUM": MPI.SUM, "AVG": MPI.SUM, "MAX": MPI.MAX, "MIN": MPI.MIN, "PRODUCT": MPI.PROD}[op_name]


def record_event(a: Any):
    """On the producing (calling) thread: an event recorded on CuPy's current stream, else None.

    See [Note: Device arrays]: the communication thread synchronises on it before MPI touches
    the array, so a kernel still writing the input is never raced.
    """
    if not is_cupy_array(a):
        return None
    cp = sys.modules["cupy"]
    with cp.cuda.Device(a.device.id):
        ev = cp.cuda.Event(block=False, disable_timing=True)
        ev.record(cp.cuda.get_current_stream())
    return ev


def needs_staging(a: Any) -> bool:
    """True when MPI must not see device array ``a`` itself: HPCFSDP_GPU_COMM=staged, or (auto / nccl, for
    what NCCL does not run) an MPI that is not CUDA-aware. See [Note: GPU collectives] in _nccl.py."""
    if not is_cupy_array(a):
        return False
    mode = _settings.get("HPCFSDP_GPU_COMM")
    return mode == "staged" or (mode != "mpi" and not cuda_aware()[0])


@contextlib.contextmanager
def device_stream(a: Any):
    """On the communication thread: run device work on ``a``'s GPU, on that GPU's comm stream.

    Yields the stream (None for host arrays). Work queued there must be finished with ``complete``
    before MPI reads its result or the Work completes. See [Note: Device arrays].
    """
    if not is_cupy_array(a):
        yield None
        return
    cp = sys.modules["cupy"]
    with cp.cuda.Device(a.device.id):
        s = stager().stream(a.device.id)
        with s:
            yield s


def complete(stream: Any) -> None:
    """Wait until the device work queued on ``stream`` (from ``device_stream``; None: nothing) has finished."""
    if stream is not None:
        stream.synchronize()


def to_work_dtype(a: Any, dtype: Any, stream: Any) -> Any:
    """``a`` converted to ``dtype`` for MPI; a device conversion has finished when this returns."""
    w = a.astype(dtype)
    complete(stream)
    return w


# [Note: Device arrays]
# A CuPy array is handed to MPI only after the stream that produced it is done: the issuing
# thread records an event after its last write of the input (after the copy that breaks an
# aliasing of input and output, too), and the communication thread synchronises it. With a
# CUDA-aware MPI the device pointer goes to MPI directly (mpi4py takes it from __dlpack__(stream=-1), the
# consumer ordering nothing, which is why the stream is synchronised first; __cuda_array_interface__ where an
# array has no DLPack).
# Without one, the communication thread copies device -> pinned host on a side stream, runs MPI
# on the host copy, and copies the result back, waiting for that side stream before the Work
# completes. Device work of the communication thread itself (the float32 conversion of a half
# precision reduction, AVG's division, the cast back) runs on its own stream of the array's GPU
# (device_stream) and is waited for (complete) before MPI reads the result and before the Work
# completes: a kernel is asynchronous, and MPI reads memory from the host. CUDA's current device
# is per host thread, so the communication thread runs every Work on the issuing thread's device
# (_comm_thread.py). Pinned buffers are kept per slot and grown, never shrunk, so steady-state
# training allocates nothing.


class HostStager:
    """Reusable pinned host buffers (one per slot) for staging device arrays through host MPI."""

    def __init__(self):
        self._bufs: dict[tuple[str, int], Any] = {}
        self._lock = threading.Lock()
        self._streams: dict[int, Any] = {}

    def host_buffer(self, slot: str, nbytes: int, device_id: int = 0) -> np.ndarray:
        """A pinned uint8 host buffer of at least ``nbytes`` bytes for ``slot`` (reused)."""
        key = (slot, device_id)
        with self._lock:
            buf = self._bufs.get(key)
            if buf is None or buf.nbytes < nbytes:
                buf = _backend.pinned_bytes(nbytes)
                self._bufs[key] = buf
            return buf[:nbytes]

    def stream(self, device_id: int):
        cp = sys.modules["cupy"]
        s = self._streams.get(device_id)
        if s is None:
            with cp.cuda.Device(device_id):
                s = cp.cuda.Stream(non_blocking=True)
            self._streams[device_id] = s
        return s

    def to_host(self, a: Any, slot: str) -> np.ndarray:
        """Copy device array ``a`` into the slot's pinned buffer; return a host view of a's dtype/shape."""
        host = self.host_buffer(slot, a.nbytes, a.device.id).view(a.dtype).reshape(a.shape)
        if a.size:
            cp = sys.modules["cupy"]
            with cp.cuda.Device(a.device.id):
                s = self.stream(a.device.id)
                a.get(stream=s, out=host)
                s.synchronize()
        return host

    def empty_host(self, a: Any, slot: str) -> np.ndarray:
        return self.host_buffer(slot, a.nbytes, a.device.id).view(a.dtype).reshape(a.shape)

    def to_device(self, host: np.ndarray, a: Any) -> None:
        """Copy host staging buffer ``host`` back into device array ``a`` (waits for the copy)."""
        if not a.size:
            return
        cp = sys.modules["cupy"]
        with cp.cuda.Device(a.device.id):
            s = self.stream(a.device.id)
            a.set(host, stream=s)
            s.synchronize()

    def clear(self) -> None:
        with self._lock:
            self._bufs.clear()


def progress(req) -> None:
    """Complete an MPI request by polling Test with a sleeping back-off (mode 'test')."""
    spins = 0
    delay = 0.0
    while not req.Test():
        spins += 1
        if spins < 32:
            time.sleep(0)
        else:
            delay = min(max(delay * 2, 2e-5), 5e-4)
            time.sleep(delay)


# ---------------------------------------------------------------------------------------------
# MPI calls made by the communication thread (_comm_thread.py)

_STAGER: HostStager | None = None


def stager() -> HostStager:
    """The process's HostStager (used only by the communication thread)."""
    global _STAGER
    if _STAGER is None:
        _STAGER = HostStager()
    return _STAGER


def call_mpi(mode: str, blocking, nonblocking, *args) -> None:
    """Call the blocking MPI routine, or (mode 'test') the nonblocking one and poll it."""
    window = _backend.MPI_WINDOW  # the simulated device's (see [Note: Simulated CUDA] in _backend)
    token = window.call(blocking if mode == "blocking" else nonblocking, args) if window is not None else None
    try:
        if mode == "blocking":
            blocking(*args)
        else:
            progress(nonblocking(*args))
    finally:
        if token is not None:
            window.end(token)


def allgather_bytes(comm, src, dst, in_place: bool, k: int, mode: str) -> None:
    """Allgather of ``src`` (or MPI_IN_PLACE) into ``dst`` as bytes."""
    MPI = get_mpi()
    if k == 0:
        return
    recv = byte_spec(dst)
    send = MPI.IN_PLACE if in_place else byte_spec(src)
    call_mpi(mode, comm.Allgather, comm.Iallgather, send, recv)


def finish_reduce(work, dst, avg: bool, n: int) -> None:
    """AVG's division (floor for integers) and the cast back from a float32 work buffer into ``dst``."""
    if avg:
        if np.issubdtype(work.dtype, np.integer):
            work //= n
        elif work.dtype == np.bool_:
            raise TypeError("ReduceOp.AVG is not defined for bool arrays")
        else:
            work /= n
    if work is not dst:
        dst[...] = work.astype(dst.dtype)


def ptr(a: Any) -> int:
    return a.data.ptr if is_cupy_array(a) else a.__array_interface__["data"][0]


def copy_into(dst, src) -> None:
    """``dst[...] = src`` unless they are the same memory (a size-1 gather or scatter)."""
    if ptr(dst) != ptr(src):
        dst[...] = src


def may_share(a, b) -> bool:
    """Cheap test: could ``a`` and ``b`` share memory (same base or overlapping bounds)?"""
    if is_cupy_array(a) or is_cupy_array(b):
        return overlaps(a, b)
    return bool(np.may_share_memory(a, b))


def overlaps(a, b) -> bool:
    pa, pb = ptr(a), ptr(b)
    return pa < pb + b.nbytes and pb < pa + a.nbytes


def check_same_kind(a, b, what: str) -> None:
    if is_cupy_array(a) != is_cupy_array(b):
        raise TypeError(f"{what}: output {describe(a)} and input {describe(b)} are on different devices")
    if is_cupy_array(a) and a.device.id != b.device.id:
        raise TypeError(f"{what}: output {describe(a)} and input {describe(b)} are on different GPUs")


# ---------------------------------------------------------------------------------------------
# objects on the wire

# [Note: Objects without pickle]
# all_gather_object / broadcast_object move Python objects as UTF-8 JSON with tags for what
# JSON lacks: tuples, dicts with non-string keys, sets, bytes, NumPy dtypes, scalars and arrays, and
# Tensors (their host copy, device and requires_grad; they arrive on the same device, as PyTorch's
# pickled tensors do; DTensors are refused: send their local pieces or full_tensor()).
# Decoding never runs code. Anything else (custom classes) raises TypeError naming its type.

def _enc(o: Any) -> Any:
    if o is None or isinstance(o, (bool, int, float, str)):
        return o
    if isinstance(o, np.generic):
        return {"__np": [o.dtype.str if o.dtype.kind != "V" else o.dtype.name, _enc(o.item())]}
    if isinstance(o, list):
        return [_enc(x) for x in o]
    if isinstance(o, tuple):
        return {"__tuple": [_enc(x) for x in o]}
    if isinstance(o, (set, frozenset)):
        return {"__set": [_enc(x) for x in o], "frozen": isinstance(o, frozenset)}
    if isinstance(o, dict):
        return {"__dict": [[_enc(k), _enc(v)] for k, v in o.items()]}
    if isinstance(o, (bytes, bytearray)):
        return {"__bytes": _b64.b64encode(bytes(o)).decode("ascii")}
    if isinstance(o, np.dtype):
        return {"__dtype": o.name}
    if isinstance(o, np.ndarray):
        a = np.asarray(o, order="C")  # keeps 0-dim arrays 0-dim (ascontiguousarray makes them (1,))
        return {"__array": [a.dtype.name, list(a.shape), _b64.b64encode(a.tobytes()).decode("ascii")]}
    if isinstance(o, Tensor):
        if hasattr(o, "device_mesh"):
            raise TypeError("cannot send a DTensor as an object: send to_local() or full_tensor()")
        return {"__tensor": [_enc(to_numpy(o._data)), str(o.device), bool(o.requires_grad)]}
    raise TypeError(
        f"cannot send an object of type {type(o).__module__}.{type(o).__qualname__}: collectives on "
        "objects accept None, bool, int, float, str, list, tuple, dict, set, bytes, NumPy dtypes, "
        "scalars, arrays and Tensors (no pickle)"
    )


def _dtype_from_name(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def _dec(o: Any) -> Any:
    if isinstance(o, list):
        return [_dec(x) for x in o]
    if not isinstance(o, dict):
        return o
    if "__tuple" in o:
        return tuple(_dec(x) for x in o["__tuple"])
    if "__dict" in o:
        return {_dec(k): _dec(v) for k, v in o["__dict"]}
    if "__set" in o:
        items = [_dec(x) for x in o["__set"]]
        return frozenset(items) if o.get("frozen") else set(items)
    if "__bytes" in o:
        return _b64.b64decode(o["__bytes"])
    if "__dtype" in o:
        return _dtype_from_name(o["__dtype"])
    if "__np" in o:
        code, val = o["__np"]
        return _dtype_from_name(code).type(val)
    if "__array" in o:
        name, shape, data = o["__array"]
        return np.frombuffer(_b64.b64decode(data), _dtype_from_name(name)).reshape(shape).copy()
    if "__tensor" in o:
        data, device, requires_grad = o["__tensor"]
        return Tensor._wrap(_dec(data)).to(device).requires_grad_(requires_grad)
    raise ValueError(f"malformed object encoding: unknown tag in {sorted(o)}")


def encode_object(obj: Any) -> bytes:
    """Tagged-JSON bytes of ``obj``. See [Note: Objects without pickle]."""
    return _json.dumps(_enc(obj), separators=(",", ":")).encode("utf-8")


def decode_object(data: bytes) -> Any:
    return _dec(_json.loads(data.decode("utf-8"))) if data else None


# ---------------------------------------------------------------------------------------------
# collective fingerprints (debug mode, HPCFSDP_DEBUG=1; see [Note: Debug mode] in _failure.py)

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier", "all_gather_object",
         "broadcast_object", "split", "create_subgroup", "reduce", "gather", "scatter", "all_to_all",
         "gather_object", "scatter_object", "monitored_barrier")
_FP_DTYPES = ("", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "bfloat16", "float32", "float64", "complex64", "complex128")
_FP_OPS = ("", "SUM", "AVG", "MAX", "MIN", "PRODUCT")
FP_LEN = 7  # [hash, seq, kind, count, dtype, op, root]


_DTYPE_NAMES: dict = {}


def dtype_name(dtype: Any) -> str:
    """np.dtype(dtype).name, cached (NumPy 2 computes it in Python: ~10 us a call)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = np.dtype(dtype).name
    return name


@functools.lru_cache(maxsize=4096)
def _fp_fields(kind: str, count: int, dtype: str, op: str, root: int) -> tuple[int, ...]:
    import hashlib

    text = f"{kind}|{count}|{dtype}|{op}|{root}".encode()
    h = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little", signed=True)
    dt = _FP_DTYPES.index(dtype) if dtype in _FP_DTYPES else -1
    return h, KINDS.index(kind), count, dt, _FP_OPS.index(op), root


def fingerprint(seq: int, kind: str, count: int = -1, dtype: str = "", op: str = "", root: int = -1) -> np.ndarray:
    """int64[FP_LEN]: a 64-bit hash of (kind, count, dtype, op, root) and those fields raw, with the
    per-group sequence number. Deterministic across processes (no Python ``hash``)."""
    h, *fields = _fp_fields(kind, count, dtype, op, root)
    return np.array([h, seq, *fields], np.int64)


def describe_fingerprint(row) -> str:
    """'#12 all_reduce(count=1024, dtype=float32, op=SUM)' from a fingerprint row."""
    _, seq, kind, count, dt, op, root = (int(x) for x in row)
    name = KINDS[kind] if 0 <= kind < len(KINDS) else f"<kind {kind}>"
    args = []
    if count >= 0:
        args.append(f"count={count}")
    if dt != 0:
        args.append(f"dtype={_FP_DTYPES[dt] if 0 < dt < len(_FP_DTYPES) else 'other'}")
    if op > 0:
        args.append(f"op={_FP_OPS[op] if op < len(_FP_OPS) else op}")
    if root >= 0:
        args.append(f"src={root}")
    return f"#{seq} {name}({', '.join(args)})"


def fingerprint_mismatch(rows: np.ndarray, world_ranks) -> str | None:
    """None when every rank's row equals group rank 0's; else a message naming the first rank that differs."""
    if rows.tobytes() == rows[0].tobytes() * len(rows):  # the common case, in ~1 us
        return None
    bad = np.flatnonzero(np.any(rows != rows[0], axis=1))
    if bad.size == 0:
        return None
    r = int(bad[0])
    others = "" if bad.size == 1 else f" ({bad.size} ranks differ: group ranks {bad[:8].tolist()}" + \
        ("..." if bad.size > 8 else "") + ")"
    how = " (same fields, different hash: dtype names differ)" if np.array_equal(rows[r][1:], rows[0][1:]) else ""
    return (f"group rank {r} (world rank {world_ranks[r]}) is the first rank whose call differs: it calls "
            f"{describe_fingerprint(rows[r])}, but group rank 0 (world rank {world_ranks[0]}) calls "
            f"{describe_fingerprint(rows[0])}{how}{others}")
