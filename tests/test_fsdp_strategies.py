"""ShardingStrategy through the FSDP1 entry point: parity, HSDP communication, memory, precision, bad input.

HSDP runs as 2 replicas x 2 shards on 4 ranks, with HPCFSDP_RANKS_PER_NODE=2 standing in for two nodes.
"""
import warnings

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp.distributed import _c10d_groups
from hpcfsdp.distributed.fsdp import (
    FSDP,
    MixedPrecision,
    ShardingStrategy,
)
from hpcfsdp.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy
from hpcfsdp.models.gpt import Block

from _fsdp_util import full, global_mean, gpt_batches, local, rounded_reference_step, tiny_gpt, world

pytestmark = pytest.mark.mpi(min_size=4)

STRATEGIES = [ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP, ShardingStrategy.NO_SHARD,
              ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2]


@pytest.fixture(autouse=True)
def two_nodes(monkeypatch):
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", "2")


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
@pytest.mark.parametrize("micro", [1, 2])
def test_parity_every_strategy(strategy, micro):
    w, _ = world()
    ref = tiny_gpt()
    fsdp = FSDP(tiny_gpt(), sharding_strategy=strategy, auto_wrap_policy=ModuleWrapPolicy({Block}))
    opt = hp.optim.AdamW(fsdp.parameters(), lr=1e-2, weight_decay=0.1)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    for x, y in gpt_batches(10, 4 * w + 1, B_per_rank=2 * micro):
        xl, yl = local(x), local(y)
        n = xl.shape[0] // micro
        losses = []
        for i in range(micro):
            ctx = fsdp.no_sync() if i < micro - 1 else _null()
            with ctx:
                _, loss = fsdp(hp.tensor(xl[i * n:(i + 1) * n]), hp.tensor(yl[i * n:(i + 1) * n]))
                (loss / micro).backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad()
        _, rl = ref(hp.tensor(x), hp.tensor(y))
        rl.backward()
        ropt.step()
        ropt.zero_grad()
        np.testing.assert_allclose(global_mean(np.mean(losses)), rl.item(), rtol=1e-5, atol=1e-6)
    refp = dict(ref.named_parameters())
    for name, p in fsdp.named_parameters():
        np.testing.assert_allclose(full(p), refp[name].detach().numpy(), atol=2e-5, rtol=2e-4, err_msg=name)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_hsdp_communication_stays_in_shard_and_replicate_groups():
    w, _ = world()
    model = tiny_gpt(n_layer=2)
    fsdp = FSDP(model, sharding_strategy=ShardingStrategy.HYBRID_SHARD, auto_wrap_policy=ModuleWrapPolicy({Block}))
    info = model._get_fsdp_state().mesh_info
    assert info.shard_world_size == 2 and info.replicate_world_size == 2
    shard_ranks = info.shard_process_group.world_ranks
    assert len({r // 2 for r in shard_ranks}) == 1  # a shard group stays inside one (simulated) node
    x, y = gpt_batches(1, 4 * w + 1)[0]
    world_pg = _c10d_groups.default_group()
    before = dict(world_pg.stats)
    shard_group, replicate_group = info.shard_process_group, info.replicate_process_group
    s0, r0 = dict(shard_group.stats), dict(replicate_group.stats)
    _, loss = fsdp(hp.tensor(local(x)), hp.tensor(local(y)))
    loss.backward()
    units = 3  # 2 blocks + root
    assert shard_group.stats["reduce_scatter"] - s0.get("reduce_scatter", 0) == units
    assert replicate_group.stats["all_reduce"] - r0.get("all_reduce", 0) == units
    assert dict(world_pg.stats) == before


def test_parameter_memory_per_strategy():
    w, _ = world()
    expect = {ShardingStrategy.FULL_SHARD: 1 / 4, ShardingStrategy.HYBRID_SHARD: 1 / 2, ShardingStrategy.NO_SHARD: 1.0}
    hp.manual_seed(0)
    from hpcfsdp.models import GPT, GPTConfig

    cfg = GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=64)
    total = sum(p._data.nbytes for p in GPT(cfg).parameters())
    for strategy, frac in expect.items():
        fsdp = FSDP(GPT(cfg), sharding_strategy=strategy, auto_wrap_policy=ModuleWrapPolicy({Block}))
        mine = sum(p._data.nbytes for p in fsdp.parameters())
        assert abs(mine / total - frac) < 0.02, (strategy, mine / total)


def test_mixed_precision_bf16_with_fp32_norms():
    w, _ = world()
    mp = MixedPrecision(param_dtype=hp.bfloat16, reduce_dtype=hp.float32, buffer_dtype=hp.bfloat16,
                        _module_classes_to_ignore=(hp.nn.LayerNorm,))
    model = tiny_gpt()
    fsdp = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), mixed_precision=mp)
    ref = tiny_gpt()
    opt = hp.optim.AdamW(fsdp.parameters(), lr=1e-2)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2)
    for x, y in gpt_batches(8, 4 * w + 1):
        _, loss = fsdp(hp.tensor(local(x)), hp.tensor(local(y)))
        # inside forward the compute parameters are bf16 except the LayerNorms
        loss.backward()
        opt.step()
        opt.zero_grad()
        rl = rounded_reference_step(ref, ropt, x, y, hp.bfloat16, keep_full=lambda n: ".ln_" in n or "ln_f" in n)
        np.testing.assert_allclose(global_mean(loss.item()), rl, rtol=2e-2)
    ln = model.blocks[0].ln_1
    assert ln._get_fsdp_state()._param_group.param_dtype == hp.float32
    assert model.blocks[0]._get_fsdp_state()._param_group.param_dtype == hp.bfloat16
    assert all(p.dtype == hp.float32 for p in fsdp.parameters())


def test_strategy_bad_input():
    w, _ = world()
    mesh2d = dist.init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    mesh1d = dist.init_device_mesh("cpu", (w,), mesh_dim_names=("shard",))
    with pytest.raises(ValueError, match="FULL_SHARD needs a 1-D device_mesh"):
        FSDP(tiny_gpt(), sharding_strategy=ShardingStrategy.FULL_SHARD, device_mesh=mesh2d)
    with pytest.raises(ValueError, match="HYBRID_SHARD needs a 2-D"):
        FSDP(tiny_gpt(), sharding_strategy=ShardingStrategy.HYBRID_SHARD, device_mesh=mesh1d)
    # ranks laid out column-major: each shard group {0, 2} / {1, 3} spans both (simulated) nodes
    crossing = dist.DeviceMesh("cpu", np.arange(4).reshape(2, 2).T, mesh_dim_names=("replicate", "shard"))
    with pytest.raises(ValueError, match="is not inside one node"):
        FSDP(tiny_gpt(), sharding_strategy=ShardingStrategy.HYBRID_SHARD, device_mesh=crossing)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        FSDP(tiny_gpt(), auto_wrap_policy=size_based_auto_wrap_policy)  # 1e8 parameters: wraps nothing
    assert any("wrapped no submodule" in str(r.message) for r in rec)
    with pytest.raises(TypeError, match="sharding_strategy must be a ShardingStrategy"):
        FSDP(tiny_gpt(), sharding_strategy="FULL_SHARD")
    with pytest.raises(TypeError, match="mixed_precision must be a MixedPrecision"):
        FSDP(tiny_gpt(), mixed_precision="bf16")
