"""Fused neural-network primitives: linear, gelu, layer_norm, cross_entropy, embedding, dropout, attention.

Each is one Op (not a composition) for speed and numerical stability. Half-precision inputs on NumPy are
computed in float32 and rounded back, as PyTorch's CPU kernels accumulate in float32.
"""
import math

import numpy as np

from .. import _backend
from .ops import mm, sum_to, xp_of
from .function import Op

__all__ = ["Linear", "Gelu", "GeluTanh", "LayerNorm", "CrossEntropy", "Embedding", "Dropout",
           "ScaledDotProductAttention", "MseLoss", "erf", "normal_cdf"]

_LOWP = (_backend.float16, _backend.bfloat16)
_CHUNK = 1 << 15  # elements per block for multi-pass element-wise kernels: keeps temporaries in L2


def _compute_dtype(dt):
    return np.float32 if dt in _LOWP else dt


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


def _blocked(fn, out, *arrays):
    """Apply fn(out_block, *array_blocks) over flat blocks of C-contiguous arrays (NumPy), or at once."""
    if xp_of(out) is not np or out.size <= 2 * _CHUNK:
        fn(out, *arrays)
        return out
    fo = out.reshape(-1)
    fa = [a.reshape(-1) for a in arrays]
    for i in range(0, fo.size, _CHUNK):
        j = i + _CHUNK
        fn(fo[i:j], *[a[i:j] for a in fa])
    return out


def erf(x):
    """Vectorised erf of a floating array (See [Note: erf])."""
    xp = xp_of(x)
    x = xp.ascontiguousarray(x)
    out = xp.empty_like(x)
    return _blocked(lambda o, a: _rational_odd(a, o, _ERF_P, _ERF_Q, _ERF_CLAMP, 0.0, xp), out, x)


def normal_cdf(x):
    """Standard normal CDF, 0.5 * (1 + erf(x / sqrt(2)))."""
    xp = xp_of(x)
    x = xp.ascontiguousarray(x)
    out = xp.empty_like(x)
    return _blocked(lambda o, a: _rational_odd(a, o, _CDF_P, _CDF_Q, _CDF_CLAMP, 0.5, xp), out, x)


class Gelu(Op):
    """gelu(x) = x * Phi(x) (exact, erf form). Saves x and Phi(x)."""

    @staticmethod
    def forward(ctx, x):
        dt = x.dtype
        xc = x.astype(np.float32) if dt in _LOWP else x
        xp = xp_of(xc)
        xc = xp.ascontiguousarray(xc)
        cdf = normal_cdf(xc)
        out = xc * cdf
        ctx.x, ctx.cdf = xc, cdf
        return out.astype(dt) if dt in _LOWP else out

    @staticmethod
    def backward(ctx, g):
        x, cdf = ctx.x, ctx.cdf
        xp = xp_of(x)
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
        xc = x.astype(np.float32) if dt in _LOWP else x
        xp = xp_of(xc)
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
        return out.astype(dt) if dt in _LOWP else out

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
        out = mm(x2, w.T)
        if b is not None:
            out += b
        ctx.x2, ctx.w, ctx.has_b = x2, w, b is not None
        return out.reshape(lead + (w.shape[0],))

    @staticmethod
    def backward(ctx, g):
        x2, w = ctx.x2, ctx.w
        nx, nw, nb = (ctx.needs_input_grad + (False,))[:3]
        g2 = g.reshape(-1, g.shape[-1])
        gx = mm(g2, w).reshape(g.shape[:-1] + (w.shape[1],)) if nx else None
        gw = mm(g2.T, x2) if nw else None
        gb = g2.sum(axis=0, dtype=np.float32 if g2.dtype in _LOWP else None).astype(g2.dtype, copy=False) \
            if (ctx.has_b and nb) else None
        return gx, gw, gb


class LayerNorm(Op):
    """Layer normalisation over the trailing ``nd`` dims with optional affine weight and bias."""

    @staticmethod
    def forward(ctx, x, nd, w=None, b=None, eps=1e-5):
        dt = x.dtype
        xp = xp_of(x)
        shape = x.shape
        d = int(np.prod(shape[len(shape) - nd:])) if nd else 1
        xc = x.reshape(-1, d)
        if dt in _LOWP:
            xc = xc.astype(np.float32)
        mean = xc.mean(axis=1, keepdims=True)
        xhat = xc - mean
        var = xp.einsum("ij,ij->i", xhat, xhat)[:, None] if xp is np else (xhat * xhat).sum(axis=1, keepdims=True)
        var *= xhat.dtype.type(1.0 / d)
        var += xhat.dtype.type(eps)
        rstd = xp.sqrt(var, out=var)
        xp.reciprocal(rstd, out=rstd)
        xhat *= rstd
        out = xhat
        if w is not None:
            out = xhat * w.reshape(-1).astype(xhat.dtype, copy=False)
            if b is not None:
                out += b.reshape(-1).astype(xhat.dtype, copy=False)
        elif b is not None:
            out = xhat + b.reshape(-1).astype(xhat.dtype, copy=False)
        ctx.xhat, ctx.rstd, ctx.w, ctx.has_b, ctx.shape, ctx.dt = xhat, rstd, w, b is not None, shape, dt
        out = out.reshape(shape)
        return out.astype(dt) if dt in _LOWP else out

    @staticmethod
    def backward(ctx, g):
        xhat, rstd, w = ctx.xhat, ctx.rstd, ctx.w
        xp = xp_of(xhat)
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
            gb = g2.sum(axis=0).reshape(w.shape if w is not None else (d,)).astype(ctx.dt, copy=False)
        if nx:
            gxh = g2 * w.reshape(-1).astype(xhat.dtype, copy=False) if w is not None else g2.copy()
            m1 = gxh.mean(axis=1, keepdims=True)
            m2 = (xp.einsum("ij,ij->i", gxh, xhat)[:, None] if xp is np else (gxh * xhat).sum(axis=1, keepdims=True))
            m2 *= xhat.dtype.type(1.0 / d)
            gxh -= m1
            gxh -= xhat * m2
            gxh *= rstd
            gx = gxh.reshape(ctx.shape).astype(ctx.dt, copy=False)
        if gb is not None and w is None:
            gb = gb.reshape(ctx.shape[len(ctx.shape) - len(gb.shape):])
        return gx, None, gw, gb, None


# ---------------------------------------------------------------------------------------------------
class CrossEntropy(Op):
    """cross_entropy on (N, C) logits and (N,) class indices, fused with a stable log-softmax.

    Mean reduction divides by the summed class weights of non-ignored targets (their count without
    weights), and label smoothing mixes in the uniform-target loss, both as PyTorch.
    """

    @staticmethod
    def forward(ctx, x, target, weight, ignore_index, reduction, label_smoothing):
        xp = xp_of(x)
        dt = x.dtype
        xf = x.astype(np.float32) if dt in _LOWP else x
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
        p = xp.exp(z, out=z)
        s = p.sum(axis=1)
        lse = xp.log(s)
        p /= s[:, None]  # softmax, saved for backward
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
        ctx.p, ctx.tsafe, ctx.validf, ctx.wt, ctx.w, ctx.eps = p, tsafe, validf, wt, w, eps
        ctx.red, ctx.denom, ctx.dt = reduction, denom, dt
        return out.astype(dt) if dt in _LOWP else out

    @staticmethod
    def backward(ctx, g):
        # dL/dz_ij = a_i [(1 - eps) w_ti (p_ij - [j == t_i]) + eps / C (W p_ij - w_j)],
        # a_i = (upstream scale) * valid_i, W = sum_c w_c (C without weights)
        p, tsafe, wt, w, eps = ctx.p, ctx.tsafe, ctx.wt, ctx.w, ctx.eps
        xp = xp_of(p)
        n, c = p.shape
        f = p.dtype.type
        g = g.astype(p.dtype, copy=False)
        a = (g / ctx.denom if ctx.red == "mean" else g) * ctx.validf
        coef_t = a * wt if wt is not None else a
        rows = xp.arange(n)
        if eps > 0:
            coef_t = coef_t * f(1 - eps)
            a_s = a * f(eps / c)
            wsum = w.sum() if w is not None else f(c)
            gx = p * (coef_t + a_s * wsum)[:, None]
            gx -= a_s[:, None] * w[None, :] if w is not None else a_s[:, None]
        else:
            gx = p * coef_t[:, None]
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
        xp = xp_of(w)
        if idx.size:
            lo, hi = int(idx.min()), int(idx.max())
            if lo < 0 or hi >= w.shape[0]:
                raise IndexError(f"embedding: index {lo if lo < 0 else hi} out of range for {w.shape[0]} rows")
        ctx.idx, ctx.shape, ctx.pad = idx, w.shape, padding_idx
        return xp.take(w, idx, axis=0)

    @staticmethod
    def backward(ctx, g):
        xp = xp_of(g)
        idx = ctx.idx.reshape(-1)
        d = ctx.shape[1]
        g2 = g.reshape(-1, d)
        gw = xp.zeros(ctx.shape, dtype=g.dtype)
        if xp is np and g2.dtype == np.float32 and idx.size:
            # sort + segment sums: faster than np.add.at for many rows
            order = np.argsort(idx, kind="stable")
            sidx = idx[order]
            starts = np.flatnonzero(np.r_[True, sidx[1:] != sidx[:-1]])
            gw[sidx[starts]] = np.add.reduceat(g2[order], starts, axis=0)
        else:
            xp.add.at(gw, idx, g2)
        if ctx.pad is not None:
            gw[ctx.pad] = 0
        return None, gw, None


class Dropout(Op):
    @staticmethod
    def forward(ctx, x, p):
        xp = xp_of(x)
        gen = _backend.generator(_backend.device_of_array(x))
        r = gen.random(x.shape, dtype=np.float32) if isinstance(gen, np.random.Generator) \
            else gen.random_sample(x.shape, dtype=np.float32)
        keep = r >= np.float32(p)
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


# ---------------------------------------------------------------------------------------------------
class ScaledDotProductAttention(Op):
    """softmax(q k^T * scale + mask) v, with optional causal mask, bool/additive mask and dropout."""

    @staticmethod
    def forward(ctx, q, k, v, mask, dropout_p, is_causal, scale):
        xp = xp_of(q)
        dt = q.dtype
        if dt in _LOWP:
            q, k, v = q.astype(np.float32), k.astype(np.float32), v.astype(np.float32)
        f = q.dtype.type
        L, S = q.shape[-2], k.shape[-2]
        s = mm(q, k.swapaxes(-1, -2))  # (..., L, S)
        s *= f(scale)
        if is_causal:
            allowed = xp.tril(xp.ones((L, S), dtype=bool))
            s = xp.where(allowed, s, f(-np.inf)) if s.shape[-2:] != (L, S) else _mask_inplace(s, allowed, xp)
        if mask is not None:
            if mask.dtype == np.bool_:
                s = xp.where(mask, s, f(-np.inf))
            else:
                s = s + mask.astype(s.dtype, copy=False)
        s -= s.max(axis=-1, keepdims=True)
        p = xp.exp(s, out=s)
        p /= p.sum(axis=-1, keepdims=True)
        keep = None
        if dropout_p > 0:
            gen = _backend.generator(_backend.device_of_array(q))
            r = gen.random(p.shape, dtype=np.float32) if isinstance(gen, np.random.Generator) \
                else gen.random_sample(p.shape, dtype=np.float32)
            keep = r >= np.float32(dropout_p)
            pd = p * keep
            pd *= f(1.0 / (1.0 - dropout_p))
        else:
            pd = p
        out = mm(pd, v)
        ctx.q, ctx.k, ctx.v, ctx.p, ctx.keep, ctx.scale = q, k, v, p, keep, f(scale)
        ctx.dp, ctx.dt = dropout_p, dt
        ctx.shapes = (ctx.q.shape, ctx.k.shape, ctx.v.shape)
        return out.astype(dt) if dt in _LOWP else out

    @staticmethod
    def backward(ctx, g):
        q, k, v, p, keep = ctx.q, ctx.k, ctx.v, ctx.p, ctx.keep
        f = p.dtype.type
        g = g.astype(p.dtype, copy=False)
        nq, nk, nv = ctx.needs_input_grad[:3]
        if keep is not None:
            pd = p * keep
            pd *= f(1.0 / (1.0 - ctx.dp))
        else:
            pd = p
        gv = sum_to(mm(pd.swapaxes(-1, -2), g), v.shape) if nv else None
        gp = mm(g, v.swapaxes(-1, -2))  # (..., L, S)
        if keep is not None:
            gp *= keep
            gp *= f(1.0 / (1.0 - ctx.dp))
        # softmax backward: ds = p * (gp - sum(gp * p))
        gp -= (gp * p).sum(axis=-1, keepdims=True)
        gp *= p
        gp *= ctx.scale
        gq = sum_to(mm(gp, k), q.shape) if nq else None
        gk = sum_to(mm(gp.swapaxes(-1, -2), q), k.shape) if nk else None
        dt = ctx.dt
        cast = (lambda a: a.astype(dt) if a is not None else None) if dt in _LOWP else (lambda a: a)
        return cast(gq), cast(gk), cast(gv), None, None, None, None


def _mask_inplace(s, allowed, xp):
    if xp is np:
        np.copyto(s, -np.inf, where=~allowed)
        return s
    return xp.where(allowed, s, s.dtype.type(-np.inf))
