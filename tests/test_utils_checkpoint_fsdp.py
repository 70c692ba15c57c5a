"""Activation checkpointing composed with fully_shard: identical losses and gradients to no checkpointing."""
import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
from hpcfsdp.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from hpcfsdp.distributed.process_group import collective_counts, reset_collective_counts
from hpcfsdp.models import GPT, Block, GPTConfig
from hpcfsdp.utils.checkpoint import checkpoint

from _fsdp_util import full, gpt_batches, local, world

pytestmark = pytest.mark.mpi(min_size=2)


def _model(dropout):
    hp.manual_seed(0)
    return GPT(GPTConfig(vocab_size=17, block_size=8, n_layer=3, n_head=2, n_embd=16, dropout=dropout))


def _shard(model, ac, order, mp):
    kw = dict(reshard_after_forward=True, mp_policy=mp or MixedPrecisionPolicy())
    if ac and order == "ac_then_shard":
        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))
    for b in model.blocks:
        fully_shard(b, **kw)
    fully_shard(model, **kw)
    if ac and order == "shard_then_ac":  # the recomputed forward runs the blocks' FSDP hooks in backward
        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))


def _run(ac, order, dropout, mp, steps=3):
    model = _model(dropout)
    _shard(model, ac, order, mp)
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2)
    losses, grads = [], []
    for step, (x, y) in enumerate(gpt_batches(steps, 17)):
        hp.manual_seed(100 + step)
        _, loss = model(hp.tensor(local(x)), hp.tensor(local(y)))
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.to_local().numpy().copy() for n, p in model.state_dict(keep_vars=True).items()})
        opt.step()
        opt.zero_grad()
    params = {n: full(p) for n, p in model.state_dict().items()}
    return losses, grads, params


@pytest.mark.timeout(300)
@pytest.mark.parametrize("order,dropout", [("ac_then_shard", 0.0), ("ac_then_shard", 0.1), ("shard_then_ac", 0.1)])
def test_same_losses_and_gradients_as_without_checkpointing(order, dropout):
    world()
    ref = _run(False, order, dropout, None)
    got = _run(True, order, dropout, None)
    np.testing.assert_allclose(got[0], ref[0], rtol=0, atol=1e-6)
    for gs, rs in zip(got[1], ref[1]):
        assert gs.keys() == rs.keys()
        for n in rs:
            np.testing.assert_allclose(gs[n], rs[n], rtol=0, atol=1e-6, err_msg=n)
    for n in ref[2]:
        np.testing.assert_allclose(got[2][n], ref[2][n], rtol=0, atol=1e-6, err_msg=n)


@pytest.mark.timeout(300)
def test_mixed_precision():
    mp = MixedPrecisionPolicy(param_dtype=hp.bfloat16, reduce_dtype=hp.float32)
    ref = _run(False, "ac_then_shard", 0.1, mp, steps=2)
    got = _run(True, "ac_then_shard", 0.1, mp, steps=2)
    np.testing.assert_allclose(got[0], ref[0], rtol=0, atol=1e-6)
    for gs, rs in zip(got[1], ref[1]):
        for n in rs:
            np.testing.assert_allclose(gs[n], rs[n], rtol=0, atol=1e-6, err_msg=n)


class _Layers(nn.Module):
    """Four linears; those in ``ckpt`` run under checkpoint, each on its own."""

    def __init__(self, ckpt):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)])
        self.ckpt = ckpt

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = (checkpoint(layer, x, use_reentrant=False) if i in self.ckpt else layer(x)).relu()
        return x


@pytest.mark.parametrize("units", ["list", "separate"])
@pytest.mark.parametrize("reshard", [True, False])
def test_checkpointed_layers_of_one_unit_or_several_gather_and_reduce_once(units, reshard):
    """fully_shard([layers[1], layers[2]]) (one unit of two modules, each checkpointed on its own) or a unit
    per layer: gradients as without checkpointing, each unit reduced once, and no more all-gathers than
    without checkpointing: the recompute runs inside the unit's backward (see [Note: Recompute under FSDP])."""
    w, r = world()
    counts, grads = {}, {}
    for ckpt in ((), (1, 2)):
        hp.manual_seed(0)
        model = _Layers(ckpt)
        if units == "list":
            fully_shard([model.layers[1], model.layers[2]], reshard_after_forward=reshard)
        else:
            fully_shard(model.layers[1], reshard_after_forward=reshard)
            fully_shard(model.layers[2], reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
        x = hp.tensor(np.random.default_rng(r).standard_normal((4, 8)).astype(np.float32))
        for _ in range(2):  # the second iteration prefetches
            model.zero_grad()
            reset_collective_counts()
            model(x).sum().backward()
            counts[ckpt] = collective_counts()
        grads[ckpt] = [full(p.grad) for p in model.parameters()]
    n_units = 2 if units == "list" else 3
    assert counts[(1, 2)]["reduce_scatter"] == n_units
    assert counts[(1, 2)]["all_gather"] == counts[()]["all_gather"], counts
    for g, e in zip(grads[(1, 2)], grads[()]):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-7)
