"""hpcfsdp.cuda.amp: PyTorch's deprecated ``torch.cuda.amp`` names (GradScaler, autocast) over hpcfsdp.amp."""

from __future__ import annotations

import warnings

from .. import _backend
from . import grad_scaler as _grad_scaler
from .autocast_mode import autocast as _autocast
from .autocast_mode import custom_bwd as _custom_bwd
from .autocast_mode import custom_fwd as _custom_fwd

__all__ = ["autocast", "custom_bwd", "custom_fwd", "GradScaler"]


class GradScaler(_grad_scaler.GradScaler):
    """Deprecated: ``hpcfsdp.amp.GradScaler("cuda", ...)``."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        warnings.warn("`torch.cuda.amp.GradScaler(args...)` is deprecated. Please use "
                      "`torch.amp.GradScaler('cuda', args...)` instead.", FutureWarning, stacklevel=2)
        super().__init__("cuda", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)


class autocast(_autocast):  # noqa: N801 (PyTorch's name)
    """Deprecated: ``hpcfsdp.amp.autocast("cuda", ...)``."""

    def __init__(self, enabled: bool = True, dtype=_backend.float16, cache_enabled: bool = True):
        warnings.warn("`torch.cuda.amp.autocast(args...)` is deprecated. Please use "
                      "`torch.amp.autocast('cuda', args...)` instead.", FutureWarning, stacklevel=2)
        super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


def custom_fwd(fwd=None, *, cast_inputs=None):
    """Deprecated: ``hpcfsdp.amp.custom_fwd(device_type="cuda")``; returns ``fwd`` unchanged."""
    return _custom_fwd(fwd, device_type="cuda", cast_inputs=cast_inputs)


def custom_bwd(bwd=None):
    """Deprecated: ``hpcfsdp.amp.custom_bwd(device_type="cuda")``; returns ``bwd`` unchanged."""
    return _custom_bwd(bwd, device_type="cuda")
