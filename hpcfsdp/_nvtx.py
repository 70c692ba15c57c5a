"""hpcfsdp.cuda.nvtx: PyTorch's ``torch.cuda.nvtx`` ranges and marks, through CuPy's NVTX on a real GPU."""
import contextlib
import itertools
import threading

from . import _backend

__all__ = ["range_push", "range_pop", "range_start", "range_end", "mark", "range"]

# [Note: NVTX ranges]
# On a machine where CuPy sees a real GPU, ranges and marks go to NVTX through cupy.cuda.nvtx (Nsight Systems
# shows them on the thread's timeline, around the kernels CuPy launched). Elsewhere (no CuPy, no GPU, the
# simulated device) the calls do nothing but keep the bookkeeping, so code written for a GPU runs and nests
# the same: range_push returns the zero-based depth of the range it starts and range_pop that of the range
# it ends (-1 with no open range), per thread as NVTX's push/pop ranges are; range_start returns an id that
# range_end takes, from any thread. Which of the two is decided once, at the first call.

_tls = threading.local()
_ids = itertools.count(1)
_open = {}  # range_start id -> message (the no-op path's record of start/end ranges)
_lib = None  # cupy.cuda.nvtx, or False for the no-op path; None until the first call


def _nvtx():
    global _lib
    if _lib is None:
        lib = False
        if _backend.cupy_available() and not _backend.cuda_simulated():
            try:
                import cupy.cuda.nvtx as lib  # noqa: PLC0415
            except Exception:  # a CuPy built without NVTX: ranges are then only bookkept
                lib = False
            if lib is not False and not getattr(lib, "available", True):
                lib = False
        _lib = lib
    return _lib


def _stack() -> list:
    s = getattr(_tls, "stack", None)
    if s is None:
        s = _tls.stack = []
    return s


def _message(msg) -> str:
    if not isinstance(msg, str):
        raise TypeError(f"nvtx: expected a str message, got {type(msg).__name__} {msg!r}")
    return msg


def range_push(msg: str) -> int:
    """Start a nested range on this thread; returns its zero-based depth."""
    msg = _message(msg)
    lib = _nvtx()
    if lib:
        lib.RangePush(msg)
    s = _stack()
    s.append(msg)
    return len(s) - 1


def range_pop() -> int:
    """End this thread's innermost range; returns its zero-based depth (-1 when none is open)."""
    s = _stack()
    if not s:
        return -1
    lib = _nvtx()
    if lib:
        lib.RangePop()
    s.pop()
    return len(s)


def range_start(msg: str) -> int:
    """Start a range that may end on another thread (not nested); returns the id range_end takes."""
    msg = _message(msg)
    lib = _nvtx()
    rid = lib.RangeStart(msg) if lib else next(_ids)
    _open[rid] = msg
    return rid


def range_end(range_id: int) -> None:
    """End the range that range_start returned ``range_id`` for."""
    if range_id not in _open:
        raise ValueError(f"nvtx.range_end({range_id!r}): no open range has this id (from range_start)")
    del _open[range_id]
    lib = _nvtx()
    if lib:
        lib.RangeEnd(range_id)


def mark(msg: str) -> None:
    """An instantaneous event."""
    msg = _message(msg)
    lib = _nvtx()
    if lib:
        lib.Mark(msg)


@contextlib.contextmanager
def range(msg: str, *args, **kwargs):  # noqa: A001 (PyTorch's name)
    """``with nvtx.range("step {}", i):`` a nested range around the block (msg formatted with the arguments)."""
    range_push(msg.format(*args, **kwargs) if args or kwargs else _message(msg))
    try:
        yield
    finally:
        range_pop()
