"""ShardedGradScaler: GradScaler for sharded gradients; the found-inf flag is agreed over the ranks."""

from __future__ import annotations

import numpy as np

from ... import _backend
from ..._creation import full
from ..._tensor import Tensor
from ...amp.grad_scaler import GradScaler, OptState
from ..distributed_c10d import all_reduce
from ..process_group import ReduceOp

__all__ = ["ShardedGradScaler"]

# [Note: Sharded gradient scaling]
# Under FSDP each rank holds only its piece of every gradient (a DTensor whose ``_data`` is the local
# shard), so an inf or NaN in one rank's piece is invisible to the others. unscale_ therefore reduces this
# rank's found-inf flag with MAX over ``process_group`` (default: the world group): every rank skips the
# optimizer step and backs off the scale together, or none does, and the scale stays the same everywhere.
# One all-reduce per optimizer per step, of one float. Half-precision gradients are allowed (FSDP's
# reduce dtype may be float16), and scale() keeps the dtype of what it scales, as PyTorch's does.


class ShardedGradScaler(GradScaler):
    """PyTorch's ``torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler`` (note its argument order:
    backoff_factor before growth_factor). See [Note: Sharded gradient scaling] and [Note: Gradient scaling]."""

    def __init__(self, device: str = "cuda", init_scale: float = 2.0**16, backoff_factor: float = 0.5,
                 growth_factor: float = 2.0, growth_interval: int = 2000, enabled: bool = True,
                 process_group=None) -> None:
        super().__init__(device, init_scale=init_scale, backoff_factor=backoff_factor, growth_factor=growth_factor,
                         growth_interval=growth_interval, enabled=enabled)
        if self._enabled:
            self.process_group = process_group

    def _scale_one(self, t: Tensor) -> Tensor:
        scaled = super()._scale_one(t)
        return scaled if scaled.dtype == t.dtype else scaled.to(t.dtype)

    def unscale_(self, optimizer) -> None:
        """Unscale this rank's gradient pieces and agree on the found-inf flag over the ranks (collective)."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("unscale_")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = float(np.float32(1.0 / float(self._scale.item())))
        found = self._unscale_grads_(optimizer, inv_scale, True)
        flag = Tensor._wrap(np.array(max((f.item() for f in found.values()), default=0.0), np.float32))
        all_reduce(flag, op=ReduceOp.MAX, group=self.process_group)
        dev = _backend.device_of_array(self._scale._data)
        state["found_inf_per_device"] = {dev: full((), flag.item(), dtype=_backend.float32, device=dev)}
        state["stage"] = OptState.UNSCALED
