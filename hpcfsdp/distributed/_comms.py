"""Default MPI implementations of FSDP's AllGather / ReduceScatter communication interfaces."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from hpcfsdp import _backend
from hpcfsdp._tensor import Tensor
from hpcfsdp.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
from hpcfsdp.distributed.process_group import ProcessGroup, ReduceOp

__all__ = ["MPIAllGather", "MPIReduceScatter", "allocate_buffer"]

# [Note: Comm buffers]
# FSDP asks its AllGather / ReduceScatter for the flat buffers it communicates in. On the CPU we
# hand out page-locked memory when CuPy is present (a later host-to-device copy of the gathered
# parameters, CPU offload, is then asynchronous) and plain NumPy memory otherwise; on a GPU the
# buffer is a CuPy array on the requested device. Staging for a non-CUDA-aware MPI uses the comm
# thread's own pinned buffers (_buffers.HostStager), so device buffers stay on the device.


def allocate_buffer(size: Sequence[int], *, dtype: Any, device: Any) -> Tensor:
    """An uninitialised Tensor of ``size`` on ``device`` suited to MPI (see [Note: Comm buffers])."""
    dt = _backend.to_dtype(dtype)
    dev = _backend.to_device(device)
    shape = tuple(int(s) for s in size)
    if dev.type == "cpu":
        return Tensor._wrap(_backend.pinned_empty(shape, dt))
    if dev.type == "cuda":
        cp = _backend.array_module(dev)
        with cp.cuda.Device(dev.index):
            return Tensor._wrap(cp.empty(shape, dt))
    raise ValueError(f"allocate: device {dev} cannot hold communication buffers; expected cpu or cuda")


def _array(x: Any, what: str):
    if isinstance(x, Tensor):
        return x._data
    if isinstance(x, np.ndarray) or _backend.is_cupy_array(x):
        return x
    raise TypeError(f"{what}: expected a Tensor or an array, got {type(x).__name__}")


def _group(group: Any) -> ProcessGroup:
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group={group!r}: expected a ProcessGroup")
    return group


class MPIAllGather(AllGather):
    """All-gather over the group's MPI communicator on the communication thread."""

    def allocate(self, size: Sequence[int], *, dtype: Any, device: Any) -> Tensor:
        return allocate_buffer(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, async_op: bool = False):
        return _group(group).all_gather_into(
            _array(output_tensor, "all-gather output"), _array(input_tensor, "all-gather input"), async_op
        )


class MPIReduceScatter(ReduceScatter):
    """Reduce-scatter over the group's MPI communicator on the communication thread."""

    def allocate(self, size: Sequence[int], *, dtype: Any, device: Any) -> Tensor:
        return allocate_buffer(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any = ReduceOp.SUM,
                 async_op: bool = False):
        return _group(group).reduce_scatter_into(
            _array(output_tensor, "reduce-scatter output"), _array(input_tensor, "reduce-scatter input"),
            op, async_op,
        )
