"""Loss family: cross_entropy, mse, binary cross entropy (of probabilities and of logits), smooth L1, Huber, KL div."""
import numpy as np

from ..._array import HALF_DTYPES, sum_to
from ..._backend import array_module
from ..._kernels import CTYPES, checks, use_fused
from ..._kernels import softmax as _fused
from ..function import Op
from .activation import softplus_array

# CrossEntropy and MseLoss reduce themselves (fused). The element-wise terms (binary cross entropy, smooth L1 /
# Huber, KL divergence) return the unreduced loss; weighting and reduction are Tensor ops in nn.functional.
# Gradients follow PyTorch's formulas (binary_cross_entropy clamps its logs at -100 and its gradient's denominator
# at 1e-12).

__all__ = ["CrossEntropy", "MseLoss", "BinaryCrossEntropy", "BinaryCrossEntropyWithLogits", "SmoothL1", "KlDiv"]


class CrossEntropy(Op):
    """cross_entropy on (N, C) logits and (N,) class indices, fused with a stable log-softmax.

    Mean reduction divides by the summed class weights of non-ignored targets (their count without
    weights), and label smoothing mixes in the uniform-target loss, both as PyTorch.

    On CuPy without class weights: one fused kernel computes each row's loss and its gradient row, one more the
    reduction, with no host read; a target out of range is raised at the next host read (See [Note: Deferred device
    checks] in hpcfsdp/_kernels/checks.py); backward is one kernel scaling the saved rows.
    """

    @staticmethod
    def forward(ctx, x, target, weight, ignore_index, reduction, label_smoothing):
        ctx.fused = weight is None and use_fused(x) and x.dtype in CTYPES
        if ctx.fused:
            out, ctx.grad, ctx.den, flag = _fused.cross_entropy_forward(x, target, ignore_index, reduction,
                                                                        label_smoothing)
            checks.defer(flag, _bad_target(target, x.shape[1]))
            ctx.red = reduction
            return out
        xp = array_module(x)
        dt = x.dtype
        xf = x.astype(np.float32) if dt in HALF_DTYPES else x
        n, c = xf.shape
        f = xf.dtype.type
        valid = target != ignore_index
        tsafe = xp.where(valid, target, 0)
        if n and (int(tsafe.min()) < 0 or int(tsafe.max()) >= c):
            bad = target[valid & ((target < 0) | (target >= c))]
            raise IndexError(_bad_target_message(int(bad.reshape(-1)[0]), c))
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
        if ctx.fused:
            return _fused.cross_entropy_backward(ctx.grad, g, ctx.den, ctx.red), None, None, None, None, None
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


def _bad_target_message(t: int, c: int) -> str:
    return f"cross_entropy: target {t} is out of bounds for {c} classes"


def _bad_target(target, c):
    """The deferred check of the fused path: flag = the first bad row (-1 = none) -> its IndexError."""
    return lambda row: None if row < 0 else IndexError(_bad_target_message(int(target[row]), c))


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


# -- element-wise terms --------------------------------------------------------------------------------------
class BinaryCrossEntropy(Op):
    """-(t log x + (1 - t) log(1 - x)) with both logs clamped at -100."""

    @staticmethod
    def forward(ctx, x, t):
        xp = array_module(x)
        f = x.dtype.type
        with np.errstate(divide="ignore"):
            logx = xp.maximum(xp.log(x), f(-100))
            log1mx = xp.maximum(xp.log(1 - x), f(-100))
        ctx.x, ctx.t, ctx.logx, ctx.log1mx = x, t, logx, log1mx
        return -(t * logx + (1 - t) * log1mx)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        x, t = ctx.x, ctx.t
        nx, nt = ctx.needs_input_grad
        gx = g * (x - t) / xp.maximum(x * (1 - x), x.dtype.type(1e-12)) if nx else None
        gt = g * (ctx.log1mx - ctx.logx) if nt else None
        return gx, gt


class BinaryCrossEntropyWithLogits(Op):
    """(1 - t) x + (1 + (pw - 1) t) softplus(-x): -[pw t log sigmoid(x) + (1 - t) log(1 - sigmoid(x))], stably.

    ``pw`` (pos_weight, an array broadcasting against x, or None) receives no gradient.
    """

    @staticmethod
    def forward(ctx, x, t, pw):
        xp = array_module(x)
        sp = softplus_array(-x, xp)  # -log sigmoid(x)
        lw = 1 + (pw - 1) * t if pw is not None else None
        ctx.x, ctx.t, ctx.pw, ctx.sp, ctx.lw = x, t, pw, sp, lw
        return (1 - t) * x + (lw * sp if lw is not None else sp)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        x, t, pw, lw = ctx.x, ctx.t, ctx.pw, ctx.lw
        nx, nt = ctx.needs_input_grad[:2]
        gx = gt = None
        if nx:
            with np.errstate(over="ignore"):
                sig = 1 / (1 + xp.exp(-x))
            gx = g * (sig * lw - pw * t if lw is not None else sig - t)
        if nt:
            gt = g * (-x + (pw - 1) * ctx.sp if pw is not None else -x)
        return gx, gt, None


class SmoothL1(Op):
    """Of the difference d: smooth L1 (0.5 d^2 / beta where |d| < beta, else |d| - beta / 2) or, with
    ``huber``, the Huber loss (0.5 d^2 where |d| < beta, else beta (|d| - beta / 2))."""

    @staticmethod
    def forward(ctx, d, beta, huber):
        xp = array_module(d)
        f = d.dtype.type
        a = xp.abs(d)
        ctx.d, ctx.beta, ctx.huber = d, beta, huber
        if huber:
            return xp.where(a < beta, f(0.5) * d * d, f(beta) * (a - f(0.5 * beta)))
        if beta == 0:
            return a
        return xp.where(a < beta, f(0.5 / beta) * d * d, a - f(0.5 * beta))

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        d, beta = ctx.d, ctx.beta
        f = d.dtype.type
        if ctx.huber:
            return g * xp.clip(d, f(-beta), f(beta)), None, None
        if beta == 0:
            return g * xp.sign(d), None, None
        return g * xp.clip(d * f(1.0 / beta), f(-1), f(1)), None, None


class KlDiv(Op):
    """t (log t - x) (0 where t = 0), or exp(t) (t - x) with ``log_target``: x holds log-probabilities."""

    @staticmethod
    def forward(ctx, x, t, log_target):
        xp = array_module(x)
        ctx.x, ctx.t, ctx.log_target = x, t, log_target
        if log_target:
            et = xp.exp(t)
            ctx.et = et
            return et * (t - x)
        with np.errstate(divide="ignore", invalid="ignore"):
            tlogt = xp.where(t == 0, t.dtype.type(0), t * xp.log(t))
        return tlogt - t * x

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        x, t = ctx.x, ctx.t
        nx, nt = ctx.needs_input_grad[:2]
        gx = gt = None
        if ctx.log_target:
            et = ctx.et
            gx = -g * et if nx else None
            gt = g * et * (t - x + 1) if nt else None
        else:
            gx = -g * t if nx else None
            if nt:
                with np.errstate(divide="ignore", invalid="ignore"):
                    gt = g * (xp.log(t) + 1 - x)
        return gx, gt, None
