"""Llama: RMSNorm, SiLU, rotary embedding and GQA attention against NumPy float64 and finite differences."""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F
from hpcfsdp import nn
from hpcfsdp.models import Llama, LlamaConfig
from hpcfsdp.models.llama import apply_rotary_pos_emb, rotate_half

from _gradcheck import gradcheck


# ----------------------------------------------------------------------------------- NumPy references
def np_rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def np_rope(T, hd, theta, angles_dtype=np.float64):
    """cos, sin (T, hd); Hugging Face computes angles, cos and sin in float32 whatever the model's dtype."""
    inv = (1.0 / theta ** (np.arange(0, hd, 2).astype(angles_dtype) / angles_dtype(hd))).astype(angles_dtype)
    ang = np.arange(T, dtype=angles_dtype)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], -1)
    return np.cos(ang).astype(np.float64), np.sin(ang).astype(np.float64)


def np_rotate(x, cos, sin):
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    # pairs (j, j + d) rotate by angle a_j
    return np.concatenate([x1 * cos[..., :d] - x2 * sin[..., :d], x2 * cos[..., d:] + x1 * sin[..., d:]], -1)


def np_attention(q, k, v, causal=True):
    rep = q.shape[1] // k.shape[1]
    k = np.repeat(k, rep, axis=1)  # query head h uses key/value head h // rep
    v = np.repeat(v, rep, axis=1)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        T, S = s.shape[-2:]
        s = np.where(np.tril(np.ones((T, S), bool)), s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def np_llama(sd, c, idx):
    silu = lambda z: z / (1 + np.exp(-z))  # noqa: E731
    x = sd["model.embed_tokens.weight"][idx]
    B, T = idx.shape
    cos, sin = np_rope(T, c.head_dim, c.rope_theta, np.float32)
    for i in range(c.n_layer):
        p = lambda n: sd[f"model.layers.{i}.{n}"]  # noqa: E731
        h = np_rms_norm(x, p("input_layernorm.weight"), c.rms_norm_eps)
        q = (h @ p("self_attn.q_proj.weight").T).reshape(B, T, c.n_head, c.head_dim).transpose(0, 2, 1, 3)
        k = (h @ p("self_attn.k_proj.weight").T).reshape(B, T, c.n_kv_head, c.head_dim).transpose(0, 2, 1, 3)
        v = (h @ p("self_attn.v_proj.weight").T).reshape(B, T, c.n_kv_head, c.head_dim).transpose(0, 2, 1, 3)
        y = np_attention(np_rotate(q, cos, sin), np_rotate(k, cos, sin), v)
        x = x + y.transpose(0, 2, 1, 3).reshape(B, T, -1) @ p("self_attn.o_proj.weight").T
        h = np_rms_norm(x, p("post_attention_layernorm.weight"), c.rms_norm_eps)
        x = x + (silu(h @ p("mlp.gate_proj.weight").T) * (h @ p("mlp.up_proj.weight").T)) @ p("mlp.down_proj.weight").T
    x = np_rms_norm(x, sd["model.norm.weight"], c.rms_norm_eps)
    return x @ sd["lm_head.weight"].T


# ----------------------------------------------------------------------------------- functional pieces
def test_rms_norm_forward_and_defaults():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 4, 5)), rng.standard_normal(5)
    out = F.rms_norm(hp.tensor(x), (5,), hp.tensor(w), eps=1e-3).numpy()
    np.testing.assert_allclose(out, np_rms_norm(x, w, 1e-3), rtol=1e-12)
    x32 = x.astype(np.float32)
    out = F.rms_norm(hp.tensor(x32), 5).numpy()  # eps None = float32's machine epsilon
    np.testing.assert_allclose(out, np_rms_norm(x32.astype(np.float64), 1.0, np.finfo(np.float32).eps), rtol=1e-5)
    two = F.rms_norm(hp.tensor(x), (4, 5), eps=1e-6).numpy()
    ref = x / np.sqrt((x * x).mean((-2, -1), keepdims=True) + 1e-6)
    np.testing.assert_allclose(two, ref, rtol=1e-12)
    with pytest.raises(RuntimeError, match="normalized_shape"):
        F.rms_norm(hp.tensor(x), (4,))
    with pytest.raises(RuntimeError, match="weight of shape"):
        F.rms_norm(hp.tensor(x), (5,), hp.ones(4, dtype=hp.float64))
    with pytest.raises(RuntimeError, match="floating point"):
        F.rms_norm(hp.tensor([1, 2]), 2)


def test_rms_norm_module():
    m = nn.RMSNorm([5], eps=1e-4)
    assert m.weight.shape == (5,) and np.all(m.weight.detach().numpy() == 1)
    assert repr(m) == "RMSNorm((5,), eps=0.0001, elementwise_affine=True)"
    assert nn.RMSNorm(3, elementwise_affine=False).weight is None
    assert [n for n, _ in nn.RMSNorm(3).named_parameters()] == ["weight"]
    x = hp.randn(2, 5)
    np.testing.assert_allclose(m(x).detach().numpy(), np_rms_norm(x.numpy().astype(np.float64), 1.0, 1e-4), rtol=1e-5)


def test_silu():
    x = np.linspace(-4, 4, 9)
    np.testing.assert_allclose(nn.SiLU()(hp.tensor(x)).numpy(), x / (1 + np.exp(-x)), rtol=1e-12)
    np.testing.assert_allclose(F.silu(hp.tensor(x)).numpy(), x / (1 + np.exp(-x)), rtol=1e-12)


def test_gradchecks():
    rng = np.random.default_rng(1)
    gradcheck(lambda x, w: F.rms_norm(x, (4,), w, eps=1e-5), [rng.standard_normal((3, 4)), rng.standard_normal(4)])
    gradcheck(lambda x: F.rms_norm(x, (2, 3), eps=1e-5), [rng.standard_normal((2, 2, 3))])
    gradcheck(F.silu, [rng.standard_normal((3, 4))])
    gradcheck(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
              [rng.standard_normal((1, 4, 3, 2)), rng.standard_normal((1, 2, 3, 2)), rng.standard_normal((1, 2, 3, 2))])
    cos, sin = np_rope(3, 4, 100.0)
    gradcheck(lambda q, k: apply_rotary_pos_emb(q, k, hp.tensor(cos), hp.tensor(sin)),
              [rng.standard_normal((1, 2, 3, 4)), rng.standard_normal((1, 1, 3, 4))])


def test_gqa_attention_matches_numpy_and_rejects_bad_heads():
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((2, 6, 5, 4)), rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 3, 5, 4))
    out = F.scaled_dot_product_attention(hp.tensor(q), hp.tensor(k), hp.tensor(v), is_causal=True, enable_gqa=True)
    np.testing.assert_allclose(out.numpy(), np_attention(q, k, v), rtol=1e-10, atol=1e-12)
    with pytest.raises(RuntimeError, match="multiple of the key/value heads"):
        k4 = hp.tensor(rng.standard_normal((2, 4, 5, 4)))
        F.scaled_dot_product_attention(hp.tensor(q), k4, k4, enable_gqa=True)


def test_rotate_half_and_rotation():
    x = np.arange(8.0).reshape(1, 1, 1, 8)
    np.testing.assert_array_equal(rotate_half(hp.tensor(x)).numpy(), [[[[-4, -5, -6, -7, 0, 1, 2, 3]]]])
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((1, 2, 5, 6)), rng.standard_normal((1, 1, 5, 6))
    cos, sin = np_rope(5, 6, 500.0)
    qr, kr = apply_rotary_pos_emb(hp.tensor(q), hp.tensor(k), hp.tensor(cos), hp.tensor(sin))
    np.testing.assert_allclose(qr.numpy(), np_rotate(q, cos, sin), rtol=1e-12)
    np.testing.assert_allclose(kr.numpy(), np_rotate(k, cos, sin), rtol=1e-12)
    # a rotation: norms of each (j, j + d) pair are kept, and dot products depend on relative position only
    np.testing.assert_allclose(np.linalg.norm(qr.numpy(), axis=-1), np.linalg.norm(q, axis=-1), rtol=1e-12)


# ----------------------------------------------------------------------------------- the model
def _cfg(**kw):
    base = dict(vocab_size=23, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=16, intermediate_size=24,
                rope_theta=500.0, rms_norm_eps=1e-5)
    base.update(kw)
    return LlamaConfig(**base)


def test_llama_forward_matches_numpy_float64():
    hp.manual_seed(0)
    c = _cfg()
    m = Llama(c, dtype=hp.float64)
    with hp.no_grad():
        for p in m.parameters():  # non-trivial norms too
            p.add_(hp.randn(*p.shape, dtype=hp.float64) * 0.1)
    idx = np.random.default_rng(0).integers(0, 23, (2, 7))
    logits, _ = m(hp.tensor(idx))
    sd = {k: v.numpy() for k, v in m.state_dict().items()}
    np.testing.assert_allclose(logits.detach().numpy(), np_llama(sd, c, idx), rtol=1e-10, atol=1e-10)


def test_llama_parameter_gradients_match_finite_differences():
    hp.manual_seed(1)
    c = _cfg(n_layer=1)
    m = Llama(c, dtype=hp.float64)
    with hp.no_grad():
        for p in m.parameters():
            p.add_(hp.randn(*p.shape, dtype=hp.float64) * 0.2)
    rng = np.random.default_rng(1)
    idx, tgt = hp.tensor(rng.integers(0, 23, (2, 5))), hp.tensor(rng.integers(0, 23, (2, 5)))
    _, loss = m(idx, tgt)
    loss.backward()
    eps = 1e-6
    for name, p in m.named_parameters():
        a = p._data
        for j in [tuple(rng.integers(0, s) for s in a.shape) for _ in range(3)]:
            old = a[j]
            a[j] = old + eps
            with hp.no_grad():
                lp = m(idx, tgt)[1].item()
            a[j] = old - eps
            with hp.no_grad():
                lm = m(idx, tgt)[1].item()
            a[j] = old
            np.testing.assert_allclose(p.grad.numpy()[j], (lp - lm) / (2 * eps), rtol=1e-5, atol=1e-8, err_msg=name)


def test_llama_config_and_helpers():
    c = LlamaConfig(n_embd=64, n_head=4)
    assert c.n_kv_head == 4 and c.head_dim == 16 and c.intermediate_size == 256
    with pytest.raises(ValueError, match="multiple of n_kv_head"):
        LlamaConfig(n_embd=64, n_head=4, n_kv_head=3)
    with pytest.raises(ValueError, match="positive int"):
        LlamaConfig(n_layer=0)
    m = Llama(_cfg())
    assert m.blocks is m.model.layers and len(m.blocks) == 2
    assert m.lm_head.weight is not m.model.embed_tokens.weight  # untied by default
    tied = Llama(_cfg(tie_weights=True))
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    with pytest.raises(ValueError, match="block size"):
        m(hp.zeros(1, 17, dtype=hp.int64))
    m.init_weights()
    assert np.all(m.model.norm.weight.detach().numpy() == 1.0)
    assert m.get_num_params() == sum(p.numel() for p in m.parameters()) - 23 * 16


# ----------------------------------------------------------------------------------- fully_shard
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("ac", [False, True])
def test_llama_fully_shard_parity(ac):
    from hpcfsdp.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_block_checkpointing
    from hpcfsdp.distributed.fsdp import fully_shard

    from _fsdp_util import gpt_batches, train_parity, world

    w, _ = world()

    def make():
        hp.manual_seed(0)
        m = Llama(_cfg(vocab_size=4 * w + 1))
        return apply_block_checkpointing(m) if ac else m  # the reference too: same parameter names

    def shard(model):
        for b in model.blocks:
            fully_shard(b)
        fully_shard(model.lm_head)
        fully_shard(model)

    train_parity(make, shard, steps=5, batches=gpt_batches(5, 4 * w + 1))
