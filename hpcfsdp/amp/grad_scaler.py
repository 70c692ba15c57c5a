"""GradScaler: dynamic loss scaling for float16 training (PyTorch's ``torch.amp.GradScaler``)."""

from __future__ import annotations

import warnings
from collections import abc, defaultdict
from enum import Enum
from typing import Any

import numpy as np

from .. import _backend, accelerator
from .._creation import full
from .._tensor import Tensor

__all__ = ["OptState", "GradScaler"]

# [Note: Gradient scaling]
# As PyTorch's GradScaler: scale(loss) multiplies the loss by the scale S (a float32 0-d tensor on the
# loss's device), so float16 gradients do not underflow; unscale_(opt) multiplies every gradient of
# ``opt`` by float32(1/S) in place (half-precision gradients through float32) and records whether any
# gradient holds an inf or NaN; step(opt) unscales if that has not happened yet and calls opt.step()
# only when nothing was found; update() then backs off (S *= backoff_factor, tracker = 0) after a step
# with an inf/NaN, or counts the clean step and grows (S *= growth_factor, if that stays finite) after
# growth_interval clean steps in a row. unscale_ runs once per optimizer per step (a second call raises).
# Gradients are the local arrays (``g._data``): for a sharded DTensor gradient this rank's piece, which
# is why ShardedGradScaler (distributed.fsdp.sharded_grad_scaler) all-reduces the found-inf flag.
# ``device="cuda"`` without a visible GPU warns and disables the scaler, as PyTorch does on a CPU-only
# machine; ``device="cpu"`` scales on the CPU.


class OptState(Enum):
    READY = 0  # nothing done for this optimizer since the last update()
    UNSCALED = 1  # unscale_() ran: gradients unscaled, found-inf recorded
    STEPPED = 2  # step() ran (or skipped the optimizer's step)


def _refresh_per_optimizer_state() -> dict[str, Any]:
    return {"stage": OptState.READY, "found_inf_per_device": {}}


class GradScaler:
    """Dynamic loss scaling: ``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()``.
    See [Note: Gradient scaling]."""

    def __init__(self, device: str = "cuda", init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        self._device = str(device)
        self._enabled = enabled
        if self._device == "cuda" and enabled and not accelerator.is_available():
            warnings.warn("torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.",
                          stacklevel=2)
            self._enabled = False
        if self._enabled:
            if growth_factor <= 1.0:
                raise ValueError(f"The growth factor must be > 1.0, got {growth_factor}")
            if backoff_factor >= 1.0:
                raise ValueError(f"The backoff factor must be < 1.0, got {backoff_factor}")
            self._init_scale = init_scale
            self._scale: Tensor | None = None
            self._growth_factor = growth_factor
            self._backoff_factor = backoff_factor
            self._growth_interval = growth_interval
            self._init_growth_tracker = 0
            self._growth_tracker: Tensor | None = None
            self._per_optimizer_states: dict = defaultdict(_refresh_per_optimizer_state)

    # -- scale --------------------------------------------------------------------------------------
    def _check_scale_growth_tracker(self, funcname: str) -> tuple[Tensor, Tensor]:
        if self._scale is None or self._growth_tracker is None:
            raise RuntimeError(f"Attempted {funcname} but _scale is None.  This may indicate your script did not "
                               "use scaler.scale(loss or outputs) earlier in the iteration.")
        return self._scale, self._growth_tracker

    def _lazy_init_scale_growth_tracker(self, dev) -> None:
        self._scale = full((), self._init_scale, dtype=_backend.float32, device=dev)
        self._growth_tracker = full((), self._init_growth_tracker, dtype=_backend.int32, device=dev)

    def _scale_one(self, t: Tensor) -> Tensor:
        if self._scale is None:
            self._lazy_init_scale_growth_tracker(t.device)
        return t * self._scale.to(t.device)

    def scale(self, outputs):
        """``outputs`` (a tensor, or nested lists/tuples/iterables of tensors) times the scale; unchanged when
        disabled."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            return self._scale_one(outputs)

        def apply_scale(val):
            if isinstance(val, Tensor):
                return self._scale_one(val)
            if isinstance(val, abc.Iterable):
                it = map(apply_scale, val)
                return type(val)(it) if isinstance(val, (list, tuple)) else it
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply_scale(outputs)

    # -- unscale / step -----------------------------------------------------------------------------
    def _unscale_grads_(self, optimizer, inv_scale: float, allow_fp16: bool) -> dict:
        """Multiply the gradients of ``optimizer`` by ``inv_scale`` (a float32 value) in place; returns
        {device: 0-d float32 tensor, 1.0 where some gradient on that device has an inf or NaN}."""
        found: dict = {}
        agreed: dict = {}  # gradient type with an agreement hook (DTensor) -> (its grads, device, any bad here)
        for group in optimizer.param_groups:
            for param in group["params"]:
                g = param.grad
                if g is None:
                    continue
                if not allow_fp16 and g.dtype == _backend.float16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                arr = g._data
                if _backend.is_meta_array(arr):
                    continue
                xp = _backend.array_module(arr)
                dev = _backend.device_of_array(arr)
                if arr.dtype in (_backend.float16, _backend.bfloat16):  # through float32, as PyTorch's kernel
                    wide = arr.astype(np.float32)
                    bad = ~xp.isfinite(wide).all()
                    if inv_scale != 1.0:
                        arr[...] = (wide * np.float32(inv_scale)).astype(arr.dtype)
                else:
                    bad = ~xp.isfinite(arr).all()
                    if inv_scale != 1.0:
                        arr *= arr.dtype.type(inv_scale)
                found[dev] = bad if dev not in found else (found[dev] | bad)
                if getattr(type(g), "__hp_agree_max__", None) is not None:
                    gs, _, any_bad = agreed.get(type(g), ([], dev, False))
                    agreed[type(g)] = (gs + [g], dev, any_bad | bool(bad))
        # Sharded gradients: an inf in one rank's piece is invisible to the others, so the flag is agreed (MAX)
        # over the ranks that shard them, as PyTorch's DTensor does in its unscale kernel: every rank skips the
        # step together (in gradient order, the same on every rank: collective)
        for cls, (gs, dev, any_bad) in agreed.items():
            if cls.__hp_agree_max__(gs, 1.0 if any_bad else 0.0):
                found[dev] = _backend.array_module(gs[0]._data).asarray(True)
        return {dev: Tensor._wrap(_backend.array_module(bad).asarray(bad, dtype=np.float32))
                for dev, bad in found.items()}

    def unscale_(self, optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale in place (e.g. before clipping) and record infs/NaNs.
        Once per optimizer per step; ``step`` does it when it has not been done."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("unscale_")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = float(np.float32(1.0 / float(self._scale.item())))
        state["found_inf_per_device"] = self._unscale_grads_(optimizer, inv_scale, False)
        state["stage"] = OptState.UNSCALED

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        if not sum(v.item() for v in optimizer_state["found_inf_per_device"].values()):
            return optimizer.step(*args, **kwargs)
        return None

    def step(self, optimizer, *args, **kwargs):
        """Unscale (if not done) and call ``optimizer.step(*args, **kwargs)`` unless a gradient has an inf or
        NaN; returns what ``optimizer.step`` returned (None when skipped)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if len(state["found_inf_per_device"]) == 0:
            raise RuntimeError("No inf checks were recorded for this optimizer: none of its parameters has a "
                               "gradient.")
        retval = self._maybe_opt_step(optimizer, state, *args, **kwargs)
        state["stage"] = OptState.STEPPED
        return retval

    # -- update -------------------------------------------------------------------------------------
    def _found_inf_combined(self) -> float:
        found = [f.item() for st in self._per_optimizer_states.values() for f in st["found_inf_per_device"].values()]
        if not found:
            raise RuntimeError("No inf checks were recorded prior to update.")
        return float(sum(found))

    def _update_scale(self, found_inf: float) -> None:
        """PyTorch's _amp_update_scale_: back off after an inf/NaN, grow after growth_interval clean steps."""
        scale, tracker = self._scale, self._growth_tracker
        if found_inf:
            scale._data[...] = np.float32(float(scale.item()) * self._backoff_factor)
            tracker._data[...] = 0
            return
        successful = int(tracker.item()) + 1
        if successful == self._growth_interval:
            with np.errstate(over="ignore"):  # a scale past float32's range stays where it is
                new = np.float32(float(scale.item()) * self._growth_factor)
            if np.isfinite(new):
                scale._data[...] = new
            tracker._data[...] = 0
        else:
            tracker._data[...] = successful

    def update(self, new_scale=None) -> None:
        """End of the iteration: set the scale to ``new_scale`` when given, else back off or grow it (see
        [Note: Gradient scaling]); forgets the per-optimizer state of this iteration."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("update")
        if new_scale is not None:
            if isinstance(new_scale, Tensor):
                if new_scale.numel() != 1 or new_scale.requires_grad:
                    raise ValueError("new_scale should be a float or a 1-element tensor with requires_grad=False.")
                new_scale = float(new_scale.item())
            self._scale._data[...] = np.float32(new_scale)
        else:
            self._update_scale(self._found_inf_combined())
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    # -- accessors and state ------------------------------------------------------------------------
    def _get_scale_async(self):
        return self._scale

    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled)."""
        if self._enabled:
            return self._init_scale if self._scale is None else float(self._scale.item())
        return 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = new_interval

    def _get_growth_tracker(self) -> int:
        if self._enabled:
            return self._init_growth_tracker if self._growth_tracker is None else int(self._growth_tracker.item())
        return 0

    def is_enabled(self) -> bool:
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        """{"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}; {} when disabled."""
        if self._enabled:
            return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                    "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                    "_growth_tracker": self._get_growth_tracker()}
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned; a no-op when disabled."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved from a disabled "
                               "instance of GradScaler.")
        self._init_scale = float(state_dict["scale"])
        if self._scale is not None:
            self._scale._data[...] = np.float32(self._init_scale)
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        if self._growth_tracker is not None:
            self._growth_tracker._data[...] = self._init_growth_tracker

    def _found_inf_per_device(self, optimizer) -> dict:
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
