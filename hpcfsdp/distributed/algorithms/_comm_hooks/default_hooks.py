"""The gradient communication hooks FSDP1's ``register_comm_hook`` takes, as PyTorch's default_hooks: plain
all-reduce / reduce-scatter with the pre- and post-division by the group size, and float16 / bfloat16 compression.

A hook owns the whole reduction of a unit's flat gradient, division included: ``hook(state, grad)`` all-reduces in
place (unsharded strategies), ``hook(state, grad, output)`` reduce-scatters ``grad`` (this rank's flat gradient,
every rank's piece back to back) into ``output`` (this rank's piece).
"""
import functools

from ... import distributed_c10d as dist
from .... import _backend

__all__ = ["DefaultState", "LowPrecisionState", "allreduce_hook", "reduce_scatter_hook", "fp16_compress_hook",
           "bf16_compress_hook"]


class DefaultState:
    """The group a hook reduces over and its division factors (before the sum, by about sqrt(N); after it, by
    the rest), so that a low-precision sum does not overflow."""

    __slots__ = ["process_group", "world_size", "gradient_predivide_factor", "gradient_postdivide_factor"]

    def __init__(self, process_group):
        if process_group is None:
            raise ValueError(f"Expected to pass in an explicit ProcessGroup to {self}.")
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.gradient_predivide_factor = self._get_gradient_predivide_factor(self.world_size)
        self.gradient_postdivide_factor = self.world_size / self.gradient_predivide_factor

    @staticmethod
    def _get_gradient_predivide_factor(world_size: int) -> float:
        factor = 1
        while world_size % factor == 0 and world_size / factor > factor:
            factor *= 2
        return float(factor)


class LowPrecisionState(DefaultState):
    """DefaultState plus the parameters' dtype, which a compression hook casts the reduced gradient back to."""

    __slots__ = ["parameter_type"]

    def __init__(self, process_group, parameter_type=None):
        super().__init__(process_group)
        self.parameter_type = _backend.float32 if parameter_type is None else _backend.to_dtype(parameter_type)


def allreduce_hook(state: DefaultState, grad) -> None:
    """All-reduce ``grad`` in place over ``state.process_group``, averaged in two divisions."""
    if state.gradient_predivide_factor > 1:
        grad.div_(state.gradient_predivide_factor)
    dist.all_reduce(grad, group=state.process_group)
    if state.gradient_postdivide_factor > 1:
        grad.div_(state.gradient_postdivide_factor)


def reduce_scatter_hook(state: DefaultState, grad, output) -> None:
    """Reduce-scatter ``grad`` into ``output`` over ``state.process_group``, averaged in two divisions."""
    if state.gradient_predivide_factor > 1:
        grad.div_(state.gradient_predivide_factor)
    dist.reduce_scatter_tensor(output, grad, group=state.process_group)
    if state.gradient_postdivide_factor > 1:
        output.div_(state.gradient_postdivide_factor)


def _low_precision_hook(dtype, state: LowPrecisionState, grad, output) -> None:
    dtype = _backend.to_dtype(dtype)
    if grad.dtype != dtype:
        grad.data = grad.data.to(dtype)
    if output is not None:
        if output.dtype != dtype:
            output.data = output.data.to(dtype)
        reduce_scatter_hook(state, grad, output)
        output.data = output.data.to(state.parameter_type)
    else:
        allreduce_hook(state, grad)
        grad.data = grad.data.to(state.parameter_type)


def fp16_compress_hook(state: LowPrecisionState, grad, output=None) -> None:
    """Communicate the gradient in float16 (pre- and post-divided), then cast it back to the parameters' dtype."""
    return functools.partial(_low_precision_hook, _backend.float16)(state, grad, output)


def bf16_compress_hook(state: LowPrecisionState, grad, output=None) -> None:
    """Communicate the gradient in bfloat16 (pre- and post-divided), then cast it back to the parameters' dtype."""
    return functools.partial(_low_precision_hook, _backend.bfloat16)(state, grad, output)
