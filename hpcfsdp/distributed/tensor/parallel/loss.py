"""Cross-entropy over logits whose vocabulary dim is split over a tensor-parallel mesh."""

from __future__ import annotations

import numpy as np

from hpcfsdp._backend import array_module
from hpcfsdp._tensor import Tensor
from hpcfsdp.autograd.function import Function
from hpcfsdp.distributed.process_group import ReduceOp

__all__ = ["vocab_parallel_cross_entropy"]

# [Note: Vocabulary-parallel cross-entropy]
# With lm_head column-wise (output Shard(-1)), rank r holds logits of the vocabulary block
# [r*V/n, (r+1)*V/n). The loss needs, per row, max and sum of exp over the whole vocabulary and the
# target's logit: an all-reduce MAX, an all-reduce SUM of the local exp sums and one of the target logit
# (taken by the rank that owns it). The gradient is local: softmax minus the one-hot of the target on this
# rank's block, over the count of non-ignored targets (reduction "mean", as F.cross_entropy).


class _VocabParallelCE(Function):
    @staticmethod
    def forward(ctx, logits, target, group, ignore_index):
        x = logits._data
        xp = array_module(x)
        vl = x.shape[-1]
        x2 = x.reshape(-1, vl).astype(np.float64)
        t = (target._data if isinstance(target, Tensor) else xp.asarray(target)).reshape(-1)
        if t.shape[0] != x2.shape[0]:
            raise ValueError(f"vocab_parallel_cross_entropy: {x2.shape[0]} rows of logits, {t.shape[0]} targets")
        m = x2.max(axis=-1)
        group.all_reduce_(m, ReduceOp.MAX)
        e = xp.exp(x2 - m[:, None])
        s = e.sum(axis=-1)
        group.all_reduce_(s, ReduceOp.SUM)
        local = t - group.rank() * vl
        valid = t != ignore_index
        mine = valid & (local >= 0) & (local < vl)
        rows = xp.nonzero(mine)[0]
        tl = xp.zeros(x2.shape[0], np.float64)
        tl[rows] = x2[rows, local[rows]] - m[rows]
        group.all_reduce_(tl, ReduceOp.SUM)
        count = int(valid.sum())
        loss = float(((xp.log(s) - tl) * valid).sum()) / count if count else float("nan")
        ctx.save = (e / s[:, None], rows, local, valid, count, x.shape, x.dtype)
        return Tensor._wrap(xp.asarray(loss, dtype=x.dtype))

    @staticmethod
    def backward(ctx, g):
        p, rows, local, valid, count, shape, dtype = ctx.save
        grad = p.copy()
        grad[rows, local[rows]] -= 1.0
        grad *= valid[:, None]
        scale = float(g._data) / count if count else 0.0
        return Tensor._wrap((grad * scale).astype(dtype).reshape(shape)), None, None, None


def vocab_parallel_cross_entropy(input, target, device_mesh, ignore_index: int = -100):  # noqa: A002
    """Mean cross-entropy of ``input`` logits (local vocabulary block, last dim, of a Shard(-1) split over the
    1-D ``device_mesh``) against ``target`` class ids; see [Note: Vocabulary-parallel cross-entropy]."""
    if device_mesh.ndim != 1:
        raise ValueError(f"vocab_parallel_cross_entropy: needs a 1-D tensor-parallel mesh, got {device_mesh!r}")
    return _VocabParallelCE.apply(input, target, device_mesh.get_group(0), ignore_index)
