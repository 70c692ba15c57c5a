"""DTensor: a Tensor whose storage is this rank's piece of a global tensor laid out on a DeviceMesh."""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from hpcfsdp._backend import array_module, is_floating_dtype, is_meta_array, meta_array
from hpcfsdp._tensor import Size, Tensor
from hpcfsdp.autograd import function as _function
from hpcfsdp.autograd.function import Function
from hpcfsdp.autograd.grad_mode import is_grad_enabled
import hpcfsdp.distributed.tensor._dispatch as _dispatch
from hpcfsdp.distributed.device_mesh import DeviceMesh
from hpcfsdp.distributed.process_group import ReduceOp
from hpcfsdp.distributed.tensor.placement_types import (Partial, Placement, Replicate, Shard, _InterleavedShard,
                                                        _NormPartial, _StridedShard)

__all__ = ["DTensor", "DTensorSpec", "distribute_tensor", "_chunk_bounds", "_nested_chunk_bounds", "_local_ranges",
           "_local_boxes", "_take"]

# [Note: DTensor storage]
# A DTensor's ``_data`` is the LOCAL piece (what optimizers update in place and what the
# checkpoint writes); ``_spec`` holds the mesh, the placements (one per mesh dimension) and the
# global shape, stride and dtype. ``shape``/``size()``/``numel()``/``stride()`` report the global
# tensor, as in PyTorch; everything else a Tensor does on ``_data`` (in-place updates, ``.grad``)
# acts on the local piece. Sharding follows torch.chunk (FSDP2): Shard(d) over n ranks gives rank
# r the indices [r*c, min((r+1)*c, size)) with c = ceil(size/n), so the last ranks may hold fewer
# rows or none. Several mesh dimensions sharding the same tensor dimension nest in mesh order (plain
# Shard and _InterleavedShard placements first, then _StridedShard ones; see [Note: Strided shard]).
# A rank's piece is, per tensor dim, a list of global index ranges concatenated in its local array:
# one range except under an _InterleavedShard (see [Note: Interleaved shard]).
#
# [Note: Partial placement]
# Partial(op) on mesh dim i: every rank of that dim holds a whole-shaped partial value (laid out like
# Replicate) and the global tensor is their reduction with ``op``. from_local and distribute_tensor make
# one (the latter splits the value: v / n for "sum", v itself for "avg"/"max"/"min"), and so do reductions
# over a sharded dim (See [Note: Reduction placements] in _rules/reduce.py; _NormPartial for norms); full_tensor
# and redistribute to Replicate or Shard all-reduce over the Partial mesh dims first (on a copy: the
# local partial values stay), then proceed as for Replicate. Redistributing to a Partial the tensor does
# not already have raises, as in PyTorch. Different reduce ops on one tensor do not commute and are
# refused (sum with avg excepted).


def _chunk_bounds(n: int, world: int, rank: int) -> tuple[int, int]:
    """(start, stop) of rank ``rank``'s torch.chunk piece of ``n`` indices over ``world`` ranks.

    The one chunking rule of DTensor and FSDP: every piece has ceil(n / world) indices (rank 0's piece,
    the padded size FSDP gives every rank) except the last non-empty one; the ranks after it get none."""
    if world <= 0 or not 0 <= rank < world:
        raise ValueError(f"_chunk_bounds: rank {rank} outside 0..{world - 1}")
    c = -(-n // world) if n else 0
    return min(rank * c, n), min((rank + 1) * c, n)


def _nested_chunk_bounds(n: int, sizes: Sequence[int], coord: Sequence[int]) -> tuple[int, int]:
    """(start, stop) of the piece of ``n`` indices at mesh coordinate ``coord`` when several mesh dims of
    ``sizes`` shard the same tensor dim: chunked over the first, each piece over the next, and so on."""
    lo, hi = 0, n
    for size, c in zip(sizes, coord):
        a, b = _chunk_bounds(hi - lo, size, c)
        lo, hi = lo + a, lo + b
    return lo, hi


@dataclass(frozen=True)
class DTensorSpec:
    """Mesh, placements and global metadata of a DTensor."""

    mesh: DeviceMesh
    placements: tuple[Placement, ...]
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: Any

    def __deepcopy__(self, memo):
        """Immutable, and its mesh a handle to communicators: a deep-copied DTensor shares both (PyTorch's copy
        resolves the same process groups), so ``copy.deepcopy(optim.state_dict())`` works on sharded states."""
        return self


def _contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(st))


def _norm_placements(placements, mesh: DeviceMesh, ndim: int) -> tuple[Placement, ...]:
    if placements is None:
        placements = [Replicate()] * mesh.ndim
    placements = tuple(placements)
    if len(placements) != mesh.ndim:
        raise ValueError(f"placements {placements} have {len(placements)} entries for a {mesh.ndim}-d mesh")
    out = []
    for p in placements:
        if isinstance(p, Shard):
            d = p.dim + ndim if p.dim < 0 else p.dim
            if not 0 <= d < ndim:
                raise ValueError(f"{p!r} is out of range for a {ndim}-d tensor")
            out.append(type(p)(d, p.split_factor) if isinstance(p, (_StridedShard, _InterleavedShard)) else Shard(d))
        elif isinstance(p, (Replicate, Partial)):
            out.append(p)
        else:
            raise TypeError(f"placement {p!r}: expected Shard(dim), Replicate() or Partial(reduce_op)")
    ops = {p.reduce_op for p in out if isinstance(p, Partial)}
    if any(isinstance(p, _NormPartial) for p in out) and len({p for p in out if isinstance(p, Partial)}) > 1:
        raise ValueError(f"placements {placements}: a _NormPartial cannot mix with other Partial placements")
    if len(ops) > 1 and ops != {"sum", "avg"}:
        raise ValueError(f"placements {placements}: mixed Partial reduce ops {sorted(ops)} are not supported; "
                         "use one reduce op (sum and avg may mix)")
    for p in out:
        if isinstance(p, _StridedShard):
            want = math.prod(mesh.size(i) for i, q in enumerate(out) if _first_phase(q) and q.dim == p.dim)
            if p.split_factor != want:
                raise ValueError(f"{p!r} on mesh {mesh!r}: split_factor must be the number of pieces the plain "
                                 f"Shard({p.dim}) placements cut the dim into ({want})")
    return tuple(out)


def _first_phase(p) -> bool:
    """A Shard or _InterleavedShard placement: chunks in mesh order before any _StridedShard."""
    return isinstance(p, Shard) and not isinstance(p, _StridedShard)


def _shard_order(placements) -> list[int]:
    """Mesh dims with a Shard placement in the order their chunking applies: plain (and interleaved) shards
    in mesh order, then strided shards in mesh order (see [Note: Strided shard])."""
    plain = [i for i, p in enumerate(placements) if _first_phase(p)]
    return plain + [i for i, p in enumerate(placements) if isinstance(p, _StridedShard)]


def _level_picks(n: int, placement, size: int, r: int) -> list[tuple[int, int]]:
    """[start, stop) ranges, in local order, that rank ``r`` of ``size`` takes from a piece of ``n`` indices."""
    if isinstance(placement, _InterleavedShard):
        sf = placement.split_factor
        if n % sf:
            raise ValueError(f"{placement!r}: a piece of {n} indices along dim {placement.dim} does not split into "
                             f"{sf} equal blocks")
        a, b = _chunk_bounds(n // sf, size, r)
        return [(k * (n // sf) + a, k * (n // sf) + b) for k in range(sf)]
    return [_chunk_bounds(n, size, r)]


def _select(ranges, a: int, b: int) -> list[tuple[int, int]]:
    """Positions [a, b) of the index sequence that ``ranges`` (global ranges, concatenated) spells."""
    out, pos = [], 0
    for lo, hi in ranges:
        s, e = max(a - pos, 0), min(b - pos, hi - lo)
        if s < e:
            out.append((lo + s, lo + e))
        pos += hi - lo
    return out


def _position(ranges, a: int) -> int:
    """Global index of position ``a`` of the sequence ``ranges`` spells (its end when ``a`` is past it)."""
    pos = 0
    for lo, hi in ranges:
        if a < pos + hi - lo:
            return lo + a - pos
        pos += hi - lo
    return ranges[-1][1]


def _local_ranges(shape: Sequence[int], mesh: DeviceMesh, placements, coord) -> list[list[tuple[int, int]]]:
    """Per tensor dim, the global [start, stop) ranges of this rank's piece in local order (nested chunking in
    ``_shard_order``; more than one range only under an _InterleavedShard). An empty piece is one empty range."""
    ranges = [[(0, int(s))] for s in shape]
    for i in _shard_order(placements):
        p = placements[i]
        cur = ranges[p.dim]
        picks = _level_picks(sum(b - a for a, b in cur), p, mesh.size(i), coord[i])
        new = [x for a, b in picks for x in _select(cur, a, b)]
        merged = []
        for a, b in new:
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        if not merged:  # an empty piece sits where torch.chunk puts it
            pos = _position(cur, picks[0][0])
            merged = [(pos, pos)]
        ranges[p.dim] = merged
    return ranges


_PARTIAL_OPS = {"sum": ReduceOp.SUM, "avg": ReduceOp.AVG, "max": ReduceOp.MAX, "min": ReduceOp.MIN,
                "product": ReduceOp.PRODUCT}


def _reduce_partials(local, mesh: DeviceMesh, placements, keep=frozenset()):
    """``local`` all-reduced over each Partial mesh dim not in ``keep`` (a copy; collective), and the placements
    with those dims made Replicate. See [Note: Partial placement]."""
    dims = [i for i, p in enumerate(placements) if isinstance(p, Partial) and i not in keep]
    if not dims:
        return local, tuple(placements)
    xp = array_module(local)
    out = xp.array(local, order="C", copy=True)  # (ascontiguousarray would make a 0-d value 1-d)
    norm = [placements[i] for i in dims if isinstance(placements[i], _NormPartial)]
    if norm:  # p-norm partials: (sum v_i^p)^(1/p) over all their mesh dims (See _NormPartial)
        out = xp.array(norm[0]._pre_reduce(out), order="C", copy=True)
    for i in dims:
        mesh.get_group(i).all_reduce_(out, _PARTIAL_OPS[placements[i].reduce_op])
    if norm:
        out = norm[0]._post_reduce(out)
    return out, tuple(Replicate() if i in dims else p for i, p in enumerate(placements))


def _partial_grad_scale(local, mesh: DeviceMesh, placements, dims):
    """d(global)/d(local) of the reduction of ``local`` over the Partial mesh dims ``dims`` whose reduce op is
    not linear ("max", "min", "product", p-norms; None when all are sums or averages): the gradient of the
    reduced value reaches each rank's partial value times this factor (for max/min: 1 on the ranks holding the
    extreme, divided among ties; for p-norms (v_i / N)^(p-1)). Collective: one all-reduce of ``local``'s size,
    one more for the ties of max/min."""
    nonlin = [i for i in dims if isinstance(placements[i], _NormPartial) or placements[i].reduce_op in
              ("max", "min", "product")]
    if not nonlin:
        return None
    xp = array_module(local)
    full, _ = _reduce_partials(local, mesh, placements, frozenset(i for i in range(len(placements)) if i not in dims))
    p = placements[nonlin[0]]
    if p.reduce_op in ("max", "min"):
        hit = (local == full).astype(local.dtype)
        count = xp.array(hit, order="C", copy=True)
        for i in dims:
            mesh.get_group(i).all_reduce_(count, ReduceOp.SUM)
        return hit / xp.maximum(count, 1)
    if p.reduce_op == "product":
        with np.errstate(divide="ignore", invalid="ignore"):
            return full / local
    power = p._power()
    if power is None:  # p = 1: a sum; p = 0: a count (no gradient)
        return xp.ones_like(local) if float(p.norm_type) == 1.0 else xp.zeros_like(local)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = xp.where(full == 0, 0, local / full)
    return r ** r.dtype.type(power - 1)


def _local_boxes(ranges) -> list[tuple[tuple, tuple, tuple]]:
    """(global offsets, lengths, local offsets) of each box of a piece described by ``_local_ranges``."""
    per_dim = []
    for rs in ranges:
        items, at = [], 0
        for a, b in rs:
            items.append((a, b - a, at))
            at += b - a
        per_dim.append(items)
    return [tuple(tuple(x[j] for x in combo) for j in range(3)) for combo in itertools.product(*per_dim)]


def _take(arr, ranges):
    """The piece of the full array ``arr`` that ``ranges`` (see ``_local_ranges``) describe (a view when one box)."""
    if is_meta_array(arr):
        return meta_array(tuple(sum(b - a for a, b in rs) for rs in ranges), arr.dtype)
    xp = array_module(arr)
    out = arr
    for d, rs in enumerate(ranges):
        head = (slice(None),) * d
        if len(rs) == 1:
            out = out[head + (slice(*rs[0]),)]
        else:
            out = xp.concatenate([out[head + (slice(a, b),)] for a, b in rs], axis=d)
    return out


class DTensor(Tensor):
    """A distributed tensor: ``_data`` is the local piece, ``_spec`` the layout. See [Note: DTensor storage]."""

    _spec: DTensorSpec
    _hp_is_dtensor = True  # what layers below this one test (See [Note: Functionals on DTensors])

    @classmethod
    def _from_array(cls, local, spec: DTensorSpec, requires_grad: bool = False) -> "DTensor":
        t = Tensor._make_subclass(cls, local, requires_grad)
        t._spec = spec
        _function.SHARDING[0] = True  # the primitives refuse DTensors from now on: [Note: Mixed Tensor and DTensor]
        return t

    # -- construction ----------------------------------------------------------------------------
    @staticmethod
    def from_local(local_tensor, device_mesh: DeviceMesh | None = None, placements=None, *,
                   run_check: bool = False, shape=None, stride=None) -> "DTensor":
        """A DTensor over ``local_tensor`` (shares its storage). Without ``shape`` the global shape
        assumes even shards (local size x mesh size per Shard dim), as PyTorch does."""
        if not isinstance(local_tensor, Tensor):
            raise TypeError(f"from_local: expected a Tensor, got {type(local_tensor).__name__}")
        if device_mesh is None:
            raise ValueError("from_local: device_mesh is required")
        if not isinstance(device_mesh, DeviceMesh):
            raise TypeError(f"from_local: device_mesh must be a DeviceMesh, got {type(device_mesh).__name__}")
        local = local_tensor._data
        pl = _norm_placements(placements, device_mesh, local.ndim)
        if shape is None:
            gshape = list(local.shape)
            for i, p in enumerate(pl):
                if isinstance(p, Shard):
                    gshape[p.dim] *= device_mesh.size(i)
            shape = tuple(gshape)
        shape = tuple(int(s) for s in shape)
        if len(shape) != local.ndim:
            raise ValueError(f"from_local: shape {shape} has {len(shape)} dims, the local tensor {local.ndim}")
        stride = tuple(stride) if stride is not None else _contiguous_stride(shape)
        spec = DTensorSpec(device_mesh, pl, shape, stride, local.dtype)
        if run_check:
            _run_check(local, spec)
        if local_tensor.requires_grad and is_grad_enabled():  # differentiable: the gradient's local piece
            return _dispatch.wrap(_dispatch._LocalView.apply(local_tensor), device_mesh, pl, shape)
        return DTensor._from_array(local, spec, local_tensor.requires_grad)

    # -- local / global views ----------------------------------------------------------------------
    def to_local(self, *, grad_placements=None) -> Tensor:
        """The local piece as a plain Tensor sharing storage, differentiable: its gradient is laid out as
        ``grad_placements`` (default: this tensor's placements) and redistributed to this tensor's layout."""
        if not (self.requires_grad and is_grad_enabled()):
            return Tensor._wrap(self._data)
        if grad_placements is None:
            return _dispatch._LocalView.apply(self)
        return _ToLocal.apply(self, _norm_placements(grad_placements, self._spec.mesh, self.ndim))

    def full_tensor(self, *, grad_placements=None) -> Tensor:
        """The global tensor on every rank (all-reduces over each Partial mesh dimension, all-gathers over each
        Shard one; collective). Differentiable: the gradient's local piece is taken back."""
        if not (self.requires_grad and is_grad_enabled()):
            return Tensor._wrap(self._full_array())
        return _dispatch.redistribute_local(self, (Replicate(),) * self._spec.mesh.ndim)

    def _full_array(self, keep_partial=frozenset()):
        """The global array, still partial over the Partial mesh dims in ``keep_partial`` (collective)."""
        spec = self._spec
        mesh = spec.mesh
        coord = mesh.get_coordinate()
        if coord is None:
            raise RuntimeError(f"full_tensor: rank {mesh.get_rank()} is not part of {mesh!r}")
        if is_meta_array(self._data):
            raise RuntimeError("full_tensor: a meta DTensor has no data")
        cur, pl = _reduce_partials(self._data, mesh, spec.placements, keep_partial)
        # sizes of the nested pieces, outermost first: extent[i] = piece size along dim before level i
        shards = _shard_order(pl)
        extents = {}
        bounds = list(spec.shape)  # per dim, the piece size before the next level
        for i in shards:
            d = pl[i].dim
            extents[i] = bounds[d]
            bounds[d] = sum(b - a for a, b in _level_picks(bounds[d], pl[i], mesh.size(i), coord[i]))
        for i in reversed(shards):
            sf = pl[i].split_factor if isinstance(pl[i], _InterleavedShard) else 1
            cur = _gather_dim(cur, mesh, i, pl[i].dim, extents[i], sf)
        if tuple(cur.shape) != spec.shape:  # pragma: no cover - internal invariant
            raise AssertionError(f"full_tensor produced {cur.shape}, expected {spec.shape}")
        return cur

    def redistribute(self, device_mesh: DeviceMesh | None = None, placements=None, *, async_op: bool = False,
                     forward_dtype=None, backward_dtype=None) -> "DTensor":
        """This tensor laid out with ``placements`` on the same mesh (collective: reduces Partial dims, gathers the
        global tensor, then keeps this rank's new piece; outside autograd). See [Note: Partial placement]."""
        mesh = self._spec.mesh if device_mesh is None else device_mesh
        if mesh != self._spec.mesh:
            raise NotImplementedError(f"redistribute: cross-mesh redistribution ({self._spec.mesh!r} to {mesh!r}) "
                                      "is not supported")
        if placements is None:
            raise RuntimeError("redistribute: placements are needed")
        pl = _norm_placements(placements, mesh, self.ndim)
        for src, dst in zip(self._spec.placements, pl):
            if isinstance(dst, Partial) and src != dst:
                raise RuntimeError(f"Can not redistribute from {src} to {dst}, redistributing to Partial is for "
                                   "internal use only!")
        if pl == self._spec.placements and forward_dtype is None:
            return self
        if self.requires_grad and is_grad_enabled() and forward_dtype is None:  # differentiable
            return _dispatch.wrap(_dispatch.redistribute_local(self, pl), mesh, pl, self._spec.shape)
        full = self._full_array(frozenset(i for i, p in enumerate(pl) if isinstance(p, Partial)))
        if forward_dtype is not None:
            from hpcfsdp._backend import to_dtype

            full = full.astype(to_dtype(forward_dtype))
        local = _take(full, _local_ranges(full.shape, mesh, pl, mesh.get_coordinate())).copy()
        spec = DTensorSpec(mesh, pl, self._spec.shape, self._spec.stride, local.dtype)
        return DTensor._from_array(local, spec, self.requires_grad)

    # -- tensor methods that must keep the layout -----------------------------------------------------
    def detach(self) -> "DTensor":
        """A DTensor sharing this one's local storage and layout, outside autograd (state dicts use it). A
        parameter sharded by FSDP passes on its mark (see [Note: Mixed Tensor and DTensor], autograd/function.py)."""
        out = DTensor._from_array(self._data, self._spec)
        if getattr(self, "_hp_fsdp_shard", False):
            out._hp_fsdp_shard = True
        return out

    @property
    def data(self) -> "DTensor":
        """As PyTorch: ``dtensor.data`` is a DTensor (the layout kept), not a plain tensor of the local shard."""
        return self.detach()

    @data.setter
    def data(self, other) -> None:
        self._data = other._data if isinstance(other, Tensor) else other

    def __hp_like__(self, array, requires_grad: bool = False) -> "DTensor":
        """``zeros_like``/``ones_like``/``empty_like``/``full_like`` of a DTensor: ``array`` (a new local piece,
        maybe of another dtype) laid out as this one."""
        spec = self._spec
        return DTensor._from_array(array, DTensorSpec(spec.mesh, spec.placements, spec.shape, spec.stride,
                                                      array.dtype), requires_grad)

    def __hp_wrap_like__(self, array) -> "DTensor":
        """Optimizer state of a DTensor parameter is a DTensor laid out like it (PyTorch's behaviour)."""
        return DTensor._from_array(array, self._spec)

    def copy_(self, src, non_blocking: bool = False) -> "DTensor":
        """Copy ``src`` into this rank's piece: a DTensor of the same layout (local copy), a DTensor of
        another layout (gathered first: collective), or a full tensor of the global shape (sliced)."""
        if tuple(src.shape) != tuple(self._spec.shape):
            raise RuntimeError(f"copy_: source of shape {tuple(src.shape)} does not match the DTensor's global "
                               f"shape {tuple(self._spec.shape)}")
        if isinstance(src, DTensor):
            if src._spec.placements == self._spec.placements and src._spec.mesh == self._spec.mesh:
                piece = src._data
            else:
                src = src.full_tensor()
                piece = None
        else:
            piece = None
        if piece is None:
            coord = self._spec.mesh.get_coordinate()
            piece = _take(src._data, _local_ranges(self._spec.shape, self._spec.mesh, self._spec.placements, coord))
        xp = array_module(self._data)
        if is_meta_array(self._data):
            return self
        self._data[...] = xp.asarray(piece)
        return self

    # -- global metadata -----------------------------------------------------------------------------
    @property
    def placements(self) -> tuple[Placement, ...]:
        return self._spec.placements

    @property
    def device_mesh(self) -> DeviceMesh:
        return self._spec.mesh

    @property
    def shape(self) -> Size:
        return Size(self._spec.shape)

    def size(self, dim=None):
        if dim is None:
            return Size(self._spec.shape)
        n = len(self._spec.shape)
        if not -n <= dim < n:
            raise IndexError(f"dimension {dim} out of range for a {n}-d DTensor")
        return self._spec.shape[dim]

    @property
    def ndim(self) -> int:
        return len(self._spec.shape)

    def dim(self) -> int:
        return len(self._spec.shape)

    def numel(self) -> int:
        return math.prod(self._spec.shape)

    nelement = numel

    def stride(self, dim=None):
        return self._spec.stride if dim is None else self._spec.stride[dim]

    def __len__(self) -> int:
        if not self._spec.shape:
            raise TypeError("len() of a 0-d tensor")
        return self._spec.shape[0]

    def __repr__(self) -> str:
        local = Tensor._wrap(self._data)
        return (f"DTensor(local_tensor={local!r}, device_mesh={self._spec.mesh!r}, "
                f"placements={self._spec.placements})")

    # -- gradient norm over shards (nn.utils.clip_grad_norm_) ----------------------------------------
    @classmethod
    def __hp_reduce_norm__(cls, grads, local_value: float, norm_type: float) -> float:
        """Reduce the local partial norm (sum |x|^p, or max |x| for inf) over the mesh groups of the
        Shard dimensions of ``grads`` (one all-reduce per such dimension; collective)."""
        grads = list(grads)
        if not grads:
            return float(local_value)
        first = grads[0]._spec
        key = _shard_key(first)
        inf = math.isinf(float(norm_type))
        op = ReduceOp.MAX if inf else ReduceOp.SUM
        if any(_shard_key(g._spec) != key for g in grads[1:]):
            return _reduce_mixed_norm(grads, norm_type, inf, op)
        buf = np.array([local_value], np.float64)
        for i in sorted({i for i, p in enumerate(first.placements) if isinstance(p, Shard)}):
            first.mesh.get_group(i).all_reduce_(buf, op)
        return float(buf[0])

    @classmethod
    def __hp_reduce_norm_device__(cls, grads, partial, norm_type: float):
        """``__hp_reduce_norm__`` of a (1,) float64 device partial without reading it back: the same all-reduces,
        in place on the device array (See [Note: Clipping on the device] in nn/utils/clip_grad.py); gradients of
        mixed shardings take the host path (one read)."""
        grads = list(grads)
        if not grads:
            return partial
        first = grads[0]._spec
        key = _shard_key(first)
        if any(_shard_key(g._spec) != key for g in grads[1:]):
            return array_module(partial).asarray([cls.__hp_reduce_norm__(grads, float(partial[0]), norm_type)], np.float64)
        op = ReduceOp.MAX if math.isinf(float(norm_type)) else ReduceOp.SUM
        for i in sorted({i for i, p in enumerate(first.placements) if isinstance(p, Shard)}):
            first.mesh.get_group(i).all_reduce_(partial, op)
        return partial

    @classmethod
    def __hp_agree_max__(cls, tensors, value: float) -> float:
        """The largest ``value`` over every rank of the meshes ``tensors`` live on (GradScaler's found-inf flag;
        one all-reduce per mesh, in the tensors' order: collective)."""
        buf = np.array([value], np.float64)
        roots = []
        for t in tensors:
            root = t._spec.mesh._root
            if all(root is not r for r in roots):
                roots.append(root)
        for root in roots:
            group = _flat_group(root)
            if group.size() > 1:
                group.all_reduce_(buf, ReduceOp.MAX)
        return float(buf[0])

    def __hp_vector_norm__(self, ord: float, dim, keepdim: bool) -> "DTensor":  # noqa: A002
        """``hpcfsdp.linalg.vector_norm`` of a DTensor (not a registry op; its arguments checked): Tensor.norm's
        sharding rule (See [Note: Reduction placements] in _rules/reduce.py)."""
        return self.norm(ord, None if isinstance(dim, (list, tuple)) and len(dim) == 0 else dim, keepdim)

    # d(global)/d(local) of a Partial resolution, for _dispatch's differentiable redistribution
    _partial_grad_scale = staticmethod(_partial_grad_scale)

    @classmethod
    def __hp_norm_result__(cls, grads, total: Tensor) -> "DTensor":
        """The total norm of DTensor gradients: a DTensor replicated over their mesh (PyTorch's result type)."""
        mesh = grads[0]._spec.mesh
        return DTensor.from_local(total, mesh, [Replicate()] * mesh.ndim)


def _reduce_mixed_norm(grads, norm_type, inf: bool, op) -> float:
    """Gradients with different shardings on slices of one mesh (FSDP over TP: some sharded over dp and
    tp, some over dp only, maybe on mesh["dp"]): each rank adds every gradient's local partial divided by
    the number of ranks of the whole mesh holding that same piece (the mesh dims it does not shard), and
    the sum (or max) runs over the whole mesh (collective). Meshes of different roots over the same ranks
    (FSDP1 instances of different sharding strategies: NO_SHARD beside FULL_SHARD) reduce the same way."""
    root = grads[0]._spec.mesh._root
    flat = _flat_group(root)
    groups: dict = {}
    for g in grads:
        spec = g._spec
        other = spec.mesh._root
        if other is not root and sorted(_flat_group(other).world_ranks) != sorted(flat.world_ranks):
            raise RuntimeError(
                f"clip_grad_norm_: DTensor gradients on meshes over different ranks ({grads[0]._spec.mesh!r} vs "
                f"{spec.mesh!r}) cannot share one reduction")
        sharded = tuple(sorted(d for d, p in zip(spec.mesh._dims, spec.placements) if isinstance(p, Shard)))
        groups.setdefault((id(other), sharded), (other, sharded, []))[2].append(g)
    total = 0.0
    for mesh_root, sharded, gs in groups.values():
        part = _local_partial(gs, norm_type, inf)
        if inf:
            total = max(total, part)
        else:
            total += part / math.prod(mesh_root.size(d) for d in range(mesh_root.ndim) if d not in sharded)
    buf = np.array([total], np.float64)
    flat.all_reduce_(buf, op)
    return float(buf[0])


def _flat_group(root):
    """The process group of all ranks of a root mesh."""
    return root._flatten().get_group() if root.ndim > 1 else root.get_group()


def _local_partial(tensors, norm_type, inf: bool) -> float:
    """sum |x|^p (max |x| for inf, the nonzero count for p=0) over the local arrays of ``tensors``."""
    out = 0.0
    for t in tensors:
        a = t._data
        if a.size == 0 or is_meta_array(a):
            continue
        x = array_module(a).abs(a.astype(np.float64))
        if inf:
            out = max(out, float(x.max()))
        elif float(norm_type) == 0.0:
            out += float(array_module(a).count_nonzero(x))
        else:
            out += float((x ** float(norm_type)).sum())
    return out


def _shard_key(spec: DTensorSpec):
    """The rank sets the partial norm is summed over (equal keys: one reduction serves both)."""
    dims = sorted({i for i, p in enumerate(spec.placements) if isinstance(p, Shard)})
    return tuple(spec.mesh.get_group(i).world_ranks for i in dims)


def _gather_dim(local, mesh: DeviceMesh, mesh_dim: int, tdim: int, extent: int, split_factor: int = 1):
    """All-gather ``local`` pieces along tensor dim ``tdim`` over mesh dim ``mesh_dim``; unpad to ``extent``
    (with ``split_factor`` > 1, each rank's piece holds its chunk of each block: see [Note: Interleaved shard])."""
    from hpcfsdp.distributed._buffers import array_module

    xp = array_module(local)
    n = mesh.size(mesh_dim)
    blk = extent // split_factor
    c = _chunk_bounds(blk, n, 0)[1] * split_factor  # every rank's padded piece
    moved = xp.moveaxis(local, tdim, 0)
    rest = moved.shape[1:]
    padded = xp.zeros((c,) + rest, local.dtype)
    padded[: moved.shape[0]] = moved
    out = xp.empty((n * c,) + rest, local.dtype)
    mesh.get_group(mesh_dim).all_gather_into(out, padded)
    if split_factor == 1:
        out = out[:extent]
    else:  # block k of the result: rank 0's chunk of it, then rank 1's, ...
        parts = []
        for k in range(split_factor):
            for r in range(n):
                a, b = _chunk_bounds(blk, n, r)
                parts.append(out[r * c + k * (b - a): r * c + (k + 1) * (b - a)])
        out = xp.concatenate(parts)
    return xp.ascontiguousarray(xp.moveaxis(out, 0, tdim))


def _run_check(local, spec: DTensorSpec) -> None:
    """Check every rank's local shape and dtype against the global spec (collective: all ranks
    learn every rank's metadata, so they all raise together)."""
    mesh = spec.mesh
    coord = mesh.get_coordinate()
    expect = tuple(sum(hi - lo for lo, hi in rs) for rs in _local_ranges(spec.shape, mesh, spec.placements, coord))
    g = mesh._flatten().get_group() if mesh.ndim > 1 else mesh.get_group()
    meta = g.all_gather_object((mesh.get_rank(), coord, tuple(local.shape), expect, np.dtype(local.dtype).name))
    for rank, c, got, want, _ in meta:
        if tuple(got) != tuple(want):
            raise ValueError(
                f"from_local(run_check=True): rank {rank} at mesh coordinate {list(c)} has local shape "
                f"{tuple(got)}, which does not match the piece {tuple(want)} of global shape {spec.shape} "
                f"under {spec.placements}"
            )
    dts = sorted({m[4] for m in meta})
    if len(dts) != 1:
        raise ValueError(f"from_local(run_check=True): ranks hold different dtypes {dts}")


# [Note: Broadcast over a mesh]
# To give every mesh rank the data of the rank at coordinate s, broadcast along mesh dim 0 from
# local rank s[0], then along dim 1 from s[1], and so on. After step i every rank whose
# coordinates in dims > i equal s's holds the data; a broadcast in a group with no holder sends
# stale data that a later step overwrites. After the last step every rank holds it.


def distribute_tensor(tensor, device_mesh: DeviceMesh | None = None, placements=None, *,
                      src_data_rank: int | None = 0) -> DTensor:
    """Shard/replicate ``tensor`` over ``device_mesh`` by local slicing (collective).

    With ``src_data_rank`` (a group rank on EVERY mesh dimension, default 0: the data of the rank at mesh
    coordinate (s, s, ...), as PyTorch's "group rank 0 on each mesh dimension") that rank's data is
    broadcast first, so ranks may pass different values; with None every rank must pass the same tensor.
    A mesh dimension of size 1 has only group rank 0, which is used there.
    """
    if not isinstance(tensor, Tensor):
        raise TypeError(f"distribute_tensor: expected a Tensor, got {type(tensor).__name__}")
    if isinstance(tensor, DTensor):
        raise ValueError("distribute_tensor: the input is already a DTensor")
    if device_mesh is None:
        raise ValueError("distribute_tensor: device_mesh is required")
    full = tensor._data
    pl = _norm_placements(placements, device_mesh, full.ndim)
    for p in pl:
        if isinstance(p, Partial) and (p.reduce_op not in ("sum", "avg", "max", "min")
                                       or p.reduce_op == "sum" and not is_floating_dtype(full.dtype)):
            raise ValueError(f"distribute_tensor: Replicate to {p!r} conversion is not supported for a {full.dtype} "
                             "tensor (sum splits the value into value / n: floating-point only; avg, max and min "
                             "keep it)")
    coord = device_mesh.get_coordinate()
    if coord is None:
        raise RuntimeError(f"distribute_tensor: rank {device_mesh.get_rank()} is not part of {device_mesh!r}")
    if src_data_rank is not None:
        if isinstance(src_data_rank, bool) or not isinstance(src_data_rank, int):
            raise TypeError(f"distribute_tensor: src_data_rank must be an int or None, got {src_data_rank!r}")
        bad = [i for i in range(device_mesh.ndim) if device_mesh.size(i) > 1
               and not 0 <= src_data_rank < device_mesh.size(i)]
        if bad:
            raise ValueError(
                f"distribute_tensor: src_data_rank={src_data_rank} is a group rank on each mesh dimension, "
                f"but mesh dimension {bad[0]} of {device_mesh!r} has size {device_mesh.size(bad[0])}")
    if src_data_rank is not None and device_mesh.size() > 1 and not is_meta_array(full):
        from hpcfsdp.distributed._buffers import array_module

        full = array_module(full).ascontiguousarray(full).copy()
        for i in range(device_mesh.ndim):  # See [Note: Broadcast over a mesh]
            if device_mesh.size(i) > 1:
                device_mesh.get_group(i).broadcast_(full, int(src_data_rank))
    local = _take(full, _local_ranges(full.shape, device_mesh, pl, coord))
    if not is_meta_array(local):
        local = local.copy()
        for i, p in enumerate(pl):  # See [Note: Partial placement]
            if isinstance(p, _NormPartial) and p.reduce_op == "sum":  # n parts of norm v / n^(1/p) (PyTorch's)
                if float(p.norm_type) == 0.0:
                    raise NotImplementedError(f"distribute_tensor: Replicate to {p!r} is not supported")
                local = local / local.dtype.type(device_mesh.size(i) ** (1.0 / float(p.norm_type)))
            elif isinstance(p, Partial) and p.reduce_op == "sum":
                local = local / local.dtype.type(device_mesh.size(i))
    spec = DTensorSpec(device_mesh, pl, tuple(full.shape), _contiguous_stride(full.shape), full.dtype)
    return DTensor._from_array(local, spec, tensor.requires_grad)


class _ToLocal(Function):
    """``to_local(grad_placements=...)``: the local piece; its gradient, laid out as ``grad_placements``, is
    redistributed to the DTensor's own layout (a Partial gradient all-reduced)."""

    @staticmethod
    def forward(ctx, x, grad_placements):
        ctx.spec = x._spec
        ctx.grad_placements = grad_placements
        return Tensor._wrap(x._data)

    @staticmethod
    def backward(ctx, g):
        src = dataclasses.replace(ctx.spec, placements=tuple(ctx.grad_placements))
        dst = _dispatch._grad_spec(ctx.spec)
        return Tensor._wrap(_dispatch._move(g._data, src, dst)), None


_dispatch.install(DTensor, DTensorSpec)
import hpcfsdp.distributed.tensor._rules  # noqa: E402,F401  (registers the sharding rules)

_function.DTENSOR[0] = DTensor
