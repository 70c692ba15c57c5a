"""Deferred device checks: a kernel records a bad input in a device flag, and the host raises at its next read."""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from .._backend import HOST_READ_CHECKS, _need_cupy
from .._settings import get as _setting

__all__ = ["defer", "raise_pending", "pending", "LIMIT"]

# [Note: Deferred device checks]
# Checking an input on the host (a target index in range) means reading a device value, which waits for the GPU and
# stalls the step (DESIGN.md decision 4: the step makes no host synchronisation). Instead the kernel that reads the
# input writes a flag (one int64; -1 = fine, else a row index) and the op hands it to ``defer`` with a function that
# turns the flag's value into the exception PyTorch would raise. The pending flags are read, all in ONE device-to-host
# copy, at the next point the host reads any device array (_backend.to_numpy: Tensor.item, tolist, cpu(), ...), which
# raises the first error in the order the checks were deferred. A flag is read on the current stream after it waits
# for the stream that wrote it. HPCFSDP_DEBUG_SYNC_CHECKS=1 reads each flag as soon as it is deferred (the eager check,
# at the op that got the bad input). A loop that never reads the host would let the list grow: at LIMIT pending flags
# they are read (one synchronisation per LIMIT checked ops).

LIMIT = 1024
_pending: list = []  # (flag, stream, error(value) -> Exception or None)
_lock = threading.Lock()


def defer(flag, error: Callable[[int], BaseException | None]) -> None:
    """Check device int64 ``flag`` (shape (1,)) later: ``error(value)`` returns the exception to raise, or None."""
    cp = _need_cupy()
    with _lock:
        _pending.append((flag, cp.cuda.get_current_stream(), error))
        full = len(_pending) >= LIMIT
    if full or _setting("HPCFSDP_DEBUG_SYNC_CHECKS"):
        raise_pending()


def pending() -> int:
    """How many deferred checks are waiting to be read."""
    return len(_pending)


def raise_pending() -> None:
    """Read every pending flag with one device-to-host copy and raise the first error among them (they are cleared)."""
    if not _pending:
        return
    with _lock:
        items = list(_pending)
        _pending.clear()
    cp = _need_cupy()
    cur = cp.cuda.get_current_stream()
    for s in {s.ptr: s for _, s, _ in items}.values():
        if s.ptr != cur.ptr:
            cur.wait_event(s.record())
    flags = items[0][0] if len(items) == 1 else cp.concatenate([f.reshape(1) for f, _, _ in items])
    values = np.asarray(flags.get()).reshape(-1)
    for (_, _, error), v in zip(items, values):
        e = error(int(v))
        if e is not None:
            raise e


HOST_READ_CHECKS.append(raise_pending)
