"""Parameter initialisation in place (``torch.nn.init``): PyTorch's formulas, no-ops on meta tensors."""
import math
import warnings

import numpy as np

from hpcfsdp import _backend, _normal_math
from hpcfsdp import random as _random
from hpcfsdp._tensor import Tensor

__all__ = [
    "calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
    "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_",
    "uniform", "normal", "constant", "eye", "dirac", "xavier_uniform", "xavier_normal", "kaiming_uniform",
    "kaiming_normal", "orthogonal", "sparse",
]

# [Note: Initialising local storage]
# Every function here writes the tensor's local array (``tensor._data``) in place, outside autograd
# (PyTorch runs init under no_grad). A sharded parameter (DTensor) therefore fills its own local piece,
# while fan-in/fan-out come from the global ``tensor.shape``; its random values are those of the unsharded
# tensor from the same seed (See [Note: Random values of a sharded tensor] in hpcfsdp/random.py). Meta tensors have no storage: the call
# is a no-op that returns the tensor, so `with hp.device("meta"): model = GPT(cfg)` is free.


def _check(tensor, fn_name):
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{fn_name} expects an hpcfsdp Tensor, got {type(tensor).__name__}")
    return not _backend.is_meta_array(tensor._data)


def _gen_dtype(arr):
    return np.float64 if arr.dtype == np.float64 else np.float32


def _generator(arr, generator):
    return _backend.generator_for(generator, _backend.device_of_array(arr))


def _rand01(gen, shape, dtype):
    if isinstance(gen, np.random.Generator):
        return gen.random(shape, dtype=dtype)
    if isinstance(gen, np.random.RandomState):
        return gen.random_sample(shape).astype(dtype)
    return gen.random_sample(shape, dtype=dtype)  # CuPy RandomState


def _write(tensor, values):
    tensor._data[...] = values
    return tensor


def calculate_gain(nonlinearity, param=None):
    """The recommended gain for a nonlinearity (PyTorch's table)."""
    linear_fns = ["linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                  "conv_transpose3d"]
    if nonlinearity in linear_fns or nonlinearity == "sigmoid":
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            negative_slope = 0.01
        elif not isinstance(param, bool) and isinstance(param, (int, float)):
            negative_slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + negative_slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor):
    shape = tuple(tensor.shape)
    if len(shape) < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 dimensions")
    receptive_field_size = 1
    for s in shape[2:]:
        receptive_field_size *= s
    return shape[1] * receptive_field_size, shape[0] * receptive_field_size


def _calculate_correct_fan(tensor, mode):
    mode = mode.lower()
    valid_modes = ["fan_in", "fan_out"]
    if mode not in valid_modes:
        raise ValueError(f"Mode {mode} not supported, please use one of {valid_modes}")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor, a=0.0, b=1.0, generator=None):
    """Fill with U(a, b)."""
    if not _check(tensor, "uniform_"):
        return tensor
    arr = tensor._data
    gen, dt = _generator(arr, generator), _gen_dtype(arr)
    u = _random._uniform_stream(_random._sink(tensor, dt), gen, dt, lambda shape: _rand01(gen, shape, dt)).result()
    return _write(tensor, u * (b - a) + a)


def normal_(tensor, mean=0.0, std=1.0, generator=None):
    """Fill with N(mean, std^2) (Box-Muller on uniform pairs: See [Note: Normal values at fixed positions])."""
    if not _check(tensor, "normal_"):
        return tensor
    arr = tensor._data
    gen, dt = _generator(arr, generator), _gen_dtype(arr)
    z = _random._normal_stream(_random._sink(tensor, dt), gen, dt).result()
    return _write(tensor, z * std + mean)


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """Fill with N(mean, std^2) truncated to [a, b] (a, b in absolute units, as PyTorch), by the inverse CDF:
    x = mean + std * ndtri(u) with u uniform on [Phi(lo), Phi(hi)], one float64 uniform per value (See [Note:
    Truncated normal values])."""
    if not _check(tensor, "trunc_normal_"):
        return tensor
    if not a < b:
        raise ValueError(f"trunc_normal_ needs a < b, got a={a}, b={b}")
    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn("mean is more than 2 std from [a, b] in nn.init.trunc_normal_. "
                      "The distribution of values may be incorrect.", stacklevel=2)
    arr = tensor._data
    xp = _backend.array_module(arr)
    gen = _generator(arr, generator)
    dt = _gen_dtype(arr)
    lo, hi = (a - mean) / std, (b - mean) / std
    sign = -1.0 if lo + hi > 0 else 1.0  # the window's lower-tail mirror when it lies mostly above the mean
    p_lo, p_hi = _normal_math.normal_cdf(min(sign * lo, sign * hi)), _normal_math.normal_cdf(max(sign * lo, sign * hi))

    def values(u):  # float64 U[0, 1) -> float64 values in [a, b]
        return _normal_math.truncated_normal(u, p_lo, p_hi, sign * std, mean, a, b)

    sink = _random._uniform_stream(_random._sink(tensor, dt), gen, np.float64,
                                   lambda shape: _rand01(gen, shape, np.float64), values)
    return _write(tensor, xp.clip(sink.result(), a, b))


# [Note: Truncated normal values]
# trunc_normal_ takes one float64 uniform (one 64-bit draw) per value, a fixed share of the stream, so a sharded
# tensor skips to its piece's values as a uniform fill does (See [Note: Skipping to a shard's values]). Rejection
# sampling (a variable share) is gone: u in [0, 1) maps to p in [Phi(lo), Phi(hi)) and the value is
# mean + std * ndtri(p), in float64 (See [Note: ndtri]), clipped into [a, b] against rounding and rounded once to
# the tensor's dtype. PyTorch does the same with erfinv on [2 Phi(lo) - 1, 2 Phi(hi) - 1]; a window above the
# mean is mirrored here (p from the lower tail of -hi .. -lo, the value negated), since p near 1 keeps only the
# absolute precision of float64 and a far upper tail (a = 5 std) would be all one value.


def constant_(tensor, val):
    """Fill with ``val``."""
    if not _check(tensor, "constant_"):
        return tensor
    return _write(tensor, val)


def ones_(tensor):
    """Fill ``tensor`` with 1 in place (no gradient recorded); returns it."""
    return constant_(tensor, 1.0)


def zeros_(tensor):
    """Fill ``tensor`` with 0 in place (no gradient recorded); returns it."""
    return constant_(tensor, 0.0)


def eye_(tensor):
    """Fill a 2-D tensor with the identity matrix."""
    if len(tuple(tensor.shape)) != 2:
        raise ValueError(f"Only tensors with 2 dimensions are supported, got shape {tuple(tensor.shape)}")
    if not _check(tensor, "eye_"):
        return tensor
    xp = _backend.array_module(tensor._data)
    return _write(tensor, xp.eye(*tensor._data.shape, dtype=tensor._data.dtype))


def xavier_uniform_(tensor, gain=1.0, generator=None):
    """U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    a = math.sqrt(3.0) * std
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor, gain=1.0, generator=None):
    """N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std, generator)


def kaiming_uniform_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """U(-bound, bound) with bound = gain * sqrt(3 / fan)."""
    if 0 in tuple(tensor.shape):
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=2)
        return tensor
    fan = _calculate_correct_fan(tensor, mode)
    gain = calculate_gain(nonlinearity, a)
    std = gain / math.sqrt(fan)
    bound = math.sqrt(3.0) * std  # PyTorch's order of operations (the same float bound)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """N(0, std^2) with std = gain / sqrt(fan)."""
    if 0 in tuple(tensor.shape):
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=2)
        return tensor
    fan = _calculate_correct_fan(tensor, mode)
    std = calculate_gain(nonlinearity, a) / math.sqrt(fan)
    return normal_(tensor, 0.0, std, generator)


def _write_whole(tensor, values):
    """Write the values of the whole tensor (C order, its global shape) into its local storage: all of it for a
    plain tensor, the local piece of a sharded one (See [Note: Random values of a sharded tensor])."""
    sink = _random._sink(tensor, values.dtype)
    sink.put_range(0, values.reshape(-1))
    return _write(tensor, sink.result())


def dirac_(tensor, groups=1):
    """Fill a 3-, 4- or 5-d (convolution) weight with the Dirac delta: out channel ``g * (C_out / groups) + d``
    of group ``g`` passes input channel ``d`` through at the kernel's centre (``size // 2``), for ``d`` below
    ``min(C_out / groups, C_in)``; everything else 0.

    Raises:
        ValueError: another rank, or dim 0 not divisible by ``groups``.
    """
    sizes = tuple(tensor.shape)
    if len(sizes) not in (3, 4, 5):
        raise ValueError("Only tensors with 3, 4, or 5 dimensions are supported")
    if sizes[0] % groups != 0:
        raise ValueError("dim 0 must be divisible by groups")
    if not _check(tensor, "dirac_"):
        return tensor
    xp = _backend.array_module(tensor._data)
    out_chans_per_grp = sizes[0] // groups
    min_dim = min(out_chans_per_grp, sizes[1])
    whole = np.zeros(sizes, dtype=tensor._data.dtype)
    centre = tuple(n // 2 for n in sizes[2:])
    for g in range(groups):
        for d in range(min_dim):
            whole[(g * out_chans_per_grp + d, d) + centre] = 1
    return _write_whole(tensor, xp.asarray(whole))


def orthogonal_(tensor, gain=1, generator=None):
    """Fill with a (semi-)orthogonal matrix times ``gain``, PyTorch's construction: a standard normal
    (rows, numel / rows) matrix (transposed when wider than tall) factored by QR, Q's columns multiplied by the
    signs of R's diagonal (uniform over the orthogonal group: Mezzadri, math-ph/0609050), transposed back.
    Trailing dims are flattened; the QR runs in float32 (float64 for a float64 tensor).

    Raises:
        ValueError: fewer than 2 dimensions.
    """
    shape = tuple(tensor.shape)
    if len(shape) < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    if not _check(tensor, "orthogonal_") or math.prod(shape) == 0:
        return tensor
    xp = _backend.array_module(tensor._data)
    rows = shape[0]
    cols = math.prod(shape) // rows
    dt = _gen_dtype(tensor._data)
    flattened = Tensor._wrap(xp.empty((rows, cols), dtype=dt))
    normal_(flattened, 0.0, 1.0, generator)  # the values a normal_ fill of the tensor itself would take
    a = flattened._data
    if rows < cols:
        a = a.T
    q, r = xp.linalg.qr(a)
    q = q * xp.sign(xp.diagonal(r))
    if rows < cols:
        q = q.T
    q = q * gain
    return _write_whole(tensor, xp.ascontiguousarray(q).astype(tensor._data.dtype))


def sparse_(tensor, sparsity, std=0.01, generator=None):
    """Fill a 2-D tensor from N(0, std^2) and zero ``ceil(sparsity * rows)`` entries of every column: those at the
    first rows of ``randperm(rows)``, one permutation per column from the global CPU generator (as PyTorch:
    ``generator`` draws only the normal values).

    Raises:
        ValueError: not 2-D.
    """
    shape = tuple(tensor.shape)
    if len(shape) != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    if not _check(tensor, "sparse_"):
        return tensor
    import hpcfsdp

    rows, cols = shape
    num_zeros = math.ceil(sparsity * rows)
    normal_(tensor, 0.0, std, generator)
    keep = np.ones(shape, dtype=np.bool_)
    for col_idx in range(cols):
        zero_indices = hpcfsdp.randperm(rows).numpy()[:num_zeros]
        keep[zero_indices, col_idx] = False
    xp = _backend.array_module(tensor._data)
    sink = _random._sink(tensor, np.bool_)
    sink.put_range(0, xp.asarray(keep.reshape(-1)))
    tensor._data[...] = xp.where(sink.result(), tensor._data, 0)
    return tensor


def _make_deprecate(meth):
    """The old name of an in-place init function (``uniform`` for ``uniform_``): PyTorch's FutureWarning, then the
    function."""
    new_name = meth.__name__
    old_name = new_name[:-1]

    def deprecated_init(*args, **kwargs):
        warnings.warn(f"`nn.init.{old_name}` is now deprecated in favor of `nn.init.{new_name}`.",
                      FutureWarning, stacklevel=2)
        return meth(*args, **kwargs)

    deprecated_init.__doc__ = f"Deprecated alias of :func:`{new_name}` (warns FutureWarning)."
    deprecated_init.__name__ = old_name
    deprecated_init.__qualname__ = old_name
    return deprecated_init


uniform = _make_deprecate(uniform_)
normal = _make_deprecate(normal_)
constant = _make_deprecate(constant_)
eye = _make_deprecate(eye_)
dirac = _make_deprecate(dirac_)
xavier_uniform = _make_deprecate(xavier_uniform_)
xavier_normal = _make_deprecate(xavier_normal_)
kaiming_uniform = _make_deprecate(kaiming_uniform_)
kaiming_normal = _make_deprecate(kaiming_normal_)
orthogonal = _make_deprecate(orthogonal_)
sparse = _make_deprecate(sparse_)
