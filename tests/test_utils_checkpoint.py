"""Activation checkpointing: same losses and gradients as without, activations not kept, wrapper names."""
import gc
import warnings
import weakref

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl, CheckpointWrapper, apply_activation_checkpointing, checkpoint_wrapper)
from hpcfsdp.models import GPT, Block, GPTConfig
from hpcfsdp.utils.checkpoint import checkpoint


def _mlp(seed=0, p=0.0):
    hp.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Dropout(p), nn.Linear(12, 6))


def _grads(m):
    return {n: p.grad.numpy().copy() for n, p in m.named_parameters()}


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_function_matches_plain(p):
    x0 = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    results = []
    for use_ckpt in (False, True):
        m = _mlp(p=p)
        x = hp.tensor(x0, requires_grad=True)
        hp.manual_seed(7)
        y = checkpoint(m, x) if use_ckpt else m(x)
        draw_after = hp.rand(3).numpy()  # the generator's stream continues as without checkpointing
        (y * y).sum().backward()
        results.append((y.detach().numpy(), x.grad.numpy(), _grads(m), draw_after))
    (y0, gx0, g0, r0), (y1, gx1, g1, r1) = results
    np.testing.assert_array_equal(y0, y1)
    np.testing.assert_array_equal(gx0, gx1)
    np.testing.assert_array_equal(r0, r1)
    for n in g0:
        np.testing.assert_array_equal(g0[n], g1[n], err_msg=n)


def test_activations_are_not_kept():
    refs = []

    def fn(x):
        h = (x * 2.0).tanh()  # an intermediate the plain graph would keep for tanh's backward
        refs.append(weakref.ref(h._data))  # the graph keeps arrays
        return (h * h).sum(-1)

    x = hp.randn(5, 3, requires_grad=True)
    y_plain = fn(x)
    gc.collect()
    assert refs[0]() is not None  # kept alive by the graph
    y = checkpoint(fn, x)
    gc.collect()
    assert refs[1]() is None  # nothing but the inputs is saved
    y.sum().backward()
    g = x.grad.numpy().copy()
    x.grad = None
    y_plain.sum().backward()
    np.testing.assert_allclose(g, x.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_no_input_requires_grad_non_reentrant_reaches_parameters():
    m = _mlp()
    x = hp.randn(4, 6)
    checkpoint(m, x, use_reentrant=False).sum().backward()
    ref = _mlp()
    ref(x).sum().backward()
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy(), err_msg=n)


def test_reentrant_warns_without_grad_inputs_and_rejects_kwargs():
    m = _mlp()
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        y = checkpoint(m, hp.randn(4, 6), use_reentrant=True)
    assert not y.requires_grad
    with pytest.raises(ValueError, match="Unexpected keyword arguments: scale"):
        checkpoint(lambda x, scale: x * scale, hp.randn(2), use_reentrant=True, scale=2.0)
    x = hp.randn(4, 6, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checkpoint(m, x, use_reentrant=True).sum().backward()
    assert x.grad is not None and all(p.grad is not None for p in m.parameters())


def test_kwargs_and_nested_outputs():
    def fn(a, b, *, scale):
        return {"s": (a * b * scale).sum(), "pair": [a + b, None], "k": 3}

    a0, b0 = np.arange(6.0).reshape(2, 3), np.ones((2, 3)) * 0.5
    a = hp.tensor(a0, requires_grad=True)
    b = hp.tensor(b0, requires_grad=True)
    out = checkpoint(fn, a, b, scale=3.0)
    assert out["k"] == 3 and out["pair"][1] is None
    (out["s"] + out["pair"][0].sum()).backward()
    np.testing.assert_allclose(a.grad.numpy(), b0 * 3.0 + 1.0)
    np.testing.assert_allclose(b.grad.numpy(), a0 * 3.0 + 1.0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="determinism_check"):
        checkpoint(lambda x: x, hp.randn(2), determinism_check="strict")


def test_recompute_shape_change_is_an_error():
    calls = []

    def fn(x):
        calls.append(1)
        return x[: len(calls)] * 2.0

    x = hp.randn(4, requires_grad=True)
    y = checkpoint(fn, x)
    with pytest.raises(RuntimeError, match="recomputed forward returned"):
        y.sum().backward()


def _tiny(dropout=0.0):
    hp.manual_seed(0)
    return GPT(GPTConfig(vocab_size=13, block_size=8, n_layer=3, n_head=2, n_embd=8, dropout=dropout))


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_gpt_with_wrapped_blocks_matches_plain(dropout):
    rng = np.random.default_rng(0)
    x, y = (hp.tensor(rng.integers(0, 13, (2, 8))) for _ in range(2))
    res = []
    for wrap in (False, True):
        m = _tiny(dropout)
        if wrap:
            apply_activation_checkpointing(m, check_fn=lambda s: isinstance(s, Block))
            assert all(isinstance(b, CheckpointWrapper) for b in m.blocks)
        hp.manual_seed(3)
        _, loss = m(x, y)
        loss.backward()
        res.append((loss.item(), {n: p.grad.numpy() for n, p in m.state_dict(keep_vars=True).items()}))
    assert res[0][0] == res[1][0]
    assert res[0][1].keys() == res[1][1].keys()
    for n in res[0][1]:
        np.testing.assert_array_equal(res[0][1][n], res[1][1][n], err_msg=n)


def test_wrapper_state_dict_keys_and_attribute_forwarding():
    plain = _tiny()
    m = _tiny()
    apply_activation_checkpointing(m, check_fn=lambda s: s in set(m.blocks))
    sd = m.state_dict()
    assert list(sd.keys()) == list(plain.state_dict().keys())
    names = [n for n, _ in m.named_parameters()]
    assert "transformer.h.0._checkpoint_wrapped_module.ln_1.weight" in names  # as PyTorch
    assert [n for n, _ in m.blocks[0].named_parameters()] == [n for n, _ in plain.blocks[0].named_parameters()]
    assert m.blocks[0].ln_1 is m.blocks[0]._checkpoint_wrapped_module.ln_1
    other = _tiny()
    with hp.no_grad():
        for p in other.parameters():
            p.mul_(0.0)
    m.load_state_dict(other.state_dict())
    assert all(float(np.abs(p.detach().numpy()).sum()) == 0.0 for p in m.parameters())
    w = checkpoint_wrapper(nn.Linear(2, 2), checkpoint_impl=CheckpointImpl.REENTRANT)
    assert w.checkpoint_impl is CheckpointImpl.REENTRANT and w.in_features == 2
    with pytest.raises(TypeError, match="CheckpointImpl"):
        checkpoint_wrapper(nn.Linear(2, 2), checkpoint_impl="no_reentrant")


@pytest.mark.timeout(300)
def test_train_cli_activation_checkpointing_same_losses(tmp_path):
    """`hpcfsdp train --activation-checkpointing` at 2 ranks logs the losses of the run without it."""
    from test_cli_train import TINY, job, losses, ok

    runs = {}
    for name, extra in (("plain", []), ("ac", ["--activation-checkpointing"])):
        d = tmp_path / name
        ok(job(tmp_path, 2, TINY + ["--steps", "4", "--dropout", "0.1", "--out-dir", str(d)] + extra))
        runs[name] = losses(d / "metrics.jsonl")
    assert [s for s, _, _ in runs["ac"]] == [1, 2, 3, 4]
    for (s, l0, g0), (_, l1, g1) in zip(runs["plain"], runs["ac"]):
        assert abs(l0 - l1) <= 1e-6 and abs(g0 - g1) <= 1e-6 * max(1.0, g0), (s, l0, l1, g0, g1)


@pytest.mark.timeout(300)
def test_train_cli_resume_with_checkpointing_from_a_plain_checkpoint(tmp_path):
    """State-dict names do not depend on the wrappers: a run resumed with --activation-checkpointing from a
    checkpoint written without it continues with the losses of the uninterrupted run."""
    from test_cli_train import TINY, job, losses, ok

    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    ok(job(tmp_path, 2, TINY + ["--steps", "2", "--out-dir", str(tmp_path / "a")] + ckpt))
    ok(job(tmp_path, 2, TINY + ["--steps", "4", "--out-dir", str(tmp_path / "a"), "--resume",
                                "--activation-checkpointing"] + ckpt))
    ok(job(tmp_path, 2, TINY + ["--steps", "4", "--out-dir", str(tmp_path / "ref")]))
    got, ref = losses(tmp_path / "a" / "metrics.jsonl"), losses(tmp_path / "ref" / "metrics.jsonl")
    assert [s for s, _, _ in got] == [1, 2, 3, 4]
    for (s, l0, _), (_, l1, _) in zip(ref, got):
        assert abs(l0 - l1) <= 1e-6, (s, l0, l1)
