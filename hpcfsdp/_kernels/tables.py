"""Device tables of arrays' addresses for the multi-tensor kernels, cached while the arrays stay where they are."""
from __future__ import annotations

import collections
import threading

import numpy as np

from .._backend import array_module, pinned_empty
from ._registry import PointerTable

__all__ = ["TableCache", "RETIRED"]

# [Note: Multi-tensor pointer tables]
# A group's fused step is one launch over the concatenation of its tensors, which the kernel finds through
# device tables of their addresses (See [Note: Fused kernels] in _registry.py for the "table" parameter).
# The tables of one call (one int64 array: each column's addresses, then the prefix sums of the sizes) are
# built on the host into pinned memory and uploaded with ndarray.set on the current stream: asynchronous, no
# host sync, ordered before the kernel. A TableCache keeps the device copy while every address, size and
# dtype stays the same (FSDP's sharded parameters are views into one flat buffer and its optimizer state is
# allocated once, so in steady state nothing is uploaded; a gradient buffer that moves costs one small async
# upload); any change of an address rebuilds it. The cache keeps addresses, never the arrays: a table built
# for freed arrays is used only if new arrays sit at the same addresses, where it is right again. A replaced
# pinned buffer may still be read by its in-flight copy, so it is retired into a ring of RETIRED entries and
# freed only after that many later rebuilds (the host would have to run that many rebuilds ahead of the
# device to overwrite a buffer still being read; querying an event instead would cost a host query a step).

RETIRED = 16


class TableCache:
    """Device pointer tables per tag, kept while the arrays' addresses, sizes and dtypes stay the same."""

    def __init__(self):
        self._entries: dict = {}
        self._retired: collections.deque = collections.deque(maxlen=RETIRED)
        self._lock = threading.Lock()
        self.uploads = 0  # how many tables were built and uploaded (for tests)

    def tables(self, tag, columns) -> tuple[list, object, int]:
        """``columns``: lists of device arrays, the k-th of each of the k-th tensor's size (non-empty, contiguous).
        Returns (one PointerTable per column, the device offsets array of n + 1 prefix sums, the total size)."""
        n = len(columns[0])
        sizes = [int(a.size) for a in columns[0]]
        addrs = [a.data.ptr for col in columns for a in col]
        key = (tuple(addrs), tuple(sizes), tuple(a.dtype.str for col in columns for a in col))
        with self._lock:
            entry = self._entries.get(tag)
            if entry is None or entry[0] != key:
                host = pinned_empty(len(addrs) + n + 1, np.int64)
                host[:len(addrs)] = addrs
                host[len(addrs)] = 0
                np.cumsum(sizes, out=host[len(addrs) + 1:])
                xp = array_module(columns[0][0])
                dev = xp.empty(host.size, np.int64)
                dev.set(host, stream=xp.cuda.get_current_stream())  # from pinned memory: asynchronous
                if entry is not None:
                    self._retired.append(entry)
                entry = self._entries[tag] = (key, host, dev)
                self.uploads += 1
        dev = entry[2]
        tables = [PointerTable(dev[c * n:(c + 1) * n], col) for c, col in enumerate(columns)]
        return tables, dev[len(addrs):], int(sum(sizes))
