"""hpcfsdp.amp: PyTorch's ``torch.amp``: GradScaler (loss scaling) and autocast (per-op dtypes in a region)."""

from .autocast_mode import autocast, custom_bwd, custom_fwd, is_autocast_available
from .grad_scaler import GradScaler

__all__ = ["autocast", "custom_bwd", "custom_fwd", "is_autocast_available", "GradScaler"]
