"""hpcfsdp.cuda: PyTorch's ``torch.cuda`` runtime functions on CuPy (devices, memory, streams, seeds)."""
import sys

from . import _backend, accelerator

__all__ = [
    "is_available", "device_count", "is_initialized", "init", "current_device", "set_device", "synchronize",
    "manual_seed", "manual_seed_all", "empty_cache", "memory_stats", "memory_allocated", "max_memory_allocated",
    "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats", "mem_get_info", "is_bf16_supported",
    "get_device_name", "get_device_capability", "get_device_properties", "device", "device_of", "Stream", "Event",
    "current_stream", "default_stream", "set_stream", "stream", "StreamContext",
]

# [Note: torch.cuda on CuPy]
# hpcfsdp reaches CUDA through CuPy (real, or the simulated device under HPCFSDP_CUDA_SIM=1); device
# counting and selection are hpcfsdp.accelerator's, synchronisation and seeding _backend's. Without CUDA
# these functions answer as a CPU-only PyTorch build does: is_available() is False, device_count() 0,
# memory_allocated() 0, manual_seed and empty_cache do nothing, and what needs a device raises
# AssertionError("Torch not compiled with CUDA enabled") when CuPy is missing (PyTorch built without CUDA),
# RuntimeError("No CUDA GPUs are available") when CuPy sees no GPU (a CUDA build on a machine without one).
#
# Memory is CuPy's default memory pool (the analogue of PyTorch's caching allocator): allocated bytes are
# the pool's used bytes on the device, reserved bytes its total bytes. CuPy keeps no peaks, so the peaks
# here are the largest values seen when this module sampled the pool: every memory_* call, synchronize()
# and empty_cache(). The reserved peak is exact (the pool only grows until blocks are freed, and
# empty_cache samples before freeing); the allocated peak is a lower bound that misses peaks between
# samples, so a training loop that wants it calls memory_allocated() (or synchronize()) where it peaks.

_NO_CUDA = ("Torch not compiled with CUDA enabled: hpcfsdp reaches CUDA through CuPy, which is not importable "
            "(install hpcfsdp with the 'cuda12' or 'cuda13' extra)")
_peaks = {}  # device index -> [peak allocated, peak reserved]


def is_available() -> bool:
    """True when CuPy is importable and sees at least one GPU."""
    return accelerator.is_available()


def device_count() -> int:
    """The number of visible GPUs (0 without CuPy or without a GPU)."""
    return accelerator.device_count()


def is_initialized() -> bool:
    """True once CuPy is loaded in this process and sees a GPU (PyTorch: CUDA was initialised)."""
    return "cupy" in sys.modules and accelerator.is_available()


def _lazy_init():
    """CuPy, or PyTorch's error for a machine without CUDA (See [Note: torch.cuda on CuPy])."""
    if not _backend.cupy_available():
        if "needs a CUDA GPU" in _backend.cupy_unavailable_reason():  # PyTorch built with CUDA, no GPU here
            raise RuntimeError("No CUDA GPUs are available: CuPy is importable but sees no CUDA device")
        raise AssertionError(_NO_CUDA)
    if accelerator.device_count() == 0:
        raise RuntimeError("No CUDA GPUs are available: CuPy is importable but sees no CUDA device")
    return _backend._try_cupy()


def init() -> None:
    """Initialise CUDA (check that a GPU is there); raises as PyTorch does without one."""
    _lazy_init()


def _device_index(dev, optional=True) -> int:
    """PyTorch's _get_device_index: an int, "cuda", "cuda:N" or an hp.device; None (or no index) is the
    current device when ``optional``; a negative int is returned as is (PyTorch's "no device")."""
    if isinstance(dev, bool):
        raise TypeError(f"expected a CUDA device index, got {dev!r}")
    if isinstance(dev, int):
        return dev
    if dev is None:
        idx = None
    else:
        if isinstance(dev, str):
            dev = _backend.device(dev)
        if not isinstance(dev, _backend.device):
            raise TypeError(f"expected a CUDA device (int, 'cuda:N' or hp.device), got {dev!r}")
        if dev.type != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {dev}")
        idx = dev.index
    if idx is None:
        if not optional:
            raise ValueError(f"Expected a cuda device with a specified index or an integer, but got: {dev}")
        return current_device()
    return idx


def current_device() -> int:
    """The index of the calling thread's current GPU."""
    _lazy_init()
    return accelerator.current_device_index()


def set_device(device) -> None:
    """Make ``device`` (an int, "cuda:N" or an hp.device) the calling thread's current GPU; negative: no-op."""
    idx = _device_index(device)
    if idx < 0:
        return
    _lazy_init()
    accelerator.set_device_index(idx)


def synchronize(device=None) -> None:
    """Wait for all work queued on a GPU (the current one by default)."""
    _lazy_init()
    idx = _device_index(device)
    _backend.synchronize(idx)
    _sample(idx)


def manual_seed(seed) -> None:
    """Seed the random generator of the current GPU (nothing without CUDA, as PyTorch)."""
    seed = int(seed)
    if is_available():
        cp = _backend._try_cupy()
        with cp.cuda.Device(current_device()):
            cp.random.seed(seed)


def manual_seed_all(seed) -> None:
    """Seed the random generators of all GPUs (nothing without CUDA, as PyTorch)."""
    seed = int(seed)
    if is_available():
        cp = _backend._try_cupy()
        for i in range(device_count()):
            with cp.cuda.Device(i):
                cp.random.seed(seed)


# ---------------------------------------------------------------------------------------------
# memory: CuPy's default pool (See [Note: torch.cuda on CuPy])
def _pool_bytes(idx):
    """(used, total) bytes of CuPy's default memory pool on device ``idx``."""
    cp = _backend._try_cupy()
    pool = cp.get_default_memory_pool()
    with cp.cuda.Device(idx):
        return int(pool.used_bytes()), int(pool.total_bytes())


def _sample(idx):
    used, total = _pool_bytes(idx)
    peak = _peaks.setdefault(idx, [0, 0])
    peak[0], peak[1] = max(peak[0], used), max(peak[1], total)
    return used, total, peak[0], peak[1]


def memory_stats(device=None) -> dict:
    """PyTorch's memory_stats keys for the "all" pool: allocated/reserved bytes, current and peak ({} without CUDA)."""
    if not is_available():
        return {}
    used, total, peak_used, peak_total = _sample(_device_index(device))
    return {"allocated_bytes.all.current": used, "allocated_bytes.all.peak": peak_used,
            "reserved_bytes.all.current": total, "reserved_bytes.all.peak": peak_total}


def memory_allocated(device=None) -> int:
    """Bytes of GPU memory in use by arrays (CuPy pool's used bytes; 0 without CUDA)."""
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None) -> int:
    """The peak of memory_allocated since the start or reset_peak_memory_stats (sampled; see the module Note)."""
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None) -> int:
    """Bytes of GPU memory held by the CuPy pool (used and cached; 0 without CUDA)."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None) -> int:
    """The peak of memory_reserved since the start or reset_peak_memory_stats."""
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device=None) -> None:
    """Restart the peaks from the current allocated and reserved bytes."""
    _lazy_init()
    idx = _device_index(device)
    used, total = _pool_bytes(idx)
    _peaks[idx] = [used, total]


def empty_cache() -> None:
    """Return the CuPy pool's cached, unused blocks to CUDA (nothing without CUDA)."""
    if not is_available():
        return
    cp = _backend._try_cupy()
    for i in range(device_count()):
        _sample(i)
        with cp.cuda.Device(i):
            cp.get_default_memory_pool().free_all_blocks()


def mem_get_info(device=None) -> tuple:
    """(free, total) bytes of GPU memory, from the CUDA driver."""
    cp = _lazy_init()
    with cp.cuda.Device(_device_index(device)):
        free, total = cp.cuda.runtime.memGetInfo()
    return int(free), int(total)


# ---------------------------------------------------------------------------------------------
# device properties
class _CudaDeviceProperties:
    """What torch.cuda.get_device_properties gives: name, total_memory, major, minor, multi_processor_count."""

    def __init__(self, props):
        name = props["name"]
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        self.total_memory = int(props["totalGlobalMem"])
        self.major, self.minor = int(props["major"]), int(props["minor"])
        self.multi_processor_count = int(props["multiProcessorCount"])

    def __repr__(self):
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // 2**20}MB, multi_processor_count={self.multi_processor_count})")


def get_device_properties(device=None) -> _CudaDeviceProperties:
    """The properties of a GPU (the current one by default)."""
    cp = _lazy_init()
    return _CudaDeviceProperties(cp.cuda.runtime.getDeviceProperties(_device_index(device)))


def get_device_name(device=None) -> str:
    """The name of a GPU (the current one by default)."""
    return get_device_properties(device).name


def get_device_capability(device=None) -> tuple:
    """(major, minor) compute capability of a GPU (the current one by default)."""
    p = get_device_properties(device)
    return p.major, p.minor


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Whether CuPy computes with bfloat16 on the current GPU (False without CUDA).

    Without ``including_emulation`` the GPU must also have bfloat16 hardware (compute capability 8.0+).
    """
    if not is_available() or not _backend.cupy_bfloat16()[0]:
        return False
    return including_emulation or get_device_capability() >= (8, 0)


class device:  # noqa: N801  (PyTorch's name)
    """``with hp.cuda.device(i):`` makes GPU ``i`` current inside the block; None or a negative index: no change."""

    def __init__(self, device):
        self.idx = -1 if device is None else _device_index(device, optional=False)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            if not _backend.cupy_available():
                raise RuntimeError("PyTorch was compiled without CUDA support: hpcfsdp reaches CUDA through CuPy, "
                                   "which is not importable")
            _lazy_init()
            self.prev_idx = accelerator.current_device_index()
            if self.prev_idx != self.idx:
                accelerator.set_device_index(self.idx)
        return self

    def __exit__(self, *exc):
        if self.idx >= 0 and self.prev_idx != self.idx:
            accelerator.set_device_index(self.prev_idx)
        return False


class device_of(device):  # noqa: N801  (PyTorch's name)
    """``with hp.cuda.device_of(t):`` makes the GPU of tensor ``t`` current; a CPU tensor changes nothing."""

    def __init__(self, obj):
        d = obj.device
        super().__init__(d.index if d.type == "cuda" else -1)


# ---------------------------------------------------------------------------------------------
# streams and events: thin wrappers of cupy.cuda.Stream / cupy.cuda.Event
class Stream:
    """A CUDA stream (a non-blocking CuPy stream) on ``device`` (the current GPU by default).

    hpcfsdp's kernels run on CuPy's current stream, so ``with hp.cuda.stream(s):`` queues them on ``s``.
    """

    def __init__(self, device=None, priority=0, **kwargs):
        if not is_available():
            raise RuntimeError("torch.cuda.Stream requires CUDA support: hpcfsdp found no CuPy GPU")
        cp = _backend._try_cupy()
        stream = kwargs.pop("_cupy_stream", None)
        if kwargs:
            raise TypeError(f"Stream() got unexpected arguments {sorted(kwargs)}")
        if stream is None:
            with cp.cuda.Device(_device_index(device)):
                stream = cp.cuda.Stream(non_blocking=True)
        self._stream = stream
        self.priority = priority

    @classmethod
    def _wrap(cls, cupy_stream):
        return cls(_cupy_stream=cupy_stream)

    @property
    def device(self):
        """The GPU of this stream, as hp.device("cuda", i)."""
        dev = getattr(self._stream, "device_id", None)
        return _backend.device("cuda", int(dev) if dev is not None and dev >= 0 else current_device())

    @property
    def cuda_stream(self) -> int:
        """The raw cudaStream_t handle."""
        return int(self._stream.ptr)

    def wait_event(self, event) -> None:
        """Make future work on this stream wait for ``event``."""
        self._stream.wait_event(event._event)

    def wait_stream(self, stream) -> None:
        """Make future work on this stream wait for all work queued so far on ``stream``."""
        self.wait_event(stream.record_event())

    def record_event(self, event=None):
        """Record ``event`` (a new Event by default) on this stream and return it."""
        event = Event() if event is None else event
        event.record(self)
        return event

    def query(self) -> bool:
        """True when all work queued on this stream has completed."""
        return bool(self._stream.done)

    def synchronize(self) -> None:
        """Wait until all work queued on this stream has completed."""
        self._stream.synchronize()

    def __eq__(self, other):
        if not isinstance(other, Stream):
            return NotImplemented
        return self._stream is other._stream or (self.cuda_stream == other.cuda_stream and self.device == other.device)

    def __hash__(self):
        return hash((self.cuda_stream, self.device))

    def __repr__(self):
        return f"<hpcfsdp.cuda.Stream device={self.device} cuda_stream={self.cuda_stream:#x}>"


class Event:
    """A CUDA event (cupy.cuda.Event): a point in a stream to wait for, query or time."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        if not is_available():
            raise RuntimeError("torch.cuda.Event requires CUDA support: hpcfsdp found no CuPy GPU")
        cp = _backend._try_cupy()
        self._event = cp.cuda.Event(block=blocking, disable_timing=not enable_timing, interprocess=interprocess)

    def record(self, stream=None) -> None:
        """Record the event on ``stream`` (the current stream by default)."""
        self._event.record((current_stream() if stream is None else stream)._stream)

    def wait(self, stream=None) -> None:
        """Make future work on ``stream`` (the current stream by default) wait for this event."""
        (current_stream() if stream is None else stream).wait_event(self)

    def query(self) -> bool:
        """True when the work recorded before this event has completed."""
        return bool(self._event.done)

    def synchronize(self) -> None:
        """Wait until the work recorded before this event has completed."""
        self._event.synchronize()

    def elapsed_time(self, end_event) -> float:
        """Milliseconds between this event and ``end_event`` (both recorded, with enable_timing=True)."""
        return float(_backend._try_cupy().cuda.get_elapsed_time(self._event, end_event._event))


def current_stream(device=None) -> Stream:
    """The calling thread's current stream on a GPU (the current one by default)."""
    cp = _lazy_init()
    with cp.cuda.Device(_device_index(device)):
        return Stream._wrap(cp.cuda.get_current_stream())


def default_stream(device=None) -> Stream:
    """The default (legacy null) stream of a GPU (the current one by default)."""
    cp = _lazy_init()
    with cp.cuda.Device(_device_index(device)):
        return Stream._wrap(cp.cuda.Stream.null)


def set_stream(stream) -> None:
    """Make ``stream`` the current stream of its GPU (None: no change)."""
    if stream is not None:
        stream._stream.use()


class StreamContext:
    """``with hp.cuda.stream(s):`` queues work on ``s`` and makes its GPU current; None changes nothing."""

    def __init__(self, stream):
        self.stream = stream
        self._device = None

    def __enter__(self):
        if self.stream is not None:
            self._device = device(self.stream.device.index)
            self._device.__enter__()
            self.stream._stream.__enter__()
        return self.stream

    def __exit__(self, *exc):
        if self.stream is not None:
            self.stream._stream.__exit__(*exc)
            self._device.__exit__(*exc)
        return False


def stream(stream) -> StreamContext:
    """A context manager that makes ``stream`` current (PyTorch's torch.cuda.stream)."""
    return StreamContext(stream)


# torch.cuda.amp (deprecated GradScaler/autocast); importable as hpcfsdp.cuda.amp although this is a module
from .amp import _cuda as amp  # noqa: E402

sys.modules[__name__ + ".amp"] = amp
# torch.cuda.nvtx, importable as hpcfsdp.cuda.nvtx in the same way (See [Note: NVTX ranges] in hpcfsdp/_nvtx.py)
from . import _nvtx as nvtx  # noqa: E402

sys.modules[__name__ + ".nvtx"] = nvtx
