"""MultiheadAttention (PyTorch's parameter names, init and forward) and its out-projection Linear."""
from hpcfsdp.nn import init
from hpcfsdp.nn._functional.attention import canonical_mask, mask_dtype_or_none, multi_head_attention_forward
from hpcfsdp.nn.modules.linear import Linear
from hpcfsdp.nn.modules.module import Module
from hpcfsdp.nn.parameter import Parameter

__all__ = ["MultiheadAttention", "NonDynamicallyQuantizableLinear"]


def _empty(shape, device, dtype):
    import hpcfsdp

    return hpcfsdp.empty(shape, device=device, dtype=dtype)


class NonDynamicallyQuantizableLinear(Linear):
    """A Linear under PyTorch's name for MultiheadAttention's ``out_proj`` (a marker for its quantization tools)."""


class MultiheadAttention(Module):
    """Multi-head attention as ``torch.nn.MultiheadAttention``: project, attend per head, project out.

    Parameters, as PyTorch names and initializes them: ``in_proj_weight`` (3E, E) (xavier_uniform) when key and
    value have the query's embedding size, else ``q_proj_weight`` (E, E), ``k_proj_weight`` (E, kdim) and
    ``v_proj_weight`` (E, vdim); ``in_proj_bias`` (3E,) (zeros); ``out_proj`` (weight (E, E), bias zeros);
    ``bias_k`` and ``bias_v`` (1, 1, E) (xavier_normal) with ``add_bias_kv``.

    Args:
        embed_dim: E, the query (and output) embedding size.
        num_heads: heads; E must divide by it.
        dropout: dropout on the attention weights, in training.
        bias: biases on the in- and out-projections.
        add_bias_kv: learn one more key and value position.
        add_zero_attn: append a zero key and value position.
        kdim: the key embedding size (default E).
        vdim: the value embedding size (default E).
        batch_first: inputs and output are (N, L, E) instead of (L, N, E).

    Raises:
        ValueError: ``embed_dim`` or ``num_heads`` is not positive, or E does not divide by ``num_heads``
            (PyTorch raises AssertionError for the last).
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None) -> None:
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got embed_dim={embed_dim} and "
                             f"num_heads={num_heads} instead")
        super().__init__()
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != self.embed_dim:
            raise ValueError(f"embed_dim must be divisible by num_heads, got embed_dim={embed_dim} and "
                             f"num_heads={num_heads}")
        if not self._qkv_same_embed_dim:
            self.q_proj_weight = Parameter(_empty((embed_dim, embed_dim), device, dtype))
            self.k_proj_weight = Parameter(_empty((embed_dim, self.kdim), device, dtype))
            self.v_proj_weight = Parameter(_empty((embed_dim, self.vdim), device, dtype))
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = Parameter(_empty((3 * embed_dim, embed_dim), device, dtype))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(_empty((3 * embed_dim,), device, dtype))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, device=device, dtype=dtype)
        if add_bias_kv:
            self.bias_k = Parameter(_empty((1, 1, embed_dim), device, dtype))
            self.bias_v = Parameter(_empty((1, 1, embed_dim), device, dtype))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            init.xavier_normal_(self.bias_v)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        """Attend ``query`` to ``key``/``value``; returns (attn_output, attn_weights or None).

        Args:
            query: (L, N, E), (N, L, E) with batch_first, or (L, E) unbatched.
            key: (S, N, kdim), (N, S, kdim) with batch_first, or (S, kdim) unbatched.
            value: (S, N, vdim), likewise.
            key_padding_mask: (N, S) or (S,); True (or -inf) marks a key to ignore.
            need_weights: also return the attention weights (averaged over heads with ``average_attn_weights``:
                (N, L, S), else (N, num_heads, L, S)); False uses the fused attention kernel.
            attn_mask: (L, S) or (N * num_heads, L, S); True forbids attending, a float mask is added.
            is_causal: a hint that ``attn_mask`` is the causal mask (it must still be given).
        """
        is_batched = query.ndim == 3
        key_padding_mask = canonical_mask(key_padding_mask, "key_padding_mask", mask_dtype_or_none(attn_mask),
                                          "attn_mask", query.dtype)
        attn_mask = canonical_mask(attn_mask, "attn_mask", None, "", query.dtype, check_other=False)
        if self.batch_first and is_batched:  # to (L, N, E), keeping `query is key` and `key is value`
            if key is value:
                if query is key:
                    query = key = value = query.transpose(1, 0)
                else:
                    query, key = (x.transpose(1, 0) for x in (query, key))
                    value = key
            else:
                query, key, value = (x.transpose(1, 0) for x in (query, key, value))
        separate = not self._qkv_same_embed_dim
        out, weights = multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads, self.in_proj_weight, self.in_proj_bias, self.bias_k,
            self.bias_v, self.add_zero_attn, self.dropout, self.out_proj.weight, self.out_proj.bias,
            training=self.training, key_padding_mask=key_padding_mask, need_weights=need_weights,
            attn_mask=attn_mask, use_separate_proj_weight=separate, q_proj_weight=self.q_proj_weight,
            k_proj_weight=self.k_proj_weight, v_proj_weight=self.v_proj_weight,
            average_attn_weights=average_attn_weights, is_causal=is_causal)
        if self.batch_first and is_batched:
            return out.transpose(1, 0), weights
        return out, weights
