"""Composable sharding policies and the communication interfaces FSDP calls."""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = [
    "MixedPrecisionPolicy",
    "Comm",
    "AllGather",
    "ReduceScatter",
    "DataParallelMeshDims",
    "OffloadPolicy",
    "CPUOffloadPolicy",
]


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """Dtypes FSDP uses for communication and compute.

    param_dtype: dtype of the unsharded parameters (all-gather and forward/backward compute);
        None keeps the sharded parameters' dtype.
    reduce_dtype: dtype of the gradient reduction; None uses param_dtype.
    output_dtype: dtype the root module's floating-point outputs are cast to; None leaves them.
    cast_forward_inputs: cast floating-point forward inputs to param_dtype.
    """

    param_dtype: Any = None
    reduce_dtype: Any = None
    output_dtype: Any = None
    cast_forward_inputs: bool = True


class Comm(ABC):
    """A communication primitive that also owns the allocation of its buffers."""

    @abstractmethod
    def allocate(self, size: Sequence[int], *, dtype: Any, device: Any) -> Any:
        """Return an uninitialised tensor of ``size`` for this primitive to communicate in."""
        import hpcfsdp as hp

        return hp.empty(tuple(size), dtype=dtype, device=device)


class AllGather(Comm):
    """All-gather of equal-size inputs into ``output_tensor`` (rank-major)."""

    @abstractmethod
    def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, async_op: bool = False) -> Any:
        raise NotImplementedError


class ReduceScatter(Comm):
    """Reduce ``input_tensor`` over ``group`` and scatter equal pieces into ``output_tensor``."""

    @abstractmethod
    def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any, async_op: bool = False) -> Any:
        raise NotImplementedError


@dataclass
class DataParallelMeshDims:
    """Names of the mesh dimensions FSDP shards over and replicates over (HSDP)."""

    shard: str | tuple[str, ...] | None = None
    replicate: str | tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.shard is None and self.replicate is None:
            raise ValueError("at least one data-parallel mesh dimension is required")

    @property
    def shard_names(self) -> tuple[str, ...]:
        """The mesh dimension names FSDP shards over, as a tuple."""
        if self.shard is None:
            return ()
        return (self.shard,) if isinstance(self.shard, str) else tuple(self.shard)

    @property
    def replicate_names(self) -> tuple[str, ...]:
        """The mesh dimension names FSDP replicates over (HSDP), as a tuple."""
        if self.replicate is None:
            return ()
        return (self.replicate,) if isinstance(self.replicate, str) else tuple(self.replicate)


@dataclass
class OffloadPolicy:
    """No offloading: sharded parameters, gradients and optimizer state stay on the compute device."""


@dataclass
class CPUOffloadPolicy(OffloadPolicy):
    """Sharded parameters, gradients and optimizer state live in host memory; the optimizer steps there.

    pin_memory: use page-locked host buffers for the device transfers (CuPy only).
    """

    pin_memory: bool = True
