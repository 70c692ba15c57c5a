"""FSDP's copies between a group's rank-major flat buffer and its parameters as one launch each (fsdp.cu)."""
from __future__ import annotations

import collections
import threading

import numpy as np

from .._backend import array_module, pinned_empty
from ._registry import kernel, launch
from .optim import grid_for
from .tables import RETIRED, TableCache

__all__ = ["GroupCopies", "ALIGN"]

BLOCK = 256
ALIGN = 64  # elements: where each parameter starts in the copy-out destination (cuBLAS likes aligned operands)
_META = [("meta", "in", "long long"), ("nparams", "scalar", "int"), ("total", "scalar", "long long"),
         ("n", "scalar", "long long")]


def _spans(meta, total, n):
    """(param index, rank, flat start, length, full start) of each piece of the rank-major buffer (NumPy)."""
    world = n // total if total else 0
    for i, (off, chunk, full, _dst) in enumerate(meta.reshape(-1, 4).tolist()):
        for r in range(world):
            a, b = r * chunk, min((r + 1) * chunk, full)
            if b > a:
                yield i, r * total + off, b - a, a


@kernel("fsdp_copy_out", "fsdp", [("src", "in"), ("dst", "out")] + _META)
def _copy_out_twin(args, dtype):
    src, dst, meta, nparams, total, n = args
    for i, s, ln, g in _spans(meta, int(total), int(n)):
        d = int(meta[4 * i + 3])
        dst[d + g:d + g + ln] = src[s:s + ln]


def _copy_in(args, dtype):
    grads, dst, meta, nparams, total, n = args
    dst[...] = 0
    for i, s, ln, g in _spans(meta, int(total), int(n)):
        dst[s:s + ln] = grads[i].reshape(-1)[g:g + ln]


kernel("fsdp_copy_in", "fsdp", [("grads", "table"), ("dst", "out")] + _META)(_copy_in)
kernel("fsdp_copy_in_f32", "fsdp", [("grads", "table"), ("dst", "out", "float")] + _META)(_copy_in)


class GroupCopies:
    """One FSDP group's fused copies: the layouts' metadata uploaded once (it never changes), the gradients' address
    table per reduction (their arrays are new each backward: an asynchronous upload from pinned memory)."""

    def __init__(self, layouts, total: int, world: int):
        self.total, self.world, self.n = int(total), int(world), int(total) * int(world)
        order = sorted(range(len(layouts)), key=lambda i: layouts[i].offset)
        self.order = order
        self.fulls = [layouts[i].rows * layouts[i].row_numel for i in range(len(layouts))]
        self.starts, pos = [0] * len(layouts), 0
        for i in order:
            self.starts[i] = pos
            pos += -(-self.fulls[i] // ALIGN) * ALIGN
        self.size = pos
        self._host = np.array([[layouts[i].offset, layouts[i].numel, self.fulls[i], self.starts[i]] for i in order],
                              np.int64).reshape(-1)
        self._dev = {}  # device -> the metadata on it
        self._tables = TableCache()
        self._lock = threading.Lock()
        self._kept = collections.deque(maxlen=RETIRED)  # partial groups' pinned metadata, as TableCache retires

    def _meta(self, like, have=None):
        xp = array_module(like)
        if have is not None and not all(have):  # a parameter without gradient: its pieces read as zeros
            host = self._host.copy().reshape(-1, 4)
            host[[k for k, i in enumerate(self.order) if not have[i]], 2] = 0
            pinned = pinned_empty(host.size, np.int64)
            pinned[...] = host.reshape(-1)
            dev = xp.empty(host.size, np.int64)
            dev.set(pinned, stream=xp.cuda.get_current_stream())
            return dev, pinned
        key = like.device.id
        with self._lock:
            dev = self._dev.get(key)
            if dev is None:
                pinned = pinned_empty(self._host.size, np.int64)
                pinned[...] = self._host
                dev = xp.empty(self._host.size, np.int64)
                dev.set(pinned, stream=xp.cuda.get_current_stream())
                self._dev[key] = (dev, pinned)
            return self._dev[key][0], None  # (its pinned source is kept with it)

    def copy_out(self, out):
        """The all-gather output (world * total,) -> one buffer of every parameter's full data; returns it and the
        flat views (full_i elements each, in layout order)."""
        xp = array_module(out)
        dst = xp.empty(self.size, out.dtype)
        meta, _ = self._meta(out)
        launch("fsdp_copy_out", out.dtype, grid_for(self.n, BLOCK), BLOCK,
               (out, dst, meta, len(self.fulls), self.total, self.n))
        return [dst[s:s + f] for s, f in zip(self.starts, self.fulls)]

    def copy_in(self, grads, inp):
        """Every parameter's gradient (contiguous, one dtype; None: zeros) -> the reduce-scatter input (world *
        total,) of float32 or the gradients' dtype."""
        have = [g is not None for g in grads]
        present = [g for g in grads if g is not None]
        table_arrays = [g if g is not None else present[0] for g in grads]
        table_arrays = [table_arrays[i] for i in self.order]
        (table,), _, _ = self._tables.tables("grads", [table_arrays])
        meta, keep = self._meta(inp, have)
        name = "fsdp_copy_in" if inp.dtype == present[0].dtype else "fsdp_copy_in_f32"
        launch(name, present[0].dtype, grid_for(self.n, BLOCK), BLOCK,
               (table, inp, meta, len(self.fulls), self.total, self.n))
        if keep is not None:  # pinned metadata stays alive while its upload may be in flight
            self._kept.append(keep)
