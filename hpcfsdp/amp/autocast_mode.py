"""autocast: PyTorch's signature; disabled it does nothing, enabled it raises (hpcfsdp has no per-op autocast)."""

from __future__ import annotations

import functools

__all__ = ["autocast", "is_autocast_available", "custom_fwd", "custom_bwd"]

# [Note: No autocast]
# PyTorch's autocast picks a dtype per op inside a region (matmuls in float16/bfloat16, reductions in
# float32). hpcfsdp has no per-op dtype dispatch: mixed precision is FSDP's, by parameter and reduction
# dtype (fully_shard(mp_policy=MixedPrecisionPolicy(param_dtype=hp.bfloat16, reduce_dtype=hp.float32)), or
# FSDP1's MixedPrecision), which is what autocast does for the matmuls of an FSDP model. So that a script
# runs unchanged where it can, ``autocast(..., enabled=False)`` is an inert context manager and decorator;
# an enabled autocast raises NotImplementedError naming those policies instead of silently computing in
# float32. is_autocast_available() answers False for every device; custom_fwd/custom_bwd, which only act
# inside an enabled autocast region, return the function unchanged.

_MESSAGE = ("hpcfsdp has no per-op autocast: autocast(device_type={dev!r}, dtype={dtype}, enabled=True) is not "
            "supported. Use FSDP mixed precision instead: fully_shard(model, mp_policy=MixedPrecisionPolicy("
            "param_dtype=hp.bfloat16, reduce_dtype=hp.float32)) (hpcfsdp.distributed.fsdp.MixedPrecisionPolicy), "
            "or FSDP(model, mixed_precision=MixedPrecision(...)) for FSDP1, and cast inputs yourself; pass "
            "enabled=False to keep the autocast region as a no-op.")


class autocast:  # noqa: N801 (PyTorch's name)
    """``with autocast(device_type, dtype=None, enabled=True, cache_enabled=None):`` (also a decorator).
    Only ``enabled=False`` is supported; see [Note: No autocast]."""

    def __init__(self, device_type: str, dtype=None, enabled: bool = True, cache_enabled: bool | None = None):
        if not isinstance(device_type, str):
            raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
        self.device = device_type
        self.fast_dtype = dtype
        self._enabled = bool(enabled)
        self._cache_enabled = cache_enabled
        if self._enabled:
            raise NotImplementedError(_MESSAGE.format(dev=device_type, dtype=dtype))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        return False

    def __call__(self, func):
        @functools.wraps(func)
        def decorate_autocast(*args, **kwargs):
            with self:
                return func(*args, **kwargs)

        return decorate_autocast


def is_autocast_available(device_type: str) -> bool:
    """False: hpcfsdp has no autocast on any device (see [Note: No autocast])."""
    return False


def custom_fwd(fwd=None, *, device_type: str | None = None, cast_inputs=None):
    """``@custom_fwd(device_type="cuda")`` on a custom Function's forward: unchanged (no autocast region)."""
    if fwd is None:
        return functools.partial(custom_fwd, device_type=device_type, cast_inputs=cast_inputs)
    return fwd


def custom_bwd(bwd=None, *, device_type: str | None = None):
    """``@custom_bwd(device_type="cuda")`` on a custom Function's backward: unchanged (no autocast region)."""
    if bwd is None:
        return functools.partial(custom_bwd, device_type=device_type)
    return bwd
