"""GELU as fused kernels (activation.cu): exact and tanh forms, with or without the Linear's bias added first."""
from __future__ import annotations

import math

import numpy as np

from .._backend import array_module
from .._erf import _CDF_CLAMP, _CDF_P, _CDF_Q, _rational_odd
from ._registry import kernel, launch

__all__ = ["gelu_forward", "gelu_backward", "bias_gelu_forward", "bias_gelu_backward", "acc_dtype", "grid_for"]

_K = math.sqrt(2.0 / math.pi)
_C = 0.044715
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
BLOCK = 256


def acc_dtype(dtype) -> np.dtype:
    """What a kernel computes in for storage dtype ``dtype``: double for double, else float (common.cuh's Acc)."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def grid_for(n: int, block: int = BLOCK) -> int:
    """Blocks for a grid-stride loop over ``n`` elements: enough to fill an H200 (132 SMs), at most one per block of
    elements."""
    return max(1, min((int(n) + block - 1) // block, 132 * 32))


def _gelu_and_slope(x, approx):
    """(gelu(x), d gelu / dx) of x in its accumulation dtype (NumPy)."""
    f = x.dtype.type
    if approx:
        th = np.tanh(f(_K) * (x + f(_C) * x * x * x))
        y = f(0.5) * x * (f(1) + th)
        s = f(0.5) * (f(1) + th) + f(0.5) * x * (f(1) - th * th) * f(_K) * (f(1) + f(3 * _C) * x * x)
        return y, s
    cdf = _rational_odd(x, np.empty_like(x), _CDF_P, _CDF_Q, _CDF_CLAMP, 0.5, np)
    return x * cdf, cdf + x * f(_INV_SQRT_2PI) * np.exp(f(-0.5) * x * x)


def _acc(a, dtype):
    return a.astype(acc_dtype(dtype))


def _biased(x, b, dtype):
    return _acc((_acc(x, dtype) + _acc(b, dtype)).astype(dtype), dtype)  # x + b rounded as T, as unfused


@kernel("gelu_fwd", "activation", [("x", "in"), ("y", "out"), ("n", "scalar", "long long"),
                                   ("approx", "scalar", "int")])
def _gelu_fwd_twin(args, dtype):
    x, y, n, approx = args
    y[...] = _gelu_and_slope(_acc(x, dtype), approx)[0].astype(dtype)


@kernel("gelu_bwd", "activation", [("g", "in"), ("x", "in"), ("dx", "out"), ("n", "scalar", "long long"),
                                   ("approx", "scalar", "int")])
def _gelu_bwd_twin(args, dtype):
    g, x, dx, n, approx = args
    dx[...] = (_acc(g, dtype) * _gelu_and_slope(_acc(x, dtype), approx)[1]).astype(dtype)


@kernel("bias_gelu_fwd", "activation", [("x", "in"), ("b", "in"), ("y", "out"), ("n", "scalar", "long long"),
                                        ("c", "scalar", "long long"), ("approx", "scalar", "int")])
def _bias_gelu_fwd_twin(args, dtype):
    x, b, y, n, c, approx = args
    y[...] = _gelu_and_slope(_biased(x.reshape(-1, c), b, dtype), approx)[0].astype(dtype).reshape(y.shape)


@kernel("bias_gelu_bwd", "activation", [("g", "in"), ("x", "in"), ("b", "in"), ("dx", "out"),
                                        ("n", "scalar", "long long"), ("c", "scalar", "long long"),
                                        ("approx", "scalar", "int")])
def _bias_gelu_bwd_twin(args, dtype):
    g, x, b, dx, n, c, approx = args
    s = _gelu_and_slope(_biased(x.reshape(-1, c), b, dtype), approx)[1]
    dx[...] = (_acc(g, dtype).reshape(-1, c) * s).astype(dtype).reshape(dx.shape)


def _contig(xp, a):
    return a if a.flags.c_contiguous else xp.ascontiguousarray(a)


def gelu_forward(x, approximate: str):
    """gelu(x) of a CuPy array in one launch (``approximate`` "none" or "tanh"); x contiguous or not."""
    xp = array_module(x)
    x = _contig(xp, x)
    y = xp.empty_like(x)
    launch("gelu_fwd", x.dtype, grid_for(x.size), BLOCK, (x, y, x.size, int(approximate == "tanh")))
    return y


def gelu_backward(g, x, approximate: str):
    """The gradient of gelu at x for output gradient g (same shape), in one launch; in x's dtype."""
    xp = array_module(x)
    x, g = _contig(xp, x), _contig(xp, g.astype(x.dtype, copy=False))
    dx = xp.empty_like(x)
    launch("gelu_bwd", x.dtype, grid_for(x.size), BLOCK, (g, x, dx, x.size, int(approximate == "tanh")))
    return dx


def bias_gelu_forward(x, b, approximate: str):
    """gelu(x + b) with b broadcast over x's last dim, in one launch."""
    xp = array_module(x)
    x, b = _contig(xp, x), _contig(xp, b.astype(x.dtype, copy=False))
    y = xp.empty_like(x)
    launch("bias_gelu_fwd", x.dtype, grid_for(x.size), BLOCK,
           (x, b, y, x.size, x.shape[-1], int(approximate == "tanh")))
    return y


def bias_gelu_backward(g, x, b, approximate: str):
    """d gelu(x + b) / d(x + b) times g, in one launch (the bias gradient is its sum over rows)."""
    xp = array_module(x)
    x, b, g = _contig(xp, x), _contig(xp, b.astype(x.dtype, copy=False)), _contig(xp, g.astype(x.dtype, copy=False))
    dx = xp.empty_like(x)
    launch("bias_gelu_bwd", x.dtype, grid_for(x.size), BLOCK,
           (g, x, b, dx, x.size, x.shape[-1], int(approximate == "tanh")))
    return dx
