"""Linear-algebra family: matmul, einsum, vector norm, svdvals, det, slogdet, inv, solve, cholesky, factorizations (no
grad)."""
import math

import numpy as np

from ..._array import HALF_DTYPES, array_matmul, sum_to
from ..._backend import array_module, bfloat16
from ..function import Op
from ._common import _reduced_shape, _up

__all__ = ["Matmul", "Einsum", "einsum_plan", "VectorNorm", "Svdvals", "Det", "Slogdet", "Inv", "Solve", "Cholesky",
           "ForwardOnly"]


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
                rows = int(np.prod(a2.shape[:-1]))  # explicit: a piece may have 0 columns
                gb = array_matmul(a2.reshape(rows, k).T, g.reshape(rows, g.shape[-1]))
            else:
                gb = sum_to(array_matmul(a2.swapaxes(-1, -2), g), b2.shape)
            gb = gb.reshape(b.shape)
        return ga, gb


def _matrix_shape(a):
    return "x".join(str(s) for s in a.shape)


# -- einsum --------------------------------------------------------------------------------------------------
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


# -- norms and singular values -------------------------------------------------------------------------------
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


# -- torch.linalg --------------------------------------------------------------------------------------------
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


class Slogdet(Op):
    """(sign, log|det A|) of A; the gradient of log|det A| g A^-T (A invertible), sign has none."""

    @staticmethod
    def forward(ctx, a):
        sign, logabs = array_module(a).linalg.slogdet(a)
        ctx.a = a
        return sign, logabs

    @staticmethod
    def backward(ctx, g_sign, g):
        if g is None:
            return None
        xp = array_module(g)
        return g[..., None, None] * _mT(xp.linalg.inv(ctx.a))


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
