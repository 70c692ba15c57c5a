"""Llama: a decoder with RMSNorm, rotary position embedding, SwiGLU MLP and grouped-query attention."""
from dataclasses import dataclass
from typing import Optional

from hpcfsdp import nn
from hpcfsdp.nn import functional as F

from .gpt import _Embedding, _Linear

__all__ = ["LlamaConfig", "Llama", "LlamaBlock", "LlamaAttention", "LlamaMLP", "apply_rotary_pos_emb",
           "rotate_half"]


@dataclass
class LlamaConfig:
    vocab_size: int = 32000
    block_size: int = 2048           # maximum sequence length (max_position_embeddings)
    n_layer: int = 16                # decoder blocks
    n_head: int = 16                 # query heads
    n_kv_head: Optional[int] = None  # key/value heads (grouped-query attention); None = n_head
    n_embd: int = 1024               # hidden width
    intermediate_size: Optional[int] = None  # SwiGLU width; None = Llama's rule from 8/3 * n_embd
    head_dim: Optional[int] = None   # None = n_embd // n_head
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    dropout: float = 0.0             # attention dropout
    bias: bool = False               # biases in the attention and MLP projections
    tie_weights: bool = False        # lm_head.weight is the token embedding
    init_std: float = 0.02

    def __post_init__(self):
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.head_dim is None:
            if self.n_embd % self.n_head != 0:
                raise ValueError(f"LlamaConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}) "
                                 f"unless head_dim is given")
            self.head_dim = self.n_embd // self.n_head
        if self.intermediate_size is None:
            h = int(2 * 4 * self.n_embd / 3)
            self.intermediate_size = 256 * ((h + 255) // 256)
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd", "intermediate_size",
                     "head_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"LlamaConfig.{name} must be a positive int, got {v!r}")
        if self.n_head % self.n_kv_head != 0:
            raise ValueError(f"LlamaConfig.n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")
        if self.head_dim % 2 != 0:
            raise ValueError(f"LlamaConfig.head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LlamaConfig.dropout must be in [0, 1), got {self.dropout}")


def rotate_half(x):
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    import hpcfsdp

    d = x.shape[-1] // 2
    return hpcfsdp.cat([-x[..., d:], x[..., :d]], dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    """Rotary embedding with Hugging Face's convention: x * cos + rotate_half(x) * sin (one fused kernel each way
    for plain CUDA tensors with (T, head_dim) tables that need no gradient)."""
    if _fused_rotary(q, cos, sin) and _fused_rotary(k, cos, sin):
        from hpcfsdp.autograd import ops

        return ops.Rotary.apply(q, cos, sin), ops.Rotary.apply(k, cos, sin)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _fused_rotary(x, cos, sin) -> bool:
    from hpcfsdp._kernels import CTYPES, use_fused
    from hpcfsdp._tensor import Tensor

    return (all(type(t) is Tensor for t in (x, cos, sin)) and use_fused(x._data) and x.dtype in CTYPES
            and x.ndim >= 2 and tuple(cos.shape) == tuple(sin.shape) == tuple(x.shape[-2:])
            and not cos.requires_grad and not sin.requires_grad)


# [Note: Rotary tables]
# The angle of position p and frequency i is p * theta^(-2i / head_dim), i < head_dim / 2; cos and sin
# are laid out as cat(freqs, freqs) so that they pair element j with j + head_dim / 2 (rotate_half), as
# Hugging Face's Llama does. They are computed on the host (positions 0..T-1, cheap next to attention)
# and cast to the activation dtype: no buffer, so nothing to shard, save or materialise after meta-device
# construction. Each (T, head_dim, theta, dtype, device) is computed once per process and kept (a few
# (T, head_dim) tables): a forward on a GPU uploads nothing, so it makes no host synchronisation.
_ROPE_CACHE: dict = {}


def _rope_tables(T, head_dim, theta, dtype, device):
    key = (int(T), int(head_dim), float(theta), str(dtype), str(device))
    tables = _ROPE_CACHE.get(key)
    if tables is None:
        if len(_ROPE_CACHE) >= 64:  # many lengths (generation grows T by one): keep the memory bounded
            _ROPE_CACHE.clear()
        tables = _ROPE_CACHE[key] = _compute_rope_tables(T, head_dim, theta, dtype, device)
    return tables


def _compute_rope_tables(T, head_dim, theta, dtype, device):
    import numpy as np

    import hpcfsdp

    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))
    freqs = np.outer(np.arange(T, dtype=np.float32), inv_freq.astype(np.float32))  # float32 as Hugging Face
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos = hpcfsdp.tensor(np.cos(emb), device=device).to(dtype)
    sin = hpcfsdp.tensor(np.sin(emb), device=device).to(dtype)
    return cos, sin  # (T, head_dim)


# [Note: Llama tensor parallelism]
# ``Llama.tp_plan`` splits attention by heads: q_proj, k_proj and v_proj column-wise (each rank holds the rows
# of its q heads [r*H/n, (r+1)*H/n) and of its k/v heads [r*Hkv/n, ...): contiguous, since the projections are
# separate), so grouped-query attention on the local heads pairs each local q head with its own k/v head
# (H/n = (H/Hkv) * Hkv/n); o_proj row-wise (its input dim split the same way), all-reduced. The MLP: gate and up
# column-wise, down row-wise. Embedding, norms and lm_head stay replicated. With sequence parallelism the
# residual stream is sharded on the sequence (torchtitan's plan): the embedding's output sliced, the norms on
# the shard (DTensor outputs), each sublayer's input all-gathered once (PrepareModuleInput), o_proj and
# down_proj reduce-scattered back, lm_head's input all-gathered.


class LlamaAttention(nn.Module):
    """Causal self-attention with separate q/k/v projections, rotary embedding and grouped-query attention."""

    def __init__(self, config, device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype, std=config.init_std)
        c = config
        self.q_proj = _Linear(c.n_embd, c.n_head * c.head_dim, bias=c.bias, **kw)
        self.k_proj = _Linear(c.n_embd, c.n_kv_head * c.head_dim, bias=c.bias, **kw)
        self.v_proj = _Linear(c.n_embd, c.n_kv_head * c.head_dim, bias=c.bias, **kw)
        self.o_proj = _Linear(c.n_head * c.head_dim, c.n_embd, bias=c.bias, **kw)
        self.n_head, self.n_kv_head, self.head_dim = c.n_head, c.n_kv_head, c.head_dim
        self.dropout = c.dropout

    def forward(self, x, cos, sin):
        # under tensor parallelism the projections' outputs are this rank's heads: the head counts are read
        # from their widths (See [Note: Llama tensor parallelism])
        B, T, _ = x.shape
        hd = self.head_dim
        q = self.q_proj(x)
        k = self.k_proj(x)
        v = self.v_proj(x)
        q = q.reshape(B, T, q.shape[-1] // hd, hd).transpose(1, 2)  # (B, H, T, hd)
        k = k.reshape(B, T, k.shape[-1] // hd, hd).transpose(1, 2)  # (B, Hkv, T, hd)
        v = v.reshape(B, T, v.shape[-1] // hd, hd).transpose(1, 2)  # (B, Hkv, T, hd)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True, enable_gqa=True)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, y.shape[1] * hd)
        return self.o_proj(y)


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config, device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype, std=config.init_std)
        c = config
        self.gate_proj = _Linear(c.n_embd, c.intermediate_size, bias=c.bias, **kw)
        self.up_proj = _Linear(c.n_embd, c.intermediate_size, bias=c.bias, **kw)
        self.down_proj = _Linear(c.intermediate_size, c.n_embd, bias=c.bias, **kw)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config, device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.input_layernorm = nn.RMSNorm(config.n_embd, eps=config.rms_norm_eps, **kw)
        self.self_attn = LlamaAttention(config, **kw)
        self.post_attention_layernorm = nn.RMSNorm(config.n_embd, eps=config.rms_norm_eps, **kw)
        self.mlp = LlamaMLP(config, **kw)
        self.config = config

    def forward(self, x):
        h = self.input_layernorm(x)
        T = h.shape[1]  # the whole sequence (h is a Shard(1) DTensor under sequence parallelism, x a shard)
        cos, sin = _rope_tables(T, self.config.head_dim, self.config.rope_theta, x.dtype, x.device)
        x = x + self.self_attn(h, cos, sin)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x

    def reset_parameters(self):
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()


class Llama(nn.Module):
    """Token embedding, ``n_layer`` LlamaBlocks, final RMSNorm and an lm_head (untied by default).

    Submodule names follow Hugging Face's LlamaForCausalLM (``model.layers.0.self_attn.q_proj``...), so
    state-dict keys are the Hub's.
    """

    def __init__(self, config: LlamaConfig, device=None, dtype=None):
        super().__init__()
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"Llama expects a LlamaConfig, got {type(config).__name__}")
        self.config = config
        kw = dict(device=device, dtype=dtype)
        self.model = nn.ModuleDict(dict(
            embed_tokens=_Embedding(config.vocab_size, config.n_embd, std=config.init_std, **kw),
            layers=nn.ModuleList([LlamaBlock(config, **kw) for _ in range(config.n_layer)]),
            norm=nn.RMSNorm(config.n_embd, eps=config.rms_norm_eps, **kw),
        ))
        self.lm_head = _Linear(config.n_embd, config.vocab_size, bias=False, std=config.init_std, **kw)
        if config.tie_weights:
            self.model.embed_tokens.weight = self.lm_head.weight

    @property
    def blocks(self):
        """The decoder blocks (``model.layers``): the natural ``fully_shard`` units."""
        return self.model.layers

    def init_weights(self):
        """Re-draw every parameter (N(0, init_std) for Linear and Embedding, ones for RMSNorm)."""
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def get_num_params(self, non_embedding: bool = True) -> int:
        """Number of parameters (shared ones once); minus the token embedding when ``non_embedding`` and untied."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and not self.config.tie_weights:
            n -= self.model.embed_tokens.weight.numel()
        return n

    def forward(self, idx, targets=None):
        """idx (B, T) int64 token ids -> (logits (B, T, vocab), loss or None); targets -1 are skipped."""
        if idx.ndim != 2:
            raise ValueError(f"Llama expects idx of shape (B, T), got shape {tuple(idx.shape)}")
        b, t = idx.shape
        if t > self.config.block_size:
            raise ValueError(f"Cannot forward sequence of length {t}, block size is only {self.config.block_size}")
        x = self.model.embed_tokens(idx)
        for block in self.model.layers:
            x = block(x)
        x = self.model.norm(x)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            if tuple(targets.shape) != (b, t):
                raise ValueError(f"targets must have shape {(b, t)} like idx, got {tuple(targets.shape)}")
            loss = F.cross_entropy(logits.reshape(b * t, -1), targets.reshape(b * t), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type=None):
        """AdamW with weight decay on matrices (dim >= 2) only."""
        from hpcfsdp.optim import AdamW

        params = [p for p in self.parameters() if p.requires_grad]
        return AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                      {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                     lr=learning_rate, betas=betas)

    def tp_plan(self, sequence_parallel: bool = False) -> dict:
        """The tensor-parallel plan for ``parallelize_module(model, mesh["tp"], model.tp_plan())`` (torchtitan's
        layout; See [Note: Llama tensor parallelism]). n_head and n_kv_head must divide over the tp ranks."""
        from hpcfsdp.distributed.tensor import Replicate, Shard
        from hpcfsdp.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                                         RowwiseParallel, SequenceParallel)

        layer = "model.layers.*."
        if not sequence_parallel:
            plan = {layer + f"self_attn.{n}_proj": ColwiseParallel() for n in "qkv"}
            plan.update({layer + "self_attn.o_proj": RowwiseParallel(), layer + "mlp.gate_proj": ColwiseParallel(),
                         layer + "mlp.up_proj": ColwiseParallel(), layer + "mlp.down_proj": RowwiseParallel()})
            return plan
        seq = Shard(1)
        plan = {"model.embed_tokens": PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=seq),
                layer + "input_layernorm": SequenceParallel(),
                layer + "self_attn": PrepareModuleInput(input_layouts=(seq, None, None),
                                                        desired_input_layouts=(Replicate(), None, None)),
                layer + "post_attention_layernorm": SequenceParallel(),
                layer + "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
                "model.norm": SequenceParallel(),
                "lm_head": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                                              use_local_output=True)}
        plan.update({layer + f"self_attn.{n}_proj": ColwiseParallel() for n in "qkv"})
        plan.update({layer + "self_attn.o_proj": RowwiseParallel(output_layouts=seq),
                     layer + "mlp.gate_proj": ColwiseParallel(), layer + "mlp.up_proj": ColwiseParallel(),
                     layer + "mlp.down_proj": RowwiseParallel(output_layouts=seq)})
        return plan

    @classmethod
    def from_pretrained(cls, path, *, device=None, dtype=None, shard_fn=None, **config_overrides):
        """A Llama from a local Hugging Face directory (config.json + safetensors, single or sharded).

        With ``shard_fn`` the model is built on the meta device, sharded, and each rank reads only its
        own slices. Collective when ``shard_fn`` shards.
        """
        from . import _hf

        cfg = LlamaConfig(**_hf.llama_config(_hf.read_config(path), **config_overrides))
        model, used, ckpt = _hf.from_pretrained(cls, cfg, path, _hf.llama_names, device=device, dtype=dtype,
                                                shard_fn=shard_fn)
        _hf.check_unused(ckpt, used, "Llama", tied_to="model.embed_tokens.weight" if cfg.tie_weights else None,
                         ignored=(".rotary_emb.inv_freq",))
        return model

    def save_pretrained(self, path):
        """Write config.json and model.safetensors in Hugging Face Llama layout (weights only); collective
        for a sharded model (rank 0 writes)."""
        from . import _hf

        _hf.save_weights(self, path, _hf.llama_names, config=_hf.llama_hf_config(self.config))

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Append ``max_new_tokens`` sampled tokens to idx (B, T); see ``hpcfsdp.models.generate``."""
        from ._generate import generate

        return generate(self, idx, max_new_tokens, temperature=temperature, top_k=top_k)
