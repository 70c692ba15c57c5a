"""Yet more primitive ops on raw arrays: roll, flip, repeat, diagonals, element-wise functions with a table of
derivatives, atan2/hypot, remainder/fmod, cumprod, sampling with zero gradient and the linear algebra of
torch.linalg (det, inv, solve, cholesky differentiable; the factorizations forward-only).

Same contract as ops.py (See its docstring). Half-precision inputs compute in float32 and round back.
"""
import math

import numpy as np

from .._array import sum_to, shape_of
from .._backend import array_module
from .function import Op
from .ops_extra import _up

__all__ = ["Roll", "Flip", "Repeat", "Diagonal", "DiagEmbed", "Unary", "UNARY", "Atan2", "Hypot", "Remainder",
           "Cumprod", "Sampled", "Det", "Inv", "Solve", "Cholesky", "ForwardOnly"]


# -- shape -------------------------------------------------------------------------------------------
class Roll(Op):
    @staticmethod
    def forward(ctx, a, shifts, dims):
        ctx.shifts, ctx.dims = shifts, dims
        return array_module(a).roll(a, shifts, dims)

    @staticmethod
    def backward(ctx, g):
        return array_module(g).roll(g, tuple(-s for s in ctx.shifts), ctx.dims), None, None


class Flip(Op):
    """flip along ``dims``: a copy, as PyTorch's (a view would let writes to the result reach the input)."""

    @staticmethod
    def forward(ctx, a, dims):
        ctx.dims = dims
        xp = array_module(a)
        return xp.ascontiguousarray(xp.flip(a, dims))

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        return xp.ascontiguousarray(xp.flip(g, ctx.dims)), None


class Repeat(Op):
    """Tensor.repeat(*reps) (len(reps) >= ndim): tile; the gradient sums the copies."""

    @staticmethod
    def forward(ctx, a, reps):
        xp = array_module(a)
        shape = (1,) * (len(reps) - a.ndim) + a.shape
        ctx.shape, ctx.full, ctx.reps = a.shape, shape, reps
        return xp.tile(a.reshape(shape), reps)

    @staticmethod
    def backward(ctx, g):
        split = []
        for r, s in zip(ctx.reps, ctx.full):
            split += [r, s]
        return g.reshape(split).sum(axis=tuple(range(0, len(split), 2))).reshape(ctx.shape), None


def _diag_index(n_rows, n_cols, offset, xp):
    """(rows, cols) of the ``offset`` diagonal of an n_rows x n_cols matrix."""
    k = max(0, min(n_rows + min(offset, 0), n_cols - max(offset, 0)))
    i = xp.arange(k)
    return i - min(offset, 0), i + max(offset, 0)


class Diagonal(Op):
    """diagonal(offset, dim1, dim2): the diagonal as the last dim (a copy); the gradient fills it back in."""

    @staticmethod
    def forward(ctx, a, offset, d1, d2):
        ctx.shape, ctx.offset, ctx.d1, ctx.d2 = a.shape, offset, d1, d2
        return array_module(a).diagonal(a, offset, d1, d2).copy()

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        out = xp.zeros(ctx.shape, dtype=g.dtype)
        moved = xp.moveaxis(out, (ctx.d1, ctx.d2), (-2, -1))  # a view: writes land in out
        rows, cols = _diag_index(moved.shape[-2], moved.shape[-1], ctx.offset, xp)
        moved[..., rows, cols] = g
        return out, None, None, None


class DiagEmbed(Op):
    """diag(v, offset) of a vector: a square matrix with v on the ``offset`` diagonal."""

    @staticmethod
    def forward(ctx, v, offset):
        xp = array_module(v)
        n = v.shape[0] + abs(offset)
        ctx.offset = offset
        out = xp.zeros((n, n), dtype=v.dtype)
        rows, cols = _diag_index(n, n, offset, xp)
        out[rows, cols] = v
        return out

    @staticmethod
    def backward(ctx, g):
        return array_module(g).diagonal(g, ctx.offset).copy(), None


# -- element-wise ------------------------------------------------------------------------------------
# name -> derivative d(out)/d(a) from (xp, a, out), all in the compute dtype (float32 for half inputs)
UNARY = {
    "log1p": lambda xp, a, out: 1 / (1 + a),
    "expm1": lambda xp, a, out: out + 1,
    "log2": lambda xp, a, out: 1 / (a * a.dtype.type(math.log(2))),
    "log10": lambda xp, a, out: 1 / (a * a.dtype.type(math.log(10))),
    "sinh": lambda xp, a, out: xp.cosh(a),
    "cosh": lambda xp, a, out: xp.sinh(a),
    "arcsin": lambda xp, a, out: 1 / xp.sqrt(1 - a * a),
    "arccos": lambda xp, a, out: -1 / xp.sqrt(1 - a * a),
    "arctan": lambda xp, a, out: 1 / (1 + a * a),
    "reciprocal": lambda xp, a, out: -(out * out),
}


class Unary(Op):
    """out = xp.<name>(a) for a name of UNARY; the gradient is g times the derivative there."""

    @staticmethod
    def forward(ctx, a, name):
        xp = array_module(a)
        x = _up(a)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out = getattr(xp, name)(x)
        ctx.x, ctx.out, ctx.name, ctx.dtype = x, out, name, a.dtype
        return out.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            d = UNARY[ctx.name](xp, ctx.x, ctx.out)
            return (_up(g) * d).astype(ctx.dtype, copy=False), None


class Atan2(Op):
    @staticmethod
    def forward(ctx, a, b):
        ctx.a, ctx.b = a, b
        return array_module(a).arctan2(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.a, ctx.b
        na, nb = ctx.needs_input_grad
        with np.errstate(divide="ignore", invalid="ignore"):
            r = g / (a * a + b * b)
        return (sum_to(r * b, a.shape) if na else None), (sum_to(-r * a, b.shape) if nb else None)


class Hypot(Op):
    @staticmethod
    def forward(ctx, a, b):
        out = array_module(a).hypot(a, b)
        ctx.a, ctx.b, ctx.out = a, b, out
        return out

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.a, ctx.b
        na, nb = ctx.needs_input_grad
        with np.errstate(divide="ignore", invalid="ignore"):
            r = g / ctx.out
        return (sum_to(r * a, a.shape) if na else None), (sum_to(r * b, b.shape) if nb else None)


class Remainder(Op):
    """remainder (sign of b, Python's %) or fmod (sign of a); a or b may be a Python scalar.

    d/da = 1, d/db = -floor(a / b) (remainder) or -trunc(a / b) (fmod), as PyTorch's.
    """

    @staticmethod
    def forward(ctx, a, b, kind):
        xp = array_module(b if isinstance(a, (int, float)) else a)
        ctx.a, ctx.b, ctx.kind = a, b, kind
        with np.errstate(divide="ignore", invalid="ignore"):
            return xp.asarray(getattr(xp, kind)(a, b))

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.a, ctx.b
        na, nb, _ = ctx.needs_input_grad
        xp = array_module(g)
        ga = sum_to(g, shape_of(a)) if na else None
        gb = None
        if nb:
            with np.errstate(divide="ignore", invalid="ignore"):
                q = xp.floor(a / b) if ctx.kind == "remainder" else xp.trunc(a / b)
            gb = sum_to(-g * q, shape_of(b))
        return ga, gb, None


# -- scans -------------------------------------------------------------------------------------------
class Cumprod(Op):
    """cumprod along ``dim``. The gradient sum_{j >= i} g_j out_j / a_i where no element is 0; elsewhere it is
    computed exactly from exclusive products (one pass per element of the dim, only for inputs with zeros)."""

    @staticmethod
    def forward(ctx, a, dim):
        x = _up(a)
        out = x.cumprod(axis=dim) if a.ndim else x.copy()
        ctx.x, ctx.out, ctx.dim, ctx.dtype = x, out, dim, a.dtype
        return out.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, out, d = ctx.x, ctx.out, ctx.dim
        if x.ndim == 0:
            return g, None
        xp = array_module(g)
        g = _up(g)
        rev_cumsum = lambda v: xp.flip(xp.flip(v, d).cumsum(axis=d), d)  # noqa: E731
        if bool((x != 0).all()):
            return (rev_cumsum(g * out) / x).astype(ctx.dtype, copy=False), None
        xm = xp.moveaxis(x, d, -1)
        gm = xp.moveaxis(g, d, -1)
        n = xm.shape[-1]
        res = xp.zeros_like(xm)
        before = xp.ones(xm.shape[:-1], dtype=xm.dtype)  # prod of x[:i]
        for i in range(n):
            after = xp.cumprod(xm[..., i + 1:], axis=-1)  # prod of x[i+1:j+1] for j > i
            res[..., i] = before * (gm[..., i] + (gm[..., i + 1:] * after).sum(axis=-1))
            before = before * xm[..., i]
        return xp.moveaxis(res, -1, d).astype(ctx.dtype, copy=False), None


# -- sampling ----------------------------------------------------------------------------------------
class Sampled(Op):
    """A sample drawn with parameters ``params`` (normal's mean and std): their gradients are zero, as PyTorch's."""

    @staticmethod
    def forward(ctx, sample, *params):
        ctx.shapes = [shape_of(p) for p in params]
        return sample

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        return (None,) + tuple(xp.zeros(s, dtype=g.dtype) for s in ctx.shapes)


# -- linear algebra ----------------------------------------------------------------------------------
def _mT(a):
    return array_module(a).swapaxes(a, -1, -2)


class Det(Op):
    """det(A); the gradient g det(A) A^-T (A invertible)."""

    @staticmethod
    def forward(ctx, a):
        out = array_module(a).linalg.det(a)
        ctx.a, ctx.out = a, out
        return out

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        return (g * ctx.out)[..., None, None] * _mT(xp.linalg.inv(ctx.a))


class Inv(Op):
    @staticmethod
    def forward(ctx, a):
        out = array_module(a).linalg.inv(a)
        ctx.out = out
        return out

    @staticmethod
    def backward(ctx, g):
        out_t = _mT(ctx.out)
        return -(out_t @ g @ out_t)


class Solve(Op):
    """X = A^-1 B for matrices B (..., n, k), A and B broadcast in the batch dims."""

    @staticmethod
    def forward(ctx, a, b):
        out = array_module(a).linalg.solve(a, b)
        ctx.a, ctx.out, ctx.sa, ctx.sb = a, out, a.shape, b.shape
        return out

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        na, nb = ctx.needs_input_grad
        gb = xp.linalg.solve(_mT(ctx.a), g)
        ga = sum_to(-(gb @ _mT(ctx.out)), ctx.sa) if na else None
        return ga, (sum_to(gb, ctx.sb) if nb else None)


class Cholesky(Op):
    """L (lower) with A = L L^T for symmetric positive-definite A; the gradient L^-T Phi(L^T gL) L^-1, Phi
    taking the lower triangle symmetrized with halved diagonal (PyTorch's cholesky_backward)."""

    @staticmethod
    def forward(ctx, a, upper):
        xp = array_module(a)
        try:
            low = xp.linalg.cholesky(a)
        except xp.linalg.LinAlgError as e:
            raise RuntimeError(f"linalg.cholesky: The factorization could not be completed because the input is "
                               f"not positive-definite ({e}).") from None
        ctx.low, ctx.upper = low, upper
        return _mT(low).copy() if upper else low

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        low = ctx.low
        gl = xp.tril(_mT(g) if ctx.upper else g)
        p = xp.tril(_mT(low) @ gl)
        p = (p + _mT(xp.tril(p, -1))) * g.dtype.type(0.5)
        linv = xp.linalg.inv(low)
        return _mT(linv) @ p @ linv, None


class ForwardOnly(Op):
    """A factorization computed by ``fn(array)`` with no gradient here: backward raises naming it."""

    @staticmethod
    def forward(ctx, a, name, fn):
        ctx.name = name
        return fn(a)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(f"hpcfsdp does not implement the derivative of {ctx.name}: compute it under "
                           f"hp.no_grad() or detach its input")
