"""multi_head_attention_forward: PyTorch's MultiheadAttention computation, on the fused linear and attention ops.

Shapes follow PyTorch: sequence first, (L, N, E) query and (S, N, E_k) / (S, N, E_v) key and value, or (L, E)
and (S, E_k) / (S, E_v) unbatched. Masks follow MultiheadAttention's convention, the opposite of
scaled_dot_product_attention's: a True in a bool mask forbids attending; a float mask is added to the scores.
"""
import math
import warnings

import numpy as np

from ..._array import dtype_category
from ..._creation import zeros
from ..._tensor import Tensor
from ..._tensor_methods.creation import zeros_like
from ..._tensor_methods.shape import cat
from ...autograd import ops
from ._common import check_float, check_tensor
from .conv import pad

__all__ = ["multi_head_attention_forward", "canonical_mask", "mask_dtype_or_none"]

_NAME = "multi_head_attention_forward"


def mask_dtype_or_none(mask):
    """The mask's dtype, or None for no mask."""
    if mask is None:
        return None
    if isinstance(mask, Tensor):
        return mask.dtype
    raise RuntimeError("input to _none_or_dtype() must be None or torch.Tensor")


def canonical_mask(mask, mask_name, other_type, other_name, target_type, check_other=True):
    """A bool mask as a float mask of ``target_type`` (-inf where True, 0 elsewhere); a float mask as it is.

    Warns (as PyTorch) when ``check_other`` and the other mask of the call has another dtype.

    Raises:
        TypeError: the mask is neither bool nor floating point.
    """
    if mask is None:
        return None
    check_tensor(mask, _NAME, mask_name)
    is_float = dtype_category(mask.dtype) == 2
    if mask.dtype != np.bool_ and not is_float:
        raise TypeError(f"only bool and floating types of {mask_name} are supported, got dtype {mask.dtype}")
    if check_other and other_type is not None and mask.dtype != other_type:
        warnings.warn(f"Support for mismatched {mask_name} and {other_name} is deprecated. Use same type for both "
                      "instead.", stacklevel=3)
    if not is_float:
        return zeros_like(mask, dtype=target_type).masked_fill(mask, float("-inf"))
    return mask


def _shape_check(query, key, value, key_padding_mask, attn_mask, num_heads):
    """True for batched (3-D) input, False for unbatched (2-D); RuntimeError on other ranks or mismatched masks."""
    if query.ndim == 3:
        if key.ndim != 3 or value.ndim != 3:
            raise RuntimeError("For batched (3-D) `query`, expected `key` and `value` to be 3-D but found "
                               f"{key.ndim}-D and {value.ndim}-D tensors respectively")
        if key_padding_mask is not None and key_padding_mask.ndim != 2:
            raise RuntimeError("For batched (3-D) `query`, expected `key_padding_mask` to be `None` or 2-D but "
                               f"found {key_padding_mask.ndim}-D tensor instead")
        if attn_mask is not None and attn_mask.ndim not in (2, 3):
            raise RuntimeError("For batched (3-D) `query`, expected `attn_mask` to be `None`, 2-D or 3-D but "
                               f"found {attn_mask.ndim}-D tensor instead")
        return True
    if query.ndim == 2:
        if key.ndim != 2 or value.ndim != 2:
            raise RuntimeError("For unbatched (2-D) `query`, expected `key` and `value` to be 2-D but found "
                               f"{key.ndim}-D and {value.ndim}-D tensors respectively")
        if key_padding_mask is not None and key_padding_mask.ndim != 1:
            raise RuntimeError("For unbatched (2-D) `query`, expected `key_padding_mask` to be `None` or 1-D but "
                               f"found {key_padding_mask.ndim}-D tensor instead")
        if attn_mask is not None:
            if attn_mask.ndim not in (2, 3):
                raise RuntimeError("For unbatched (2-D) `query`, expected `attn_mask` to be `None`, 2-D or 3-D "
                                   f"but found {attn_mask.ndim}-D tensor instead")
            expected = (num_heads, query.shape[0], key.shape[0])
            if attn_mask.ndim == 3 and tuple(attn_mask.shape) != expected:
                raise RuntimeError(f"Expected `attn_mask` shape to be {expected} but got {tuple(attn_mask.shape)}")
        return False
    raise RuntimeError(f"query should be unbatched 2D or batched 3D tensor but received {query.ndim}-D query tensor")


def _linear(x, w, b):
    if x.dtype != w.dtype:
        raise RuntimeError(f"{_NAME}(): input and projection weight must have the same dtype, but got {x.dtype} "
                           f"and {w.dtype}")
    return ops.Linear.apply(x, w) if b is None else ops.Linear.apply(x, w, b)


def _in_projection_packed(q, k, v, w, b):
    """q, k, v projected by the packed (3E, E) weight: one GEMM for self-attention (q is k is v), two when only
    k is v (encoder-decoder attention), else three."""
    E = q.shape[-1]
    if k is v:
        if q is k:
            return _linear(q, w, b).chunk(3, -1)  # (..., 3E) -> 3 x (..., E)
        w_q, w_kv = w.split([E, 2 * E])
        b_q, b_kv = (None, None) if b is None else b.split([E, 2 * E])
        k_proj, v_proj = _linear(k, w_kv, b_kv).chunk(2, -1)
        return _linear(q, w_q, b_q), k_proj, v_proj
    w_q, w_k, w_v = w.chunk(3)
    b_q, b_k, b_v = (None, None, None) if b is None else b.chunk(3)
    return _linear(q, w_q, b_q), _linear(k, w_k, b_k), _linear(v, w_v, b_v)


def _in_projection(q, k, v, w_q, w_k, w_v, b_q, b_k, b_v):
    Eq, Ek, Ev = q.shape[-1], k.shape[-1], v.shape[-1]
    for what, w, shape in (("query", w_q, (Eq, Eq)), ("key", w_k, (Eq, Ek)), ("value", w_v, (Eq, Ev))):
        if tuple(w.shape) != shape:
            raise RuntimeError(f"expecting {what} weights shape of {shape}, but got {tuple(w.shape)}")
    for what, b in (("query", b_q), ("key", b_k), ("value", b_v)):
        if b is not None and tuple(b.shape) != (Eq,):
            raise RuntimeError(f"expecting {what} bias shape of {(Eq,)}, but got {tuple(b.shape)}")
    return _linear(q, w_q, b_q), _linear(k, w_k, b_k), _linear(v, w_v, b_v)


def _static(t, name, bsz, num_heads, head_dim):
    if t.shape[0] != bsz * num_heads:
        raise RuntimeError(f"expecting {name}.size(0) of {bsz * num_heads}, but got {t.shape[0]}")
    if t.shape[2] != head_dim:
        raise RuntimeError(f"expecting {name}.size(2) of {head_dim}, but got {t.shape[2]}")
    return t


def multi_head_attention_forward(query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias,
                                 bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight, out_proj_bias,
                                 training=True, key_padding_mask=None, need_weights=True, attn_mask=None,
                                 use_separate_proj_weight=False, q_proj_weight=None, k_proj_weight=None,
                                 v_proj_weight=None, static_k=None, static_v=None, average_attn_weights=True,
                                 is_causal=False):
    """Multi-head attention of (L, N, E) queries over (S, N, E_k) keys and (S, N, E_v) values (or unbatched
    (L, E), (S, E_k), (S, E_v)), as ``torch.nn.functional.multi_head_attention_forward``.

    The queries, keys and values are projected (one packed (3E, E) ``in_proj_weight``, or separate
    ``q/k/v_proj_weight`` with ``use_separate_proj_weight``), split into ``num_heads`` heads, attended
    (softmax(q k^T / sqrt(E / num_heads) + mask) v, with dropout in training) and projected out.

    Args:
        key_padding_mask: (N, S) (or (S,) unbatched); True or -inf marks a key to ignore.
        need_weights: also return the attention weights; without it the fused scaled_dot_product_attention
            computes the output and the weights are not formed.
        attn_mask: (L, S) or (N * num_heads, L, S); True forbids attending, a float mask is added.
        bias_k: (1, 1, E) appended to the keys as one more position (with ``bias_v``).
        bias_v: (1, 1, E) appended to the values.
        add_zero_attn: append a zero key and value per head.
        static_k: (N * num_heads, S, E / num_heads) keys to use instead of the projected ones.
        static_v: the same for the values.
        average_attn_weights: average the returned weights over heads ((N, L, S)) instead of (N, num_heads, L, S).
        is_causal: a hint that ``attn_mask`` is the causal mask; it still must be given. Without need_weights and
            key_padding_mask the causal mask is applied by the attention kernel instead of ``attn_mask``.

    Returns:
        (attn_output, attn_weights): (L, N, E) (or (L, E)), and the weights or None.

    Raises:
        RuntimeError: mismatched shapes or ranks (PyTorch raises AssertionError for most of them), or is_causal
            without attn_mask.
        TypeError: a mask that is neither bool nor floating point.
    """
    for argname, t in (("query", query), ("key", key), ("value", value)):
        check_float(t, _NAME, argname)
    is_batched = _shape_check(query, key, value, key_padding_mask, attn_mask, num_heads)
    if not is_batched:  # a batch of 1 at dim 1, squeezed out at the end
        q1 = query.unsqueeze(1)  # keep `query is key` and `key is value`: they pick the packed projection
        k1 = q1 if key is query else key.unsqueeze(1)
        value = k1 if value is key else value.unsqueeze(1)
        query, key = q1, k1
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.shape[0]
    key_padding_mask = canonical_mask(key_padding_mask, "key_padding_mask", mask_dtype_or_none(attn_mask),
                                      "attn_mask", query.dtype)
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the Transformer module "
                           "method `generate_square_subsequent_mask` to create this mask.")
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None  # the kernel applies the causal mask itself
    else:
        attn_mask = canonical_mask(attn_mask, "attn_mask", None, "", query.dtype, check_other=False)
        if key_padding_mask is not None:
            is_causal = False  # the merged mask is no longer causal
    if embed_dim != embed_dim_to_check:
        raise RuntimeError(f"was expecting embedding dimension of {embed_dim_to_check}, but got {embed_dim}")
    head_dim = embed_dim // num_heads
    if head_dim * num_heads != embed_dim:
        raise RuntimeError(f"embed_dim {embed_dim} not divisible by num_heads {num_heads}")
    if use_separate_proj_weight:
        if tuple(key.shape[:2]) != tuple(value.shape[:2]):
            raise RuntimeError(f"key's sequence and batch dims {tuple(key.shape[:2])} do not match value's "
                               f"{tuple(value.shape[:2])}")
        if q_proj_weight is None or k_proj_weight is None or v_proj_weight is None:
            raise RuntimeError("use_separate_proj_weight is True but q_proj_weight, k_proj_weight or v_proj_weight "
                               "is None")
        b_q, b_k, b_v = (None, None, None) if in_proj_bias is None else in_proj_bias.chunk(3)
        q, k, v = _in_projection(query, key, value, q_proj_weight, k_proj_weight, v_proj_weight, b_q, b_k, b_v)
    else:
        if tuple(key.shape) != tuple(value.shape):
            raise RuntimeError(f"key shape {tuple(key.shape)} does not match value shape {tuple(value.shape)}")
        if in_proj_weight is None:
            raise RuntimeError("use_separate_proj_weight is False but in_proj_weight is None")
        q, k, v = _in_projection_packed(query, key, value, in_proj_weight, in_proj_bias)  # (L|S, N, E) each

    if attn_mask is not None:  # as (1, L, S) or (N * nh, L, S)
        if attn_mask.ndim == 2:
            if tuple(attn_mask.shape) != (tgt_len, src_len):
                raise RuntimeError(f"The shape of the 2D attn_mask is {tuple(attn_mask.shape)}, but should be "
                                   f"{(tgt_len, src_len)}.")
            attn_mask = attn_mask.unsqueeze(0)
        elif tuple(attn_mask.shape) != (bsz * num_heads, tgt_len, src_len):
            raise RuntimeError(f"The shape of the 3D attn_mask is {tuple(attn_mask.shape)}, but should be "
                               f"{(bsz * num_heads, tgt_len, src_len)}.")
        if attn_mask.dtype != query.dtype:
            attn_mask = attn_mask.to(query.dtype)
    if key_padding_mask is not None and key_padding_mask.dtype != query.dtype:
        key_padding_mask = key_padding_mask.to(query.dtype)

    if bias_k is not None and bias_v is not None:  # one more key position, the same for every sequence
        if static_k is not None or static_v is not None:
            raise RuntimeError("bias cannot be added to static key or value.")
        k = cat([k, bias_k.expand(1, bsz, embed_dim)])  # (S + 1, N, E)
        v = cat([v, bias_v.expand(1, bsz, embed_dim)])
        attn_mask = None if attn_mask is None else pad(attn_mask, (0, 1))
        key_padding_mask = None if key_padding_mask is None else pad(key_padding_mask, (0, 1))
    elif bias_k is not None or bias_v is not None:
        raise RuntimeError("bias_k and bias_v must be given together")

    q = q.reshape(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)  # (N * nh, L, hs)
    k = k.reshape(k.shape[0], bsz * num_heads, head_dim).transpose(0, 1) if static_k is None else \
        _static(static_k, "static_k", bsz, num_heads, head_dim)  # (N * nh, S, hs)
    v = v.reshape(v.shape[0], bsz * num_heads, head_dim).transpose(0, 1) if static_v is None else \
        _static(static_v, "static_v", bsz, num_heads, head_dim)  # (N * nh, S, hs)

    if add_zero_attn:  # a zero key and value per head
        z = zeros((bsz * num_heads, 1, head_dim), dtype=k.dtype, device=k.device)
        k = cat([k, z], dim=1)  # (N * nh, S + 1, hs)
        v = cat([v, z], dim=1)
        attn_mask = None if attn_mask is None else pad(attn_mask, (0, 1))
        key_padding_mask = None if key_padding_mask is None else pad(key_padding_mask, (0, 1))
    src_len = k.shape[1]

    if key_padding_mask is not None:  # merged into attn_mask: (N * nh, 1 | L, S)
        if tuple(key_padding_mask.shape) != (bsz, src_len):
            raise RuntimeError(f"Expected key_padded_mask of shape {(bsz, src_len)}, but got "
                               f"{tuple(key_padding_mask.shape)}")
        kpm = key_padding_mask.reshape(bsz, 1, 1, src_len).expand(bsz, num_heads, 1, src_len)
        kpm = kpm.reshape(bsz * num_heads, 1, src_len)
        attn_mask = kpm if attn_mask is None else attn_mask + kpm

    if not training:
        dropout_p = 0.0

    if need_weights:
        q_scaled = q * math.sqrt(1.0 / float(q.shape[-1]))
        w = q_scaled @ k.transpose(-2, -1)  # (N * nh, L, S)
        if attn_mask is not None:
            w = w + attn_mask
        w = w.softmax(-1)
        if dropout_p > 0.0:
            w = ops.Dropout.apply(w, float(dropout_p))
        out = w @ v  # (N * nh, L, hs)
        out = out.transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
        out = _linear(out, out_proj_weight, out_proj_bias).reshape(tgt_len, bsz, -1)  # (L, N, E)
        w = w.reshape(bsz, num_heads, tgt_len, src_len)
        if average_attn_weights:
            w = w.mean(dim=1)  # (N, L, S)
        if not is_batched:
            out, w = out.squeeze(1), w.squeeze(0)
        return out, w

    mask = None
    if attn_mask is not None:  # (1, 1, L, S) or (N, nh, L | 1, S), broadcast by the kernel
        mask = (attn_mask.unsqueeze(0) if attn_mask.shape[0] == 1 else
                attn_mask.reshape(bsz, num_heads, -1, src_len))._data
    q = q.reshape(bsz, num_heads, tgt_len, head_dim)  # (N, nh, L, hs)
    k = k.reshape(bsz, num_heads, src_len, head_dim)  # (N, nh, S, hs)
    v = v.reshape(bsz, num_heads, src_len, head_dim)
    out = ops.ScaledDotProductAttention.apply(q, k, v, mask, float(dropout_p), bool(is_causal),
                                                 1.0 / math.sqrt(head_dim))  # (N, nh, L, hs)
    out = out.permute(2, 0, 1, 3).reshape(tgt_len * bsz, embed_dim)  # (L * N, E)
    out = _linear(out, out_proj_weight, out_proj_bias).reshape(tgt_len, bsz, -1)  # (L, N, E)
    if not is_batched:
        out = out.squeeze(1)
    return out, None
