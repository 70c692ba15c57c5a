"""CuPy's device memory pool, simulated: blocks freed to their allocation stream's arena and reused there,
carrying the accesses of other streams still pending on them (see [Note: Simulated device] in cuda_sim)."""
from __future__ import annotations

from . import _sim_counters as _ctr
from . import _sim_runtime as _rt
from ._sim_buffers import _Buf
from ._sim_runtime import _lock, _where

__all__ = ["alloc", "MemoryPool", "PinnedMemoryPool", "UNIT", "device_peak_bytes", "reset_device_peak"]

_rt.SIM_FILES.add(__file__)

# [Note: Simulated memory pool]
# Facts from CuPy's cupy/cuda/memory.pyx (SingleDeviceMemoryPool): a request is rounded up to a multiple
# of 512 bytes (ALLOCATION_UNIT_SIZE, cudaMalloc's alignment); a zero-byte request takes no block; a
# block is taken from the arena of the stream current at malloc (one arena per stream), and a freed
# block goes back to the arena of the stream it was allocated on, whatever stream used it since; it is
# reused for the next fitting request on that stream with no synchronisation (the CUDA stream semantics
# make that safe for work on the allocation stream only: PyTorch's record_stream problem). What the
# freeing thread knows complete when it frees is ordered before any reuse (the pool's lock orders the
# free before the next malloc): only the accesses it does not know complete stay with the block.
# used_bytes() is the bytes of blocks in use, total_bytes() those held from the device (in use or
# free), free_all_blocks() gives the free blocks back to the device. The simulation reuses a free block
# only for a request of the same rounded size (CuPy also splits larger free blocks and merges
# neighbours, which the simulation does not: it finds fewer reuses, never a false one). A reused block
# brings the accesses still recorded on the freed buffer: the new array's first access on a stream they
# are not ordered before (an event waited, a synchronize) raises a "memory-pool reuse" hazard.

UNIT = 512


def _round(n: int) -> int:
    return (n + UNIT - 1) // UNIT * UNIT


class _DevicePool:
    """One device's pool: free blocks per (allocation stream, rounded size)."""

    __slots__ = ("dev", "used", "peak", "free", "nfree")

    def __init__(self, dev: int):
        self.dev = dev
        self.used = 0
        self.peak = 0  # the high-water mark of used (see [Note: Simulated device counts] in _sim_counters)
        self.free: dict[int, dict[int, list]] = {}  # stream id -> rounded size -> [(pending, reads, note)]
        self.nfree = 0  # bytes in free blocks

    def take(self, buf: _Buf, stream, size: int) -> None:
        with _lock:
            self.used += size
            if self.used > self.peak:
                self.peak = self.used
            if _ctr.OPEN is not None:
                _ctr.allocated(self.dev, size, self.used)
            bins = self.free.get(stream.id)
            blocks = bins.get(size) if bins else None
            if not blocks:
                return
            pending, reads, note = blocks.pop()
            self.nfree -= size
        if pending or reads:
            buf.pending.update((k, (e[0], e[1], e[2], note)) for k, e in pending.items())
            buf.reads.update((k, (e[0], e[1], e[2], note)) for k, e in reads.items())

    def _release(self, buf: _Buf) -> None:
        """The last view of ``buf`` died: its block goes back to its allocation stream's arena, with the
        accesses recorded on it (they stay pending for the block's next user)."""
        try:
            size, home = buf.size, buf.home
            pending, reads = buf.pending, buf.reads
            note = None
            if pending or reads:
                with _lock:  # what the freeing thread knows complete is ordered before the reuse (the pool's lock)
                    known = _rt.host().vc
                    pending = {k: e for k, e in pending.items() if known.get(k, 0) < e[0]}
                    reads = {k: e for k, e in reads.items() if known.get(k, 0) < e[0]}
                if pending or reads:
                    others = any(k != home for k in pending) or any(k != home for k in reads)
                    note = (size, home, _where(3) if others else ())
            with _lock:
                self.used -= size
                self.free.setdefault(home, {}).setdefault(size, []).append((pending, reads, note))
                self.nfree += size
        except Exception:  # noqa: BLE001 (interpreter shutdown: module state already gone)
            pass

    def free_all(self, stream=None) -> None:
        with _lock:
            keys = list(self.free) if stream is None else [stream.id]
            for k in keys:
                for size, blocks in self.free.pop(k, {}).items():
                    self.nfree -= size * len(blocks)


_POOLS: dict[int, _DevicePool] = {}


def _pool(dev: int) -> _DevicePool:
    p = _POOLS.get(dev)
    if p is None:
        with _lock:
            p = _POOLS.setdefault(dev, _DevicePool(dev))
    return p


def alloc(dev: int, nbytes: int, stream=None) -> _Buf:
    """A buffer for ``nbytes`` bytes on device ``dev`` from its pool, on ``stream`` (default: the calling
    thread's current stream of ``dev``); a reused block brings its pending accesses."""
    buf = _Buf(dev)
    size = _round(int(nbytes))
    if size == 0:
        return buf
    s = stream or _rt.get_current_stream(dev)
    p = _pool(dev)
    buf.home, buf.size = s.id, size
    p.take(buf, s, size)
    buf.pool = p
    return buf


_ctr.wire(_rt._cur_dev, lambda dev: _pool(dev).used)


def device_peak_bytes(dev: int | None = None) -> int:
    """The most bytes in use at once in device ``dev``'s pool (default: the current device) since the process
    started or ``reset_device_peak`` (CuPy's pool has no such query: see [Note: Simulated device counts])."""
    return _pool(_rt._cur_dev() if dev is None else dev).peak


def reset_device_peak(dev: int | None = None) -> None:
    """Start device ``dev``'s high-water mark again from the bytes in use now."""
    p = _pool(_rt._cur_dev() if dev is None else dev)
    with _lock:
        p.peak = p.used


class MemoryPool:
    """cupy.cuda.MemoryPool: every query is about the calling thread's current device."""

    def used_bytes(self) -> int:
        return _pool(_rt._cur_dev()).used

    def free_bytes(self) -> int:
        return _pool(_rt._cur_dev()).nfree

    def total_bytes(self) -> int:
        p = _pool(_rt._cur_dev())
        return p.used + p.nfree

    def n_free_blocks(self) -> int:
        p = _pool(_rt._cur_dev())
        with _lock:
            return sum(len(b) for bins in p.free.values() for b in bins.values())

    def free_all_blocks(self, stream=None) -> None:
        _pool(_rt._cur_dev()).free_all(stream)


class PinnedMemoryPool:
    """cupy.cuda.PinnedMemoryPool: the simulation's pinned allocations are not pooled (nothing to free)."""

    def free_all_blocks(self) -> None:
        pass

    def n_free_blocks(self) -> int:
        return 0
