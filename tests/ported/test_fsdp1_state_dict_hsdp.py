"""Re-expresses PyTorch's test/distributed/fsdp/test_fsdp_hybrid_shard.py::test_hsdp_save_load_state_dict on
CPU: SHARDED model and optimizer state dicts of a HYBRID_SHARD model (an explicit (shard, replicate) group pair
or a 2-D device_mesh) reload into a fresh one. From 4 ranks the world is split into 2 replicas of world/2 ranks
(a real 2x2 at 4); at 2 ranks one shard group of both, replicate groups of one rank (PyTorch turns shard groups of
one rank into NO_SHARD over that rank alone, without replication, where its optimizer state does not reload)."""
import pytest

from _common import assert_close, fsdp1_cpu, fsdp1_full_params, local, randn, world
from _framework import FSDP, ShardingStrategy, StateDictType, dist, init_device_mesh, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)


class MyModel(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.lin1 = nn.Linear(6, 6)
        self.lin2 = nn.Linear(6, 6)
        self.lin3 = nn.Linear(6, 6)

    def forward(self, x):
        return self.lin3(self.lin2(self.lin1(x)))


def _replicas():
    w, _ = world()
    return 2 if w >= 4 else 1


def _groups():
    """(shard group, replicate group, this rank's shard ranks): ``_replicas()`` shard groups of consecutive
    ranks; replicate groups {i, i + size, ...}. Every rank creates every group."""
    w, r = world()
    size = w // _replicas()
    shard_lists = [list(range(k, k + size)) for k in range(0, w, size)]
    shard_groups = [dist.new_group(ranks) for ranks in shard_lists]
    mine = r // size
    replicate = None
    for i in range(size):
        ranks = list(range(i, w, size))
        g = dist.new_group(ranks)
        if r in ranks:
            replicate = g
    return shard_groups[mine], replicate, shard_lists[mine]


def _step(model, optim, it):
    w, _ = world()
    loss = model(local(randn(2 * w, 6, seed=it))).sum()
    loss.backward()
    optim.step()
    optim.zero_grad()
    return loss


@pytest.mark.parametrize("by", ["process_group", "device_mesh"])
def test_hsdp_save_load_state_dict(by):
    """TestFSDPHybridShard.test_hsdp_save_load_state_dict: after an AdamW step, SHARDED_STATE_DICT model and
    FSDP.optim_state_dict state reload into a differently initialized HYBRID_SHARD model; the reloaded pair
    then trains exactly as the original (same losses, same full parameters)."""
    w, r = world()
    if w % _replicas():
        pytest.skip("needs an even world size")
    shard_pg, replicate_pg, shard_ranks = _groups()
    if by == "process_group":
        kw = dict(process_group=(shard_pg, replicate_pg))
    else:
        kw = dict(device_mesh=init_device_mesh("cpu", (_replicas(), w // _replicas()), mesh_dim_names=("replicate", "shard")))

    def make(seed):
        return FSDP(MyModel(seed), sharding_strategy=ShardingStrategy.HYBRID_SHARD, use_orig_params=True,
                    device_id=fsdp1_cpu(), **kw)

    model = make(0)
    assert sorted(dist.get_process_group_ranks(model.process_group)) == shard_ranks
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _step(model, optim, 0)
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        msd = model.state_dict()
        osd = FSDP.optim_state_dict(model, optim)

    load_model = make(1)
    load_optim = torch.optim.AdamW(load_model.parameters(), lr=1e-2)
    with FSDP.state_dict_type(load_model, StateDictType.SHARDED_STATE_DICT):
        load_model.load_state_dict(msd)
        load_optim.load_state_dict(FSDP.optim_state_dict_to_load(load_model, load_optim, osd))
    full, loaded = fsdp1_full_params(model), fsdp1_full_params(load_model)
    assert sorted(full) == sorted(loaded)
    for name in full:
        assert_close(loaded[name], full[name], rtol=0, atol=0, msg=f"reloaded {name}")
    for it in (1, 2):
        assert_close(_step(load_model, load_optim, it), _step(model, optim, it), rtol=1e-6, atol=1e-6,
                     msg=f"loss at iter {it}")
    full, loaded = fsdp1_full_params(model), fsdp1_full_params(load_model)
    for name in full:
        assert_close(loaded[name], full[name], rtol=1e-6, atol=1e-6, msg=f"after training {name}")
