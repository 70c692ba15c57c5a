"""NN family: the fused layers linear, layer_norm, embedding and dropout."""
import numpy as np

from ..._array import HALF_DTYPES, array_matmul, index_add
from ... import _backend
from ..._backend import array_module
from ..._kernels import CTYPES, use_fused
from ..._kernels import checks
from ..._kernels import dropout as _fused_dropout
from ..._kernels import embedding as _fused_embedding
from ..._kernels import norm as _fused
from ..._kernels import rotary as _fused_rotary
from ..function import Op
from ._common import bias_grad
from .random import _random_keep

# Each is one Op (not a composition) for speed and numerical stability. Half-precision inputs on NumPy are
# computed in float32 and rounded back, as PyTorch's CPU kernels accumulate in float32.

__all__ = ["Linear", "LayerNorm", "RmsNorm", "Embedding", "Dropout"]


class Linear(Op):
    """y = x @ W.T + b as one op: one GEMM each for the output and both weight gradients."""

    @staticmethod
    def forward(ctx, x, w, b=None):
        if w.ndim != 2:
            raise RuntimeError(f"linear: weight must be 2-D (out_features, in_features), got shape {tuple(w.shape)}")
        if x.shape[-1] != w.shape[1]:
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied "
                               f"({int(np.prod(x.shape[:-1]))}x{x.shape[-1]} and {w.shape[1]}x{w.shape[0]})")
        lead = x.shape[:-1]
        x2 = x.reshape(int(np.prod(lead)), x.shape[-1])  # explicit rows: a piece may have 0 columns
        out = array_matmul(x2, w.T)
        if b is not None:
            out += b
        ctx.x2, ctx.w, ctx.has_b = x2, w, b is not None
        return out.reshape(lead + (w.shape[0],))

    @staticmethod
    def backward(ctx, g):
        x2, w = ctx.x2, ctx.w
        nx, nw, nb = (ctx.needs_input_grad + (False,))[:3]
        g2 = g.reshape(x2.shape[0], g.shape[-1])
        gx = array_matmul(g2, w).reshape(g.shape[:-1] + (w.shape[1],)) if nx else None
        gw = array_matmul(g2.T, x2) if nw else None
        gb = bias_grad(g2) if (ctx.has_b and nb) else None
        return gx, gw, gb


def _fusable(x, d, *params) -> bool:
    """Whether the norm kernels take x: a CuPy array of a kernel dtype with rows of d > 0 elements and every given
    parameter of x's dtype (a float32 weight on bfloat16 x takes the unfused path, which multiplies in float32)."""
    return (use_fused(x) and x.dtype in CTYPES and d > 0
            and all(p is None or p.dtype == x.dtype for p in params))


def _shaped(a, shape):
    return a if a.shape == tuple(shape) else a.reshape(shape)  # a fresh array stays one (no view)


class LayerNorm(Op):
    """Layer normalisation over the trailing ``nd`` dims with optional affine weight and bias.

    On CuPy (weight and bias of x's dtype) one fused kernel forward saving x, mean and rstd; backward one kernel for
    dx and one for the weight and bias gradients (hpcfsdp/_kernels/norm.cu). The output is in x's dtype either way."""

    @staticmethod
    def forward(ctx, x, nd, w=None, b=None, eps=1e-5):
        dt = x.dtype
        xp = array_module(x)
        shape = x.shape
        d = int(np.prod(shape[len(shape) - nd:])) if nd else 1
        ctx.fused = _fusable(x, d, w, b)
        if ctx.fused:
            y, ctx.mean, ctx.rstd, ctx.x = _fused.norm_forward(x, d, w, b, eps, rms=False)
            ctx.d, ctx.w, ctx.nshape = d, w, shape[len(shape) - nd:]
            return y
        xc = x.reshape(-1, d)
        if dt in HALF_DTYPES:
            xc = xc.astype(np.float32)
        mean = xc.mean(axis=1, keepdims=True)
        xhat = xc - mean
        var = xp.einsum("ij,ij->i", xhat, xhat)[:, None] if xp is np else (xhat * xhat).sum(axis=1, keepdims=True)
        var *= xhat.dtype.type(1.0 / d)
        var += xhat.dtype.type(eps)
        rstd = xp.sqrt(var, out=var)
        xp.reciprocal(rstd, out=rstd)
        xhat *= rstd
        if w is not None:
            out = xhat * w.reshape(-1).astype(xhat.dtype, copy=False)
            if b is not None:
                out += b.reshape(-1).astype(xhat.dtype, copy=False)
        elif b is not None:
            out = xhat + b.reshape(-1).astype(xhat.dtype, copy=False)
        else:
            out = xhat.copy()  # never hand out the saved array itself
        ctx.xhat, ctx.rstd, ctx.w, ctx.has_b, ctx.shape, ctx.dt = xhat, rstd, w, b is not None, shape, dt
        ctx.nshape = shape[len(shape) - nd:]
        out = out.reshape(shape)
        return out.astype(dt) if dt in HALF_DTYPES else out

    @staticmethod
    def backward(ctx, g):
        nx, _, nw, nb, _ = ctx.needs_input_grad
        if ctx.fused:
            gx, gw, gb = _fused.norm_backward(g, ctx.x, ctx.d, ctx.w, ctx.mean, ctx.rstd, False, nx, nw or nb)
            return gx, None, _shaped(gw, ctx.nshape) if nw else None, _shaped(gb, ctx.nshape) if nb else None, None
        xhat, rstd, w = ctx.xhat, ctx.rstd, ctx.w
        xp = array_module(xhat)
        d = xhat.shape[1]
        g2 = g.reshape(-1, d)
        if g2.dtype != xhat.dtype:
            g2 = g2.astype(xhat.dtype)
        gw = gb = gx = None
        if nw:
            gw = xp.einsum("ij,ij->j", g2, xhat) if xp is np else (g2 * xhat).sum(axis=0)
            gw = gw.reshape(w.shape).astype(w.dtype, copy=False)
        if nb:
            gb = g2.sum(axis=0).reshape(ctx.nshape).astype(ctx.dt, copy=False)
        if nx:
            gxh = g2 * w.reshape(-1).astype(xhat.dtype, copy=False) if w is not None else g2.copy()
            m1 = gxh.mean(axis=1, keepdims=True)
            m2 = (xp.einsum("ij,ij->i", gxh, xhat)[:, None] if xp is np else (gxh * xhat).sum(axis=1, keepdims=True))
            m2 *= xhat.dtype.type(1.0 / d)
            gxh -= m1
            gxh -= xhat * m2
            gxh *= rstd
            gx = gxh.reshape(ctx.shape).astype(ctx.dt, copy=False)
        return gx, None, gw, gb, None


class RmsNorm(Op):
    """F.rms_norm over the trailing ``nd`` dims on CuPy: x * rstd rounded to x's dtype, times the weight (of x's
    dtype, or None), as one fused kernel saving x and rstd; backward one kernel for dx, one for the weight gradient.
    The CPU path (and a weight of another dtype) is nn.functional.rms_norm's composition of Tensor ops."""

    @staticmethod
    def forward(ctx, x, nd, w=None, eps=1e-6):
        shape = x.shape
        d = int(np.prod(shape[len(shape) - nd:])) if nd else 1
        if not _fusable(x, d, w):
            raise TypeError(f"RmsNorm: a CuPy array of float32/float64/bfloat16/float16 with a weight of its dtype, got "
                            f"{type(x).__name__} of {x.dtype} (d={d}, weight {None if w is None else w.dtype})")
        y, ctx.mean, ctx.rstd, ctx.x = _fused.norm_forward(x, d, w, None, eps, rms=True)
        ctx.d, ctx.w, ctx.nshape = d, w, shape[len(shape) - nd:]
        return y

    @staticmethod
    def backward(ctx, g):
        nx, _, nw, _ = ctx.needs_input_grad
        gx, gw, _ = _fused.norm_backward(g, ctx.x, ctx.d, ctx.w, ctx.mean, ctx.rstd, True, nx, nw)
        return gx, None, _shaped(gw, ctx.nshape) if nw else None, None


def _bad_index(idx, rows):
    """The deferred bounds check of the fused gather: flag = a bad position (-1 = none) -> its IndexError."""
    return lambda pos: None if pos < 0 else IndexError(
        f"embedding: index {int(idx.reshape(-1)[pos])} out of range for {rows} rows")


class Embedding(Op):
    @staticmethod
    def forward(ctx, idx, w, padding_idx=None):
        xp = array_module(w)
        ctx.idx, ctx.shape, ctx.pad = idx, w.shape, padding_idx
        if use_fused(w) and w.dtype in CTYPES and idx.size and w.shape[1]:
            # one gather, its bounds check on the device (See [Note: Deferred device checks] in _kernels/checks.py)
            out, flag = _fused_embedding.embedding_forward(idx, w)
            checks.defer(flag, _bad_index(idx, w.shape[0]))
            return out
        if idx.size:
            lo, hi = int(idx.min()), int(idx.max())
            if lo < 0 or hi >= w.shape[0]:
                raise IndexError(f"embedding: index {lo if lo < 0 else hi} out of range for {w.shape[0]} rows")
        return xp.take(w, idx, axis=0)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        idx = ctx.idx.reshape(-1)
        d = ctx.shape[1]
        g2 = g.reshape(idx.size, d)  # explicit rows: a piece may have 0 columns
        gw = xp.zeros(ctx.shape, dtype=g.dtype)
        if xp is np and idx.size:
            # sort + segment sums: faster than np.add.at for many rows
            order = np.argsort(idx, kind="stable")
            sidx = idx[order]
            starts = np.flatnonzero(np.r_[True, sidx[1:] != sidx[:-1]])
            gw[sidx[starts]] = np.add.reduceat(g2[order], starts, axis=0)
        else:
            index_add(gw, idx, g2)
        if ctx.pad is not None:
            gw[ctx.pad] = 0
        return None, gw, None


class Rotary(Op):
    """x * cos + rotate_half(x) * sin (Hugging Face's rotary embedding) as one kernel each way, for CuPy arrays x
    (..., T, D) and cos, sin (T, D) that need no gradient (hpcfsdp/_kernels/rotary.cu)."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.cos, ctx.sin = cos, sin
        return _fused_rotary.rotary_forward(x, cos, sin)

    @staticmethod
    def backward(ctx, g):
        return _fused_rotary.rotary_backward(g, ctx.cos, ctx.sin), None, None


class Dropout(Op):
    """x where a uniform draw is >= p, times 1 / (1 - p); on CuPy the draw and one fused kernel each way (the same
    draws, so the same result: hpcfsdp/_kernels/dropout.cu)."""

    @staticmethod
    def forward(ctx, x, p):
        scale = x.dtype.type(1.0 / (1.0 - p)) if p < 1 else x.dtype.type(0)
        ctx.fused = use_fused(x) and 0 < p < 1 and x.dtype in CTYPES
        if ctx.fused:
            gen = _backend.generator(_backend.device_of_array(x))
            r = gen.random_sample(x.shape, dtype=np.float32)  # what _random_keep draws
            out, ctx.keep = _fused_dropout.dropout_forward(x, r, float(p), float(1.0 / (1.0 - p)))
            ctx.scale = float(1.0 / (1.0 - p))
            return out
        keep = _random_keep(x.shape, p, x)
        ctx.keep, ctx.scale = keep, scale
        out = x * keep
        out *= scale
        return out

    @staticmethod
    def backward(ctx, g):
        if ctx.fused:
            return _fused_dropout.dropout_backward(g, ctx.keep, ctx.scale), None
        out = g * ctx.keep
        out *= ctx.scale
        return out, None
