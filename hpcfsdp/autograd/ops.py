"""Primitive differentiable ops on raw arrays: one Op per primitive, backward right under forward.

Each ``forward`` receives NumPy/CuPy arrays (Python scalars pass through) and saves on ``ctx`` only
what its ``backward`` needs. ``backward`` must not write into the gradients it receives
(See [Note: Gradient ownership] in engine.py).
"""
import numpy as np

from .._array import array_matmul, shape_of, sum_to
from .._backend import array_module
from .function import Op
from .ops_shape import *  # noqa: F401,F403  (the shape primitives are part of this set)
from .ops_shape import __all__ as _shape_all

__all__ = [
    "Add", "Sub", "Mul", "Div", "Pow", "PowScalar", "RPowScalar", "Neg", "Exp", "Log", "Sqrt", "Rsqrt",
    "Tanh", "Sigmoid", "Abs", "Relu", "Clamp", "Maximum", "Minimum", "Sum", "Mean", "Amax", "MaxDim",
    "Var", "Softmax", "LogSoftmax", "Matmul", "xp_of", "sum_to", "mm",
] + _shape_all

# Array helpers exported under these names: _backend.array_module and _array.array_matmul.
xp_of = array_module
mm = array_matmul


# -- binary element-wise -----------------------------------------------------------------------------
class Add(Op):
    @staticmethod
    def forward(ctx, a, b):
        ctx.sa, ctx.sb = shape_of(a), shape_of(b)
        return a + b

    @staticmethod
    def backward(ctx, g):
        na, nb = ctx.needs_input_grad
        return (sum_to(g, ctx.sa) if na else None, sum_to(g, ctx.sb) if nb else None)


class Sub(Op):
    @staticmethod
    def forward(ctx, a, b):
        ctx.sa, ctx.sb = shape_of(a), shape_of(b)
        return a - b

    @staticmethod
    def backward(ctx, g):
        na, nb = ctx.needs_input_grad
        return (sum_to(g, ctx.sa) if na else None, sum_to(-g, ctx.sb) if nb else None)


class Mul(Op):
    @staticmethod
    def forward(ctx, a, b):
        ctx.a, ctx.b = a, b
        return a * b

    @staticmethod
    def backward(ctx, g):
        na, nb = ctx.needs_input_grad
        a, b = ctx.a, ctx.b
        return (sum_to(g * b, shape_of(a)) if na else None, sum_to(g * a, shape_of(b)) if nb else None)


class Div(Op):
    @staticmethod
    def forward(ctx, a, b):
        ctx.a, ctx.b = a, b
        return a / b

    @staticmethod
    def backward(ctx, g):
        na, nb = ctx.needs_input_grad
        a, b = ctx.a, ctx.b
        ga = g / b
        gb = sum_to(-ga * a / b, shape_of(b)) if nb else None
        return (sum_to(ga, shape_of(a)) if na else None, gb)


class Pow(Op):
    """a ** b with b a tensor."""

    @staticmethod
    def forward(ctx, a, b):
        out = a ** b
        ctx.a, ctx.b, ctx.out = a, b, out
        return out

    @staticmethod
    def backward(ctx, g):
        na, nb = ctx.needs_input_grad
        a, b, out = ctx.a, ctx.b, ctx.out
        xp = array_module(out)
        ga = sum_to(g * b * a ** (b - 1), shape_of(a)) if na else None
        gb = None
        if nb:
            with np.errstate(divide="ignore", invalid="ignore"):
                la = xp.where(a > 0, xp.log(xp.where(a > 0, a, 1)), xp.where(a == 0, -np.inf, np.nan))
                t = g * out * la
                t = xp.where(out == 0, 0, t).astype(out.dtype)  # PyTorch masks the 0 * inf case
            gb = sum_to(t, shape_of(b))
        return ga, gb


class PowScalar(Op):
    """a ** c with c a Python number."""

    @staticmethod
    def forward(ctx, a, c):
        ctx.a, ctx.c = a, c
        if c == 2:
            return a * a
        if c == 0.5:
            return array_module(a).sqrt(a)
        return a ** c

    @staticmethod
    def backward(ctx, g):
        a, c = ctx.a, ctx.c
        if c == 0:
            return g * 0, None
        if c == 2:
            return g * (a + a), None
        if c == 1:
            return g, None
        return g * (c * a ** (c - 1)), None


class RPowScalar(Op):
    """c ** a with c a Python number."""

    @staticmethod
    def forward(ctx, c, a):
        out = array_module(a).power(a.dtype.type(c), a)
        ctx.c, ctx.out = c, out
        return out

    @staticmethod
    def backward(ctx, g):
        return None, g * ctx.out * np.log(ctx.c).astype(ctx.out.dtype)


class Maximum(Op):
    @staticmethod
    def forward(ctx, a, b):
        ctx.a, ctx.b = a, b
        return array_module(a).maximum(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.a, ctx.b
        # ties share the gradient equally, as PyTorch
        w = (a > b) + 0.5 * (a == b)
        w = w.astype(g.dtype)
        na, nb = ctx.needs_input_grad
        return (sum_to(g * w, shape_of(a)) if na else None, sum_to(g * (1 - w), shape_of(b)) if nb else None)


class Minimum(Op):
    @staticmethod
    def forward(ctx, a, b):
        ctx.a, ctx.b = a, b
        return array_module(a).minimum(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.a, ctx.b
        w = ((a < b) + 0.5 * (a == b)).astype(g.dtype)
        na, nb = ctx.needs_input_grad
        return (sum_to(g * w, shape_of(a)) if na else None, sum_to(g * (1 - w), shape_of(b)) if nb else None)


# -- unary element-wise ------------------------------------------------------------------------------
class Neg(Op):
    @staticmethod
    def forward(ctx, a):
        return -a

    @staticmethod
    def backward(ctx, g):
        return -g


class Exp(Op):
    @staticmethod
    def forward(ctx, a):
        out = array_module(a).exp(a)
        ctx.out = out
        return out

    @staticmethod
    def backward(ctx, g):
        return g * ctx.out


class Log(Op):
    @staticmethod
    def forward(ctx, a):
        ctx.a = a
        return array_module(a).log(a)

    @staticmethod
    def backward(ctx, g):
        return g / ctx.a


class Sqrt(Op):
    @staticmethod
    def forward(ctx, a):
        out = array_module(a).sqrt(a)
        ctx.out = out
        return out

    @staticmethod
    def backward(ctx, g):
        return g / (2 * ctx.out)


class Rsqrt(Op):
    @staticmethod
    def forward(ctx, a):
        xp = array_module(a)
        out = xp.reciprocal(xp.sqrt(a))
        ctx.out = out
        return out

    @staticmethod
    def backward(ctx, g):
        out = ctx.out
        return g * (-0.5 * out * out * out)


class Tanh(Op):
    @staticmethod
    def forward(ctx, a):
        out = array_module(a).tanh(a)
        ctx.out = out
        return out

    @staticmethod
    def backward(ctx, g):
        out = ctx.out
        return g * (1 - out * out)


class Sigmoid(Op):
    @staticmethod
    def forward(ctx, a):
        xp = array_module(a)
        # 1 / (1 + exp(-a)) overflows harmlessly to 0 for very negative a
        with np.errstate(over="ignore"):
            out = xp.exp(-a)
            out += 1
            xp.reciprocal(out, out=out)
        ctx.out = out
        return out

    @staticmethod
    def backward(ctx, g):
        out = ctx.out
        return g * (out * (1 - out))


class Abs(Op):
    @staticmethod
    def forward(ctx, a):
        ctx.a = a
        return array_module(a).abs(a)

    @staticmethod
    def backward(ctx, g):
        return g * array_module(g).sign(ctx.a)


class Relu(Op):
    @staticmethod
    def forward(ctx, a):
        out = array_module(a).maximum(a, 0)
        ctx.out = out
        return out

    @staticmethod
    def backward(ctx, g):
        return g * (ctx.out > 0)


class Clamp(Op):
    """clamp(a, min, max); the gradient passes where min <= a <= max, as PyTorch."""

    @staticmethod
    def forward(ctx, a, lo, hi):
        xp = array_module(a)
        out = a
        if lo is not None:
            out = xp.maximum(out, lo)
        if hi is not None:
            out = xp.minimum(out, hi)
        if out is a:
            out = a.copy()
        ctx.a, ctx.lo, ctx.hi = a, lo, hi
        return out

    @staticmethod
    def backward(ctx, g):
        a, lo, hi = ctx.a, ctx.lo, ctx.hi
        ok = None
        if lo is not None:
            ok = a >= lo
        if hi is not None:
            ok = (a <= hi) if ok is None else ok & (a <= hi)
        na, nlo, nhi = ctx.needs_input_grad
        ga = sum_to(g * ok, a.shape) if ok is not None else g
        glo = ghi = None
        if nlo:  # tensor bound: gets the gradient where it was the result
            glo = sum_to(g * (a < lo), lo.shape)
        if nhi:
            ghi = sum_to(g * (a > hi) if lo is None else g * ((a > hi) & (hi >= lo)), hi.shape)
        return (ga if na else None), glo, ghi


# -- reductions --------------------------------------------------------------------------------------
def _axes(dim, ndim):
    if dim is None:
        return None
    if isinstance(dim, (list, tuple)):
        if len(dim) == 0:
            return None
        return tuple(sorted(d % max(ndim, 1) for d in dim))
    return (dim % max(ndim, 1),)


def _keep_shape(shape, axes):
    if axes is None:
        return (1,) * len(shape)
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


class Sum(Op):
    @staticmethod
    def forward(ctx, a, dim=None, keepdim=False, dtype=None):
        axes = _axes(dim, a.ndim)
        ctx.shape, ctx.axes = a.shape, axes
        if dtype is None and a.dtype.kind in "biu":
            dtype = np.int64
        return a.sum(axis=axes, keepdims=keepdim, dtype=dtype)

    @staticmethod
    def backward(ctx, g):
        g = g.reshape(_keep_shape(ctx.shape, ctx.axes))
        return array_module(g).broadcast_to(g, ctx.shape), None, None, None


class Mean(Op):
    @staticmethod
    def forward(ctx, a, dim=None, keepdim=False):
        axes = _axes(dim, a.ndim)
        ctx.shape, ctx.axes = a.shape, axes
        n = a.size if axes is None else int(np.prod([a.shape[i] for i in axes]))
        ctx.n = n
        return a.mean(axis=axes, keepdims=keepdim)

    @staticmethod
    def backward(ctx, g):
        g = g.reshape(_keep_shape(ctx.shape, ctx.axes)) * (1.0 / ctx.n)
        return array_module(g).broadcast_to(g, ctx.shape), None, None


class Amax(Op):
    """amax/amin over dims; ties share the gradient evenly, as PyTorch."""

    @staticmethod
    def forward(ctx, a, dim=None, keepdim=False, is_min=False):
        axes = _axes(dim, a.ndim)
        out = a.min(axis=axes, keepdims=True) if is_min else a.max(axis=axes, keepdims=True)
        ctx.a, ctx.outk, ctx.axes = a, out, axes
        return out if keepdim else out.reshape(tuple(s for i, s in enumerate(a.shape)
                                                     if axes is not None and i not in axes))

    @staticmethod
    def backward(ctx, g):
        a, outk = ctx.a, ctx.outk
        mask = a == outk
        cnt = mask.sum(axis=ctx.axes, keepdims=True)
        return (g.reshape(outk.shape) / cnt).astype(g.dtype) * mask, None, None, None


class MaxDim(Op):
    """max(dim)/min(dim) -> (values, indices); the gradient goes to the returned index."""

    @staticmethod
    def forward(ctx, a, dim, keepdim=False, is_min=False):
        xp = array_module(a)
        d = dim % max(a.ndim, 1)
        if a.ndim == 0:
            return a.copy(), xp.zeros((), dtype=np.int64)
        idx = (a.argmin if is_min else a.argmax)(axis=d, keepdims=True)
        vals = xp.take_along_axis(a, idx, axis=d)
        ctx.shape, ctx.d, ctx.idx = a.shape, d, idx
        if not keepdim:
            vals, idx = vals.squeeze(d), idx.squeeze(d)
        return vals, idx.astype(np.int64, copy=False)

    @staticmethod
    def backward(ctx, g, _gi):
        if g is None:
            return None, None, None, None
        xp = array_module(g)
        if ctx.__dict__.get("shape") is None:
            return g, None, None, None
        d, shape = ctx.d, ctx.shape
        pos = xp.arange(shape[d]).reshape((-1,) + (1,) * (len(shape) - d - 1))
        onehot = pos == ctx.idx  # (..., n, ...) True only at the selected index
        return xp.where(onehot, g.reshape(ctx.idx.shape), g.dtype.type(0)), None, None, None


class Var(Op):
    @staticmethod
    def forward(ctx, a, dim=None, correction=1, keepdim=False):
        axes = _axes(dim, a.ndim)
        n = a.size if axes is None else int(np.prod([a.shape[i] for i in axes]))
        xc = a - a.mean(axis=axes, keepdims=True)
        denom = max(n - correction, 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = (xc * xc).sum(axis=axes, keepdims=keepdim) / a.dtype.type(denom)
        ctx.xc, ctx.axes, ctx.denom = xc, axes, denom
        return out.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        xc = ctx.xc
        g = g.reshape(_keep_shape(xc.shape, ctx.axes))
        with np.errstate(divide="ignore", invalid="ignore"):
            return (g * (2.0 / ctx.denom if ctx.denom else np.inf)).astype(xc.dtype) * xc, None, None, None


class Softmax(Op):
    @staticmethod
    def forward(ctx, a, dim):
        xp = array_module(a)
        out = a - a.max(axis=dim, keepdims=True)
        xp.exp(out, out=out)
        out /= out.sum(axis=dim, keepdims=True)
        ctx.out, ctx.dim = out, dim
        return out

    @staticmethod
    def backward(ctx, g):
        out, dim = ctx.out, ctx.dim
        gx = g * out
        s = gx.sum(axis=dim, keepdims=True)
        gx -= out * s
        return gx, None


class LogSoftmax(Op):
    @staticmethod
    def forward(ctx, a, dim):
        xp = array_module(a)
        out = a - a.max(axis=dim, keepdims=True)
        e = xp.exp(out)
        out -= xp.log(e.sum(axis=dim, keepdims=True))
        ctx.out, ctx.dim = out, dim
        return out

    @staticmethod
    def backward(ctx, g):
        out, dim = ctx.out, ctx.dim
        gx = array_module(g).exp(out)
        gx *= -g.sum(axis=dim, keepdims=True)
        gx += g
        return gx, None


# -- matmul ----------------------------------------------------------------------------------------
class Matmul(Op):
    @staticmethod
    def forward(ctx, a, b):
        if a.ndim == 0 or b.ndim == 0:
            raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are {a.ndim}D and {b.ndim}D")
        ka = a.shape[-1]
        kb = b.shape[-2] if b.ndim > 1 else b.shape[0]
        if ka != kb:
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({_matrix_shape(a)} and "
                               f"{_matrix_shape(b)}): inner dimensions {ka} and {kb} differ")
        ctx.a, ctx.b = a, b
        try:
            return array_matmul(a, b)
        except ValueError as e:
            raise RuntimeError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not broadcast: {e}") from None

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.a, ctx.b
        na, nb = ctx.needs_input_grad
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        if a.ndim == 1 or b.ndim == 1:  # restore the dims that matmul dropped for vector operands
            g = g.reshape(np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]) + (a2.shape[-2], b2.shape[-1]))
        ga = gb = None
        if na:
            ga = array_matmul(g, b2.swapaxes(-1, -2))
            ga = sum_to(ga, a2.shape).reshape(a.shape)
        if nb:
            if b2.ndim == 2 and a2.ndim > 2:
                # fold the batch into rows: one GEMM instead of a batch of them and a sum
                k = a2.shape[-1]
                gb = array_matmul(a2.reshape(-1, k).T, g.reshape(-1, g.shape[-1]))
            else:
                gb = sum_to(array_matmul(a2.swapaxes(-1, -2), g), b2.shape)
            gb = gb.reshape(b.shape)
        return ga, gb


def _matrix_shape(a):
    return "x".join(str(s) for s in a.shape)
