"""Cross-entropy over logits whose vocabulary dim is split over a tensor-parallel mesh: ``loss_parallel()``
(PyTorch's context manager) and ``vocab_parallel_cross_entropy`` on local logits."""

from __future__ import annotations

import contextlib

import numpy as np

from hpcfsdp._backend import array_module
from hpcfsdp._tensor import Tensor
from hpcfsdp.autograd.function import Function
from hpcfsdp.distributed.process_group import ReduceOp

__all__ = ["loss_parallel", "vocab_parallel_cross_entropy"]

# [Note: Vocabulary-parallel cross-entropy]
# With lm_head column-wise (output Shard(-1)), rank r holds logits of the vocabulary block
# [r*V/n, (r+1)*V/n). The loss needs, per row, max and sum of exp over the whole vocabulary and the
# target's logit: an all-reduce MAX, an all-reduce SUM of the local exp sums and one of the target logit
# (taken by the rank that owns it). The gradient is local: softmax minus the one-hot of the target on this
# rank's block, over the count of non-ignored targets (reduction "mean", as F.cross_entropy; "sum" and
# "none" likewise, and a class ``weight`` scales each row by its target's weight, the mean dividing by their
# sum, as F.cross_entropy).


class _VocabParallelCE(Function):
    @staticmethod
    def forward(ctx, logits, target, group, ignore_index, reduction="mean", weight=None):
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
        w = valid.astype(np.float64)
        if weight is not None:
            w = w * xp.asarray(weight, np.float64)[xp.where(valid, t, 0)]
        per = (xp.log(s) - tl) * w
        if reduction == "none":
            out, count = per.reshape(target.shape if isinstance(target, Tensor) else t.shape), None
        else:
            count = float(w.sum()) if reduction == "mean" else 1.0
            out = float(per.sum()) / count if count else float("nan")
        ctx.save = (e / s[:, None], rows, local, w, count, x.shape, x.dtype)
        return Tensor._wrap(xp.asarray(out, dtype=x.dtype))

    @staticmethod
    def backward(ctx, g):
        p, rows, local, w, count, shape, dtype = ctx.save
        grad = p.copy()
        grad[rows, local[rows]] -= 1.0
        if count is None:  # reduction "none": a gradient per row
            grad *= (w * g._data.reshape(-1))[:, None]
        else:
            grad *= w[:, None] * (float(g._data) / count if count else 0.0)
        return Tensor._wrap(grad.astype(dtype).reshape(shape)), None, None, None, None, None


def vocab_parallel_cross_entropy(input, target, device_mesh, ignore_index: int = -100):  # noqa: A002
    """Mean cross-entropy of ``input`` logits (local vocabulary block, last dim, of a Shard(-1) split over the
    1-D ``device_mesh``) against ``target`` class ids; see [Note: Vocabulary-parallel cross-entropy]."""
    if device_mesh.ndim != 1:
        raise ValueError(f"vocab_parallel_cross_entropy: needs a 1-D tensor-parallel mesh, got {device_mesh!r}")
    return _VocabParallelCE.apply(input, target, device_mesh.get_group(0), ignore_index)


# [Note: loss_parallel]
# Inside ``loss_parallel()``, F.cross_entropy (and nn.CrossEntropyLoss) on DTensor logits sharded on the
# class dim (dim 1 of (N, C, d1, ...), dim 0 of (C,); Shard(-1) of (N, C)) over a 1-D mesh computes the global
# loss without gathering the logits ([Note: Vocabulary-parallel cross-entropy]), forward and backward: the
# result is a Replicate DTensor (a scalar, or per sample for reduction "none"), the logits' gradient a DTensor
# of their layout. The target holds class indices, a plain tensor or a Replicate DTensor; a weight is
# replicated; label_smoothing is not supported (as PyTorch). Outside the context (or for other layouts),
# cross_entropy on a DTensor computes on its full tensor (gathered, differentiably), a Replicate DTensor.
_ACTIVE = [0]


@contextlib.contextmanager
def loss_parallel():
    """Loss parallelism for cross-entropy on class-sharded DTensor logits (See [Note: loss_parallel])."""
    _ACTIVE[0] += 1
    try:
        yield
    finally:
        _ACTIVE[0] -= 1


def _whole(x):
    from hpcfsdp.distributed.tensor._dtensor import DTensor

    if isinstance(x, DTensor):
        return x.full_tensor()
    return x


def _cross_entropy_dtensor(input, target, weight, ignore_index, reduction, label_smoothing):  # noqa: A002
    from hpcfsdp.distributed.tensor._dtensor import DTensor
    from hpcfsdp.distributed.tensor.placement_types import Replicate, Shard
    from hpcfsdp.nn import functional as F

    if not isinstance(input, DTensor):
        return NotImplemented
    mesh = input.device_mesh
    cdim = 0 if input.ndim == 1 else 1
    pl = input.placements
    sharded = mesh.ndim == 1 and isinstance(pl[0], Shard) and pl[0].dim % input.ndim == cdim
    if _ACTIVE[0] and sharded and (not isinstance(target, Tensor) or target.dtype.kind in "iu"):
        if label_smoothing:
            raise NotImplementedError("loss_parallel: label_smoothing is not supported (as PyTorch)")
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"{reduction} is not a valid value for reduction")
        x = input.to_local()
        t = _whole(target)
        if x.ndim == 1:
            x, t = x.unsqueeze(0), t.reshape(1)
        elif x.ndim > 2:  # (N, C, d1, ...): the class dim last, locally
            x = x.permute(0, *range(2, x.ndim), 1)
        if tuple(t.shape) != tuple(x.shape[:-1]):
            raise ValueError(f"cross_entropy(): expected target of shape {tuple(x.shape[:-1])}, got {tuple(t.shape)}")
        w = None if weight is None else _whole(weight)._data
        out = _VocabParallelCE.apply(x.reshape(-1, x.shape[-1]), t, mesh.get_group(0), int(ignore_index),
                                     reduction, w)
        if reduction == "none" and input.ndim == 1:
            out = out.reshape(())
        return DTensor.from_local(out, mesh, [Replicate()])
    if _ACTIVE[0] and mesh.ndim == 1 and not sharded and not all(isinstance(p, Replicate) for p in pl):
        raise ValueError(f"loss_parallel: the input must be sharded on the class dim {cdim} (got {list(pl)})")
    out = F.cross_entropy(input.full_tensor(), _whole(target), None if weight is None else _whole(weight),
                          ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)
    return DTensor.from_local(out, mesh, [Replicate()] * mesh.ndim)


def _install():
    from hpcfsdp.nn import functional as F

    F._CROSS_ENTROPY_DTENSOR[0] = _cross_entropy_dtensor


_install()
