"""GPT: a nanoGPT-style decoder-only transformer, the reference model for tests, demo and benchmarks."""
import math
from dataclasses import dataclass

from hpcfsdp import nn
from hpcfsdp._tensor import Tensor
from hpcfsdp.autograd.ops.attention import SplitHeads
from hpcfsdp.models import _gpt_fused
from hpcfsdp.nn import functional as F
from hpcfsdp.nn import init

__all__ = ["GPTConfig", "GPT", "Block", "CausalSelfAttention", "MLP"]


@dataclass
class GPTConfig:
    vocab_size: int = 50304    # GPT-2's 50257 padded up to a multiple of 64
    block_size: int = 1024     # maximum sequence length
    n_layer: int = 12          # number of transformer blocks
    n_head: int = 12           # attention heads per block
    n_embd: int = 768          # embedding width
    dropout: float = 0.0       # dropout on embeddings, attention and residual branches
    bias: bool = True          # biases in Linear and LayerNorm layers (False: a bit faster and better)
    tie_weights: bool = True   # lm_head.weight is the token embedding (both must sit in one FSDP unit)
    gelu_approximate: str = "none"  # MLP activation: exact GELU, or "tanh" (GPT-2's "gelu_new")
    layer_norm_eps: float = 1e-5

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {v!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"GPTConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.gelu_approximate not in ("none", "tanh"):
            raise ValueError(f"GPTConfig.gelu_approximate must be 'none' or 'tanh', got {self.gelu_approximate!r}")


# [Note: GPT initialisation]
# nanoGPT draws every Linear and Embedding weight from N(0, 0.02), zeroes biases, and scales the
# residual projections (attn.c_proj, mlp.c_proj) to N(0, 0.02 / sqrt(2 * n_layer)); LayerNorms are
# ones/zeros. Here each of those layers carries its own std and does this in its own
# ``reset_parameters()``, so any way of (re)initialising works the same: at construction, after
# ``to_empty()`` via ``GPT.init_weights()``, or by FSDP calling ``reset_parameters()`` on every
# submodule of a unit in any order (PyTorch's meta-device materialisation does exactly that).


class _Linear(nn.Linear):
    """nn.Linear whose reset_parameters is nanoGPT's: weight ~ N(0, std), bias = 0."""

    def __init__(self, in_features, out_features, bias=True, *, std=0.02, device=None, dtype=None):
        self.std = std  # set before Linear.__init__, which calls reset_parameters
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)

    def reset_parameters(self):
        init.normal_(self.weight, mean=0.0, std=self.std)
        if self.bias is not None:
            init.zeros_(self.bias)

    def _get_name(self):
        return "Linear"


class _Embedding(nn.Embedding):
    """nn.Embedding whose reset_parameters is nanoGPT's: weight ~ N(0, std)."""

    def __init__(self, num_embeddings, embedding_dim, *, std=0.02, device=None, dtype=None):
        self.std = std
        super().__init__(num_embeddings, embedding_dim, device=device, dtype=dtype)

    def reset_parameters(self):
        init.normal_(self.weight, mean=0.0, std=self.std)

    def _get_name(self):
        return "Embedding"


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention with a causal mask; q, k, v from one fused projection."""

    def __init__(self, config, device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.c_attn = _Linear(config.n_embd, 3 * config.n_embd, bias=config.bias, **kw)
        self.c_proj = _Linear(config.n_embd, config.n_embd, bias=config.bias,
                              std=0.02 / math.sqrt(2 * config.n_layer), **kw)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x):
        hs = self.n_embd // self.n_head                          # head size
        qkv = self.c_attn(x)                                     # (B, T, 3C); 3C/tp under tensor parallelism
        B, T, _ = qkv.shape                                      # T: the whole sequence (x may be a shard of it)
        C = qkv.shape[-1] // 3                                   # this rank's heads x hs (n_embd unsplit)
        nh = C // hs                                             # this rank's heads (n_head unsplit)
        if type(qkv) is Tensor:                                  # one fused split on the GPU (SplitHeads)
            q, k, v = SplitHeads.apply(qkv, nh)                  # 3 x (B, nh, T, hs)
        else:
            q, k, v = qkv.split(C, dim=2)                        # 3 x (B, T, C)
            q = q.reshape(B, T, nh, hs).transpose(1, 2)          # (B, nh, T, hs)
            k = k.reshape(B, T, nh, hs).transpose(1, 2)          # (B, nh, T, hs)
            v = v.reshape(B, T, nh, hs).transpose(1, 2)          # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )                                                        # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, C)                   # (B, T, C): heads side by side
        y = self.resid_dropout(self.c_proj(y))                   # (B, T, C)
        return y


class MLP(nn.Module):
    """Position-wise feed-forward: Linear(C, 4C), GELU, Linear(4C, C)."""

    def __init__(self, config, device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.c_fc = _Linear(config.n_embd, 4 * config.n_embd, bias=config.bias, **kw)
        self.gelu = nn.GELU(approximate=config.gelu_approximate)
        self.c_proj = _Linear(4 * config.n_embd, config.n_embd, bias=config.bias,
                              std=0.02 / math.sqrt(2 * config.n_layer), **kw)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        x = self.c_fc(x)             # (B, T, 4C)
        x = self.gelu(x)             # (B, T, 4C)
        x = self.c_proj(x)           # (B, T, C)
        x = self.dropout(x)          # (B, T, C)
        return x


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, config, device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias, **kw)
        self.attn = CausalSelfAttention(config, **kw)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias, **kw)
        self.mlp = MLP(config, **kw)

    def forward(self, x):
        if _gpt_fused.fusable(self, x, _Linear, CausalSelfAttention, MLP):   # the same sums with the biases fused (GPU): [Note: The fused GPT block]
            return _gpt_fused.block_forward(self, x)
        x = x + self.attn(self.ln_1(x))   # (B, T, C)
        x = x + self.mlp(self.ln_2(x))    # (B, T, C)
        return x

    def reset_parameters(self):
        """Re-draw this block's parameters (nanoGPT init); see [Note: GPT initialisation]."""
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()


class GPT(nn.Module):
    """Token + position embeddings, ``n_layer`` Blocks, final LayerNorm, and a bias-free lm_head."""

    def __init__(self, config: GPTConfig, device=None, dtype=None):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT expects a GPTConfig, got {type(config).__name__}")
        self.config = config
        kw = dict(device=device, dtype=dtype)
        self.transformer = nn.ModuleDict(dict(
            wte=_Embedding(config.vocab_size, config.n_embd, **kw),
            wpe=_Embedding(config.block_size, config.n_embd, **kw),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, **kw) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias, **kw),
        ))
        self.lm_head = _Linear(config.n_embd, config.vocab_size, bias=False, **kw)
        if config.tie_weights:
            # weight tying (https://paperswithcode.com/method/weight-tying): one Parameter, two uses
            self.transformer.wte.weight = self.lm_head.weight

    @property
    def blocks(self):
        """The transformer blocks (``transformer.h``): the natural ``fully_shard`` units."""
        return self.transformer.h

    def init_weights(self):
        """Re-draw every parameter with nanoGPT's init (e.g. after ``to_empty``); see [Note: GPT initialisation]."""
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def get_num_params(self, non_embedding: bool = True) -> int:
        """Number of parameters (shared ones once); minus the position embeddings when ``non_embedding``.

        The token embeddings count when tied: they are the lm_head's weights too.
        """
        n_params = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n_params -= self.transformer.wpe.weight.numel()
        return n_params

    def forward(self, idx, targets=None):
        """idx (B, T) int64 token ids -> (logits (B, T, vocab), loss or None).

        With ``targets`` (B, T) the loss is the mean cross entropy over all positions, skipping targets -1.
        """
        import hpcfsdp

        if idx.ndim != 2:
            raise ValueError(f"GPT expects idx of shape (B, T), got shape {tuple(idx.shape)}")
        b, t = idx.shape
        if t > self.config.block_size:
            raise ValueError(f"Cannot forward sequence of length {t}, block size is only {self.config.block_size}")
        pos = hpcfsdp.arange(0, t, dtype=hpcfsdp.int64, device=idx.device)  # (T,)
        tok_emb = self.transformer.wte(idx)          # (B, T, C)
        pos_emb = self.transformer.wpe(pos)          # (T, C)
        x = self.transformer.drop(tok_emb + pos_emb)  # (B, T, C)
        for block in self.transformer.h:
            x = block(x)                             # (B, T, C)
        x = self.transformer.ln_f(x)                 # (B, T, C)
        logits = self.lm_head(x)                     # (B, T, V)
        loss = None
        if targets is not None:
            if tuple(targets.shape) != (b, t):
                raise ValueError(f"targets must have shape {(b, t)} like idx, got {tuple(targets.shape)}")
            loss = F.cross_entropy(logits.reshape(b * t, -1), targets.reshape(b * t), ignore_index=-1)  # ()
        return logits, loss

    def tp_plan(self, sequence_parallel: bool = False) -> dict:
        """A ``parallelize_module`` plan over a 1-D tensor-parallel mesh: every block's attention split by heads
        and its MLP split (see [Note: GPT tensor parallelism]). Embeddings, norms and lm_head stay replicated
        over the tp dim. n_head must divide over the tp ranks (ValueError naming it otherwise). With
        ``sequence_parallel`` the norms and residual stream between the split layers run on a shard of the
        sequence (T must then divide over the tp ranks)."""
        from hpcfsdp.distributed.tensor import Replicate, Shard
        from hpcfsdp.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                                         RowwiseParallel, SequenceParallel)
        from hpcfsdp.distributed.tensor.parallel.style import _PackedColwiseParallel

        if not sequence_parallel:
            return {"transformer.h.*.attn.c_attn": _PackedColwiseParallel(3, self.config.n_head),
                    "transformer.h.*.attn.c_proj": RowwiseParallel(),
                    "transformer.h.*.mlp.c_fc": ColwiseParallel(), "transformer.h.*.mlp.c_proj": RowwiseParallel()}
        seq = Shard(1)
        return {
            "transformer.drop": PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=seq),
            "transformer.h.*.ln_1": SequenceParallel(),
            "transformer.h.*.attn.c_attn": _PackedColwiseParallel(3, self.config.n_head, input_layouts=seq),
            "transformer.h.*.attn.c_proj": RowwiseParallel(output_layouts=seq),
            "transformer.h.*.ln_2": SequenceParallel(),
            "transformer.h.*.mlp.c_fc": ColwiseParallel(input_layouts=seq),
            "transformer.h.*.mlp.c_proj": RowwiseParallel(output_layouts=seq),
            "transformer.ln_f": SequenceParallel(),
            "lm_head": PrepareModuleInput(input_layouts=seq, desired_input_layouts=Replicate()),
        }

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type=None):
        """AdamW with weight decay on matrices (dim >= 2) only, as nanoGPT."""
        from hpcfsdp.optim import AdamW

        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay_params = [p for p in param_dict.values() if p.dim() >= 2]
        nodecay_params = [p for p in param_dict.values() if p.dim() < 2]
        optim_groups = [
            {"params": decay_params, "weight_decay": weight_decay},
            {"params": nodecay_params, "weight_decay": 0.0},
        ]
        return AdamW(optim_groups, lr=learning_rate, betas=betas)

    @classmethod
    def from_pretrained(cls, path, *, device=None, dtype=None, shard_fn=None, **config_overrides):
        """A GPT from a local Hugging Face GPT-2 directory (config.json + safetensors, single or sharded).

        GPT-2's Conv1D weights are transposed into Linear layout; the head is tied as GPT-2's. With
        ``shard_fn`` (e.g. one that calls ``fully_shard``) the model is built on the meta device, sharded,
        and each rank reads only its own slices from the file. Collective when ``shard_fn`` shards.
        """
        from . import _hf

        cfg = GPTConfig(**_hf.gpt2_config(_hf.read_config(path), **config_overrides))
        model, used, ckpt = _hf.from_pretrained(cls, cfg, path, _hf.gpt2_names, _hf.gpt2_transposed, device=device,
                                                dtype=dtype, shard_fn=shard_fn)
        _hf.check_unused(ckpt, used, "GPT",
                         tied_to="transformer.wte.weight" if cfg.tie_weights else None, ignored=_hf.GPT2_IGNORED)
        return model

    def save_pretrained(self, path):
        """Write config.json and model.safetensors in Hugging Face GPT-2 layout (weights only).

        Collective for a sharded model (every rank calls it; rank 0 writes).
        """
        from . import _hf

        _hf.save_weights(self, path, _hf.gpt2_names, _hf.gpt2_transposed, config=_hf.gpt2_hf_config(self.config))

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Append ``max_new_tokens`` sampled tokens to idx (B, T); see ``hpcfsdp.models.generate``."""
        from ._generate import generate

        return generate(self, idx, max_new_tokens, temperature=temperature, top_k=top_k)


# [Note: GPT tensor parallelism]
# ``GPT.tp_plan`` splits each block Megatron-style, one all-reduce forward and one backward per sublayer:
# - attention by heads: tp rank r of n runs heads [r*H/n, (r+1)*H/n). c_attn's fused (3C, C) weight is
#   split per q, k and v (placement _InterleavedShard(0, 3): the rank holds its heads' rows of each third,
#   three ranges of the global rows, and the same entries of the bias), so its local output is [q, k, v]
#   of its heads; attention runs on those heads (the forward reads the local head count from the
#   projection's width); c_proj is row-wise (its input dim split the same way by heads), all-reduced.
# - MLP: c_fc column-wise, c_proj row-wise, all-reduced.
# Embeddings, norms and lm_head stay replicated over the tp dim (sharded over the data-parallel dims only).
# With sequence parallelism the residual stream between the split layers is sharded on the sequence: the
# embeddings' sum is sliced (transformer.drop's output), norms run on the shard (their gradients summed
# over tp), the split layers all-gather the sequence in and reduce-scatter it out, and lm_head's input is
# all-gathered again (the loss is computed replicated, as without it).
