"""Re-expresses PyTorch's test/distributed/fsdp/test_fsdp_no_sync.py and test_fsdp_grad_acc.py (FSDP1 gradient
accumulation inside and outside ``no_sync()``) on CPU."""
import contextlib

import numpy as np
import pytest

from _common import (
    assert_close,
    copy_model,
    fsdp1_clean,
    fsdp1_cpu,
    local,
    randn,
    to_np,
    world,
)
from _framework import FSDP, BackwardPrefetch, F, ModuleWrapPolicy, ShardingStrategy, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x):
        return F.relu(self.lin(x))


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), Block(6), Block(6), nn.Linear(6, 3))


def _batches(n):
    """``n`` global batches (distinct data each)."""
    w, _ = world()
    return [randn(2 * w, 4, seed=100 + i) for i in range(n)]


def _grads(fsdp):
    """Every gradient of the FSDP model as NumPy (gathered where it is a DTensor)."""
    return [to_np(p.grad) for p in fsdp.parameters() if p.grad is not None]


def _accumulate(fsdp, batches, configs):
    """Forward/backward over ``batches`` (each rank its slice): ``configs`` is [(use_no_sync, iters), ...];
    the last batch always runs outside no_sync. Returns the sum of the local losses."""
    total = len(batches)
    idx, loss_sum = 0, 0.0
    for use_no_sync, iters in configs:
        with fsdp.no_sync() if use_no_sync else contextlib.nullcontext():
            for _ in range(iters):
                if idx == total - 1:
                    break
                loss = fsdp(local(batches[idx])).sum()
                loss.backward()
                loss_sum += float(loss.item())
                idx += 1
    loss = fsdp(local(batches[-1])).sum()
    loss.backward()
    return loss_sum + float(loss.item())


def _check_grad_acc(configs, *, sharding_strategy, backward_prefetch, use_orig_params):
    """Accumulating over the batches equals one step on their concatenation (the same FSDP model, as
    PyTorch's test), and, with the original parameters exposed, the unsharded replica's gradients."""
    w, _ = world()
    model = _model()
    ref = copy_model(model)
    fsdp = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=fsdp1_cpu(),
                sharding_strategy=sharding_strategy, backward_prefetch=backward_prefetch,
                use_orig_params=use_orig_params)
    optim = torch.optim.SGD(fsdp.parameters(), lr=0.01, momentum=0.9)
    batches = _batches(sum(n for _, n in configs))
    concat = torch.cat([local(b) for b in batches], dim=0)

    fsdp.zero_grad()
    ref_loss = fsdp(concat).sum()
    ref_loss.backward()
    concat_grads = _grads(fsdp)

    fsdp.zero_grad()
    acc_loss = _accumulate(fsdp, batches, configs)
    acc_grads = _grads(fsdp)
    assert_close(acc_loss, float(ref_loss.item()), rtol=1e-5, atol=1e-5, msg="accumulated loss")
    assert len(acc_grads) == len(concat_grads)
    for i, (a, c) in enumerate(zip(acc_grads, concat_grads)):
        assert a.shape == c.shape, i
        assert_close(a, c, rtol=1e-4, atol=1e-5, msg=f"grad {i}")

    if use_orig_params:  # against the unsharded replica on the global batches
        for b in batches:
            (ref(b).sum() / w).backward()
        with FSDP.summon_full_params(fsdp, with_grads=True):
            full = {fsdp1_clean(n): to_np(p.grad) for n, p in fsdp.named_parameters()}
        for n, p in ref.named_parameters():
            assert_close(full[n], to_np(p.grad), rtol=1e-4, atol=1e-5, msg=f"grad {n} vs replica")
    optim.step()  # does not error
    return acc_grads


@pytest.mark.parametrize("num_iters_to_acc", [2, 4])
@pytest.mark.parametrize("backward_prefetch", ["BACKWARD_PRE", "BACKWARD_POST", None])
def test_no_sync(num_iters_to_acc, backward_prefetch):
    """TestNoSync.test_no_sync: all but the last batch under no_sync() accumulate to the gradients of one
    step on the concatenated batch (its CPUOffload(offload_params=True) cases: PyTorch needs an accelerator)."""
    prefetch = getattr(BackwardPrefetch, backward_prefetch) if backward_prefetch else None
    grads = _check_grad_acc([(True, num_iters_to_acc)], sharding_strategy=ShardingStrategy.FULL_SHARD,
                            backward_prefetch=prefetch, use_orig_params=False)
    assert grads and any(np.abs(g).max() > 0 for g in grads)  # a real gradient accumulated


_CONFIGS = {
    "sync_nosync_sync": [(False, 2), (True, 2), (False, 2)],
    "nosync_sync_nosync": [(True, 2), (False, 2), (True, 2)],
}


@pytest.mark.parametrize("configs", sorted(_CONFIGS))
@pytest.mark.parametrize("sharding_strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
def test_grad_acc(configs, sharding_strategy):
    """TestGradAcc.test_grad_acc: accumulation interleaving no_sync() and plain backward passes (starting and
    ending either way) equals one step on the concatenation; use_orig_params and backward prefetch are
    cycled over the cases (every value of each is exercised)."""
    prefetches = [None, BackwardPrefetch.BACKWARD_PRE, BackwardPrefetch.BACKWARD_POST]
    i = sorted(_CONFIGS).index(configs) * 3 + ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"].index(sharding_strategy)
    grads = _check_grad_acc(_CONFIGS[configs], sharding_strategy=getattr(ShardingStrategy, sharding_strategy),
                            backward_prefetch=prefetches[i % 3], use_orig_params=bool(i % 2))
    assert grads and any(np.abs(g).max() > 0 for g in grads)  # a real gradient accumulated
