"""Sharding rules of the nn.functional ops that apply fused primitives: linear, layer_norm, embedding,
scaled_dot_product_attention and the losses (See [Note: Functionals on DTensors] in nn/_functional/_common.py).

[Note: Functional placements]
A call whose DTensor operands are all Replicate computes on the local values (each the whole tensor) and
returns Replicate DTensors. Otherwise:
- linear is ``input @ weight.mT + bias`` on DTensors, so the matmul and pointwise rules place it (a
  column-sharded weight gives a Shard(-1) result, a row-sharded one a Partial, no data moved).
- layer_norm keeps the input's layout on the dims it does not normalize (a Partial input, or one sharded on a
  normalized dim, is laid out Replicate there first); weight and bias are used whole.
- embedding: per mesh dim, a Replicate weight keeps the indices' layout; a weight sharded on the embedding
  dim (Shard(1)) gives a result sharded on its last dim (the indices whole there). A vocabulary-sharded
  weight (Shard(0)) is gathered on that mesh dim (PyTorch keeps it sharded and returns a masked Partial;
  hpcfsdp's RowwiseParallel embedding does that on plain activations).
- scaled_dot_product_attention with query, key and value sharded alike on the batch or heads dim of 4-D
  inputs computes locally, sharded the same; any other layout is gathered.
- mse_loss and l1_loss are composed of DTensor ops (a mean of a Shard(0) loss is a Partial, no gather); the
  other losses gather their DTensor operands and return a Replicate result.
A gathered operand is redistributed differentiably; an operand used whole where the result is sharded has
its gradient summed over those mesh dims. A plain tensor beside a sharded DTensor raises PyTorch's mixed
error (a plain tensor of one element is a scalar).
"""
from __future__ import annotations

import types

import numpy as np

from hpcfsdp._tensor import Tensor
from hpcfsdp.distributed.tensor._dispatch import OpCall, _check_plain, local_args, wrap, wrap_all
from hpcfsdp.distributed.tensor.placement_types import Partial, Replicate, Shard
from hpcfsdp.nn._functional import _common
from hpcfsdp.nn._functional._common import legacy_reduction


def _call(fn, args, kwargs) -> OpCall:
    entry = types.SimpleNamespace(name=fn.__name__, impl=None, function=fn, inplace=False)
    return OpCall(entry, args, kwargs)


def _replicated(call: OpCall):
    """The call on local values when every DTensor operand is Replicate (else None); refuses plain tensors
    beside sharded DTensors."""
    if not _check_plain(call):
        return None
    args, kwargs = local_args(call)
    return wrap_all(call.compute(*args, **kwargs), call.mesh, (Replicate(),) * call.mesh.ndim)


def _gathered(fn, *args, **kwargs):
    """``fn`` on the full tensors of its DTensor operands: a Replicate result."""
    call = _call(fn, args, kwargs)
    out = _replicated(call)
    if out is not None:
        return out
    rep = (Replicate(),) * call.mesh.ndim
    args, kwargs = local_args(call, [rep] * len(call.dtensors))
    return wrap_all(call.compute(*args, **kwargs), call.mesh, rep)


def _whole_on(placements, bad) -> tuple:
    """``placements`` with Partial, and the Shard placements for which ``bad(dim)`` holds, made Replicate."""
    return tuple(Replicate() if isinstance(p, Partial) or (isinstance(p, Shard) and bad(p.dim)) else p
                 for p in placements)


def linear(fn, input, weight, bias=None):  # noqa: A002
    if isinstance(weight, Tensor) and input.dtype != weight.dtype:
        raise RuntimeError(f"linear(): mat1 and mat2 must have the same dtype, but got {input.dtype} and {weight.dtype}")
    out = input @ weight.mT
    return out if bias is None else out + bias


def layer_norm(fn, input, normalized_shape, weight=None, bias=None, eps=1e-5):  # noqa: A002
    call = _call(fn, (input, normalized_shape, weight, bias, eps), {})
    out = _replicated(call)
    if out is not None:
        return out
    nd = input.ndim
    k = 1 if isinstance(normalized_shape, (int, np.integer)) else len(normalized_shape)
    pl = _whole_on(input._spec.placements, lambda d: d % nd >= nd - k)
    rep = (Replicate(),) * call.mesh.ndim
    args, _ = local_args(call, [pl] + [rep] * (len(call.dtensors) - 1), pl)
    return wrap(fn(*args), call.mesh, pl, input.shape)


def embedding(fn, input, weight, padding_idx=None, max_norm=None, norm_type=2.0,  # noqa: A002
              scale_grad_by_freq=False, sparse=False):
    args = (input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)
    call = _call(fn, args, {})
    out = _replicated(call)
    if out is not None:
        return out
    if not getattr(type(weight), "_hp_is_dtensor", False):
        raise RuntimeError("embedding: got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to "
                           "DTensor before calling distributed operators!")
    out_nd = input.ndim + 1
    idx_pl, w_pl, out_pl = [], [], []
    for ip, wp in zip(input._spec.placements, weight._spec.placements):
        if isinstance(wp, Shard) and wp.dim % 2 == 1 and max_norm is None:  # column-sharded: indices whole
            idx_pl.append(Replicate())
            w_pl.append(wp)
            out_pl.append(Shard(out_nd - 1))
        else:  # a whole weight (gathered if vocabulary-sharded); the indices keep their layout
            ip = Replicate() if isinstance(ip, Partial) else ip
            idx_pl.append(ip)
            w_pl.append(Replicate())
            out_pl.append(ip)
    local, _ = local_args(call, [tuple(idx_pl), tuple(w_pl)], out_pl)
    shape = tuple(input.shape) + (weight.shape[1],)
    return wrap(fn(*local), call.mesh, out_pl, shape)


def scaled_dot_product_attention(fn, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False):
    args = (query, key, value, attn_mask, dropout_p, is_causal, scale)
    kwargs = {"enable_gqa": enable_gqa} if enable_gqa else {}
    call = _call(fn, args, kwargs)
    out = _replicated(call)
    if out is not None:
        return out
    same = all(getattr(type(t), "_hp_is_dtensor", False) for t in (query, key, value)) and \
        query._spec.placements == key._spec.placements == value._spec.placements
    pl = query._spec.placements if same else ()
    local = same and query.ndim == 4 and all(isinstance(p, Replicate) or (isinstance(p, Shard) and p.dim % 4 < 2)
                                             for p in pl)
    if not local or (attn_mask is not None and not isinstance(attn_mask, Tensor)):
        return _gathered(fn, *args, **kwargs)
    rep = (Replicate(),) * call.mesh.ndim
    targets = [tuple(pl)] * 3 + [rep] * (len(call.dtensors) - 3)
    largs, lkw = local_args(call, targets, pl)
    out = call.compute(*largs, **lkw)
    return wrap(out, call.mesh, pl, tuple(query.shape[:-1]) + (value.shape[-1],))


def _composed_loss(elementwise):
    def rule(fn, input, target, size_average=None, reduce=None, reduction="mean", **kwargs):  # noqa: A002
        if kwargs.get("weight") is not None:
            return _gathered(fn, input, target, size_average, reduce, reduction, **kwargs)
        reduction = legacy_reduction(size_average, reduce, reduction)
        _common.check_reduction(reduction)
        if tuple(input.shape) != tuple(target.shape):
            return _gathered(fn, input, target, reduction=reduction)
        return _common.reduce_loss(elementwise(input - target), reduction)

    return rule


def _gather_rule(fn, *args, **kwargs):
    return _gathered(fn, *args, **kwargs)


_common.DTENSOR_FUNCTIONAL.update({
    "linear": linear,
    "layer_norm": layer_norm,
    "embedding": embedding,
    "scaled_dot_product_attention": scaled_dot_product_attention,
    "mse_loss": _composed_loss(lambda d: d * d),
    "l1_loss": _composed_loss(lambda d: d.abs()),
    **{name: _gather_rule for name in ("nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
                                       "smooth_l1_loss", "huber_loss", "kl_div")},
})
