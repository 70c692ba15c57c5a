"""hpcfsdp.utils.data.DistributedSampler and DataLoader over a real process group: every rank draws the same
permutation, the shares are PyTorch's (disjoint, padded or cut), and defaults come from the default group."""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp.utils.data import DataLoader, TensorDataset
from hpcfsdp.utils.data.distributed import DistributedSampler

pytestmark = pytest.mark.mpi(min_size=2)


def _gather(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _interleave(shares):
    """The epoch order the shares were cut from: rank r holds positions r, r + R, r + 2R, ..."""
    return [shares[r][k] for k in range(len(shares[0])) for r in range(len(shares))]


@pytest.mark.parametrize("n", [23, 24, 3])  # not divisible, divisible, and fewer samples than ranks (at 4 ranks)
@pytest.mark.parametrize("drop_last", [False, True])
def test_shares_from_the_default_group(n, drop_last):
    if not dist.is_initialized():
        dist.init_process_group()
    R, rank = dist.get_world_size(), dist.get_rank()
    s = DistributedSampler(range(n), seed=7, drop_last=drop_last)
    assert (s.num_replicas, s.rank) == (R, rank)
    hp.manual_seed(1000 + rank)  # a different global generator on every rank must not matter
    np.random.seed(rank)
    for epoch in (0, 1):
        s.set_epoch(epoch)
        mine = list(s)
        shares = _gather(mine)
        assert all(len(x) == len(s) for x in shares)
        order = _interleave(shares)
        if drop_last:
            assert len(s) == n // R and len(set(order)) == len(order)  # disjoint, the tail dropped
        else:
            total = -(-n // R) * R
            assert len(s) == total // R and sorted(order[:n]) == list(range(n))
            assert order[n:] == (order[:n] * total)[: total - n]  # padded by repeating the start
        # every rank drew the same permutation: the shares are those a single process computes for each rank
        expected = []
        for r in range(R):
            t = DistributedSampler(range(n), R, r, seed=7, drop_last=drop_last)
            t.set_epoch(epoch)
            expected.append(list(t))
        assert shares == expected
    if n > 2 * R:
        s.set_epoch(0)
        e0 = _gather(list(s))
        s.set_epoch(1)
        assert _gather(list(s)) != e0  # set_epoch reshuffles


def test_dataloader_with_distributed_sampler_covers_the_dataset_once():
    if not dist.is_initialized():
        dist.init_process_group()
    R = dist.get_world_size()
    n = 8 * R
    ds = TensorDataset(hp.arange(n), hp.arange(n) * 3)
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=3, sampler=sampler)
    assert len(loader) == -(-8 // 3)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen = [v for xb, yb in loader for v in xb.tolist()]
        assert all(yb.tolist() == [3 * v for v in xb.tolist()] for xb, yb in loader)
        everyone = _gather(seen)
        flat = sorted(v for part in everyone for v in part)
        assert flat == list(range(n))  # divisible: no padding, every sample exactly once per epoch
