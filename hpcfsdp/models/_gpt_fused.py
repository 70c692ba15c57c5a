"""GPT's transformer block on the GPU as 13 launches forward and 23 backward: each Linear's bias rides in the fused
kernel after its GEMM. See [Note: The fused GPT block]."""
from __future__ import annotations

from hpcfsdp import _autocast, nn
from hpcfsdp._kernels import use_fused
from hpcfsdp._tensor import Tensor
from hpcfsdp.autograd.ops.attention import SplitHeads
from hpcfsdp.autograd.ops.residual import AddNorm, BiasGelu, BiasResidual, NormBranch
from hpcfsdp.nn import functional as F

__all__ = ["fusable", "block_forward"]

# [Note: The fused GPT block]
# Composed of its modules, a block on the GPU launches 18 kernels forward and 29 backward even with every op fused
# (under FSDP, whose copies and collectives are 3 of them: scripts/gpu_counts.py): each Linear adds its bias in a
# pass of its own, and each residual add and gradient accumulation is one more. The block's own forward can do
# better because it knows what follows each Linear: c_attn's bias goes into the split of q, k, v into heads
# (SplitHeads), c_proj's into the residual add, fused with ln_2 that reads it (AddNorm: one launch, the sum rounded
# as the unfused adds round it), c_fc's into GELU (BiasGelu), the MLP's c_proj's into the last residual add
# (BiasResidual); the bias gradients come out of one column-sum launch each (col_sum, or norm_bwd_wb's third column
# sum), and the residual stream's gradient meets each branch's in the norm's backward launch (NormBranch, AddNorm)
# instead of in an add of the engine's. The result and the gradients equal the module-by-module path
# (tests/test_gpu_gpt_fused.py holds them to it on the simulated device).
# The block takes this path only where nothing can tell the difference: CuPy activations with fused kernels, every
# submodule of the block (its own hooks run around this forward) of exactly GPT's own type, with no forward hook or
# pre-hook and no instance ``forward``, plain (not DTensor) parameters of the activation's dtype, biases and affine
# norms present, no dropout in effect, and no autocast (whose per-op casts the fused ops would not repeat). Anything
# else (a hook, tensor parallelism, LoRA's replaced Linear, dropout in training) runs the modules as written.


def _plain(m, kind) -> bool:
    return type(m) is kind and not (m._forward_hooks or m._forward_pre_hooks) and "forward" not in m.__dict__


def fusable(blk, x, linear, attention, mlp) -> bool:
    """Whether ``blk`` (a GPT Block, whose submodules are of the classes ``linear``, ``attention`` and ``mlp`` and of
    nn's) may run ``block_forward`` on ``x``: See [Note: The fused GPT block]."""
    if type(x) is not Tensor or not use_fused(x._data) or x.ndim != 3 or _autocast.is_autocast_enabled("cuda"):
        return False
    a, m = blk.attn, blk.mlp
    _Linear, CausalSelfAttention, MLP = linear, attention, mlp
    kinds = ((blk.ln_1, nn.LayerNorm), (blk.ln_2, nn.LayerNorm), (a, CausalSelfAttention),
             (a.c_attn, _Linear), (a.c_proj, _Linear), (a.attn_dropout, nn.Dropout), (a.resid_dropout, nn.Dropout),
             (m, MLP), (m.c_fc, _Linear), (m.c_proj, _Linear), (m.gelu, nn.GELU), (m.dropout, nn.Dropout))
    if not all(_plain(mod, kind) for mod, kind in kinds):
        return False
    if blk.training and (a.dropout > 0 or a.resid_dropout.p > 0 or m.dropout.p > 0):
        return False
    params = [blk.ln_1.weight, blk.ln_1.bias, blk.ln_2.weight, blk.ln_2.bias, a.c_attn.weight, a.c_attn.bias,
              a.c_proj.weight, a.c_proj.bias, m.c_fc.weight, m.c_fc.bias, m.c_proj.weight, m.c_proj.bias]
    if any(p is None or not isinstance(p, Tensor) or type(p._data) is not type(x._data) or p.dtype != x.dtype
           for p in params):
        return False
    return m.gelu.approximate in ("none", "tanh") and len(list(blk.parameters())) == len(params)


def block_forward(blk, x):
    """x + attn(ln_1(x)), then + mlp(ln_2(.)), as GPT's Block computes them, with the biases fused."""
    a, m = blk.attn, blk.mlp
    B, T, C = x.shape
    nh = a.c_attn.weight.shape[0] // 3 // (a.n_embd // a.n_head)
    x, h = NormBranch.apply(x, blk.ln_1.weight, blk.ln_1.bias, blk.ln_1.eps)
    q, k, v = SplitHeads.apply(F.linear(h, a.c_attn.weight), nh, a.c_attn.bias)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
    y = F.linear(y.transpose(1, 2).reshape(B, T, C), a.c_proj.weight)
    x, h = AddNorm.apply(x, y, a.c_proj.bias, blk.ln_2.weight, blk.ln_2.bias, blk.ln_2.eps)
    u = BiasGelu.apply(F.linear(h, m.c_fc.weight), m.c_fc.bias, m.gelu.approximate)
    return BiasResidual.apply(x, F.linear(u, m.c_proj.weight), m.c_proj.bias)
