"""What the simulated device did: kernel launches, host synchronisations (each with its call site) and pool memory."""
from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading

__all__ = ["Counts", "counting", "wire"]

# [Note: Simulated device counts]
# A launch is one operation queued on a stream that runs on the device: a kernel (elementwise, reduction, a
# product as its one cuBLAS call, a random draw, a fused RawModule kernel), a device-to-device copy, a fill
# or memset (zeros, ones, full; not empty, which only allocates), an NCCL collective. An operation that
# returns its input or a view of it (a view, ascontiguousarray of a contiguous array, astype to the same
# dtype with copy=False) launches nothing, as in CuPy. A host transfer is no launch: device-to-host reads
# (get, asnumpy, item, float(), tolist, repr) and host-to-device uploads (cupy.array of host data, set,
# __setitem__ of a host array). A host sync is one call after which the host has waited for the device:
# Stream/Event/Device.synchronize, every blocking read, and an upload from pageable host memory (an upload
# from pinned memory on a stream is asynchronous; the Stream/Event ``done`` queries do not wait, as
# cudaStreamQuery/cudaEventQuery, and FSDP's watchdog polls them on its own thread); one per call the caller
# made, however the simulation orders it inside. Its site is the caller's frame: the first outside
# hpcfsdp/testing and the helpers of hpcfsdp/_array.py and _backend.py (else the innermost outside the
# simulation), as "path:line in function", the path relative to the checkout.
# Counting is process-wide: every thread's launches and syncs count (FSDP's communication thread enqueues
# too), on every device; memory is the window's device's (current at entry): allocated_bytes sums the pool
# blocks taken (rounded to 512 bytes, as CuPy's pool), peak_bytes is the most bytes in use, starting from
# those in use at entry. A label (Counts.label, Counts.section) is process-wide too: while it is set,
# everything also counts in per_unit[label]. With no window open a hook costs one module-level None check
# (OPEN), which the simulation makes before calling here.

OPEN: tuple | None = None  # the open windows (Counts), or None
_DEVICE = []  # (current device(), used bytes(dev)): set by wire() from _sim_pool, which builds on this module
_lock = threading.Lock()
_TESTING = os.path.dirname(os.path.abspath(__file__)) + os.sep
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ROOT = os.path.dirname(_PKG) + os.sep
_HELPERS = frozenset(os.path.join(_PKG, f) for f in ("_array.py", "_backend.py"))


class Counts:
    """The counts of one ``counting()`` window (see [Note: Simulated device counts]): ``launches`` and
    ``launches_by_op`` (a Counter of op names), ``host_syncs`` ([(kind, site)]), ``allocated_bytes``,
    ``peak_bytes`` (and ``start_bytes``, in use at entry); ``per_unit``: label -> the Counts while it was set."""

    def __init__(self, dev: int, used: int):
        self.launches = 0
        self.launches_by_op: collections.Counter = collections.Counter()
        self.host_syncs: list[tuple[str, str]] = []
        self.allocated_bytes = 0
        self.start_bytes = self.peak_bytes = used
        self.per_unit: dict[str, Counts] = {}
        self._dev = dev
        self._label = None
        self._unit = None  # per_unit[self._label]

    def label(self, name: str | None) -> None:
        """Count what follows also in ``per_unit[name]`` (None: in no unit), until the next label."""
        used = _used(self._dev)
        with _lock:
            self._label = name
            if name is None:
                self._unit = None
                return
            u = self.per_unit.get(name)
            if u is None:
                u = self.per_unit[name] = Counts(self._dev, used)
            u.peak_bytes = max(u.peak_bytes, used)
            self._unit = u

    @contextlib.contextmanager
    def section(self, name: str):
        """``label(name)`` inside the block, the previous label after it; yields ``per_unit[name]``."""
        prev = self._label
        self.label(name)
        try:
            yield self.per_unit[name]
        finally:
            self.label(prev)

    def sites(self) -> collections.Counter:
        """Host syncs per call site."""
        return collections.Counter(site for _, site in self.host_syncs)

    def __repr__(self):
        return (f"Counts(launches={self.launches}, host_syncs={len(self.host_syncs)}, "
                f"allocated_bytes={self.allocated_bytes}, peak_bytes={self.peak_bytes})")


def wire(current_device, used_bytes) -> None:
    """``current_device()`` and ``used_bytes(dev)``: the simulation's, for the windows' memory figures."""
    _DEVICE[:] = [current_device, used_bytes]


def _used(dev: int) -> int:
    return _DEVICE[1](dev)


@contextlib.contextmanager
def counting():
    """Count what the simulated device does inside the block, in every thread; yields the Counts."""
    global OPEN
    dev = _DEVICE[0]()
    c = Counts(dev, _used(dev))
    with _lock:
        OPEN = (OPEN or ()) + (c,)
    try:
        yield c
    finally:
        with _lock:
            OPEN = tuple(x for x in OPEN if x is not c) or None


# -- the hooks (the simulation calls them only while OPEN is not None) --------------------------------------
def launch(op: str) -> None:
    """One launch of ``op``."""
    with _lock:
        for c in OPEN or ():
            for x in (c, c._unit):
                if x is not None:
                    x.launches += 1
                    x.launches_by_op[op] += 1


def host_sync(kind: str) -> None:
    """One host sync of ``kind`` (a no-op with no window open), its site the caller's."""
    if OPEN is None:
        return
    site = _site(sys._getframe(1))
    with _lock:
        for c in OPEN or ():
            for x in (c, c._unit):
                if x is not None:
                    x.host_syncs.append((kind, site))


def allocated(dev: int, size: int, used: int) -> None:
    """A pool block of ``size`` bytes taken on device ``dev``, ``used`` bytes now in use there."""
    with _lock:
        for c in OPEN or ():
            if c._dev == dev:
                for x in (c, c._unit):
                    if x is not None:
                        x.allocated_bytes += size
                        if used > x.peak_bytes:
                            x.peak_bytes = used


def _site(f) -> str:
    inner = None
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_TESTING):
            if inner is None:
                inner = f
            if fn not in _HELPERS:
                break
        f = f.f_back
    f = f or inner
    if f is None:
        return "?"
    fn = f.f_code.co_filename
    return f"{fn[len(_ROOT):] if fn.startswith(_ROOT) else fn}:{f.f_lineno} in {f.f_code.co_name}"
