"""Adadelta, Adagrad, Adamax, NAdam, RAdam, RMSprop, Rprop, ASGD and LBFGS step FSDP's sharded parameters like the unsharded model."""
import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp.distributed.fsdp import fully_shard
from hpcfsdp.distributed.tensor import DTensor
from hpcfsdp.optim import ASGD, LBFGS, Adadelta, Adagrad, Adamax, NAdam, RAdam, RMSprop, Rprop

from _fsdp_util import Blocks, full, global_mean, local, world

pytestmark = pytest.mark.mpi(min_size=2)

STEPS = 3
CASES = [
    (Adadelta, {}),  # PyTorch's defaults, as in its FSDP MNIST tutorial
    (Adadelta, dict(lr=0.5, weight_decay=0.01)),
    (RMSprop, dict(lr=1e-3)),
    (RMSprop, dict(lr=1e-3, momentum=0.9, centered=True, weight_decay=0.01)),
    (Adagrad, dict(lr=0.05, initial_accumulator_value=0.1)),
    (Adamax, {}),
    (NAdam, dict(weight_decay=0.01, decoupled_weight_decay=True)),
    (RAdam, dict(lr=1e-2)),
    (Rprop, dict(lr=1e-2)),
    (ASGD, dict(lr=0.05, lambd=0.01, t0=1)),
]


def _make(vocab):
    hp.manual_seed(0)
    return Blocks(vocab)  # 7x15 and 15x3 weights and a 4*world+1 vocabulary: uneven, padded shards


@pytest.mark.parametrize("cls,kw", CASES, ids=[f"{c.__name__}{i}" for i, (c, _) in enumerate(CASES)])
def test_sharded_steps_match_unsharded(cls, kw):
    w, _ = world()
    vocab = 4 * w + 1
    ref = _make(vocab)
    model = _make(vocab)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    init = {n: p.detach().numpy().copy() for n, p in ref.named_parameters()}
    opt = cls(model.parameters(), **kw)
    ropt = cls(ref.parameters(), **kw)
    rng = np.random.default_rng(7)
    for step in range(STEPS):
        idx = rng.integers(0, vocab, (2 * w, 5))  # the global batch, the same on every rank
        loss = model(hp.tensor(local(idx)))
        loss.backward()
        opt.step()
        opt.zero_grad()
        rloss = ref(hp.tensor(idx))
        rloss.backward()
        ropt.step()
        ropt.zero_grad()
        np.testing.assert_allclose(global_mean(loss.item()), rloss.item(), rtol=1e-5, err_msg=f"loss at step {step}")
    ref_params = dict(ref.named_parameters())
    moved = 0.0
    for name, p in model.named_parameters():
        assert isinstance(p, DTensor)
        r = ref_params[name]
        np.testing.assert_allclose(full(p), r.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
        moved = max(moved, float(np.abs(full(p) - init[name]).max()))
        state, rstate = opt.state[p], ropt.state[r]
        assert sorted(state) == sorted(rstate)
        for key, value in state.items():
            if key in ("step", "mu_product", "eta", "mu"):
                assert type(value) is hp.Tensor and value.item() == rstate[key].item()
            else:  # sharded like the parameter: the local piece only
                assert isinstance(value, DTensor) and value.to_local().shape == p.to_local().shape
                np.testing.assert_allclose(full(value), rstate[key].numpy(), rtol=1e-5, atol=1e-6,
                                           err_msg=f"{name} {key}")
    assert moved > 1e-4  # the steps did move the parameters


@pytest.mark.parametrize("line_search_fn", [None, "strong_wolfe"])
def test_lbfgs_sharded_matches_unsharded(line_search_fn):
    """Its dot products, norms and the loss are global (See [Note: L-BFGS on sharded parameters]): every rank
    takes the unsharded model's iterates and calls the closure as often."""
    w, _ = world()
    vocab = 4 * w + 1
    ref = _make(vocab)
    model = _make(vocab)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    idx = np.random.default_rng(3).integers(0, vocab, (2 * w, 5))
    kw = dict(lr=0.5, max_iter=6, history_size=3, line_search_fn=line_search_fn)
    opt, ropt = LBFGS(model.parameters(), **kw), LBFGS(ref.parameters(), **kw)
    calls = {"sharded": 0, "ref": 0}

    def closure():
        calls["sharded"] += 1
        opt.zero_grad()
        loss = model(hp.tensor(local(idx)))
        loss.backward()
        return loss

    def rclosure():
        calls["ref"] += 1
        ropt.zero_grad()
        loss = ref(hp.tensor(idx))
        loss.backward()
        return loss

    for _ in range(2):
        opt.step(closure)
        ropt.step(rclosure)
    assert calls["sharded"] == calls["ref"] > 2
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        assert isinstance(p, DTensor)
        np.testing.assert_allclose(full(p), ref_params[name].detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
    first = next(iter(opt.state.values()))
    assert first["n_iter"] == next(iter(ropt.state.values()))["n_iter"]
