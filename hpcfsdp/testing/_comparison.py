"""assert_close (torch.testing.assert_close): compare Tensors, NumPy arrays, scalars and nested containers."""
import cmath
import collections.abc
from typing import Any, Callable, NamedTuple, Optional, Union

import numpy as np

from .. import _backend
from .._array import promote_types
from .._tensor import Size, Tensor
from .._tensor_base import _dtype_name

__all__ = ["assert_close"]

# PyTorch's default (rtol, atol) per dtype; any other dtype (integers, bool) compares exactly.
_DTYPE_PRECISIONS = {
    _backend.float16: (0.001, 1e-5),
    _backend.bfloat16: (0.016, 1e-5),
    _backend.float32: (1.3e-6, 1e-5),
    _backend.float64: (1e-7, 1e-7),
    np.dtype(np.complex64): (1.3e-6, 1e-5),
    np.dtype(np.complex128): (1e-7, 1e-7),
}
_HALF = (_backend.float16, _backend.bfloat16)
_NUMBER_DTYPES = {int: _backend.int64, float: _backend.float64, complex: np.dtype(np.complex128)}


class _Failure(Exception):
    """One comparison's failure: the exception type to raise, its message and the item path (``id``)."""

    def __init__(self, type_, msg, id_=()):
        super().__init__(msg)
        self.type, self.msg, self.id = type_, msg, id_

    def to_error(self, msg: Union[str, Callable[[str], str], None] = None) -> Exception:
        if not isinstance(msg, str):
            generated = self.msg
            if self.id:
                generated += f"\n\nThe failure occurred for item {''.join(str([item]) for item in self.id)}"
            msg = msg(generated) if callable(msg) else generated
        return self.type(msg)


class _Unsupported(Exception):
    """The pair type cannot handle these inputs: try the next one."""


def _tolerances(dtypes, rtol, atol, id_):
    if (rtol is None) ^ (atol is None):
        raise _Failure(ValueError, "Both 'rtol' and 'atol' must be either specified or omitted, "
                                   f"but got no {'rtol' if rtol is None else 'atol'}.", id_)
    if rtol is not None:
        return rtol, atol
    rtols, atols = zip(*[_DTYPE_PRECISIONS.get(dt, (0.0, 0.0)) for dt in dtypes])
    return max(rtols), max(atols)


def _mismatch_msg(identifier, extra, abs_diff, abs_idx, atol, rel_diff, rel_idx, rtol):
    equality = rtol == 0 and atol == 0

    def diff_line(kind, diff, idx, tol):
        line = f"{kind.title()} difference: {diff}" if idx is None else f"Greatest {kind} difference: {diff} at index {idx}"
        return line + ("" if equality else f" (up to {tol} allowed)") + "\n"

    msg = f"{identifier} are not {'equal' if equality else 'close'}!\n\n"
    msg += f"{extra.strip()}\n"
    msg += diff_line("absolute", abs_diff, abs_idx, atol) + diff_line("relative", rel_diff, rel_idx, rtol)
    return msg.strip()


def _scalar_msg(actual, expected, rtol, atol):
    abs_diff = abs(actual - expected)
    rel_diff = float("inf") if expected == 0 else abs_diff / abs(expected)
    return _mismatch_msg("Scalars", f"Expected {expected} but got {actual}.", abs_diff, None, atol, rel_diff, None,
                         rtol)


# ---- the pairs: each compares one (actual, expected) leaf -------------------------------------------------------

def _none_pair(actual, expected, id_, **_):
    if not (actual is None or expected is None):
        raise _Unsupported

    def compare():
        if not (actual is None and expected is None):
            raise _Failure(AssertionError, f"None mismatch: {actual} is not {expected}", id_)
    return compare


def _bool_pair(actual, expected, id_, **_):
    if not all(isinstance(x, (bool, np.bool_)) for x in (actual, expected)):
        raise _Unsupported
    a, e = bool(actual), bool(expected)

    def compare():
        if a is not e:
            raise _Failure(AssertionError, f"Booleans mismatch: {a} is not {e}", id_)
    return compare


def _number_pair(actual, expected, id_, rtol=None, atol=None, equal_nan=False, check_dtype=False, **_):
    if not all(isinstance(x, (int, float, complex, np.number)) for x in (actual, expected)):
        raise _Unsupported
    a, e = (x.item() if isinstance(x, np.number) else x for x in (actual, expected))
    rtol, atol = _tolerances([_NUMBER_DTYPES.get(type(x), _backend.int64) for x in (a, e)], rtol, atol, id_)

    def compare():
        if check_dtype and type(a) is not type(e):
            raise _Failure(AssertionError, f"The (d)types do not match: {type(a)} != {type(e)}.", id_)
        if a == e or (equal_nan and cmath.isnan(a) and cmath.isnan(e)):
            return
        abs_diff = abs(a - e)
        if cmath.isfinite(abs_diff) and abs_diff <= atol + rtol * abs(e):
            return
        raise _Failure(AssertionError, _scalar_msg(a, e, rtol, atol), id_)
    return compare


class _Leaf(NamedTuple):
    """A tensor-like reduced to what the comparison reads."""
    data: Any  # NumPy or CuPy array
    dtype: np.dtype
    device: Any
    shape: Size
    stride: Callable[[], tuple]
    is_meta: bool


def _leaf(x) -> _Leaf:
    if isinstance(x, Tensor):
        return _Leaf(x._data, x.dtype, x.device, x.shape, x.stride, x.is_meta)
    if isinstance(x, np.ndarray):
        return _Leaf(x, x.dtype, _backend.device("cpu"), Size(x.shape),
                     lambda: tuple(s // x.itemsize for s in x.strides), False)
    raise _Unsupported


def _local_of_dtensors(actual, expected, id_):
    """DTensors compare by their local pieces, and only with DTensors of the same placements and mesh."""
    is_dt = [hasattr(x, "to_local") and hasattr(x, "placements") for x in (actual, expected)]
    if is_dt[0] and is_dt[1]:
        if tuple(actual.placements) != tuple(expected.placements):
            raise _Failure(AssertionError, f"DTensor placements do not match: {actual.placements} != "
                                           f"{expected.placements}", id_)
        if actual.device_mesh != expected.device_mesh:
            raise _Failure(AssertionError, f"DTensor device meshes do not match: {actual.device_mesh} != "
                                           f"{expected.device_mesh}", id_)
        return actual.to_local(), expected.to_local()
    if is_dt[0] != is_dt[1]:
        raise _Failure(TypeError, "Comparing a DTensor to a non-DTensor is ambiguous. Call .full_tensor() to compare "
                                  "the full logical tensor or .to_local() to compare the local shard.", id_)
    return actual, expected


def _tensor_pair(actual, expected, id_, allow_subclasses=True, rtol=None, atol=None, equal_nan=False,
                 check_device=True, check_dtype=True, check_stride=False, **_):
    if not (isinstance(actual, type(expected)) or isinstance(expected, type(actual))):
        raise _Unsupported
    if not allow_subclasses and type(actual) is not type(expected):
        raise _Unsupported
    actual, expected = _local_of_dtensors(actual, expected, id_)
    a, e = _leaf(actual), _leaf(expected)
    rtol, atol = _tolerances([a.dtype, e.dtype], rtol, atol, id_)

    def fail(attr, x, y):
        raise _Failure(AssertionError, f"The values for attribute '{attr}' do not match: {x} != {y}.", id_)

    def compare():
        if a.shape != e.shape:
            fail("shape", a.shape, e.shape)
        if check_stride and a.stride() != e.stride():
            fail("stride()", a.stride(), e.stride())
        if check_device and a.device != e.device:
            fail("device", a.device, e.device)
        if check_dtype and a.dtype != e.dtype:
            fail("dtype", _name(a.dtype), _name(e.dtype))
        if a.is_meta or e.is_meta:
            return  # only the attributes are compared
        x, y = _backend.to_numpy(a.data), _backend.to_numpy(e.data)  # different devices: both on the host
        if a.dtype != e.dtype:
            try:
                dt = promote_types(a.dtype, e.dtype)
            except Exception:  # NumPy dtypes hpcfsdp's tensors do not have
                dt = np.result_type(a.dtype, e.dtype)
            x, y = x.astype(dt), y.astype(dt)
        _compare_values(np.asarray(x), np.asarray(y), rtol, atol, equal_nan, id_)
    return compare


def _name(dt):
    return _dtype_name(dt) if dt in _backend._SUPPORTED else str(dt)


def _isclose(x, y, rtol, atol, equal_nan):
    """torch.isclose: x == y, or |x - y| finite and <= atol + |rtol * y|, in x's dtype (half dtypes rounded
    after each operation as PyTorch's CPU kernels do; integers and bools against a float32 allowance)."""
    if rtol < 0:
        raise RuntimeError(f"rtol must be greater than or equal to zero, but got {rtol}")
    if atol < 0:
        raise RuntimeError(f"atol must be greater than or equal to zero, but got {atol}")
    with np.errstate(invalid="ignore", over="ignore"):
        close = x == y
        floating = x.dtype.kind in "fc" or x.dtype in _HALF
        if equal_nan and floating:
            close |= np.isnan(x) & np.isnan(y)
        if rtol == 0 and atol == 0:
            return close
        if floating:
            r = (lambda v: v.astype(x.dtype)) if x.dtype in _HALF else (lambda v: v)
            allowed = r(atol + r(np.abs(r(rtol * y))))
            err = r(np.abs(r(x - y)))
        else:
            allowed = atol + np.abs(rtol * y.astype(np.float32))
            err = np.abs(x.astype(np.int64) - y.astype(np.int64))
        return close | (np.isfinite(err) & (err <= allowed))


def _compare_values(x, y, rtol, atol, equal_nan, id_):
    matches = _isclose(x, y, rtol, atol, equal_nan)
    if matches.all():
        return
    if x.shape == ():
        raise _Failure(AssertionError, _scalar_msg(x.item(), y.item(), rtol, atol), id_)
    total = matches.size
    mismatches = total - int(matches.sum())
    extra = f"Mismatched elements: {mismatches} / {total} ({mismatches / total:.1%})"
    xf, yf, mf = x.reshape(-1), y.reshape(-1), matches.reshape(-1)
    if not (x.dtype.kind in "fc" or x.dtype in _HALF):
        xf, yf = xf.astype(np.int64), yf.astype(np.int64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        abs_diff = np.abs(xf - yf)
        if x.dtype in _HALF:
            abs_diff = abs_diff.astype(x.dtype)
        abs_diff[mf] = 0
        if xf.dtype == np.int64:  # true division of integers gives float32, as PyTorch's
            rel_diff = abs_diff.astype(np.float32) / np.abs(yf).astype(np.float32)
        else:
            rel_diff = (abs_diff / np.abs(yf)).astype(abs_diff.dtype)
        rel_diff[mf] = 0
    i_abs, i_rel = int(np.argmax(abs_diff)), int(np.argmax(rel_diff))

    def index(flat):
        return tuple(int(i) for i in np.unravel_index(flat, matches.shape))

    raise _Failure(AssertionError, _mismatch_msg("Tensor-likes", extra, abs_diff[i_abs].item(), index(i_abs), atol,
                                                 rel_diff[i_rel].item(), index(i_rel), rtol), id_)


_PAIRS = (_none_pair, _bool_pair, _number_pair, _tensor_pair)


def _originate(actual, expected, id_, options):
    """The comparisons of every leaf of two possibly nested Sequences/Mappings (structure errors raise now)."""
    if (isinstance(actual, collections.abc.Sequence) and not isinstance(actual, str)
            and isinstance(expected, collections.abc.Sequence) and not isinstance(expected, str)):
        if len(actual) != len(expected):
            raise _Failure(AssertionError, f"The length of the sequences mismatch: {len(actual)} != {len(expected)}",
                           id_)
        return [c for i in range(len(actual)) for c in _originate(actual[i], expected[i], (*id_, i), options)]
    if isinstance(actual, collections.abc.Mapping) and isinstance(expected, collections.abc.Mapping):
        actual_keys, expected_keys = set(actual.keys()), set(expected.keys())
        if actual_keys != expected_keys:
            raise _Failure(AssertionError, "The keys of the mappings do not match:\n"
                                           f"Missing keys in the actual mapping: {sorted(expected_keys - actual_keys)}\n"
                                           f"Additional keys in the actual mapping: {sorted(actual_keys - expected_keys)}",
                           id_)
        keys = actual_keys
        try:
            keys = sorted(keys)
        except Exception:  # keys of mixed types do not sort: compare them in insertion order
            pass
        return [c for k in keys for c in _originate(actual[k], expected[k], (*id_, k), options)]
    for pair in _PAIRS:
        try:
            return [pair(actual, expected, id_, **options)]
        except _Unsupported:
            continue
    raise _Failure(TypeError, f"No comparison pair was able to handle inputs of type {type(actual)} and "
                              f"{type(expected)}.", id_)


def assert_close(actual: Any, expected: Any, *, allow_subclasses: bool = True, rtol: Optional[float] = None,
                 atol: Optional[float] = None, equal_nan: bool = False, check_device: bool = True,
                 check_dtype: bool = True, check_layout: bool = True, check_stride: bool = False,
                 msg: Union[str, Callable[[str], str], None] = None) -> None:
    """Assert that ``actual`` and ``expected`` are close, as torch.testing.assert_close.

    Tensors (hpcfsdp's, or NumPy arrays compared with NumPy arrays) are close when they have the same shape, device
    (``check_device``), dtype (``check_dtype``; else both are promoted) and stride (``check_stride``), and
    ``|actual - expected| <= atol + rtol * |expected|`` element-wise, infinities equal and NaNs equal only with
    ``equal_nan``. Python scalars compare likewise (their type checked with ``check_dtype``); Sequences and
    Mappings compare item by item. Default tolerances follow the dtype: float16 (1e-3, 1e-5), bfloat16
    (1.6e-2, 1e-5), float32 (1.3e-6, 1e-5), float64 (1e-7, 1e-7), integers and bool exact; mixed dtypes use
    the larger. ``rtol`` and ``atol`` are given together or not at all.

    Raises AssertionError on a mismatch, with PyTorch's message (mismatched element count, greatest absolute
    and relative differences and where); ``msg`` replaces it (a str) or rewrites it (a callable). Raises
    TypeError for inputs no comparison handles (a Tensor against a NumPy array, for one), ValueError when only
    one tolerance is given. ``check_layout`` is accepted for PyTorch's signature: hpcfsdp tensors are strided.
    """
    __tracebackhide__ = True
    options = dict(allow_subclasses=allow_subclasses, rtol=rtol, atol=atol, equal_nan=equal_nan,
                   check_device=check_device, check_dtype=check_dtype, check_stride=check_stride)
    try:
        comparisons = _originate(actual, expected, (), options)
    except _Failure as failure:
        raise failure.to_error() from None
    for compare in comparisons:
        try:
            compare()
        except _Failure as failure:
            raise failure.to_error(msg) from None
