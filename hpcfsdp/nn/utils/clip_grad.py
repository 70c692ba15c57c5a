"""Gradient clipping in place: clip_grad_norm_ (sharding-aware) and clip_grad_value_."""
import math
from typing import Iterable, Union

import numpy as np

from hpcfsdp import _backend
from hpcfsdp._tensor import Tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_", "get_total_norm", "clip_grads_with_norm_"]

# [Note: Norms of sharded gradients]
# The norm is computed from each gradient's local array (``g._data``). For a plain Tensor that is the
# whole gradient. For a sharded one (DTensor) it is this rank's piece, and summing the local partials
# over the shard group gives the global value without counting replicas twice. The Tensor subclass
# provides that reduction as the classmethod
#     __hp_reduce_norm__(grads, local_value, norm_type) -> float
# called once per subclass with all of its grads and their local partial: sum(|x|^p) over the local
# pieces, or max(|x|) for p = inf. It returns the partial reduced over the right groups (same units:
# summed |x|^p, or max), so clipping does one collective per subclass, not one per gradient.
# The subclass may also define
#     __hp_norm_result__(grads, total) -> Tensor
# to give the total norm its own type: a DTensor returns a DTensor replicated over the gradients' mesh,
# as PyTorch's clip_grad_norm_ does for DTensor gradients.
#
# [Note: Clipping on the device]
# When every gradient is a CuPy array the norm, the clip coefficient and the scaling stay on the device and
# nothing reads back (PyTorch's clip_grad_norm_ does not sync either): the 2-norm is two fused launches for
# all gradients of a dtype (hpcfsdp/_kernels/optim.py: per-block sums of squares in float64, then their sum and
# square root), the scaling one (the kernel computes min(1, max_norm / (norm + 1e-6)) from the norm in device
# memory, rounded in the norm's dtype as PyTorch's tensor ops). Other norm types, and gradients the kernels do
# not take (strided, a dtype without a kernel, HPCFSDP_FUSED_KERNELS off), use array ops on the device. A
# subclass reduces the device partial with
#     __hp_reduce_norm_device__(grads, partial) -> partial
# (a (1,) float64 device array, reduced over the right groups through the comm layer); one without it gets the
# float __hp_reduce_norm__ above, which reads the partial back (one host sync per subclass). Only
# ``error_if_nonfinite=True`` reads the norm back (as PyTorch does).


def _array_partial(arr, norm_type):
    """sum(|x|^p) (or max |x| for inf) of one local array, as a 0-d array of its own backend."""
    xp = _backend.array_module(arr)
    if arr.dtype not in (np.float32, np.float64):
        arr = arr.astype(np.float32)
    flat = arr.reshape(-1)
    if norm_type == math.inf:
        return xp.max(xp.abs(flat)).astype(np.float64)
    if norm_type == 2.0:
        return xp.dot(flat, flat).astype(np.float64)
    if norm_type == 1.0:
        return xp.sum(xp.abs(flat), dtype=np.float64)
    if norm_type == 0.0:
        return xp.asarray(xp.count_nonzero(flat), dtype=np.float64)
    return xp.sum(xp.abs(flat.astype(np.float64)) ** norm_type)


def _local_partial(tensors, norm_type):
    """The combined partial of several tensors' local arrays as a Python float: one host sync per backend."""
    by_backend = {}
    for t in tensors:
        arr = t._data
        if arr.size == 0 or _backend.is_meta_array(arr):
            continue
        by_backend.setdefault(_backend.array_module(arr), []).append(_array_partial(arr, norm_type))
    parts = []
    for xp, vals in by_backend.items():
        stacked = xp.stack(vals)
        parts.append(float(stacked.max() if norm_type == math.inf else stacked.sum()))
    return _combine(parts, norm_type)


def _combine(parts, norm_type):
    return max(parts, default=0.0) if norm_type == math.inf else math.fsum(parts)


def _norm_from_partial(partial, norm_type):
    if norm_type == math.inf or norm_type == 0.0:
        return partial
    if partial == 0.0:
        return 0.0
    return partial ** (1.0 / norm_type)


def _grads_of(tensors):
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    return [t for t in tensors]


_TABLES = None  # the device pointer tables of the gradients (a TableCache, made at first use)


def _tables():
    global _TABLES
    if _TABLES is None:
        from hpcfsdp._kernels.tables import TableCache

        _TABLES = TableCache()
    return _TABLES


def _on_device(arrays) -> bool:
    arrays = [a for a in arrays if not _backend.is_meta_array(a)]
    return bool(arrays) and all(_backend.is_cupy_array(a) for a in arrays)


def _fusable(arr) -> bool:
    from hpcfsdp._kernels._registry import CTYPES, use_fused

    return use_fused(arr) and arr.dtype in CTYPES and arr.flags.c_contiguous


def _device_partial(tensors, norm_type, xp, out_dtype):
    """(The combined partial (sum |x|^p, or max |x|) of the tensors' local arrays as a (1,) float64 device array,
    the 2-norm as a 0-d ``out_dtype`` device array when the fused kernels took every array, else None)."""
    arrays = [t._data for t in tensors if t._data.size and not _backend.is_meta_array(t._data)]
    if not arrays:
        return xp.zeros(1, np.float64), None
    parts, norm = [], None
    if norm_type == 2.0:
        from hpcfsdp._kernels.optim import sumsq_norm

        by_dtype = {}
        for a in arrays:
            if _fusable(a):
                by_dtype.setdefault(a.dtype, []).append(a)
        if by_dtype:
            sumsq, norm = sumsq_norm(_tables(), "grads", by_dtype, out_dtype)
            parts.append(sumsq)
        arrays = [a for a in arrays if not _fusable(a)]
    parts += [_array_partial(a, norm_type).reshape(1) for a in arrays]
    if len(parts) == 1:
        return parts[0], (norm if not arrays else None)
    stacked = xp.concatenate(parts)
    return (stacked.max() if norm_type == math.inf else stacked.sum()).reshape(1), None


def _device_total_norm(by_type, norm_type, error_if_nonfinite, xp, out_dtype):
    """The total norm as a 0-d ``out_dtype`` device array."""
    parts = []
    for cls, ts in by_type.items():
        local, norm = _device_partial(ts, norm_type, xp, out_dtype)
        if len(by_type) == 1 and norm is not None and not hasattr(cls, "__hp_reduce_norm__") \
                and not hasattr(cls, "__hp_reduce_norm_device__"):
            return _checked(norm, norm_type, error_if_nonfinite, xp)  # the fused kernels' own result
        reduce_dev = getattr(cls, "__hp_reduce_norm_device__", None)
        reduce_fn = getattr(cls, "__hp_reduce_norm__", None)
        if reduce_dev is not None:
            local = reduce_dev(ts, local, norm_type)
        elif reduce_fn is not None:  # reads the partial back (See [Note: Clipping on the device])
            local = xp.asarray([float(reduce_fn(ts, float(local[0]), norm_type))], np.float64)
        parts.append(local)
    total = parts[0] if len(parts) == 1 else xp.concatenate(parts)
    total = total.max() if norm_type == math.inf else total.sum()
    if norm_type not in (0.0, math.inf):
        total = total ** (1.0 / norm_type)
    return _checked(total.astype(out_dtype, copy=False).reshape(()), norm_type, error_if_nonfinite, xp)


def _checked(total, norm_type, error_if_nonfinite, xp):
    if error_if_nonfinite and not bool(xp.isfinite(total)):  # the one host read, as PyTorch's
        _raise_nonfinite(norm_type)
    return total


def _raise_nonfinite(norm_type):
    raise RuntimeError(
        f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it cannot be "
        "clipped. To disable this error and scale the gradients by the non-finite norm anyway, set "
        "`error_if_nonfinite=False`")


def get_total_norm(tensors, norm_type: float = 2.0, error_if_nonfinite: bool = False, foreach=None) -> Tensor:
    """The norm of all ``tensors`` together, as if concatenated (sharding-aware, see the Notes); on CUDA arrays
    computed without a host sync (See [Note: Clipping on the device])."""
    import hpcfsdp

    tensors = [t for t in _grads_of(tensors) if t is not None]
    try:
        norm_type = float(norm_type)
    except (TypeError, ValueError):
        raise ValueError(f"norm_type must be a number (1, 2, inf, ...), got {norm_type!r}") from None
    if norm_type < 0:
        raise ValueError(f"norm_type must be non-negative (or inf), got {norm_type}")
    if not tensors:
        return hpcfsdp.tensor(0.0)
    by_type = {}
    for t in tensors:
        by_type.setdefault(type(t), []).append(t)
    first = tensors[0]
    dtype = first.dtype if _backend.is_floating_dtype(first.dtype) else _backend.float32
    if _on_device([t._data for t in tensors]):
        xp = _backend.array_module(first._data)
        return _typed_result(by_type, Tensor._wrap(_device_total_norm(by_type, norm_type, error_if_nonfinite, xp,
                                                                      dtype)))
    parts = []
    for cls, ts in by_type.items():
        local = _local_partial(ts, norm_type)
        reduce_fn = getattr(cls, "__hp_reduce_norm__", None)
        parts.append(float(reduce_fn(ts, local, norm_type)) if reduce_fn is not None else local)
    total = _norm_from_partial(_combine(parts, norm_type), norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        _raise_nonfinite(norm_type)
    dev = _backend.device_of_array(first._data)
    return _typed_result(by_type, hpcfsdp.tensor(total, dtype=dtype, device=dev))


def _typed_result(by_type, result):
    for cls, ts in by_type.items():
        wrap = getattr(cls, "__hp_norm_result__", None)
        if wrap is not None:
            return wrap(ts, result)
    return result


def clip_grads_with_norm_(parameters, max_norm: float, total_norm, foreach=None) -> None:
    """Scale the grads of ``parameters`` by min(1, max_norm / (total_norm + 1e-6)) in place."""
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if isinstance(total_norm, Tensor) and _on_device([g._data for g in grads]) \
            and _backend.is_cupy_array(total_norm._data):
        _clip_on_device([g._data for g in grads if not _backend.is_meta_array(g._data)], float(max_norm),
                        total_norm._data)
        return
    total = float(total_norm.item() if isinstance(total_norm, Tensor) else total_norm)
    clip_coef = float(max_norm) / (total + 1e-6)
    clip_coef_clamped = min(clip_coef, 1.0)  # PyTorch clamps, so grads are never scaled up
    if clip_coef_clamped == 1.0 and math.isfinite(total):
        return
    with np.errstate(invalid="ignore"):  # a non-finite norm scales to NaN, as PyTorch, without a warning
        for g in grads:
            if not _backend.is_meta_array(g._data):
                g._data *= clip_coef_clamped


def _clip_on_device(arrays, max_norm, norm):
    """grads *= min(1, max_norm / (norm + 1e-6)), the norm a device scalar: one fused launch per dtype, array ops
    for what the kernel does not take (See [Note: Clipping on the device])."""
    from hpcfsdp._kernels.optim import clip_scale

    xp = _backend.array_module(norm)
    by_dtype, rest = {}, []
    for a in arrays:
        if a.size == 0:
            continue
        (by_dtype.setdefault(a.dtype, []) if _fusable(a) else rest).append(a)
    for dt, gs in by_dtype.items():
        clip_scale(_tables(), ("grads", dt.str), gs, norm.astype(dt, copy=False).reshape(1), max_norm)
    if rest:
        coef = xp.minimum(max_norm / (norm + 1e-6), 1.0)  # NaN stays NaN
        for a in rest:
            a *= coef.astype(a.dtype, copy=False)


def clip_grad_norm_(parameters: Union[Tensor, Iterable[Tensor]], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach=None) -> Tensor:
    """Clip the gradient norm of ``parameters`` (as one vector) to ``max_norm`` in place; return the total norm."""
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    parameters = list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    total_norm = get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    clip_grads_with_norm_(parameters, max_norm, total_norm, foreach)
    return total_norm


def clip_grad_value_(parameters: Union[Tensor, Iterable[Tensor]], clip_value: float, foreach=None) -> None:
    """Clamp every gradient element to [-clip_value, clip_value] in place."""
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    clip_value = float(clip_value)
    for p in parameters:
        g = p.grad
        if g is not None and not _backend.is_meta_array(g._data):
            xp = _backend.array_module(g._data)
            xp.clip(g._data, -clip_value, clip_value, out=g._data)
