"""Autocast's per-thread state and per-op casting (the engine behind ``hpcfsdp.autocast``).

[Note: Autocast]
``torch.autocast(device_type, dtype)`` changes the dtype of some ops inside a region, for the tensors on that
device type only: matmul-like ops run in the lower-precision dtype, some numerically sensitive ops in float32,
every other op in whatever dtype its inputs have. hpcfsdp transcribes PyTorch's op lists (checked against
PyTorch 2.13 on CPU, and PyTorch's documented CUDA lists) as decorators on the ops themselves:

    @autocast_op(cpu=LOWER, cuda=LOWER)   # e.g. linear, matmul, conv
    @autocast_op(cpu=FP32, cuda=FP32)     # e.g. cross_entropy, mse_loss
    @autocast_op(cuda=FP32)               # e.g. softmax, layer_norm: float32 under CUDA autocast only

Inside an enabled region for the device of the op's first tensor argument, the decorator casts the op's
eligible tensor arguments (floating point, not float64: PyTorch leaves doubles alone) to the region's dtype
(LOWER) or to float32 (FP32) with differentiable casts, so gradients reach float32 parameters in float32.
Outside any region one integer test is the whole cost. PyTorch's cache of cast weights is not kept (each op
casts again: the same values, some more work). State is per thread, as PyTorch's.
"""
from __future__ import annotations

import functools
import threading

from . import _backend
from ._tensor_base import TensorBase

__all__ = ["LOWER", "FP32", "autocast_op", "is_enabled", "get_dtype", "set_state", "DEFAULT_DTYPES",
           "is_autocast_enabled", "get_autocast_dtype", "set_autocast_enabled", "set_autocast_dtype",
           "is_autocast_cpu_enabled", "get_autocast_cpu_dtype", "get_autocast_gpu_dtype", "clear_autocast_cache",
           "is_autocast_cache_enabled", "set_autocast_cache_enabled"]

LOWER = "lower"
FP32 = "fp32"
DEFAULT_DTYPES = {"cpu": _backend.bfloat16, "cuda": _backend.float16}

_LOCAL = threading.local()  # .state: {device_type: (enabled, dtype)}
_ACTIVE = [0]  # enabled regions open in any thread: when 0, ops skip the casting path entirely
_ACTIVE_LOCK = threading.Lock()


def _state() -> dict:
    st = getattr(_LOCAL, "state", None)
    if st is None:
        st = _LOCAL.state = {dev: (False, dt) for dev, dt in DEFAULT_DTYPES.items()}
    return st


def is_enabled(device_type: str) -> bool:
    return _state().get(device_type, (False, None))[0]


def get_dtype(device_type: str):
    return _state()[device_type][1]


def set_state(device_type: str, enabled: bool, dtype) -> tuple:
    """Set this thread's autocast state for ``device_type``; returns the previous (enabled, dtype)."""
    st = _state()
    prev = st[device_type]
    st[device_type] = (bool(enabled), dtype)
    with _ACTIVE_LOCK:
        _ACTIVE[0] += int(bool(enabled)) - int(prev[0])
    return prev


def _first_device_type(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, TensorBase):
            return a.device.type
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, TensorBase):
                    return b.device.type
    return None


def _cast_args(policy: dict, args, kwargs):
    dev = _first_device_type(args, kwargs)
    enabled, dtype = _state().get(dev, (False, None))
    rule = policy.get(dev)
    if not enabled or rule is None:
        return args, kwargs
    target = dtype if rule == LOWER else _backend.float32

    def cast(a):
        if isinstance(a, TensorBase):
            if (a.dtype != target and a.dtype != _backend.float64 and a.is_floating_point()
                    and a.device.type == dev):
                return a.to(target)
            return a
        if isinstance(a, (list, tuple)) and any(isinstance(b, TensorBase) for b in a):
            return type(a)(cast(b) for b in a)
        return a

    return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


def autocast_op(*, cpu: str | None = None, cuda: str | None = None):
    """Decorate an op with its autocast rule per device type (LOWER, FP32 or None). See [Note: Autocast]."""
    policy = {"cpu": cpu, "cuda": cuda}

    def deco(fn):
        @functools.wraps(fn)
        def op(*args, **kwargs):
            if _ACTIVE[0]:
                args, kwargs = _cast_args(policy, args, kwargs)
            return fn(*args, **kwargs)

        return op

    return deco


# -- PyTorch's torch-level autocast state functions (torch.is_autocast_enabled, ...) -------------------------------
def _device_type(device_type):
    if device_type not in DEFAULT_DTYPES:
        raise RuntimeError(f"User specified an unsupported autocast device_type '{device_type}'")
    return device_type


def is_autocast_enabled(device_type: str | None = None) -> bool:
    """Whether autocast is on in this thread for ``device_type`` (no argument: CUDA, as PyTorch)."""
    return is_enabled(_device_type("cuda" if device_type is None else device_type))


def get_autocast_dtype(device_type: str):
    return get_dtype(_device_type(device_type))


def set_autocast_enabled(device_type, enabled=None) -> None:
    """``set_autocast_enabled(device_type, enabled)``; the older ``set_autocast_enabled(enabled)`` means CUDA."""
    if enabled is None:
        device_type, enabled = "cuda", device_type
    dev = _device_type(device_type)
    set_state(dev, enabled, get_dtype(dev))


def set_autocast_dtype(device_type: str, dtype) -> None:
    dev = _device_type(device_type)
    set_state(dev, is_enabled(dev), dtype)


def is_autocast_cpu_enabled() -> bool:
    return is_enabled("cpu")


def get_autocast_cpu_dtype():
    return get_dtype("cpu")


def get_autocast_gpu_dtype():
    return get_dtype("cuda")


def clear_autocast_cache() -> None:
    """Nothing to clear: hpcfsdp keeps no cache of cast weights (see [Note: Autocast])."""


_CACHE = [True]


def is_autocast_cache_enabled() -> bool:
    return _CACHE[0]


def set_autocast_cache_enabled(enabled: bool) -> None:
    _CACHE[0] = bool(enabled)

