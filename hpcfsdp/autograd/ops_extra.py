"""More primitive ops on raw arrays: cos, sin, erf, rounding, cumsum, prod, logsumexp, take-along-dim
(gather and the values of sort/topk), vector norms, singular values and einsum.

Same contract as ops.py (See its docstring). Ops that accumulate compute half-precision inputs in float32
and round the result back, as PyTorch's kernels accumulate in float32.
"""
import math

import numpy as np

from .._array import HALF_DTYPES, index_add
from .._backend import array_module, bfloat16
from .function import Op
from .ops_nn import erf as erf_array

__all__ = ["Cos", "Sin", "Erf", "Rounding", "Cumsum", "Prod", "Logsumexp", "TakeAlong", "VectorNorm", "Svdvals",
           "Einsum", "einsum_plan"]


def _up(a):
    """a in float32 if it is half precision (the accumulation dtype), else a itself."""
    return a.astype(np.float32) if a.dtype in HALF_DTYPES else a


def _along(ndim, dim, s):
    """An index tuple selecting slice or index ``s`` along ``dim`` and everything along the other dims."""
    return (slice(None),) * dim + (s,) + (slice(None),) * (ndim - dim - 1)


def _reduced_shape(shape, axes, keepdim):
    """The shape of a reduction over ``axes`` (None: all dims)."""
    if axes is None:
        return (1,) * len(shape) if keepdim else ()
    if keepdim:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


# -- element-wise ------------------------------------------------------------------------------------
class Cos(Op):
    @staticmethod
    def forward(ctx, a):
        ctx.a = a
        return array_module(a).cos(a)

    @staticmethod
    def backward(ctx, g):
        return -g * array_module(g).sin(ctx.a)


class Sin(Op):
    @staticmethod
    def forward(ctx, a):
        ctx.a = a
        return array_module(a).sin(a)

    @staticmethod
    def backward(ctx, g):
        return g * array_module(g).cos(ctx.a)


class Erf(Op):
    """erf(a) by the rational approximation of ops_nn (See [Note: erf] there); d/da = 2/sqrt(pi) exp(-a^2)."""

    @staticmethod
    def forward(ctx, a):
        ctx.a = a
        return erf_array(_up(a)).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        a = ctx.a
        return g * (array_module(a).exp(-a * a) * a.dtype.type(2.0 / math.sqrt(math.pi)))


class Rounding(Op):
    """sign, floor, ceil, round(decimals): piecewise constant, so the gradient is zero (as PyTorch)."""

    @staticmethod
    def forward(ctx, a, kind, decimals=0):
        xp = array_module(a)
        if kind == "round":
            return xp.round(a, decimals)
        return getattr(xp, kind)(a)

    @staticmethod
    def backward(ctx, g):
        return array_module(g).zeros_like(g), None, None


# -- scans and reductions ----------------------------------------------------------------------------
class Cumsum(Op):
    @staticmethod
    def forward(ctx, a, dim):
        ctx.dim = dim
        if a.ndim == 0:
            return a.copy()
        return _up(a).cumsum(axis=dim).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        if g.ndim == 0:
            return g, None
        xp, d = array_module(g), ctx.dim
        return xp.flip(_up(xp.flip(g, d)).cumsum(axis=d), d).astype(g.dtype, copy=False), None


class Prod(Op):
    """prod over one dim (or all, dim=None); the gradient is the product of the other elements, exact with zeros."""

    @staticmethod
    def forward(ctx, a, dim, keepdim):
        ctx.a, ctx.dim, ctx.keepdim = a, dim, keepdim
        out = _up(a).prod(axis=dim, keepdims=keepdim)
        return array_module(a).asarray(out).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        a, dim = ctx.a, ctx.dim
        xp = array_module(g)
        x = _up(a).reshape(-1) if dim is None else _up(a)
        d = 0 if dim is None else dim
        n = x.shape[d]
        if n == 0:
            return xp.zeros(a.shape, dtype=a.dtype), None, None
        one = xp.ones(x.shape[:d] + (1,) + x.shape[d + 1:], dtype=x.dtype)
        # exclusive products from the left and from the right of each element
        left = xp.concatenate([one, xp.cumprod(x[_along(x.ndim, d, slice(0, n - 1))], axis=d)], axis=d)
        right = xp.flip(xp.cumprod(xp.flip(x[_along(x.ndim, d, slice(1, n))], d), axis=d), d)
        right = xp.concatenate([right, one], axis=d)
        gk = g.reshape(()) if dim is None else (g if ctx.keepdim else xp.expand_dims(g, d))
        return (left * right * gk).reshape(a.shape).astype(a.dtype, copy=False), None, None


class Logsumexp(Op):
    @staticmethod
    def forward(ctx, a, axes, keepdim):
        xp = array_module(a)
        x = _up(a)
        if x.size:
            m = x.max(axis=axes, keepdims=True)
            m = xp.where(xp.isfinite(m), m, x.dtype.type(0))  # all -inf (or an inf) stays -inf (inf)
        else:
            m = xp.zeros(_reduced_shape(x.shape, axes, True), dtype=x.dtype)
        with np.errstate(divide="ignore"):
            outk = xp.log(xp.exp(x - m).sum(axis=axes, keepdims=True)) + m
        ctx.x, ctx.outk, ctx.dtype = x, outk, a.dtype
        return outk.reshape(_reduced_shape(x.shape, axes, keepdim)).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, outk = ctx.x, ctx.outk
        gk = _up(g).reshape(outk.shape)
        return (gk * array_module(x).exp(x - outk)).astype(ctx.dtype, copy=False), None, None


class VectorNorm(Op):
    """linalg.vector_norm over ``axes`` (None: all) for a float ``ord`` (inf, -inf, 0 included).

    The gradient follows PyTorch's norm_backward: 0 where the norm is 0 (ord >= 1), ties of the inf norms
    share the gradient evenly.
    """

    @staticmethod
    def forward(ctx, a, ord, axes, keepdim):  # noqa: A002
        xp = array_module(a)
        x = _up(a)
        ax = xp.abs(x)
        with np.errstate(divide="ignore", over="ignore"):
            if ord == math.inf:
                outk = ax.max(axis=axes, keepdims=True)
            elif ord == -math.inf:
                outk = ax.min(axis=axes, keepdims=True)
            elif ord == 0:
                outk = (x != 0).sum(axis=axes, keepdims=True).astype(x.dtype)
            elif ord == 1:
                outk = ax.sum(axis=axes, keepdims=True)
            elif ord == 2:
                outk = xp.sqrt((x * x).sum(axis=axes, keepdims=True))
            else:
                outk = (ax ** x.dtype.type(ord)).sum(axis=axes, keepdims=True) ** x.dtype.type(1.0 / ord)
        ctx.x, ctx.outk, ctx.ord, ctx.axes, ctx.dtype = x, outk, ord, axes, a.dtype
        return outk.reshape(_reduced_shape(x.shape, axes, keepdim)).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, norm, p = ctx.x, ctx.outk, ctx.ord
        xp = array_module(x)
        dt = x.dtype.type
        g = _up(g).reshape(norm.shape)
        zero = dt(0)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if p == 0:
                gx = xp.zeros_like(x)
            elif p == 1:
                gx = xp.sign(x) * g
            elif p == 2:
                gx = x * xp.where(norm == 0, zero, g / norm)
            elif math.isinf(p):
                ax = xp.abs(x)
                mask = (ax == norm) | xp.isnan(ax)
                gx = xp.sign(x) * ((g / mask.sum(axis=ctx.axes, keepdims=True)) * mask)
            elif p < 1:
                scaled = xp.sign(x) * xp.where(x == 0, zero, xp.abs(x) ** dt(p - 1))
                gx = scaled * g * norm ** dt(1 - p)
            elif p < 2:
                gx = xp.sign(x) * xp.abs(x) ** dt(p - 1) * xp.where(norm == 0, zero, g / norm ** dt(p - 1))
            else:
                gx = x * xp.abs(x) ** dt(p - 2) * xp.where(norm == 0, zero, g / norm ** dt(p - 1))
        return gx.astype(ctx.dtype, copy=False), None, None, None


class Svdvals(Op):
    """Singular values of a (batch of) matrices in the last two dims, descending.

    The gradient is U diag(g) V^T, exact where the singular values are distinct (as PyTorch's).
    """

    @staticmethod
    def forward(ctx, a):
        xp = array_module(a)
        u, s, vh = xp.linalg.svd(_up(a), full_matrices=False)
        ctx.u, ctx.vh, ctx.dtype = u, vh, a.dtype
        return s.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        u, vh = ctx.u, ctx.vh
        return ((u * _up(g)[..., None, :]) @ vh).astype(ctx.dtype, copy=False)


# -- indexing ----------------------------------------------------------------------------------------
class TakeAlong(Op):
    """out = take_along_axis(a, index, dim): gather, and the values of sort and topk.

    ``index`` may be smaller than ``a`` in the other dims (gather reads the leading block of ``a``); repeated
    indices accumulate their gradients.
    """

    @staticmethod
    def forward(ctx, a, index, dim):
        ctx.shape, ctx.index, ctx.dim = a.shape, index, dim
        if a.ndim == 0:
            return a.copy()
        block = tuple(slice(0, n) for n in index.shape[:dim]) + (slice(None),) + tuple(
            slice(0, n) for n in index.shape[dim + 1:])
        return array_module(a).take_along_axis(a[block], index, axis=dim)

    @staticmethod
    def backward(ctx, g):
        if g.ndim == 0:
            return g, None, None
        xp, index, dim = array_module(g), ctx.index, ctx.dim
        out = xp.zeros(ctx.shape, dtype=g.dtype)
        nd = index.ndim
        where = tuple(index if i == dim else xp.arange(n).reshape((-1,) + (1,) * (nd - i - 1))
                      for i, n in enumerate(index.shape))
        index_add(out, where, g)
        return out, None, None


# -- einsum ------------------------------------------------------------------------------------------
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def einsum_plan(equation, shapes):
    """(input subscripts, output subscripts, letter -> size, unused letters) of an einsum equation for operands
    of ``shapes``.

    The ellipsis is spelled out with unused letters (aligned from the right across operands); implicit mode
    (no '->') outputs the ellipsis dims and then the letters that occur once, sorted. Sizes of 1 broadcast.
    Raises RuntimeError for a malformed equation or sizes that do not match.
    """
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise RuntimeError(f"einsum(): the equation {equation!r} has {len(terms)} operand(s) but "
                           f"{len(shapes)} operand(s) were given")
    for t in [*terms, rhs]:
        bad = set(t.replace("...", "")) - set(_LETTERS)
        if bad or t.count("...") > 1:
            raise RuntimeError(f"einsum(): invalid subscript {sorted(bad)[0] if bad else '...'!r} in the equation "
                               f"{equation!r}: subscripts are letters [a-zA-Z] and at most one ellipsis per term")
    used = set(eq)
    fresh = [c for c in _LETTERS if c not in used]
    n_ell = []
    for k, (t, shape) in enumerate(zip(terms, shapes)):
        n_sub = len(t.replace("...", ""))
        n = len(shape) - n_sub if "..." in t else 0
        if n < 0 or ("..." not in t and n_sub != len(shape)):
            raise RuntimeError(f"einsum(): the number of subscripts in the equation ({n_sub}) does not match the "
                               f"number of dimensions ({len(shape)}) for operand {k}"
                               + ("" if "..." in t else " and no ellipsis was given"))
        n_ell.append(n)
    ell = "".join(fresh[:max(n_ell, default=0)])
    fresh = fresh[len(ell):]
    subs = [t.replace("...", ell[len(ell) - n:] if n else "") for t, n in zip(terms, n_ell)]
    if arrow:
        out = rhs.replace("...", ell)  # without an ellipsis in the output its dims are summed
    else:
        counts = {c: sum(s.count(c) for s in terms) for c in set(lhs) - {".", ","}}
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1))
    sizes = {}
    for k, (s, shape) in enumerate(zip(subs, shapes)):
        mine = {}
        for c, n in zip(s, shape):
            if c in mine and mine[c] != n:
                raise RuntimeError(f"einsum(): subscript {c} is repeated for operand {k} but the sizes don't match, "
                                   f"{mine[c]} != {n}")
            mine[c] = n
            seen = sizes.get(c)
            if seen is None or seen == 1:
                sizes[c] = n
            elif n not in (1, seen):
                raise RuntimeError(f"einsum(): subscript {c} has size {n} for operand {k} which does not broadcast "
                                   f"with previously seen size {seen}")
    for c in out:
        if c not in sizes:
            raise RuntimeError(f"einsum(): output subscript {c} does not appear in the equation for any input operand")
        if out.count(c) > 1:
            raise RuntimeError(f"einsum(): output subscript {c} appears more than once in the output")
    return subs, out, sizes, fresh


def _einsum(spec, arrays):
    """xp.einsum with a contraction path (BLAS for matmul-like terms); half precision in float32 on NumPy."""
    xp = array_module(arrays[0])
    dt = arrays[0].dtype
    if dt == bfloat16 or (dt in HALF_DTYPES and xp is np):  # CuPy has float16 GEMMs but no bfloat16
        arrays = [a.astype(np.float32) for a in arrays]
    return xp.asarray(xp.einsum(spec, *arrays, optimize=len(arrays) > 1)).astype(dt, copy=False)


def _broadcast(arrays, subs, sizes):
    """The operands broadcast (views) to the full size of each of their letters."""
    out = []
    for a, s in zip(arrays, subs):
        shape = tuple(sizes[c] for c in s)
        out.append(a if a.shape == shape else array_module(a).broadcast_to(a, shape))
    return out


class Einsum(Op):
    """einsum(equation, *operands); the gradient of each operand is one more einsum.

    For operand k with subscripts s_k the gradient is einsum(out, s_j (j != k) -> s_k), with a vector of ones
    for each letter only s_k has (the gradient is constant along it) and an identity matrix for each repeated
    letter of s_k (a diagonal: the gradient is zero off it). Operands broadcast in size-1 dims are summed back.
    """

    @staticmethod
    def forward(ctx, equation, *arrays):
        subs, out, sizes, fresh = einsum_plan(equation, [a.shape for a in arrays])
        ctx.subs, ctx.out, ctx.sizes, ctx.fresh = subs, out, sizes, fresh
        ctx.shapes = [a.shape for a in arrays]
        for i, a in enumerate(arrays):  # one attribute each: See [Note: Swappable storage] in function.py
            setattr(ctx, f"x{i}", a)
        return _einsum(f"{','.join(subs)}->{out}", _broadcast(arrays, subs, sizes))

    @staticmethod
    def backward(ctx, g):
        subs, out, sizes = ctx.subs, ctx.out, ctx.sizes
        full = _broadcast([getattr(ctx, f"x{i}") for i in range(len(subs))], subs, sizes)
        xp = array_module(g)
        grads = [None]
        for k, s in enumerate(subs):
            if not ctx.needs_input_grad[k + 1]:
                grads.append(None)
                continue
            others = [(subs[j], full[j]) for j in range(len(subs)) if j != k]
            terms, arrays = [out], [g]
            for sj, aj in others:
                terms.append(sj)
                arrays.append(aj)
            seen = set(out).union(*[set(sj) for sj, _ in others])
            for c in dict.fromkeys(s):
                if c not in seen:  # only this operand has c: the gradient is constant along it
                    terms.append(c)
                    arrays.append(xp.ones(sizes[c], dtype=g.dtype))
            fresh = iter(ctx.fresh)
            target = ""
            for c in s:
                if c in target:  # a repeated letter: a diagonal of this operand
                    f = next(fresh)
                    terms.append(c + f)
                    arrays.append(xp.eye(sizes[c], dtype=g.dtype))
                    c = f
                target += c
            gk = _einsum(f"{','.join(terms)}->{target}", arrays)
            shape = ctx.shapes[k]
            axes = tuple(i for i, n in enumerate(shape) if n == 1 and gk.shape[i] != 1)
            if axes:
                gk = gk.sum(axis=axes, keepdims=True)
            grads.append(gk)
        return tuple(grads)
