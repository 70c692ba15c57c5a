"""autocast: PyTorch's ``torch.autocast`` region, per-op dtypes for CPU and CUDA tensors (see [Note: Autocast])."""

from __future__ import annotations

import functools
import warnings

from hpcfsdp import _autocast, _backend, accelerator
from hpcfsdp._tensor_base import TensorBase

__all__ = ["autocast", "is_autocast_available", "custom_fwd", "custom_bwd"]

_SUPPORTED = {"cpu": (_backend.bfloat16, _backend.float16), "cuda": (_backend.float16, _backend.bfloat16)}


def _cuda_available() -> bool:
    return accelerator.is_available()  # what hpcfsdp.cuda.is_available() answers (hpcfsdp.cuda imports this package)


class autocast:  # noqa: N801 (PyTorch's name)
    """``with autocast(device_type, dtype=None, enabled=True, cache_enabled=None):`` (also a decorator).

    Inside, ops on ``device_type`` tensors follow PyTorch's autocast lists: matmul, linear, convolutions,
    attention run in ``dtype`` (default bfloat16 on CPU, float16 on CUDA), losses (and on CUDA softmax,
    layer_norm, exp, sum, ...) in float32. As PyTorch: an unavailable device or unsupported dtype warns and
    disables; nesting restores the outer state on exit; the state is per thread."""

    def __init__(self, device_type: str, dtype=None, enabled: bool = True, cache_enabled: bool | None = None):
        if not isinstance(device_type, str):
            raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
        if device_type not in _SUPPORTED:
            raise RuntimeError(f"User specified an unsupported autocast device_type '{device_type}'")
        self.device = device_type
        self.fast_dtype = _autocast.DEFAULT_DTYPES[device_type] if dtype is None else dtype
        self._cache_enabled = True if cache_enabled is None else bool(cache_enabled)
        enabled = bool(enabled)
        if enabled and device_type == "cuda" and not _cuda_available():
            warnings.warn("CUDA is not available or torch_xla is imported. Disabling autocast.", stacklevel=2)
            enabled = False
        if enabled and self.fast_dtype not in _SUPPORTED[device_type]:
            kind = "CPU" if device_type == "cpu" else "CUDA"
            names = ", ".join(f"torch.{d.name}" for d in _SUPPORTED[device_type])
            warnings.warn(f"In {kind} autocast, but the target dtype is not supported. Disabling autocast.\n"
                          f"{kind} Autocast only supports dtypes of {names} currently.", stacklevel=2)
            enabled = False
        self._enabled = enabled
        self._prev = []

    def __enter__(self):
        self._prev.append(_autocast.set_state(self.device, self._enabled, self.fast_dtype))
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        enabled, dtype = self._prev.pop()
        _autocast.set_state(self.device, enabled, dtype)
        return False

    def __call__(self, func):
        @functools.wraps(func)
        def decorate_autocast(*args, **kwargs):
            with self:
                return func(*args, **kwargs)

        return decorate_autocast


def is_autocast_available(device_type: str) -> bool:
    """Whether ``device_type`` supports autocast ("cpu" and "cuda", as PyTorch, whether or not a GPU is here)."""
    return device_type in _SUPPORTED


def _floating_args_to(dtype, device_type, args, kwargs):
    def cast(a):
        if isinstance(a, TensorBase) and a.is_floating_point() and a.device.type == device_type:
            return a.to(dtype)
        return a

    return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


def custom_fwd(fwd=None, *, device_type: str | None = None, cast_inputs=None):
    """On a custom Function's forward. Records the autocast state for ``custom_bwd``; with ``cast_inputs``
    inside an enabled region, casts the floating tensor arguments to it and runs forward with autocast off."""
    if fwd is None:
        return functools.partial(custom_fwd, device_type=device_type, cast_inputs=cast_inputs)
    dev = device_type or "cuda"

    @functools.wraps(fwd)
    def decorate_fwd(ctx, *args, **kwargs):
        ctx._dtype = _autocast.get_dtype(dev)
        enabled = _autocast.is_enabled(dev)
        ctx._fwd_used_autocast = enabled and cast_inputs is None  # as PyTorch: cast inputs, backward runs off
        if cast_inputs is None or not enabled:
            return fwd(ctx, *args, **kwargs)
        args, kwargs = _floating_args_to(cast_inputs, dev, args, kwargs)
        with autocast(device_type=dev, enabled=False):
            return fwd(ctx, *args, **kwargs)

    return decorate_fwd


def custom_bwd(bwd=None, *, device_type: str | None = None):
    """On a custom Function's backward: runs it with the autocast state its forward had (``custom_fwd``)."""
    if bwd is None:
        return functools.partial(custom_bwd, device_type=device_type)
    dev = device_type or "cuda"

    @functools.wraps(bwd)
    def decorate_bwd(ctx, *args, **kwargs):
        enabled = getattr(ctx, "_fwd_used_autocast", False)
        dtype = getattr(ctx, "_dtype", _autocast.DEFAULT_DTYPES[dev])
        prev = _autocast.set_state(dev, enabled, dtype)
        try:
            return bwd(ctx, *args, **kwargs)
        finally:
            _autocast.set_state(dev, *prev)

    return decorate_bwd
