"""DTensor placements: Shard(dim), _StridedShard, _InterleavedShard, Replicate(), Partial(reduce_op) and
_NormPartial(norm_type)."""

from __future__ import annotations

__all__ = ["Placement", "Shard", "Replicate", "Partial"]


class Placement:
    """How a DTensor's data is laid out along one mesh dimension."""

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicate(self) -> bool:
        return False

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return False


class Shard(Placement):
    """Split tensor dimension ``dim`` over the mesh dimension, ``torch.chunk`` style: each rank holds
    ``ceil(size / n)`` indices, the last ranks fewer or none."""

    __slots__ = ("dim",)

    def __init__(self, dim: int):
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"Shard(dim={dim!r}): expected an int tensor dimension")
        object.__setattr__(self, "dim", dim)

    def __setattr__(self, name, value):
        raise AttributeError("Shard is immutable")

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or dim == self.dim

    def __eq__(self, other) -> bool:
        return type(other) is Shard and other.dim == self.dim

    def __hash__(self) -> int:
        return hash(("Shard", self.dim))

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim})"

    def __str__(self) -> str:
        return f"S({self.dim})"


class _StridedShard(Shard):
    """Shard(dim) applied AFTER the plain Shard placements of the same tensor dim on other mesh dims.

    [Note: Strided shard]
    FSDP over tensor parallelism splits a parameter over the tp mesh dim first and each tp piece over
    the data-parallel dims, whatever the mesh order: on a (dp, tp) mesh both shard dim 0, and the dp
    placement is ``_StridedShard(0, split_factor=tp size)``. DTensor applies every plain Shard of a tensor
    dim in mesh order, then its strided shards in mesh order (full_tensor undoes them in reverse), which is
    PyTorch's meaning of this placement for that case. ``split_factor`` is the number of pieces the plain
    shards cut the dim into (checked when a DTensor is built)."""

    __slots__ = ("split_factor",)

    def __init__(self, dim: int, split_factor: int):
        super().__init__(dim)
        if isinstance(split_factor, bool) or not isinstance(split_factor, int) or split_factor < 1:
            raise TypeError(f"_StridedShard(split_factor={split_factor!r}): expected a positive int")
        object.__setattr__(self, "split_factor", split_factor)

    def __eq__(self, other) -> bool:
        return (type(other) is _StridedShard and other.dim == self.dim
                and other.split_factor == self.split_factor)

    def __hash__(self) -> int:
        return hash(("_StridedShard", self.dim, self.split_factor))

    def __repr__(self) -> str:
        return f"_StridedShard(dim={self.dim}, sf={self.split_factor})"

    def __str__(self) -> str:
        return f"_S({self.dim}, {self.split_factor})"


class _InterleavedShard(Shard):
    """Shard(dim) of each of ``split_factor`` equal blocks of the dim: rank r holds its chunk of every block.

    [Note: Interleaved shard]
    A fused projection packs several outputs along one dim: GPT's c_attn weight is (3C, C), q, k and v
    stacked. Split by attention heads, tp rank r must hold the rows of its heads in each of q, k and v:
    three pieces of the global dim, [q_r; k_r; v_r] in its local array. With this placement (split_factor=3)
    the dim is cut into ``split_factor`` equal blocks and each block is chunked over the mesh dim (torch.chunk
    rule), rank r taking chunk r of every block, concatenated in block order; PyTorch writes the same layout
    as _StridedShard(dim, split_factor=3) on the tp mesh dim. It applies in mesh order together with the
    plain Shard placements (before any _StridedShard), so FSDP on top chunks the local [q_r; k_r; v_r] piece
    further over the data-parallel dims, and a rank's piece is then a list of global index ranges (DTensor's
    ``_local_ranges``), which full_tensor, checkpoints and state dicts handle."""

    __slots__ = ("split_factor",)

    def __init__(self, dim: int, split_factor: int):
        super().__init__(dim)
        if isinstance(split_factor, bool) or not isinstance(split_factor, int) or split_factor < 1:
            raise TypeError(f"_InterleavedShard(split_factor={split_factor!r}): expected a positive int")
        object.__setattr__(self, "split_factor", split_factor)

    def __eq__(self, other) -> bool:
        return (type(other) is _InterleavedShard and other.dim == self.dim
                and other.split_factor == self.split_factor)

    def __hash__(self) -> int:
        return hash(("_InterleavedShard", self.dim, self.split_factor))

    def __repr__(self) -> str:
        return f"_InterleavedShard(dim={self.dim}, sf={self.split_factor})"

    def __str__(self) -> str:
        return f"_I({self.dim}, {self.split_factor})"


class Replicate(Placement):
    """The full tensor on every rank of the mesh dimension."""

    __slots__ = ()

    def is_replicate(self) -> bool:
        return True

    def __eq__(self, other) -> bool:
        return isinstance(other, Replicate)

    def __hash__(self) -> int:
        return hash("Replicate")

    def __repr__(self) -> str:
        return "Replicate()"

    def __str__(self) -> str:
        return "R"


class Partial(Placement):
    """Each rank of the mesh dimension holds a partial value; the global tensor is their reduction with
    ``reduce_op`` ("sum", "avg", "max", "min" or "product"). ``redistribute`` to Replicate/Shard and
    ``full_tensor`` perform the reduction (an all-reduce over the mesh dimension)."""

    __slots__ = ("reduce_op",)
    REDUCE_OPS = ("sum", "avg", "max", "min", "product")

    def __init__(self, reduce_op: str = "sum"):
        if not isinstance(reduce_op, str) or reduce_op not in Partial.REDUCE_OPS:
            raise ValueError(f"Partial(reduce_op={reduce_op!r}): expected one of {', '.join(Partial.REDUCE_OPS)}")
        object.__setattr__(self, "reduce_op", reduce_op)

    def __setattr__(self, name, value):
        raise AttributeError("Partial is immutable")

    def __reduce__(self):
        return (Partial, (self.reduce_op,))

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return reduce_op is None or reduce_op == self.reduce_op

    def __eq__(self, other) -> bool:
        return type(other) is Partial and other.reduce_op == self.reduce_op

    def __hash__(self) -> int:
        return 1 + hash(self.reduce_op)

    def __repr__(self) -> str:
        return f"Partial({self.reduce_op})"

    def __str__(self) -> str:
        return f"P({self.reduce_op})"



class _NormPartial(Partial):
    """Partial p-norms: each rank holds the p-norm v_i of its part and the global value is (sum_i v_i^p)^(1/p)
    (max v_i for p = inf, min for -inf; sum for p = 0 and 1). What a vector norm over a sharded dim gives, as
    PyTorch's ``_NormPartial``: ``reduce_op`` is "sum" ("max", "min" for inf, -inf), but the reduction raises to
    the p-th power before it and takes the p-th root after it (``_pre_reduce``, ``_post_reduce``), so a
    "sum" Partial of another type is not the same placement (``==`` compares the type and the norm type)."""

    __slots__ = ("norm_type",)

    def __init__(self, norm_type=2):
        if norm_type in (float("inf"), "inf"):
            op = "max"
        elif norm_type in (float("-inf"), "-inf"):
            op = "min"
        elif isinstance(norm_type, (int, float)) and not isinstance(norm_type, bool):
            op = "sum"
        else:
            raise NotImplementedError(f"Unsupported norm type: {norm_type}")
        super().__init__(op)
        object.__setattr__(self, "norm_type", norm_type)

    def __reduce__(self):
        return (_NormPartial, (self.norm_type,))

    def _power(self):
        """The power the partial values are raised to before summing (None: summed or max/min as they are)."""
        if self.reduce_op != "sum" or float(self.norm_type) in (0.0, 1.0):
            return None
        return float(self.norm_type)

    def _pre_reduce(self, a):
        p = self._power()
        return a if p is None else a ** a.dtype.type(p)

    def _post_reduce(self, a):
        p = self._power()
        return a if p is None else a ** a.dtype.type(1.0 / p)

    def __eq__(self, other) -> bool:
        return type(other) is _NormPartial and other.norm_type == self.norm_type

    def __hash__(self) -> int:
        return 1 + hash(self.norm_type)

    def __repr__(self) -> str:
        return f"_NormPartial(reduce_op={self.reduce_op}, norm_type={self.norm_type})"

    def __str__(self) -> str:
        return f"NormP({self.reduce_op}, {self.norm_type})"
