"""DTensor placements: Shard(dim) and Replicate() (the subset FSDP needs)."""

from __future__ import annotations

__all__ = ["Placement", "Shard", "Replicate"]


class Placement:
    """How a DTensor's data is laid out along one mesh dimension."""

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicate(self) -> bool:
        return False

    def is_partial(self) -> bool:
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
        return isinstance(other, Shard) and other.dim == self.dim

    def __hash__(self) -> int:
        return hash(("Shard", self.dim))

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim})"

    def __str__(self) -> str:
        return f"S({self.dim})"


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
