"""Random in-place ops on DTensors (``normal_``, ``uniform_``; nn.init's fills through the same sink): the values are
those the unsharded tensor gets from the same seed. A uniform or normal fill jumps the generator to the runs of this
rank's piece and draws only those (a CuPy generator draws the whole tensor's stream block by block and keeps its
piece; See [Note: Random values of a sharded tensor] and [Note: Skipping to a shard's values] in hpcfsdp/random.py)."""
from __future__ import annotations

import numpy as np

from hpcfsdp import random as _random
from hpcfsdp._array import random_array
from hpcfsdp._backend import array_module, device_of_array, generator_for, is_meta_array
from hpcfsdp.distributed.tensor._dispatch import OpCall, _is_dt, register_rule
from hpcfsdp.distributed.tensor.placement_types import Partial

_BLOCK = 1 << 22  # values drawn at a time
# _dtensor._local_ranges, set by hpcfsdp/distributed/tensor/__init__.py (this module is loaded by _dtensor)
_LOCAL_RANGES = [None]


class _ShardSink:
    """A DTensor's local piece as the target of the whole tensor's random stream."""

    def __init__(self, dt, dtype):
        spec = dt._spec
        if any(isinstance(p, Partial) for p in spec.placements):
            raise NotImplementedError(f"random fill of a Partial DTensor ({list(spec.placements)}): redistribute it "
                                      "first")
        coord = spec.mesh.get_coordinate()
        if coord is None:
            raise RuntimeError(f"random fill: rank {spec.mesh.get_rank()} is not part of {spec.mesh!r}")
        arr = dt._data
        self.xp = xp = array_module(arr)
        self.gshape = tuple(int(s) for s in spec.shape)
        self.n = int(np.prod(self.gshape, dtype=np.int64))
        self.block = _BLOCK
        self.lshape = tuple(arr.shape)
        self._flat = xp.empty(int(arr.size), dtype=dtype)
        # per dim: a table from global coordinate to local position (-1: not in the piece)
        self._maps = []
        self._ranges = _LOCAL_RANGES[0](self.gshape, spec.mesh, spec.placements, coord)
        for size, rs in zip(self.gshape, self._ranges):
            m = np.full(size, -1, np.int64)
            pos = 0
            for a, b in rs:
                m[a:b] = np.arange(pos, pos + b - a)
                pos += b - a
            self._maps.append(xp.asarray(m))

    def put_index(self, idx, values):
        if not self.gshape:
            self._flat[...] = values
            return
        coords = self.xp.unravel_index(idx, self.gshape)
        loc = [m[c] for m, c in zip(self._maps, coords)]
        keep = loc[0] >= 0
        for l_ in loc[1:]:
            keep &= l_ >= 0
        if not bool(keep.any()):
            return
        where = self.xp.ravel_multi_index(tuple(l_[keep] for l_ in loc), self.lshape)
        self._flat[where] = values[keep]

    def runs(self):
        """The global C-order flat [start, stop) runs of the local piece, in local order."""
        if not self.gshape:
            return [(0, 1)]
        strides = np.cumprod((self.gshape[1:] + (1,))[::-1])[::-1]
        base = np.zeros(1, np.int64)
        for rs, st in zip(self._ranges[:-1], strides[:-1]):
            c = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in rs])
            base = (base[:, None] + c[None, :] * int(st)).reshape(-1)
        return [(int(b0) + a, int(b0) + b) for b0 in base.tolist() for a, b in self._ranges[-1] if b > a]

    def put_range(self, start, values):
        self.put_index(self.xp.arange(start, start + values.shape[0], dtype=np.int64), values)

    def result(self):
        return self._flat.reshape(self.lshape)


def _sink_for(tensor, dtype):
    if not _is_dt(tensor):
        return None
    return _ShardSink(tensor, dtype)


def _args(call: OpCall, names, defaults):
    vals = list(call.args[1:]) + [None] * (len(names) - len(call.args[1:]))
    out = {}
    for i, (n, d) in enumerate(zip(names, defaults)):
        out[n] = call.kwargs.get(n, vals[i] if vals[i] is not None else d)
    return out


def fill(call: OpCall):
    """``dt.normal_(mean, std)`` / ``dt.uniform_(from_, to)``: the unsharded tensor's values, this rank's piece."""
    d = call.args[0]
    if call.dtensors[0] is not d or len(call.dtensors) != 1:
        raise NotImplementedError(f"{call.entry.name}: only the DTensor itself may be a DTensor operand")
    arr = d._data
    if is_meta_array(arr):
        return d
    normal = call.entry.name == "normal_"
    a = _args(call, ("mean", "std") if normal else ("from_", "to"), (0.0, 1.0) if normal else (0.0, 1.0))
    lo, hi = (a["mean"], a["std"]) if normal else (a["from_"], a["to"])
    dtype = arr.dtype if arr.dtype == np.float64 else np.dtype(np.float32)
    dev = device_of_array(arr)
    gen = generator_for(call.kwargs.get("generator"), dev)
    if normal:
        sink = _random._normal_stream(_random._sink(d, dtype), gen, dtype)
    else:
        draw = lambda shape: random_array("rand", shape, dtype, dev, gen=gen)  # noqa: E731
        sink = _random._uniform_stream(_random._sink(d, dtype), gen, dtype, draw)
    vals = sink.result()
    arr[...] = vals * hi + lo if normal else vals * (hi - lo) + lo
    return d


_random._SHARDED_SINK[0] = _sink_for
register_rule(fill, "normal_", "uniform_")
