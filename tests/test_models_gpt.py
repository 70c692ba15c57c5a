"""GPT: shapes, loss at init, weight tying, meta-device init, parameter count, and a short training run."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.models import GPT, GPTConfig
from hpcfsdp.models.gpt import Block

CORPUS = "the quick brown fox jumps over the lazy dog. " * 40


def _tiny(**kw):
    cfg = dict(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32)
    cfg.update(kw)
    return GPTConfig(**cfg)


def test_config_defaults_and_validation():
    c = GPTConfig()
    assert (c.vocab_size, c.block_size, c.n_layer, c.n_head, c.n_embd) == (50304, 1024, 12, 12, 768)
    assert c.dropout == 0.0 and c.bias is True and c.tie_weights is True
    with pytest.raises(ValueError, match="divisible by n_head"):
        GPTConfig(n_embd=10, n_head=3)
    with pytest.raises(ValueError, match="vocab_size must be a positive int, got 0"):
        GPTConfig(vocab_size=0)


def test_structure_shapes_and_loss_at_init():
    hp.manual_seed(0)
    model = GPT(_tiny(vocab_size=64))
    names = [n for n, _ in model.named_children()]
    assert names == ["transformer", "lm_head"]
    assert list(model.transformer.keys()) == ["wte", "wpe", "drop", "h", "ln_f"]
    assert model.blocks is model.transformer.h and len(model.blocks) == 2
    assert all(isinstance(b, Block) for b in model.blocks)
    assert model.lm_head.bias is None and isinstance(model.lm_head, nn.Linear)
    idx = hp.randint(0, 64, (3, 10))
    logits, loss = model(idx)
    assert tuple(logits.shape) == (3, 10, 64) and loss is None
    targets = hp.randint(0, 64, (3, 10))
    logits2, loss = model(idx, targets)
    assert tuple(logits2.shape) == (3, 10, 64)
    np.testing.assert_allclose(logits2.detach().numpy(), logits.detach().numpy())
    # small init: the prediction is near uniform, so the loss is near ln(vocab)
    assert abs(loss.item() - math.log(64)) < 0.1
    # the loss is the mean cross entropy over all positions, skipping targets == -1
    z = logits.detach().numpy().astype(np.float64).reshape(-1, 64)
    z = z - z.max(-1, keepdims=True)
    ls = z - np.log(np.exp(z).sum(-1, keepdims=True))
    tgt = targets.numpy().reshape(-1).copy()
    tgt[::3] = -1
    ref = -ls[np.arange(len(tgt))[tgt >= 0], tgt[tgt >= 0]].mean()
    _, loss_ign = model(idx, hp.tensor(tgt.reshape(3, 10)))
    np.testing.assert_allclose(loss_ign.item(), ref, rtol=1e-5)
    with pytest.raises(ValueError, match="Cannot forward sequence of length 17, block size is only 16"):
        model(hp.randint(0, 64, (1, 17)))


def test_causality():
    hp.manual_seed(1)
    model = GPT(_tiny())
    a = np.array([[1, 2, 3, 4, 5, 6]])
    b = a.copy()
    b[0, 4:] = [9, 9]
    la, _ = model(hp.tensor(a))
    lb, _ = model(hp.tensor(b))
    np.testing.assert_allclose(la.detach().numpy()[0, :4], lb.detach().numpy()[0, :4], rtol=1e-5, atol=1e-6)
    assert not np.allclose(la.detach().numpy()[0, 4:], lb.detach().numpy()[0, 4:])


def test_weight_tying_and_param_count():
    cfg = _tiny(vocab_size=50)
    model = GPT(cfg)
    assert model.transformer.wte.weight is model.lm_head.weight
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names and "transformer.wte.weight" in names
    C, V, L, T = cfg.n_embd, cfg.vocab_size, cfg.n_layer, cfg.block_size
    per_block = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    total = V * C + T * C + L * per_block + 2 * C
    assert model.get_num_params(non_embedding=False) == total
    assert model.get_num_params() == total - T * C
    untied = GPT(_tiny(vocab_size=50, tie_weights=False, bias=False))
    assert untied.transformer.wte.weight is not untied.lm_head.weight
    assert all(m.bias is None for m in untied.modules() if isinstance(m, (nn.Linear, nn.LayerNorm)))
    # tying survives a state_dict round trip (both keys present, one storage)
    sd = model.state_dict()
    assert "lm_head.weight" in sd and "transformer.wte.weight" in sd
    other = GPT(cfg)
    other.load_state_dict(sd)
    assert other.transformer.wte.weight is other.lm_head.weight
    np.testing.assert_array_equal(other.lm_head.weight.detach().numpy(), model.lm_head.weight.detach().numpy())


def test_nanogpt_init_statistics():
    hp.manual_seed(2)
    cfg = _tiny(n_embd=64, n_layer=4, vocab_size=256, block_size=64)
    model = GPT(cfg)
    proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    for name, p in model.named_parameters():
        a = p.detach().numpy().astype(np.float64)
        if name.endswith("c_proj.weight"):
            assert abs(a.std() - proj_std) < 0.1 * proj_std, name
        elif name.endswith(".weight") and a.ndim == 2:
            assert abs(a.std() - 0.02) < 0.1 * 0.02, name
        elif "ln" in name and name.endswith("weight"):
            assert np.all(a == 1), name
        else:  # biases
            assert np.all(a == 0), name


def test_meta_build_then_to_empty_and_reset():
    cfg = _tiny()
    with hp.device("meta"):
        model = GPT(cfg)
    assert all(p.device == "meta" for p in model.parameters())
    assert model.transformer.wte.weight is model.lm_head.weight
    model.to_empty(device="cpu")
    assert model.transformer.wte.weight is model.lm_head.weight
    hp.manual_seed(3)
    model.init_weights()
    for p in model.parameters():
        assert p.device == "cpu" and np.all(np.isfinite(p.detach().numpy()))
    ref_std = np.std(model.transformer.h[0].mlp.c_fc.weight.detach().numpy())
    assert abs(ref_std - 0.02) < 0.004
    # FSDP-style: reset_parameters on every submodule, in module order, gives the same init law
    with hp.device("meta"):
        m2 = GPT(cfg)
    m2.to_empty(device="cpu")
    for m in m2.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    assert abs(np.std(m2.transformer.h[1].attn.c_attn.weight.detach().numpy()) - 0.02) < 0.004
    assert np.all(m2.transformer.ln_f.weight.detach().numpy() == 1)
    logits, loss = m2(hp.randint(0, cfg.vocab_size, (2, 8)), hp.randint(0, cfg.vocab_size, (2, 8)))
    assert np.isfinite(loss.item())


def test_configure_optimizers_groups():
    model = GPT(_tiny())
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3, betas=(0.9, 0.95))
    decay, nodecay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and nodecay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in nodecay["params"])
    assert len(decay["params"]) + len(nodecay["params"]) == len(list(model.parameters()))


def _train(steps=200, seed=0):
    chars = sorted(set(CORPUS))
    stoi = {c: i for i, c in enumerate(chars)}
    data = np.array([stoi[c] for c in CORPUS], dtype=np.int64)
    hp.manual_seed(seed)
    rng = np.random.default_rng(seed)
    cfg = GPTConfig(vocab_size=len(chars), block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0)
    model = GPT(cfg)
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-2, betas=(0.9, 0.99))
    losses = []
    for _ in range(steps):
        ix = rng.integers(0, len(data) - cfg.block_size - 1, size=8)
        x = np.stack([data[i:i + cfg.block_size] for i in ix])
        y = np.stack([data[i + 1:i + 1 + cfg.block_size] for i in ix])
        _, loss = model(hp.tensor(x), hp.tensor(y))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses, len(chars)


def test_training_reduces_loss_deterministically():
    losses, vocab = _train()
    assert abs(losses[0] - math.log(vocab)) < 0.2
    final = float(np.mean(losses[-10:]))
    assert final < 0.2, final  # the corpus is one sentence repeated: nearly deterministic next char
    losses2, _ = _train(steps=30)  # same seed: bit-identical losses (a prefix keeps the test fast)
    assert losses2 == losses[:30]
