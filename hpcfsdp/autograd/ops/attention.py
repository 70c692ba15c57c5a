"""Attention family: fused scaled dot-product attention, softmax(q k^T * scale + mask) v, with a block-causal path."""
import numpy as np

from ..._array import HALF_DTYPES, array_matmul, sum_to
from ..._backend import array_module
from ... import _backend
from ..._kernels import attention as _fused
from ..._kernels import dropout as _fused_dropout
from ..._kernels import gemm as _gemm
from ..._kernels import use_fused
from ..function import Op
from ._common import bias_grad
from .random import _random_keep

__all__ = ["ScaledDotProductAttention", "SplitHeads", "CAUSAL_BLOCK"]


CAUSAL_BLOCK = 64  # query rows per block in the causal path (64 measured fastest at T=256)


def _softmax_rows_(s, xp):
    """In-place softmax over the last axis of s (already masked with -inf)."""
    s -= s.max(axis=-1, keepdims=True)
    xp.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s


def _mask_upper_(s, r0, xp):
    """Causal mask of a query block starting at row r0: s[..., i, j] = -inf where j > r0 + i."""
    bq, width = s.shape[-2], s.shape[-1]
    allowed = xp.arange(width)[None, :] <= (xp.arange(bq)[:, None] + r0)
    if xp is np:
        np.copyto(s, -np.inf, where=~allowed)
        return s
    return xp.where(allowed, s, s.dtype.type(-np.inf))


# [Note: Block-causal attention]
# With is_causal (and no explicit mask) query row i only sees keys 0..i. Splitting the queries into
# blocks of CAUSAL_BLOCK rows, block [r0, r1) needs only keys [0, r1): the score matrix, its softmax and
# all four GEMMs shrink to the lower block triangle, about (nb + 1) / (2 nb) of the dense work for nb
# blocks, and the exp count (the dominant element-wise cost on CPUs) shrinks alike. Each block keeps its
# own probabilities for backward; gradients of k and v accumulate over the blocks that see them.
#
# [Note: Dense attention on the GPU]
# On a GPU the block loop above costs launches, not arithmetic (about 210 forward and 214 backward at
# T=1024). With CuPy arrays and no explicit mask, attention is dense: S = q k^T and out = P v
# are one cuBLAS call each, and one fused kernel scales, masks and soft-maxes each row of S
# (hpcfsdp/_kernels/attention.cu): 3 launches forward, 5 backward (dv = P^T g, dP = g v^T, the fused
# softmax backward, dq = dS k, dk = dS^T q). The scores of half-precision inputs must not be rounded to
# their dtype: bfloat16 scores round 2**-9 of each logit, which the optimizer amplifies (measured: a 0.2
# relative gradient error in one weight of a 2-block GPT after 3 AdamW steps). So for bfloat16 and half the
# two products that make scores (S = q k^T, dP = g v^T) take half inputs on the tensor cores and write float32
# (See [Note: Mixed-precision batched GEMM] in hpcfsdp/_kernels/gemm.py), the softmax and its backward read
# float32 scores and write P and dS in the input dtype, and the three products of P or dS with a half
# operand run in that dtype with float32 accumulation: no cast, and every GEMM on the tensor cores (as
# FlashAttention, which also multiplies v by P rounded to half). Dropout of P is one draw of the device's
# generator and one fused kernel (hpcfsdp/_kernels/dropout.cu) that keeps a byte mask; backward rebuilds the
# dropped P from P and the mask and drops dP with it (two launches). Operands of different batch shapes
# (broadcast heads) compute in float32 after casts, as PyTorch's math attention. The causal half of S is
# computed and then masked.
class ScaledDotProductAttention(Op):
    """softmax(q k^T * scale + mask) v, with optional causal mask, bool/additive mask and dropout."""

    @staticmethod
    def forward(ctx, q, k, v, mask, dropout_p, is_causal, scale):
        ctx.dense = use_fused(q) and mask is None and q.dtype == k.dtype == v.dtype and 0 <= dropout_p < 1
        if ctx.dense:  # See [Note: Dense attention on the GPU]
            xp = array_module(q)
            ctx.dt = q.dtype
            ctx.tc = _gemm.supports(q, k, v)
            if ctx.tc:
                q, k, v = xp.ascontiguousarray(q), xp.ascontiguousarray(k), xp.ascontiguousarray(v)
                s = _gemm.bmm(q, k, trans_b=True, out_dtype=np.float32)
            else:
                if q.dtype in HALF_DTYPES:
                    q, k, v = q.astype(np.float32), k.astype(np.float32), v.astype(np.float32)
                s = xp.matmul(q, k.swapaxes(-1, -2))
            p = _fused.causal_softmax(s, float(scale), bool(is_causal), dtype=q.dtype)
            del s
            ctx.q, ctx.k, ctx.v, ctx.p, ctx.scale = q, k, v, p, float(scale)
            ctx.keep, ctx.dscale = None, 1.0
            if dropout_p > 0:  # dropout of the probabilities: one draw and one fused kernel (the mask kept)
                ctx.dscale = float(1.0 / (1.0 - dropout_p))
                r = _backend.generator(_backend.device_of_array(q)).random_sample(p.shape, dtype=np.float32)
                p, ctx.keep = _fused_dropout.dropout_forward(p, r, float(dropout_p), ctx.dscale)
                del r
            return _gemm.bmm(p, v) if ctx.tc else xp.matmul(p, v).astype(ctx.dt, copy=False)
        xp = array_module(q)
        dt = q.dtype
        if dt in HALF_DTYPES:
            q, k, v = q.astype(np.float32), k.astype(np.float32), v.astype(np.float32)
        f = q.dtype.type
        L, S = q.shape[-2], k.shape[-2]
        kt = k.swapaxes(-1, -2)
        blocks = [(0, L, S)]  # (r0, r1, visible keys)
        if is_causal and mask is None and L > CAUSAL_BLOCK:
            blocks = [(r0, min(r0 + CAUSAL_BLOCK, L), min(min(r0 + CAUSAL_BLOCK, L), S))
                      for r0 in range(0, L, CAUSAL_BLOCK)]
        probs, keeps, outs = [], [], []
        for r0, r1, w in blocks:
            qb = q[..., r0:r1, :]
            s = array_matmul(qb, kt[..., :w])  # (..., r1 - r0, w)
            s *= f(scale)
            if is_causal:
                s = _mask_upper_(s, r0, xp)
            if mask is not None:
                s = xp.where(mask, s, f(-np.inf)) if mask.dtype == np.bool_ else s + mask.astype(s.dtype, copy=False)
            p = _softmax_rows_(s, xp)
            pd = p
            keep = None
            if dropout_p > 0:
                keep = _random_keep(p.shape, dropout_p, q)
                pd = p * keep
                pd *= f(1.0 / (1.0 - dropout_p))
            outs.append(array_matmul(pd, v[..., :w, :]))
            probs.append(p)
            keeps.append(keep)
        out = outs[0] if len(outs) == 1 else xp.concatenate(outs, axis=-2)
        ctx.q, ctx.k, ctx.v, ctx.probs, ctx.keeps, ctx.blocks = q, k, v, probs, keeps, blocks
        ctx.scale, ctx.dp, ctx.dt = f(scale), dropout_p, dt
        return out.astype(dt) if dt in HALF_DTYPES else out

    @staticmethod
    def backward(ctx, g):
        if ctx.dense:
            return ScaledDotProductAttention._dense_backward(ctx, g)
        q, k, v = ctx.q, ctx.k, ctx.v
        xp = array_module(q)
        f = q.dtype.type
        g = g.astype(q.dtype, copy=False)
        nq, nk, nv = ctx.needs_input_grad[:3]
        bshape = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        gq_parts = []
        gk = xp.zeros(bshape + k.shape[-2:], dtype=q.dtype) if nk else None
        gv = xp.zeros(bshape + v.shape[-2:], dtype=q.dtype) if nv else None
        inv_keep = f(1.0 / (1.0 - ctx.dp)) if ctx.dp > 0 else None
        for (r0, r1, w), p, keep in zip(ctx.blocks, ctx.probs, ctx.keeps):
            gb = g[..., r0:r1, :]
            if nv:
                pd = p if keep is None else p * keep * inv_keep
                gv[..., :w, :] += array_matmul(pd.swapaxes(-1, -2), gb)
            gp = array_matmul(gb, v[..., :w, :].swapaxes(-1, -2))  # (..., rows, w)
            if keep is not None:
                gp *= keep
                gp *= inv_keep
            # softmax backward: ds = p * (gp - sum(gp * p)), then the score scale
            gp -= (gp * p).sum(axis=-1, keepdims=True)
            gp *= p
            gp *= ctx.scale
            if nq:
                gq_parts.append(array_matmul(gp, k[..., :w, :]))
            if nk:
                gk[..., :w, :] += array_matmul(gp.swapaxes(-1, -2), q[..., r0:r1, :])
        gq = None
        if nq:
            gq = gq_parts[0] if len(gq_parts) == 1 else xp.concatenate(gq_parts, axis=-2)
            gq = sum_to(gq, q.shape)
        gk = sum_to(gk, k.shape) if nk else None
        gv = sum_to(gv, v.shape) if nv else None
        dt = ctx.dt
        if dt in HALF_DTYPES:
            gq, gk, gv = (a.astype(dt) if a is not None else None for a in (gq, gk, gv))
        return gq, gk, gv, None, None, None, None

    @staticmethod
    def _dropped(ctx, p):
        """The probabilities as forward multiplied v by them: p, or its dropout (rebuilt from the kept mask)."""
        return p if ctx.keep is None else _fused_dropout.dropout_backward(p, ctx.keep, ctx.dscale)

    @staticmethod
    def _dp(ctx, dpd):
        """The gradient of the probabilities from that of their dropout (the identity without dropout)."""
        return dpd if ctx.keep is None else _fused_dropout.dropout_backward(dpd, ctx.keep, ctx.dscale)

    @staticmethod
    def _dense_backward(ctx, g):
        q, k, v, p = ctx.q, ctx.k, ctx.v, ctx.p
        xp = array_module(q)
        if ctx.tc:
            return ScaledDotProductAttention._tensor_core_backward(ctx, xp.ascontiguousarray(g, dtype=q.dtype))
        g = g.astype(q.dtype, copy=False)
        nq, nk, nv = ctx.needs_input_grad[:3]
        S = ScaledDotProductAttention
        gv = sum_to(xp.matmul(S._dropped(ctx, p).swapaxes(-1, -2), g), v.shape) if nv else None
        gq = gk = None
        if nq or nk:
            ds = _fused.softmax_backward_scaled(p, S._dp(ctx, xp.matmul(g, v.swapaxes(-1, -2))), ctx.scale)
            gq = sum_to(xp.matmul(ds, k), q.shape) if nq else None
            gk = sum_to(xp.matmul(ds.swapaxes(-1, -2), q), k.shape) if nk else None
        return (*(None if a is None else a.astype(ctx.dt, copy=False) for a in (gq, gk, gv)),
                None, None, None, None)

    @staticmethod
    def _tensor_core_backward(ctx, g):
        q, k, v, p = ctx.q, ctx.k, ctx.v, ctx.p
        nq, nk, nv = ctx.needs_input_grad[:3]
        S = ScaledDotProductAttention
        gv = _gemm.bmm(S._dropped(ctx, p), g, trans_a=True) if nv else None
        gq = gk = None
        if nq or nk:
            dp = S._dp(ctx, _gemm.bmm(g, v, trans_b=True, out_dtype=np.float32))
            ds = _fused.softmax_backward_scaled(p, dp, ctx.scale)
            gq = _gemm.bmm(ds, k) if nq else None
            gk = _gemm.bmm(ds, q, trans_a=True) if nk else None
        return gq, gk, gv, None, None, None, None


class SplitHeads(Op):
    """q, k, v (B, H, T, D) of a packed projection (B, T, 3 * H * D) (plus its bias, if given): views on NumPy; on the
    GPU one fused copy into three contiguous arrays (what the attention's batched GEMMs take), with the bias added,
    whose gradient is one fused copy back (and the bias gradient one column sum)."""

    @staticmethod
    def forward(ctx, qkv, n_head, bias=None):
        B, T, W = qkv.shape
        ctx.fused = use_fused(qkv)
        if ctx.fused:
            return _fused.split_heads3(qkv, n_head, bias)
        ctx.shape = qkv.shape
        if bias is not None:
            qkv = qkv + bias
        heads = qkv.reshape(B, T, 3, n_head, W // (3 * n_head))
        return tuple(heads[:, :, i].transpose(0, 2, 1, 3) for i in range(3))

    @staticmethod
    def backward(ctx, gq, gk, gv):
        ref = next(g for g in (gq, gk, gv) if g is not None)
        xp = array_module(ref)
        gq, gk, gv = (xp.zeros_like(ref) if g is None else g for g in (gq, gk, gv))
        if ctx.fused:
            g = _fused.merge_heads3(gq, gk, gv)
        else:
            B, T, W = ctx.shape
            g = xp.stack([gq, gk, gv], axis=1).transpose(0, 3, 1, 2, 4).reshape(B, T, W)
        nb = len(ctx.needs_input_grad) > 2 and ctx.needs_input_grad[2]
        return g, None, (bias_grad(g) if nb else None)
