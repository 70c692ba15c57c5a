"""Which gradients fully_shard reduces, and in what dtype: parameters frozen after fully_shard, no-sync accumulation."""
import copy

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp import nn
from hpcfsdp.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from hpcfsdp.distributed.process_group import collective_bytes, reset_collective_counts

from _fsdp_util import full, world

pytestmark = pytest.mark.mpi(min_size=2)


def _mlps(n=3, dim=8):
    hp.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim)) for _ in range(n)])


def _inputs(steps, dim=8, rows=4):
    """Global batches, the same on every rank: (steps, W*rows, dim)."""
    w, _ = world()
    return np.random.default_rng(7).standard_normal((steps, w * rows, dim)).astype(np.float32)


def _local(batch):
    w, r = world()
    n = batch.shape[0] // w
    return hp.tensor(batch[r * n:(r + 1) * n])


def _freeze_weights(model, requires_grad=False):
    for name, p in model.named_parameters():
        if "weight" in name:
            p.requires_grad_(requires_grad)


@pytest.mark.parametrize("reshard", [True, False, 2])
def test_freezing_after_fully_shard_keeps_weights_and_reduces_only_trainable(reshard):
    """BitFit-style: weights frozen after fully_shard keep .grad None and do not move; the biases train as in an
    unsharded reference, and each group's reduce-scatter carries the biases only."""
    w, _ = world()
    if reshard == 2 and w % 2:
        pytest.skip("reshard_after_forward=2 needs an even world")
    model = _mlps()
    ref = copy.deepcopy(model)
    for mlp in model:
        fully_shard(mlp, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    _freeze_weights(model)
    _freeze_weights(ref)
    before = {n: full(p).copy() for n, p in model.named_parameters() if "weight" in n}
    opt = hp.optim.Adam(model.parameters(), lr=1e-2)
    ropt = hp.optim.Adam([p for p in ref.parameters() if p.requires_grad], lr=1e-2)
    for batch in _inputs(3):
        reset_collective_counts()
        model(_local(batch)).sum().backward()
        rs_bytes = collective_bytes().get("reduce_scatter", 0)
        for name, p in model.named_parameters():
            assert (p.grad is None) == ("weight" in name), name
        opt.step()
        opt.zero_grad()
        ref(hp.tensor(batch)).sum().mul(1.0 / w).backward()  # FSDP averages the per-rank sums
        ropt.step()
        ropt.zero_grad()
        # one reduce-scatter per MLP group, holding its two biases (8 + 8 floats) over w ranks
        assert rs_bytes == len(model) * 16 * 4, rs_bytes
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if "weight" in name:
            np.testing.assert_array_equal(full(p), before[name])
        else:
            np.testing.assert_allclose(full(p), q.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_unfreezing_later_trains_again():
    w, _ = world()
    model = _mlps(n=2)
    ref = copy.deepcopy(model)
    for mlp in model:
        fully_shard(mlp)
    fully_shard(model)
    opt = hp.optim.SGD(model.parameters(), lr=0.1)
    ropt = hp.optim.SGD(ref.parameters(), lr=0.1)
    for step, batch in enumerate(_inputs(3)):
        frozen = step < 2
        _freeze_weights(model, not frozen)
        _freeze_weights(ref, not frozen)
        model(_local(batch)).sum().backward()
        ref(hp.tensor(batch)).sum().mul(1.0 / w).backward()
        for m in (opt, ropt):
            m.step()
            m.zero_grad()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        np.testing.assert_allclose(full(p), q.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_no_sync_microbatches_accumulate_in_the_reduce_dtype():
    """bf16 compute, fp32 reduction: gradients of micro-batches without sync add up in float32 (PyTorch's
    unsharded_accumulated_grad), so the result equals the float32 sum of each micro-batch's reduced gradient."""
    mp = MixedPrecisionPolicy(param_dtype=hp.bfloat16, reduce_dtype=hp.float32)
    model = _mlps(n=2, dim=16)
    for mlp in model:
        fully_shard(mlp, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    batches = _inputs(4, dim=16)
    per_batch = []
    for batch in batches:  # each micro-batch reduced on its own: the float32 reference of its gradient
        model(_local(batch)).sum().backward()
        per_batch.append([full(p.grad).astype(np.float64) for p in model.parameters()])
        model.zero_grad()
    expected = [sum(gs) for gs in zip(*per_batch)]
    for i, batch in enumerate(batches):
        model.set_requires_gradient_sync(i == len(batches) - 1)
        model(_local(batch)).sum().backward()
    for (name, p), e in zip(model.named_parameters(), expected):
        assert p.grad.dtype == hp.float32, name
        # float32 sums of the same bf16-computed gradients: equal to float32 rounding (bf16 sums were ~3e-3 off)
        np.testing.assert_allclose(full(p.grad), e, rtol=2e-6, atol=2e-6 * np.abs(e).max(), err_msg=name)
    assert dist.get_world_size() == world()[0]


def test_a_parameter_tied_across_two_groups_is_refused():
    """Tied weights in two fully_shard calls would be two shards trained apart (silently untied before):
    PyTorch's ValueError at the first forward, naming the parameter."""
    hp.manual_seed(0)
    emb = nn.Embedding(11, 8)
    head = nn.Linear(8, 11, bias=False)
    head.weight = emb.weight
    model = nn.Sequential(emb, head)
    fully_shard(model[0])
    fully_shard(model[1])
    fully_shard(model)
    with pytest.raises(ValueError, match="Parameter '1.weight' is shared with a parameter already managed by "
                                         "another FSDP group"):
        model(hp.tensor(np.zeros((2, 3), dtype=np.int64)))


def test_an_optimizer_built_before_fully_shard_refuses_to_step():
    """fully_shard replaces every parameter object by its sharded DTensor: an optimizer over the old objects
    trained nothing, silently (PyTorch's too); its step raises instead, and one built afterwards trains."""
    model = _mlps(n=1)
    early = hp.optim.SGD(model.parameters(), lr=0.1)
    fully_shard(model)
    model(_local(_inputs(1)[0])).sum().backward()
    with pytest.raises(RuntimeError, match="build the optimizer after sharding"):
        early.step()
    before = [full(p).copy() for p in model.parameters()]
    hp.optim.SGD(model.parameters(), lr=0.1).step()
    assert all(not np.array_equal(full(p), b) for p, b in zip(model.parameters(), before))
