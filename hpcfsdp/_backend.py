"""Array backends: dtypes, devices, the array module (NumPy or CuPy) and random generators."""
import builtins
import ctypes
import sys
import threading

import ml_dtypes
import numpy as np

import hpcfsdp._settings as _settings  # a leaf: safe while hpcfsdp is still importing

__all__ = [
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
    "double", "float", "half", "long", "int",
    "to_dtype", "is_floating_dtype", "default_float_dtype", "set_default_float_dtype", "device", "to_device", "default_device",
    "array_module", "device_of_array", "synchronize", "pinned_empty", "is_cupy_array", "to_numpy",
    "cupy_available", "generator", "generator_for", "manual_seed", "meta_array", "is_meta_array", "host_allocator_tuned",
    "pinned_bytes", "is_pinned", "host_empty", "current_cuda_device", "use_cuda_device", "cuda_simulated",
    "cupy_bfloat16", "MPI_BUFFER_CHECK", "MPI_WINDOW", "THREAD_HANDOFF", "cupy_unavailable_reason",
]

# ---------------------------------------------------------------------------------------------
# dtypes: plain NumPy dtype objects (bfloat16 through ml_dtypes, also understood by CuPy).
float64 = np.dtype("float64")
float32 = np.dtype("float32")
float16 = np.dtype("float16")
bfloat16 = np.dtype(ml_dtypes.bfloat16)
int64 = np.dtype("int64")
int32 = np.dtype("int32")
int16 = np.dtype("int16")
int8 = np.dtype("int8")
uint8 = np.dtype("uint8")
bool = np.dtype(builtins.bool)  # noqa: A001  (PyTorch's name)
double, float, half, long, int = float64, float32, float16, int64, int32  # noqa: A001

_FLOAT_KINDS = frozenset([float64, float32, float16, bfloat16])
_NAMES = {
    "float64": float64, "double": float64, "float32": float32, "float": float32, "float16": float16,
    "half": float16, "bfloat16": bfloat16, "int64": int64, "long": int64, "int32": int32, "int": int32,
    "int16": int16, "int8": int8, "uint8": uint8, "bool": bool,
}
_SUPPORTED = frozenset(_NAMES.values())


_DEFAULT_FLOAT = [float32]  # PyTorch's default dtype; hp.set_default_dtype changes it


def default_float_dtype():
    """The dtype of floating tensors built from Python floats and of the factories' results (PyTorch's default
    dtype: float32 unless hp.set_default_dtype changed it)."""
    return _DEFAULT_FLOAT[0]


def set_default_float_dtype(dt):
    """Make ``dt`` (a floating dtype, checked by the caller) the default dtype."""
    _DEFAULT_FLOAT[0] = dt


def to_dtype(x):
    """Normalise a dtype-like (hp dtype, NumPy dtype, string, Python type) to a NumPy dtype."""
    if isinstance(x, np.dtype):
        dt = x
    elif isinstance(x, str):
        name = x[6:] if x.startswith("torch.") else x
        if name not in _NAMES:
            raise TypeError(f"unknown dtype {x!r}; expected one of {sorted(_NAMES)}")
        return _NAMES[name]
    elif x is builtins.float:
        return float32
    elif x is builtins.int:
        return int64
    elif x is builtins.bool:
        return bool
    else:
        try:
            dt = np.dtype(x)
        except TypeError:
            raise TypeError(f"cannot interpret {x!r} as a dtype") from None
    if dt not in _SUPPORTED:
        raise TypeError(f"unsupported dtype {dt}; expected one of {sorted(str(d) for d in _SUPPORTED)}")
    return dt


def is_floating_dtype(dt):
    return dt in _FLOAT_KINDS


# ---------------------------------------------------------------------------------------------
# CuPy, imported on first use.
_cupy = None
_cupy_checked = False

# [Note: Simulated CUDA]
# HPCFSDP_CUDA_SIM=1 (read here, once, at import) installs hpcfsdp.testing.cuda_sim as the modules
# ``cupy`` and ``cupyx``: every ``import cupy`` in the package and the tests then gets a NumPy-backed
# stand-in that enforces CUDA's ordering and device rules (see [Note: Simulated device] there), so the
# GPU code paths run, and their races fail, on machines without a GPU. It has no more of CuPy than the
# installed CuPy has (names, ndarray attributes, dtype loops: see [Note: The real CuPy surface] in
# hpcfsdp/testing/_cupy_surface.py), so what passes there runs on CuPy. Three hooks, None with real
# CuPy (never a switch in behaviour: the product calls them only to tell the simulation what it does):
# MPI_BUFFER_CHECK checks a buffer handed to MPI now; MPI_WINDOW brackets an MPI call
# (``token = MPI_WINDOW.call(routine, args)`` before it starts, ``MPI_WINDOW.end(token)`` once it
# completed: _buffers.call_mpi, _p2p), so the simulation knows which buffers MPI owns until then and
# when its writes land; THREAD_HANDOFF carries what one host thread knows complete to another where the
# product hands results between threads (``snap = THREAD_HANDOFF.publish()`` on the handing thread,
# ``THREAD_HANDOFF.acquire(snap)`` on the taking one: a Work's issue, completion and wait, _comm_thread).
_CUDA_SIM = _settings.get("HPCFSDP_CUDA_SIM")
MPI_BUFFER_CHECK = None
MPI_WINDOW = None
THREAD_HANDOFF = None
if _CUDA_SIM:
    from hpcfsdp.testing import _sim_mpi as _sim_mpi  # noqa: E402
    from hpcfsdp.testing import cuda_sim as _cuda_sim  # noqa: E402

    _cuda_sim.install()
    MPI_BUFFER_CHECK = _cuda_sim.mpi_access
    MPI_WINDOW = _sim_mpi.WINDOW
    THREAD_HANDOFF = _sim_mpi.HANDOFF


def cuda_simulated():
    """True when HPCFSDP_CUDA_SIM=1 replaced CuPy by the simulated device."""
    return _CUDA_SIM


_cupy_missing = ""  # why CuPy is unusable here ("" while it is usable or not yet probed)

# [Note: CuPy without a GPU]
# The CuPy wheel imports on a machine without a GPU or driver (CI installs it there so the simulated device
# can be held to its real surface). CuPy is usable only where it also sees a GPU: otherwise device 'cuda'
# raises naming the cause (not importable: which extra to install; no GPU: what CuPy's runtime said).


def _try_cupy():
    global _cupy, _cupy_checked, _cupy_missing
    if not _cupy_checked:
        _cupy_checked = True
        try:
            import cupy  # noqa: PLC0415
        except Exception as e:  # ImportError, or a broken CUDA install
            _cupy, _cupy_missing = None, (
                f"needs CuPy, which is not importable ({type(e).__name__}: {e}); install hpcfsdp with the "
                "'cuda12' or 'cuda13' extra (pip install 'hpcfsdp[cuda12]')")
        else:
            if _CUDA_SIM or _cupy_sees_gpu(cupy):
                _cupy = cupy
            else:
                _cupy, _cupy_missing = None, (
                    f"needs a CUDA GPU: CuPy {cupy.__version__} is installed but sees none (no device or no "
                    "driver); use device 'cpu' here, or HPCFSDP_CUDA_SIM=1 for the simulated device")
    return _cupy


def _cupy_sees_gpu(cupy) -> bool:
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # CUDARuntimeError: no driver, no device, insufficient driver
        return False


def cupy_available():
    """Whether CuPy is importable and sees at least one GPU (see [Note: CuPy without a GPU])."""
    return _try_cupy() is not None


def cupy_unavailable_reason() -> str:
    """Why ``cupy_available()`` is False, as the end of a sentence starting "device 'cuda' ..."."""
    _try_cupy()
    return _cupy_missing


def _need_cupy():
    cp = _try_cupy()
    if cp is None:
        raise RuntimeError(f"device 'cuda' {_cupy_missing}")
    return cp


# ---------------------------------------------------------------------------------------------
# devices
_DEVICE_TYPES = ("cpu", "cuda", "meta")
_tls = threading.local()


class device:  # noqa: N801  (PyTorch's name)
    """A device: ``device("cpu")``, ``device("cuda", 1)``, ``device("cuda:1")``, ``device("meta")``.

    Also a context manager: ``with hp.device("meta"):`` makes creation functions default to it.
    """

    __slots__ = ("type", "index")

    def __init__(self, type, index=None):  # noqa: A002
        if isinstance(type, device):
            if index is not None:
                raise ValueError(f"device {type} already has an index; got index={index!r} too")
            t, i = type.type, type.index
        elif isinstance(type, str):
            t, _, rest = type.partition(":")
            if t not in _DEVICE_TYPES:
                raise ValueError(f"unknown device {type!r}; expected 'cpu', 'cuda', 'cuda:N' or 'meta'")
            i = None
            if rest:
                if not rest.isdigit():
                    raise ValueError(f"bad device index in {type!r}; expected a non-negative integer")
                if index is not None:
                    raise ValueError(f"device {type!r} given an index twice")
                i = builtins.int(rest)
            if index is not None:
                if not isinstance(index, builtins.int) or index < 0:
                    raise ValueError(f"bad device index {index!r}; expected a non-negative integer")
                i = index
        else:
            raise TypeError(f"expected a device string or hp.device, got {type!r}")
        if t == "cpu" and i not in (None, 0):
            raise ValueError(f"cpu device has no index {i}")
        object.__setattr__(self, "type", t)
        object.__setattr__(self, "index", None if t != "cuda" else i)

    def __setattr__(self, name, value):
        raise AttributeError("hp.device is immutable")

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self):
        if self.index is None:
            return f"device(type='{self.type}')"
        return f"device(type='{self.type}', index={self.index})"

    def __eq__(self, other):
        if isinstance(other, str):
            try:
                other = device(other)
            except (ValueError, TypeError):
                return False
        if not isinstance(other, device):
            return NotImplemented
        return self.type == other.type and self.index == other.index

    def __hash__(self):
        return hash((self.type, self.index))

    def __reduce__(self):
        return (device, (self.type, self.index))

    # context manager: default device for creation functions
    def __enter__(self):
        stack = getattr(_tls, "stack", None)
        if stack is None:
            stack = _tls.stack = []
        stack.append(self)
        return self

    def __exit__(self, *exc):
        _tls.stack.pop()
        return False


_CPU = device("cpu")
_META = device("meta")


def default_device():
    """The innermost ``with hp.device(...)`` device, else cpu."""
    stack = getattr(_tls, "stack", None)
    return stack[-1] if stack else _CPU


def to_device(x):
    """Normalise a device-like (hp.device, str, int CUDA ordinal, None -> default) to an hp.device."""
    if x is None:
        return default_device()
    if isinstance(x, device):
        d = x
    elif isinstance(x, str):
        d = device(x)
    elif isinstance(x, builtins.int) and not isinstance(x, builtins.bool):
        d = device("cuda", x)
    else:
        raise TypeError(f"expected a device (hp.device, 'cpu', 'cuda', 'cuda:N', 'meta'), got {x!r}")
    if d.type == "cuda":
        cp = _need_cupy()
        if d.index is None:
            d = device("cuda", cp.cuda.runtime.getDevice())
    return d


def is_cupy_array(a):
    """True for a cupy.ndarray (without importing CuPy when nobody has)."""
    cp = _cupy or sys.modules.get("cupy")
    return cp is not None and isinstance(a, cp.ndarray)


def is_meta_array(a):
    """True for meta storage (see meta_array)."""
    return type(a) is _MetaArray


class _MetaArray(np.ndarray):
    """ndarray subclass marking meta storage: zero strides, no memory, values meaningless.

    Element-wise ufuncs and matmul on meta arrays compute only the result's shape and dtype; in-place
    ufuncs into a meta ``out`` do nothing. Views (reshape, transpose, slicing, broadcast) stay meta.
    """

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.get("out")
        if out is not None and any(type(o) is _MetaArray for o in out):
            return out[0] if len(out) == 1 else out
        plain = [np.asarray(x).view(np.ndarray) if isinstance(x, np.ndarray) else x for x in inputs]
        if method != "__call__":  # reductions etc.: small outputs, compute on the zero-strided data
            res = getattr(ufunc, method)(*plain, **kwargs)
        else:
            probes = [np.zeros((), x.dtype) if isinstance(x, np.ndarray) else x for x in plain]
            shapes = [np.shape(x) for x in plain]
            if ufunc is np.matmul:
                a, b = shapes
                a2, b2 = (a if len(a) > 1 else (1,) + a), (b if len(b) > 1 else b + (1,))
                if a2[-1] != b2[-2]:
                    raise ValueError(f"matmul shape mismatch: {a} @ {b}")
                shape = np.broadcast_shapes(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
                if len(b) == 1:
                    shape = shape[:-1]
                if len(a) == 1:
                    shape = shape[:-2] + shape[-1:]
                dt = np.result_type(*[p.dtype for p in probes])
                return meta_array(shape, dt)
            shape = np.broadcast_shapes(*shapes)
            res0 = ufunc(*probes, **{k: v for k, v in kwargs.items() if k != "out"})
            if isinstance(res0, tuple):
                return tuple(meta_array(shape, np.asarray(r).dtype) for r in res0)
            return meta_array(shape, np.asarray(res0).dtype)
        if isinstance(res, tuple):
            return tuple(np.asarray(r).view(_MetaArray) for r in res)
        return np.asarray(res).view(_MetaArray)


def meta_array(shape, dtype):
    """Shape-and-dtype-only storage: a zero-strided read-only broadcast of one element."""
    base = np.broadcast_to(np.zeros((), dtype=dtype), tuple(shape))
    return base.view(_MetaArray)


def array_module(x):
    """numpy or cupy for a device-like or an array."""
    if isinstance(x, np.ndarray):
        return np
    if isinstance(x, (device, str)):
        d = x if isinstance(x, device) else device(x)
        return _need_cupy() if d.type == "cuda" else np
    if is_cupy_array(x):
        return sys.modules["cupy"]
    return np


def device_of_array(a):
    if type(a) is _MetaArray:
        return _META
    if isinstance(a, np.ndarray) or np.isscalar(a):
        return _CPU
    if is_cupy_array(a):
        return device("cuda", a.device.id)
    raise TypeError(f"not an array of a known backend: {type(a).__name__}")


def synchronize(dev=None):
    """Wait for all work on a CUDA device (no-op on cpu/meta)."""
    d = to_device(dev) if dev is not None else None
    if d is not None and d.type != "cuda":
        return
    cp = _try_cupy()
    if cp is None:
        return
    if d is None:
        cp.cuda.Device().synchronize()
    else:
        cp.cuda.Device(d.index).synchronize()


def pinned_empty(shape, dtype):
    """A host ndarray in page-locked memory when CuPy is present (fast, async copies), else np.empty."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, builtins.int) else tuple(shape)
    n = builtins.int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return pinned_bytes(n)[:n].view(dtype).reshape(shape)


def pinned_bytes(nbytes):
    """A uint8 host ndarray of ``nbytes`` (at least 1) in page-locked memory when CuPy is present, else np.empty."""
    n = max(builtins.int(nbytes), 1)
    cp = _try_cupy()
    if cp is None:
        return np.empty(n, np.uint8)
    return np.frombuffer(cp.cuda.alloc_pinned_memory(n), np.uint8, n)


def host_empty(shape, dtype, pin_memory=False):
    """An uninitialised host ndarray; page-locked when ``pin_memory`` (CPU offload's host copies) and CuPy is present."""
    return pinned_empty(shape, dtype) if pin_memory else np.empty(shape, dtype=np.dtype(dtype))


def is_pinned(a):
    """Whether host ndarray ``a`` lies in page-locked (CUDA-registered) memory."""
    if not isinstance(a, np.ndarray) or a.size == 0:
        return False
    cp = _cupy or sys.modules.get("cupy")
    if cp is None:
        return False
    try:  # (the simulated device answers from its registry of pinned memory)
        attrs = cp.cuda.runtime.pointerGetAttributes(a.__array_interface__["data"][0])
        return builtins.int(attrs.type) == 1  # cudaMemoryTypeHost
    except Exception:
        return False


def current_cuda_device():
    """The calling thread's current CUDA device, or None when CuPy is not loaded."""
    cp = _cupy or sys.modules.get("cupy")
    if cp is None:
        return None
    try:
        return builtins.int(cp.cuda.runtime.getDevice())
    except Exception:  # no visible GPU
        return None


def use_cuda_device(index):
    """Make ``index`` the calling thread's current CUDA device (CUDA's current device is per host thread)."""
    sys.modules["cupy"].cuda.runtime.setDevice(builtins.int(index))


# What the engine runs on bfloat16 arrays under MixedPrecisionPolicy(param_dtype=bfloat16): elementwise ops,
# reductions, products and casts of the forward and backward passes (nn.functional, autograd ops, optimizers).
# cupy_bfloat16() runs each on CuPy (on the simulated device that means CuPy's own type tables decide, see
# [Note: The real CuPy surface]) and compares it with NumPy in float32.
_BF16_PROBES = (
    ("add", lambda xp, a, b: a + b), ("subtract", lambda xp, a, b: a - b), ("multiply", lambda xp, a, b: a * b),
    ("divide", lambda xp, a, b: a / b), ("negative", lambda xp, a, b: -a), ("power", lambda xp, a, b: a ** 2),
    ("maximum", lambda xp, a, b: xp.maximum(a, b)), ("minimum", lambda xp, a, b: xp.minimum(a, b)),
    ("exp", lambda xp, a, b: xp.exp(a)), ("log", lambda xp, a, b: xp.log(a)), ("tanh", lambda xp, a, b: xp.tanh(a)),
    ("sqrt", lambda xp, a, b: xp.sqrt(a)), ("absolute", lambda xp, a, b: xp.abs(a)),
    ("sign", lambda xp, a, b: xp.sign(a)), ("reciprocal", lambda xp, a, b: xp.reciprocal(a)),
    ("log1p", lambda xp, a, b: xp.log1p(a)), ("expm1", lambda xp, a, b: xp.expm1(a)),
    ("greater", lambda xp, a, b: a > b), ("isfinite", lambda xp, a, b: xp.isfinite(a)),
    ("isnan", lambda xp, a, b: xp.isnan(a)), ("where", lambda xp, a, b: xp.where(a > b, a, b)),
    ("clip", lambda xp, a, b: xp.clip(a, 0.75, 1.0)), ("sum", lambda xp, a, b: a.sum()),
    ("max", lambda xp, a, b: a.max()), ("matmul", lambda xp, a, b: a[None] @ b[:, None]),
    ("astype", lambda xp, a, b: a.astype(np.float32)),
)
_BF16_PROBED: dict = {}


def cupy_bfloat16():
    """(ok, reason): whether the importable CuPy runs every op the engine uses on bfloat16 arrays (ml_dtypes.bfloat16).

    Probed once per CuPy module (see _BF16_PROBES); the reason names the first op that fails.
    """
    cp = _try_cupy()
    if cp is None:
        return False, "CuPy is not importable"
    if id(cp) not in _BF16_PROBED:
        _BF16_PROBED[id(cp)] = _probe_bfloat16(cp)
    return _BF16_PROBED[id(cp)]


def _probe_bfloat16(cp):
    ver = getattr(cp, "__version__", "?")
    ha, hb = np.array([0.5, 2.0], np.float32), np.array([1.5, 0.25], np.float32)
    for name, f in _BF16_PROBES:
        try:
            a, b = cp.asarray(ha.astype(bfloat16)), cp.asarray(hb.astype(bfloat16))
            got = cp.asnumpy(f(cp, a, b)).astype(np.float32)
        except Exception as e:
            return False, f"CuPy {ver} lacks bfloat16 {name} ({type(e).__name__}: {e})"
        if not np.allclose(got, f(np, ha, hb).astype(np.float32), rtol=2e-2, atol=1e-2):
            return False, f"CuPy {ver}: bfloat16 {name} gave a wrong result"
    return True, ""


HOST_READ_CHECKS: list = []  # run before a device array is read to the host (hpcfsdp._kernels.checks registers)


def to_numpy(a):
    """Host ndarray for any backend array (copy for CuPy, identity for NumPy); first raises any deferred device check
    (See [Note: Deferred device checks] in hpcfsdp/_kernels/checks.py)."""
    if is_cupy_array(a):
        for check in HOST_READ_CHECKS:
            check()
        return a.get()
    return a


# ---------------------------------------------------------------------------------------------
# random generators (one per backend, reseeded by manual_seed)
_np_gen = np.random.default_rng(0)
_initial_seed = 0  # the seed _np_gen was made from (hp.initial_seed())


def generator(dev=None):
    """The random generator of a device's backend: a numpy Generator or CuPy's RandomState."""
    d = to_device(dev) if dev is not None else _CPU
    if d.type == "cuda":
        cp = _need_cupy()
        with cp.cuda.Device(d.index):
            return cp.random.get_random_state()
    return _np_gen


def generator_for(gen, dev=None):
    """The generator to draw from for ``generator=gen`` on ``dev``: the device's when gen is None, an
    hp.Generator's own (its device type must match), or gen itself (a NumPy or CuPy generator)."""
    if gen is None:
        return generator(dev)
    own = getattr(gen, "_backend_rng", None)
    if own is not None:
        return own(to_device(dev) if dev is not None else _CPU)
    if not hasattr(gen, "standard_normal"):
        raise TypeError(f"generator must be an hp.Generator, got {type(gen).__name__}")
    return gen


def _seed_cpu(seed):
    """Replace the CPU generator by one seeded with ``seed`` (PyTorch's range; negative seeds wrap to uint64)."""
    global _np_gen, _initial_seed
    seed = builtins.int(seed)
    if not -(1 << 63) <= seed < (1 << 64):
        raise ValueError(f"Seed must be within the range [-0x8000_0000_0000_0000, 0xffff_ffff_ffff_ffff], got {seed}")
    seed &= (1 << 64) - 1
    _np_gen = np.random.default_rng(seed)
    _initial_seed = seed
    return seed


def manual_seed(seed):
    """Seed NumPy's generator used by hp.randn/rand/randint/dropout, and CuPy's when present."""
    seed = _seed_cpu(seed)
    cp = _try_cupy()
    if cp is not None:
        try:
            for i in range(cp.cuda.runtime.getDeviceCount()):
                with cp.cuda.Device(i):
                    cp.random.seed(seed)
        except Exception:  # no visible GPU
            pass
    return seed


# ---------------------------------------------------------------------------------------------
# [Note: Host allocator]
# NumPy takes array memory from malloc. glibc serves large requests (above a dynamic threshold) with
# fresh mmap()s and returns the top of the heap to the OS once more than M_TRIM_THRESHOLD is free there,
# so every training step re-faults (and the kernel re-zeroes) the pages of its activations: on the
# small VMs this runs on, page faults cost as much as a third of the non-GEMM time of a GPT step.
# At import we fix the mmap threshold at glibc's maximum (32 MiB) and keep up to 1 GiB of freed heap,
# so activations of one step reuse the pages of the previous one, as PyTorch's caching allocators do.
# The price is resident memory: freed pages stay mapped, so peak RSS counts them. Where memory is the
# constraint, HPCFSDP_MALLOC_TUNE=memory does the opposite: every array of 1 MiB or more gets its own
# mapping, returned to the OS when freed (measured in BENCHMARKS.md: peak RSS per rank -6 %, step time
# +15 %). HPCFSDP_MALLOC_TUNE=0 leaves malloc alone.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def _tune_host_allocator():
    mode = _settings.get("HPCFSDP_MALLOC_TUNE")
    if mode == "off" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only (musl's mallopt does nothing)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    if mode == "memory":
        return builtins.bool(mallopt(_M_MMAP_THRESHOLD, 1 << 20))
    return builtins.bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and builtins.bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))


_HOST_ALLOCATOR_TUNED = _tune_host_allocator()


def host_allocator_tuned():
    """Whether glibc malloc was tuned for array reuse at import (See [Note: Host allocator])."""
    return _HOST_ALLOCATOR_TUNED
