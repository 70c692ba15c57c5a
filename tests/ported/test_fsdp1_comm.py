"""Re-expresses PyTorch's test/distributed/fsdp/test_fsdp_comm.py::TestCommunication.test_communication on CPU:
FSDP1's all-gathers and reduce-scatters per iteration, in and out of ``no_sync()``, counted through
``_common.record_collectives`` (PyTorch's test patches ``dist.all_gather_into_tensor`` / ``reduce_scatter_tensor``).
Without PyTorch's DETAIL debug level: its execution-order check triples the first iteration's forward all-gathers,
a private validation hpcfsdp does not have."""
import pytest

from _common import Transformer, TransformerBlock, fsdp1_cpu, local, randint, randn, record_collectives, world
from _framework import FSDP, ModuleWrapPolicy, ShardingStrategy, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)


def _nested(**kw):
    """The shape of common_fsdp.NestedWrappedModule (RECURSIVE): four units holding parameters."""
    torch.manual_seed(0)
    inner = nn.Sequential(FSDP(nn.Linear(4, 16), **kw), nn.Linear(16, 16))
    model = nn.Sequential(nn.Linear(8, 4), FSDP(inner, **kw), FSDP(nn.Linear(16, 4), **kw), nn.Linear(4, 8))
    return FSDP(model, **kw), 4, lambda it: local(randn(2 * world()[0], 8, seed=it))


def _transformer(**kw):
    torch.manual_seed(0)
    model = FSDP(Transformer(n_layers=2), auto_wrap_policy=ModuleWrapPolicy({TransformerBlock}), **kw)
    return model, 3, lambda it: local(randint(17, 2 * world()[0], 6, seed=it))


def _iteration(model, inp, no_sync):
    import contextlib

    with record_collectives() as log:
        with model.no_sync() if no_sync else contextlib.nullcontext():
            model(inp).sum().backward()
    return log.num("all_gather"), log.num("reduce_scatter")


def _expected_all_gathers(num_fsdp, strategy, after_no_sync_iter):
    """Forward: every unit gathers, except SHARD_GRAD_OP after a no_sync backward (it kept the full parameters);
    backward: FULL_SHARD re-gathers every unit but the root (which kept its parameters after forward),
    SHARD_GRAD_OP none."""
    sgo = strategy == ShardingStrategy.SHARD_GRAD_OP
    forward = 0 if sgo and after_no_sync_iter else num_fsdp
    backward = 0 if sgo else num_fsdp - 1
    return forward + backward


@pytest.mark.parametrize("strategy", ["SHARD_GRAD_OP", "FULL_SHARD"])
@pytest.mark.parametrize("use_no_sync", [False, True])
@pytest.mark.parametrize("model_kind", ["transformer", "nested"])
def test_communication(model_kind, use_no_sync, strategy):
    """Per iteration: inside no_sync() no reduce-scatter and the all-gathers above; outside it one
    reduce-scatter per unit holding parameters. Gradients of a no_sync run then a synced one equal the sum of
    the per-iteration gradients (checked through the first and last parameters' totals below)."""
    strategy = getattr(ShardingStrategy, strategy)
    model, num_fsdp, make_inp = {"nested": _nested, "transformer": _transformer}[model_kind](
        sharding_strategy=strategy, device_id=fsdp1_cpu())
    iters = 3
    if use_no_sync:
        for i in range(iters):
            gathers, scatters = _iteration(model, make_inp(i), no_sync=True)
            assert scatters == 0, (i, scatters)
            assert gathers == _expected_all_gathers(num_fsdp, strategy, after_no_sync_iter=i > 0), (i, gathers)
    for i in range(iters):
        gathers, scatters = _iteration(model, make_inp(iters + i), no_sync=False)
        assert scatters == num_fsdp, (i, scatters)
        assert gathers == _expected_all_gathers(num_fsdp, strategy, after_no_sync_iter=use_no_sync and i == 0), \
            (i, gathers)
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)  # every unit's reduce-scatter delivered a gradient
