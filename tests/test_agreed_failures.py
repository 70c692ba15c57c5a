"""Failure decisions agreed across ranks: HPCFSDP_CHECK_FINITE raises the same error on every rank, and a
caller that catches it trains on without a hang."""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp import nn
from hpcfsdp.distributed.fsdp import fully_shard

from _fsdp_util import full, world

pytestmark = pytest.mark.mpi(min_size=2)

IN, OUT, B = 3, 8, 2


def _model():
    hp.manual_seed(0)
    model = nn.Linear(IN, OUT)
    fully_shard(model)
    return model


def _batch(step):
    w, r = world()
    x = np.random.default_rng(step).standard_normal((w * B, IN)).astype(np.float32)
    return x, x[r * B:(r + 1) * B]


def _loss(model, x_local, mask):
    return (model(hp.tensor(x_local)) * hp.tensor(mask)).sum()


def _reference_grads(x):
    """Gradients of the data-parallel mean of the per-rank losses (ones mask), in float64."""
    w, _ = world()
    dy = np.ones((x.shape[0], OUT)) / w
    return {"weight": dy.T @ x.astype(np.float64), "bias": dy.sum(0)}


@pytest.mark.timeout(120)
def test_nan_on_one_rank_raises_on_every_rank_and_training_continues(monkeypatch):
    """A NaN in one output column of rank 1's loss reaches only the shard holding row 0 of the weight and
    bias (rank 0's): before the agreement, the other ranks raised nothing and walked alone into the next
    collective."""
    monkeypatch.setenv("HPCFSDP_CHECK_FINITE", "1")
    w, r = world()
    model = _model()
    ones = np.ones((B, OUT), np.float32)
    _, x1 = _batch(1)
    _loss(model, x1, ones).backward()  # step 1: finite
    model.zero_grad()
    bad = ones.copy()
    if r == 1:
        bad[:, 0] = np.nan
    _, x2 = _batch(2)
    with pytest.raises(FloatingPointError) as info:
        _loss(model, x2, bad).backward()  # step 2
    msg = str(info.value)
    assert f"gradient of weight has {IN} non-finite value(s) in the shard(s) of rank(s) 0 at step 2 " \
        "(and 1 more parameter(s) of this group)" in msg, msg  # row 0 of weight and bias live on rank 0
    assert dist.group.WORLD.all_gather_object(msg) == [msg] * w  # the same error everywhere
    # caught: zero the gradients and train on with clean data, no hang, and the right gradients
    model.zero_grad()
    x3, x3_local = _batch(3)
    _loss(model, x3_local, ones).backward()
    want = _reference_grads(x3)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(full(p.grad), want[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.timeout(120)
def test_rank_with_empty_shard_raises_too(monkeypatch):
    """Linear(3, 2) over >2 ranks: the last ranks hold empty shards and must raise all the same."""
    monkeypatch.setenv("HPCFSDP_CHECK_FINITE", "1")
    w, r = world()
    hp.manual_seed(0)
    model = nn.Linear(IN, 2)
    fully_shard(model)
    x = np.ones((B, IN), np.float32)
    if r == w - 1:
        x[0, 0] = np.inf
    with pytest.raises(FloatingPointError, match=r"gradient of weight has \d+ non-finite value\(s\) in the "
                                                 r"shard\(s\) of rank\(s\) 0.* at step 1"):
        model(hp.tensor(x)).sum().backward()
    dist.barrier()


class _SometimesB(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(IN, 4), nn.Linear(IN, 4)

    def forward(self, x, use_b):
        out = self.a(x)
        return out + self.b(x) if use_b else out


@pytest.mark.timeout(60)
def test_parameters_with_a_gradient_on_some_ranks_only(monkeypatch):
    """Only rank 0 uses `b`: the ranks hold gradients for different parameters, and the check's collective
    still has the same size everywhere (no mismatch, no hang)."""
    monkeypatch.setenv("HPCFSDP_CHECK_FINITE", "1")
    w, r = world()
    hp.manual_seed(0)
    model = _SometimesB()
    fully_shard(model)
    x = np.ones((B, IN), np.float32)
    model(hp.tensor(x), r == 0).sum().backward()  # finite everywhere
    model.zero_grad()
    if r == 0:
        x[0, 0] = np.nan
    with pytest.raises(FloatingPointError, match=r"gradient of a\.weight has \d+ non-finite value\(s\) in the "
                                                 r"shard\(s\) of rank\(s\) .* at step 2"):
        model(hp.tensor(x), r == 0).sum().backward()
    dist.barrier()
