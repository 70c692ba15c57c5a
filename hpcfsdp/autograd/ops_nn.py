"""Fused neural-network primitives: linear, gelu, layer_norm, cross_entropy, embedding, dropout, attention.

Each is one Op (not a composition) for speed and numerical stability. Half-precision inputs on NumPy are
computed in float32 and rounded back, as PyTorch's CPU kernels accumulate in float32.
"""
import math

import numpy as np

from .._array import HALF_DTYPES, array_matmul, index_add, sum_to
from .._backend import array_module
from .function import Op
from .ops_attention import ScaledDotProductAttention, _random_keep

__all__ = ["Linear", "Gelu", "GeluTanh", "LayerNorm", "CrossEntropy", "Embedding", "Dropout",
           "ScaledDotProductAttention", "MseLoss", "erf", "normal_cdf"]

_CHUNK = 1 << 15  # elements per block for multi-pass element-wise kernels: keeps temporaries in L2


def _compute_dtype(dt):
    return np.float32 if dt in HALF_DTYPES else dt


# ---------------------------------------------------------------------------------------------------
# [Note: erf]
# Neither NumPy nor CuPy-free environments give a vectorised erf, and math.erf per element is far too
# slow. erf(x) = x * P(x^2) / Q(x^2) on |x| <= 4 with degrees (6, 5), fitted here by iteratively
# reweighted least squares (Lawson) against math.erf: max abs error 1.7e-8 in float64 (relative error
# < 2e-8 near 0, where the odd form keeps full relative precision), about 3 ulp of 1.0 evaluated in float32.
# Beyond |x| = 4 erf(x) = sign(x) (1 - 1.5e-8 or less), so clamping costs < 2e-8. All coefficients are
# positive but the last of P: Horner's rule in float32 has no cancellation.
_ERF_P = (1.1283791855567618, 0.1838358553920622, 0.05413784674469526, 0.003793526551674772,
          0.0003785172594783417, 4.687874290934535e-06, -1.310956790345763e-08)
_ERF_Q = (1.0, 0.49625390328465735, 0.11339510549254213, 0.01534699830033233, 0.0012946184711885931,
          6.313639149763128e-05)
_ERF_CLAMP = 4.0
# normal_cdf(x) = 0.5 + 0.5 erf(x / sqrt 2) = 0.5 + x * P'(x^2) / Q'(x^2): the 1/sqrt(2) and 0.5 folded in.
_CDF_P = tuple(c * 0.5 / math.sqrt(2.0) / 2.0 ** k for k, c in enumerate(_ERF_P))
_CDF_Q = tuple(c / 2.0 ** k for k, c in enumerate(_ERF_Q))
_CDF_CLAMP = _ERF_CLAMP * math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _rational_odd(x, out, p, q, clamp, offset, xp):
    """out = offset + c * P(c^2) / Q(c^2) with c = clip(x, -clamp, clamp) (out may not alias x)."""
    dt = out.dtype.type
    c = xp.clip(x, -clamp, clamp)
    t = c * c
    num = t * dt(p[-1])
    num += dt(p[-2])
    for a in p[-3::-1]:
        num *= t
        num += dt(a)
    den = t * dt(q[-1])
    den += dt(q[-2])
    for a in q[-3::-1]:
        den *= t
        den += dt(a)
    num *= c
    xp.divide(num, den, out=out)
    if offset:
        out += dt(offset)
    return out


def _blocked(fn, *arrays):
    """Call fn(*blocks) over matching flat blocks of same-size C-contiguous arrays (NumPy), or once (CuPy).

    Multi-pass element-wise kernels then run on L2-resident blocks instead of streaming every temporary
    through memory.
    """
    first = arrays[0]
    if array_module(first) is not np or first.size <= 2 * _CHUNK:
        fn(*arrays)
        return
    flat = [a.reshape(-1) for a in arrays]
    for i in range(0, first.size, _CHUNK):
        j = i + _CHUNK
        fn(*[a[i:j] for a in flat])


def erf(x):
    """Vectorised erf of a floating array (See [Note: erf])."""
    xp = array_module(x)
    x = xp.ascontiguousarray(x)
    out = xp.empty_like(x)
    _blocked(lambda o, a: _rational_odd(a, o, _ERF_P, _ERF_Q, _ERF_CLAMP, 0.0, xp), out, x)
    return out


def normal_cdf(x):
    """Standard normal CDF, 0.5 * (1 + erf(x / sqrt(2)))."""
    xp = array_module(x)
    x = xp.ascontiguousarray(x)
    out = xp.empty_like(x)
    _blocked(lambda o, a: _rational_odd(a, o, _CDF_P, _CDF_Q, _CDF_CLAMP, 0.5, xp), out, x)
    return out


class Gelu(Op):
    """gelu(x) = x * Phi(x) (exact, erf form). Saves x and Phi(x)."""

    @staticmethod
    def forward(ctx, x):
        dt = x.dtype
        xc = x.astype(np.float32) if dt in HALF_DTYPES else x
        xp = array_module(xc)
        xc = xp.ascontiguousarray(xc)
        cdf = xp.empty_like(xc)
        out = xp.empty_like(xc)

        def kernel(ob, cb, xb):
            _rational_odd(xb, cb, _CDF_P, _CDF_Q, _CDF_CLAMP, 0.5, xp)
            xp.multiply(xb, cb, out=ob)

        _blocked(kernel, out, cdf, xc)
        ctx.x, ctx.cdf = xc, cdf
        return out.astype(dt) if dt in HALF_DTYPES else out

    @staticmethod
    def backward(ctx, g):
        x, cdf = ctx.x, ctx.cdf
        xp = array_module(x)
        dt = x.dtype.type
        gc = xp.ascontiguousarray(g, dtype=x.dtype)
        out = xp.empty_like(x)

        def kernel(o, gb, xb, cb):
            xp.multiply(xb, xb, out=o)
            o *= dt(-0.5)
            xp.exp(o, out=o)
            o *= xb
            o *= dt(_INV_SQRT_2PI)
            o += cb
            o *= gb

        _blocked(kernel, out, gc, x, cdf)
        return out.astype(g.dtype) if g.dtype != out.dtype else out


class GeluTanh(Op):
    """gelu(x, approximate='tanh') = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""

    K = math.sqrt(2.0 / math.pi)

    @staticmethod
    def forward(ctx, x):
        dt = x.dtype
        xc = x.astype(np.float32) if dt in HALF_DTYPES else x
        xp = array_module(xc)
        f = xc.dtype.type
        inner = xc * xc
        inner *= f(0.044715)
        inner += f(1.0)
        inner *= xc
        inner *= f(GeluTanh.K)
        th = xp.tanh(inner, out=inner)
        out = th + f(1.0)
        out *= xc
        out *= f(0.5)
        ctx.x, ctx.th = xc, th
        return out.astype(dt) if dt in HALF_DTYPES else out

    @staticmethod
    def backward(ctx, g):
        x, th = ctx.x, ctx.th
        f = x.dtype.type
        # d/dx = 0.5 (1 + th) + 0.5 x (1 - th^2) K (1 + 3 * 0.044715 x^2)
        d = x * x
        d *= f(3 * 0.044715)
        d += f(1.0)
        d *= f(GeluTanh.K * 0.5)
        d *= x
        d *= 1 - th * th
        d += f(0.5) * (th + f(1.0))
        d *= g
        return d.astype(g.dtype) if g.dtype != d.dtype else d


# ---------------------------------------------------------------------------------------------------
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
        x2 = x.reshape(-1, x.shape[-1])
        out = array_matmul(x2, w.T)
        if b is not None:
            out += b
        ctx.x2, ctx.w, ctx.has_b = x2, w, b is not None
        return out.reshape(lead + (w.shape[0],))

    @staticmethod
    def backward(ctx, g):
        x2, w = ctx.x2, ctx.w
        nx, nw, nb = (ctx.needs_input_grad + (False,))[:3]
        g2 = g.reshape(-1, g.shape[-1])
        gx = array_matmul(g2, w).reshape(g.shape[:-1] + (w.shape[1],)) if nx else None
        gw = array_matmul(g2.T, x2) if nw else None
        gb = g2.sum(axis=0, dtype=np.float32 if g2.dtype in HALF_DTYPES else None).astype(g2.dtype, copy=False) \
            if (ctx.has_b and nb) else None
        return gx, gw, gb


class LayerNorm(Op):
    """Layer normalisation over the trailing ``nd`` dims with optional affine weight and bias."""

    @staticmethod
    def forward(ctx, x, nd, w=None, b=None, eps=1e-5):
        dt = x.dtype
        xp = array_module(x)
        shape = x.shape
        d = int(np.prod(shape[len(shape) - nd:])) if nd else 1
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
        xhat, rstd, w = ctx.xhat, ctx.rstd, ctx.w
        xp = array_module(xhat)
        nx, _, nw, nb, _ = ctx.needs_input_grad
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


# ---------------------------------------------------------------------------------------------------
class CrossEntropy(Op):
    """cross_entropy on (N, C) logits and (N,) class indices, fused with a stable log-softmax.

    Mean reduction divides by the summed class weights of non-ignored targets (their count without
    weights), and label smoothing mixes in the uniform-target loss, both as PyTorch.
    """

    @staticmethod
    def forward(ctx, x, target, weight, ignore_index, reduction, label_smoothing):
        xp = array_module(x)
        dt = x.dtype
        xf = x.astype(np.float32) if dt in HALF_DTYPES else x
        n, c = xf.shape
        f = xf.dtype.type
        valid = target != ignore_index
        tsafe = xp.where(valid, target, 0)
        if n and (int(tsafe.min()) < 0 or int(tsafe.max()) >= c):
            bad = target[valid & ((target < 0) | (target >= c))]
            raise IndexError(f"cross_entropy: target {int(bad.reshape(-1)[0])} is out of bounds for {c} classes")
        z = xf - xf.max(axis=1, keepdims=True)  # (N, C) shifted logits
        rows = xp.arange(n)
        zt = z[rows, tsafe]
        eps = float(label_smoothing)
        w = weight.astype(xf.dtype, copy=False) if weight is not None else None
        if eps > 0:  # sum_c w_c z_c, before z is overwritten by exp
            zsum = z @ w if w is not None else z.sum(axis=1)
        e = xp.exp(z, out=z)  # unnormalised softmax; backward folds 1 / s into its row coefficients
        s = e.sum(axis=1)
        lse = xp.log(s)
        validf = valid.astype(xf.dtype)
        wt = w[tsafe] if w is not None else None  # per-sample class weight
        nll = lse - zt
        if wt is not None:
            nll *= wt
        if eps > 0:
            # smooth_i = -sum_c w_c log p_ic = W lse_i - sum_c w_c z_ic
            wsum = w.sum() if w is not None else f(c)
            loss = nll * f(1 - eps) + (lse * wsum - zsum) * f(eps / c)
        else:
            loss = nll
        loss *= validf
        denom = None
        if reduction == "mean":
            denom = (validf * wt).sum() if wt is not None else validf.sum()
            with np.errstate(invalid="ignore", divide="ignore"):
                out = (loss.sum() / denom).astype(xf.dtype)
        elif reduction == "sum":
            out = loss.sum().astype(xf.dtype)
        else:
            out = loss
        ctx.e, ctx.s, ctx.tsafe, ctx.validf, ctx.wt, ctx.w, ctx.eps = e, s, tsafe, validf, wt, w, eps
        ctx.red, ctx.denom, ctx.dt = reduction, denom, dt
        return out.astype(dt) if dt in HALF_DTYPES else out

    @staticmethod
    def backward(ctx, g):
        # dL/dz_ij = a_i [(1 - eps) w_ti (p_ij - [j == t_i]) + eps / C (W p_ij - w_j)],
        # a_i = (upstream scale) * valid_i, W = sum_c w_c (C without weights)
        e, tsafe, wt, w, eps = ctx.e, ctx.tsafe, ctx.wt, ctx.w, ctx.eps  # p = e / s row-wise
        xp = array_module(e)
        n, c = e.shape
        f = e.dtype.type
        g = g.astype(e.dtype, copy=False)
        a = (g / ctx.denom if ctx.red == "mean" else g) * ctx.validf
        coef_t = a * wt if wt is not None else a
        rows = xp.arange(n)
        if eps > 0:
            coef_t = coef_t * f(1 - eps)
            a_s = a * f(eps / c)
            wsum = w.sum() if w is not None else f(c)
            gx = e * ((coef_t + a_s * wsum) / ctx.s)[:, None]
            gx -= a_s[:, None] * w[None, :] if w is not None else a_s[:, None]
        else:
            gx = e * (coef_t / ctx.s)[:, None]
        gx[rows, tsafe] -= coef_t
        return gx.astype(ctx.dt, copy=False), None, None, None, None, None


class MseLoss(Op):
    @staticmethod
    def forward(ctx, a, b, reduction):
        d = a - b
        ctx.d, ctx.red, ctx.sa, ctx.sb = d, reduction, a.shape, b.shape
        sq = d * d
        if reduction == "mean":
            return sq.mean()
        if reduction == "sum":
            return sq.sum()
        return sq

    @staticmethod
    def backward(ctx, g):
        d = ctx.d
        gd = d * (d.dtype.type(2.0 / d.size) if ctx.red == "mean" else d.dtype.type(2.0))
        gd = gd * g if ctx.red == "none" else gd * g.astype(d.dtype)
        na, nb = ctx.needs_input_grad[:2]
        return (sum_to(gd, ctx.sa) if na else None, sum_to(-gd, ctx.sb) if nb else None, None)


# ---------------------------------------------------------------------------------------------------
class Embedding(Op):
    @staticmethod
    def forward(ctx, idx, w, padding_idx=None):
        xp = array_module(w)
        if idx.size:
            lo, hi = int(idx.min()), int(idx.max())
            if lo < 0 or hi >= w.shape[0]:
                raise IndexError(f"embedding: index {lo if lo < 0 else hi} out of range for {w.shape[0]} rows")
        ctx.idx, ctx.shape, ctx.pad = idx, w.shape, padding_idx
        return xp.take(w, idx, axis=0)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        idx = ctx.idx.reshape(-1)
        d = ctx.shape[1]
        g2 = g.reshape(-1, d)
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


class Dropout(Op):
    @staticmethod
    def forward(ctx, x, p):
        keep = _random_keep(x.shape, p, x)
        scale = x.dtype.type(1.0 / (1.0 - p)) if p < 1 else x.dtype.type(0)
        ctx.keep, ctx.scale = keep, scale
        out = x * keep
        out *= scale
        return out

    @staticmethod
    def backward(ctx, g):
        out = g * ctx.keep
        out *= ctx.scale
        return out, None


# Attention lives in ops_attention.py (file size); re-exported here.
