"""FullyShardedDataParallel as PyTorch's FSDP1: attribute access, constructor arguments, mixed precision and
summon_full_params, against an unsharded reference trained on the global batch."""
import warnings

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp import nn
from hpcfsdp.distributed.fsdp import FSDP, MixedPrecision, ShardingStrategy
from hpcfsdp.distributed.fsdp.wrap import ModuleWrapPolicy
from hpcfsdp.distributed.tensor import DTensor

from _fsdp_util import Blocks, full, global_mean, local, world

pytestmark = pytest.mark.mpi(min_size=2)


def _blocks(seed=0):
    w, _ = world()
    hp.manual_seed(seed)
    return Blocks(4 * w + 1)


def _batches(steps, B_per_rank=2, T=5, seed=7):
    w, _ = world()
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 4 * w + 1, (w * B_per_rank, T)) for _ in range(steps)]


def _wrap_policy():
    return ModuleWrapPolicy({nn.Sequential})


def _train_parity(fsdp, ref, steps=4):
    opt = hp.optim.AdamW(fsdp.parameters(), lr=1e-2, weight_decay=0.1)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    for x in _batches(steps):
        loss = fsdp(hp.tensor(local(x)))
        loss.backward()
        opt.step()
        opt.zero_grad()
        rl = ref(hp.tensor(x))
        rl.backward()
        ropt.step()
        ropt.zero_grad()
        np.testing.assert_allclose(global_mean(loss.item()), rl.item(), rtol=1e-5, atol=1e-6)
    refp = dict(ref.named_parameters())
    for name, p in fsdp.named_parameters():
        np.testing.assert_allclose(full(p), refp[name].detach().numpy(), atol=2e-5, rtol=2e-4, err_msg=name)


def test_attribute_and_item_access_reach_the_wrapped_module():
    model = _blocks()
    fsdp = FSDP(model, auto_wrap_policy=_wrap_policy())
    assert fsdp.module is model
    assert fsdp.blocks is model.blocks and fsdp.head is model.head
    assert fsdp.blocks[1] is model.blocks[1]
    with pytest.raises(AttributeError, match="no_such_thing"):
        fsdp.no_such_thing
    seq = FSDP(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)))
    assert isinstance(seq[0], nn.Linear) and seq[2].out_features == 2


def test_pytorch_constructor_arguments_train_like_the_reference():
    ref = _blocks()
    fsdp = FSDP(_blocks(), None, ShardingStrategy.FULL_SHARD, auto_wrap_policy=_wrap_policy(),
                device_id=hp.device("cpu"), use_orig_params=True, limit_all_gathers=False, forward_prefetch=True,
                sync_module_states=False)
    assert fsdp.use_orig_params and not fsdp.limit_all_gathers and fsdp.forward_prefetch
    assert fsdp.compute_device == hp.device("cpu")
    _train_parity(fsdp, ref)
    if not hp.accelerator.is_available():
        with pytest.raises(RuntimeError, match="device_id=0: this process sees 0 CUDA device"):
            FSDP(_blocks(), device_id=0)
    model = _blocks()
    kept = FSDP(model, ignored_states=[model.head])
    assert not isinstance(model.head.weight, DTensor) and isinstance(model.emb.weight, DTensor)
    assert kept.head is model.head
    with pytest.raises(ValueError, match="Cannot pass both ignored_modules and ignored_states"):
        FSDP(_blocks(), ignored_modules=[], ignored_states=[])


def test_sync_module_states_broadcasts_rank0_parameters_and_buffers():
    w, r = world()
    hp.manual_seed(100 + r)  # every rank initialises differently
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3))
    with hp.no_grad():
        model[1].running_mean.fill_(float(r + 1))
    fsdp = FSDP(model, sync_module_states=True)
    hp.manual_seed(100)  # rank 0's model
    want = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3))
    for name, p in want.named_parameters():
        np.testing.assert_array_equal(full(dict(fsdp.named_parameters())[name]), p.detach().numpy(), err_msg=name)
    np.testing.assert_array_equal(fsdp[1].running_mean.numpy(), np.ones(6, np.float32))


def test_param_init_fn_materializes_meta_modules_and_sync_from_rank0():
    w, r = world()
    seen = []

    def init_fn(m):
        seen.append(type(m).__name__)
        m.to_empty(device="cpu", recurse=False)

    if r == 0:
        model = _blocks(seed=3)
    else:
        with hp.device("meta"):
            model = _blocks(seed=3)
    fsdp = FSDP(model, auto_wrap_policy=_wrap_policy(), param_init_fn=init_fn, sync_module_states=True)
    if r == 0:
        assert seen == []
    else:  # called on exactly the modules that hold meta tensors
        assert sorted(seen) == sorted(["Embedding", "Linear"] + ["Linear"] * 6)
    _train_parity(fsdp, _blocks(seed=3), steps=2)


def test_meta_module_without_param_init_fn_is_reset():
    with hp.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    fsdp = FSDP(model)
    ln = dict(fsdp.named_parameters())["1.weight"]
    np.testing.assert_array_equal(full(ln), np.ones(4, np.float32))  # reset_parameters ran
    assert np.isfinite(fsdp(hp.ones(2, 4)).detach().numpy()).all()


def test_process_group_argument():
    w, r = world()
    pg = dist.new_group(list(range(w)))
    _train_parity(FSDP(_blocks(), process_group=pg, auto_wrap_policy=_wrap_policy()), _blocks(), steps=2)
    with pytest.raises(ValueError, match="Cannot pass both process_group and device_mesh"):
        FSDP(_blocks(), process_group=pg, device_mesh=dist.init_device_mesh("cpu", (w,)))
    with pytest.raises(ValueError, match="HYBRID_SHARD expects process_group to be None or a pair"):
        FSDP(_blocks(), process_group=pg, sharding_strategy=ShardingStrategy.HYBRID_SHARD)
    with pytest.raises(ValueError, match="FULL_SHARD expects process_group to be a ProcessGroup"):
        FSDP(_blocks(), process_group=(pg, pg))


@pytest.mark.mpi(min_size=4)
def test_hybrid_shard_process_group_pair(monkeypatch):
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", "2")
    w, r = world()
    shard = [dist.new_group([0, 1]), dist.new_group([2, 3])][r // 2]
    replicate = [dist.new_group([0, 2]), dist.new_group([1, 3])][r % 2]
    model = _blocks()
    fsdp = FSDP(model, process_group=(shard, replicate), sharding_strategy=ShardingStrategy.HYBRID_SHARD,
                auto_wrap_policy=_wrap_policy())
    info = model._get_fsdp_state().mesh_info
    assert info.shard_world_size == 2 and info.replicate_world_size == 2
    assert sorted(info.shard_process_group.world_ranks) == sorted(shard.world_ranks)
    assert sorted(info.replicate_process_group.world_ranks) == sorted(replicate.world_ranks)
    _train_parity(fsdp, _blocks(), steps=2)


def _grads_after_one_step(mp):
    fsdp = FSDP(_blocks(), auto_wrap_policy=_wrap_policy(), mixed_precision=mp)
    fsdp(hp.tensor(local(_batches(1)[0]))).backward()
    return {n: p.grad for n, p in fsdp.named_parameters()}, fsdp


def test_keep_low_precision_grads():
    full_grads, _ = _grads_after_one_step(MixedPrecision(param_dtype=hp.bfloat16, reduce_dtype=hp.float32))
    low_grads, fsdp = _grads_after_one_step(MixedPrecision(param_dtype=hp.bfloat16, reduce_dtype=hp.float32,
                                                           keep_low_precision_grads=True))
    for name, g in low_grads.items():
        assert full_grads[name].dtype == hp.float32
        assert g.dtype == hp.bfloat16, name
        np.testing.assert_array_equal(g.to_local().numpy(), full_grads[name].to_local().numpy().astype(hp.bfloat16))
    assert all(p.dtype == hp.float32 for p in fsdp.parameters())  # the sharded parameters stay full precision
    before = {n: p.to_local().detach().numpy().copy() for n, p in fsdp.named_parameters()}
    hp.optim.SGD(fsdp.parameters(), lr=0.5).step()  # an optimizer steps the fp32 shards with the bf16 grads
    for n, p in fsdp.named_parameters():
        want = before[n] - 0.5 * low_grads[n].to_local().numpy().astype(np.float32)
        np.testing.assert_allclose(p.to_local().detach().numpy(), want, rtol=1e-6, atol=1e-7, err_msg=n)


class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.register_buffer("scale", hp.tensor([1.0 / 3.0] * 4))

    def forward(self, x):
        return self.bn(self.lin(x) * self.scale)


def test_buffer_dtype_does_not_change_the_state_dict_and_batchnorm_stays_fp32():
    hp.manual_seed(0)
    model = _Scaled()
    fsdp = FSDP(model, mixed_precision=MixedPrecision(param_dtype=hp.bfloat16, buffer_dtype=hp.bfloat16))
    assert model.scale.dtype == hp.bfloat16  # computes with the low-precision buffer
    assert model.bn.running_mean.dtype == hp.float32  # _BatchNorm is ignored by default: full precision
    assert model.bn._get_fsdp_state()._param_group.param_dtype == hp.float32
    assert model._get_fsdp_state()._param_group.param_dtype == hp.bfloat16
    out = fsdp(hp.randn(3, 4))
    assert out.dtype == hp.bfloat16
    sd = fsdp.state_dict()
    assert sd["scale"].dtype == hp.float32 and sd["bn.running_var"].dtype == hp.float32
    np.testing.assert_allclose(sd["scale"].numpy(), np.full(4, 1 / 3), rtol=4e-3)
    fsdp.load_state_dict(sd)
    assert model.scale.dtype == hp.bfloat16
    hp.manual_seed(0)
    model = _Scaled()  # a _BatchNorm that the auto-wrap policy also picks stays full precision
    FSDP(model, auto_wrap_policy=ModuleWrapPolicy({nn.BatchNorm1d}),
         mixed_precision=MixedPrecision(param_dtype=hp.bfloat16))
    assert model.bn._get_fsdp_state()._param_group.param_dtype == hp.float32
    assert model.bn._get_fsdp_state() is not model._get_fsdp_state()


def test_summon_full_params_writeback_and_full_precision():
    ref = _blocks()
    model = _blocks()
    fsdp = FSDP(model, auto_wrap_policy=_wrap_policy(), mixed_precision=MixedPrecision(param_dtype=hp.bfloat16))
    with FSDP.summon_full_params(fsdp):
        w = fsdp.blocks[0][0].weight
        assert not isinstance(w, DTensor) and w.dtype == hp.float32  # full shape, full precision
        np.testing.assert_array_equal(w.detach().numpy(), ref.blocks[0][0].weight.detach().numpy())
        np.testing.assert_array_equal(fsdp.emb.weight.detach().numpy(), ref.emb.weight.detach().numpy())
        with hp.no_grad():
            w.mul_(2.0)
    np.testing.assert_array_equal(full(model.blocks[0][0].weight), 2 * ref.blocks[0][0].weight.detach().numpy())
    assert isinstance(model.blocks[0][0].weight, DTensor)
    with FSDP.summon_full_params(fsdp, writeback=False):
        with hp.no_grad():
            fsdp.head.weight.zero_()
    np.testing.assert_array_equal(full(model.head.weight), ref.head.weight.detach().numpy())
    with FSDP.summon_full_params(fsdp, recurse=False):  # only the root unit's own parameters
        assert not isinstance(fsdp.head.weight, DTensor)
        assert isinstance(fsdp.blocks[0][0].weight, DTensor)


def test_summon_full_params_rank0_only_offload_and_bad_combinations():
    _, r = world()
    ref = _blocks()
    fsdp = FSDP(_blocks(), auto_wrap_policy=_wrap_policy())
    with FSDP.summon_full_params(fsdp, writeback=False, rank0_only=True, offload_to_cpu=True):
        w = fsdp.blocks[2][2].weight
        if r == 0:
            np.testing.assert_array_equal(w.detach().numpy(), ref.blocks[2][2].weight.detach().numpy())
            assert w.device == hp.device("cpu")
        else:
            assert isinstance(w, DTensor)  # other ranks keep their shards
    with pytest.raises(NotImplementedError, match="writeback=True and rank0_only=True"):
        with FSDP.summon_full_params(fsdp, rank0_only=True):
            pass
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with FSDP.summon_full_params(fsdp, offload_to_cpu=True):
            pass
    assert any("offload_to_cpu=True and rank0_only=False" in str(x.message) for x in rec)


def test_summon_full_params_with_grads_matches_the_reference():
    ref = _blocks()
    fsdp = FSDP(_blocks(), auto_wrap_policy=_wrap_policy(), use_orig_params=True)
    x = _batches(1)[0]
    fsdp(hp.tensor(local(x))).backward()
    ref(hp.tensor(x)).backward()
    refg = {n: p.grad.numpy() for n, p in ref.named_parameters()}
    with FSDP.summon_full_params(fsdp, with_grads=True):
        for name, p in fsdp.named_parameters():
            assert tuple(p.grad.shape) == refg[name].shape
            np.testing.assert_allclose(p.grad.numpy(), refg[name], rtol=1e-4, atol=1e-6, err_msg=name)
    with pytest.raises(NotImplementedError, match="use_orig_params=False"):
        with FSDP.summon_full_params(FSDP(_blocks()), with_grads=True):
            pass


@pytest.mark.mpi(min_size=4)
def test_hybrid_shard_sync_module_states(monkeypatch):
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", "2")
    _, r = world()
    fsdp = FSDP(_blocks(seed=50 + r), sharding_strategy=ShardingStrategy.HYBRID_SHARD, sync_module_states=True,
                auto_wrap_policy=_wrap_policy())
    rank0 = dict(_blocks(seed=50).named_parameters())
    for name, p in fsdp.named_parameters():  # every replica and shard starts from rank 0's weights
        np.testing.assert_array_equal(full(p), rank0[name].detach().numpy(), err_msg=name)
    _train_parity(fsdp, _blocks(seed=50), steps=2)


def test_summon_full_params_keeps_tied_weights_tied():
    from _fsdp_util import tiny_gpt

    ref = tiny_gpt(tie=True)
    model = tiny_gpt(tie=True)
    fsdp = FSDP(model)
    with FSDP.summon_full_params(fsdp):
        assert model.lm_head.weight is model.transformer.wte.weight
        np.testing.assert_array_equal(model.lm_head.weight.detach().numpy(),
                                      ref.transformer.wte.weight.detach().numpy())
        with hp.no_grad():
            model.lm_head.weight.add_(1.0)
    assert model.lm_head.weight is model.transformer.wte.weight
    np.testing.assert_allclose(full(model.transformer.wte.weight), ref.transformer.wte.weight.detach().numpy() + 1.0,
                               rtol=1e-6)


@pytest.mark.mpi(min_size=4)
def test_disjoint_process_groups_give_independent_fsdp_instances():
    """Ranks {0, 1} and {2, 3} each shard one model over their own group; each pair matches a reference
    trained on the pair's global batch."""
    w, r = world()
    pair = [dist.new_group([0, 1]), dist.new_group([2, 3])][r // 2]
    hp.manual_seed(0)
    ref = Blocks(17)
    hp.manual_seed(0)
    model = Blocks(17)
    fsdp = FSDP(model, process_group=pair, auto_wrap_policy=_wrap_policy())
    info = model._get_fsdp_state().mesh_info
    assert info.shard_world_size == 2 and sorted(info.shard_process_group.world_ranks) == [r // 2 * 2,
                                                                                          r // 2 * 2 + 1]
    opt = hp.optim.AdamW(fsdp.parameters(), lr=1e-2)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2)
    rng = np.random.default_rng(11 + r // 2)  # each pair its own data
    for _ in range(2):
        x = rng.integers(0, 17, (4, 5))
        fsdp(hp.tensor(x[(r % 2) * 2:(r % 2) * 2 + 2])).backward()
        opt.step()
        opt.zero_grad()
        ref(hp.tensor(x)).backward()
        ropt.step()
        ropt.zero_grad()
    refp = dict(ref.named_parameters())
    for name, p in fsdp.named_parameters():
        np.testing.assert_allclose(full(p), refp[name].detach().numpy(), atol=2e-5, rtol=2e-4, err_msg=name)


def test_clip_grad_norm_returns_the_full_norm_as_a_plain_tensor():
    ref = _blocks()
    fsdp = FSDP(_blocks(), auto_wrap_policy=_wrap_policy())
    x = _batches(1)[0]
    fsdp(hp.tensor(local(x))).backward()
    ref(hp.tensor(x)).backward()
    expected = np.sqrt(sum(float((p.grad.numpy().astype(np.float64) ** 2).sum()) for p in ref.parameters()))
    total = fsdp.clip_grad_norm_(0.5)
    assert not isinstance(total, DTensor) and isinstance(total, hp.Tensor)
    np.testing.assert_allclose(total.item(), expected, rtol=1e-5)
    clipped = np.sqrt(sum(float((full(p.grad).astype(np.float64) ** 2).sum()) for p in fsdp.parameters()))
    np.testing.assert_allclose(clipped, 0.5, rtol=1e-4)


def test_transformer_lambda_and_custom_policies_pick_the_same_units_and_train_like_the_reference():
    import functools

    from hpcfsdp.distributed.fsdp.wrap import (CustomPolicy, lambda_auto_wrap_policy, select_units,
                                                transformer_auto_wrap_policy)
    model = _blocks()
    want = [id(b) for b in model.blocks]
    policies = [functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={nn.Sequential}),
                functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: isinstance(m, nn.Sequential)),
                CustomPolicy(lambda m: isinstance(m, nn.Sequential))]
    for policy in policies:
        assert [id(u) for u in select_units(model, policy)] == want, policy
    _train_parity(FSDP(_blocks(), auto_wrap_policy=policies[0]), _blocks(), steps=2)
    with pytest.raises(NotImplementedError, match="per-unit FSDP arguments"):
        select_units(model, CustomPolicy(lambda m: {"sharding_strategy": ShardingStrategy.NO_SHARD}
                                         if isinstance(m, nn.Sequential) else False))
    with pytest.raises(ValueError, match="should return False/True or a kwarg dict"):
        select_units(model, CustomPolicy(lambda m: 1))


def _wrapped_by_hand(seed=0):
    from hpcfsdp.distributed.fsdp.wrap import enable_wrap, wrap
    model = _blocks(seed)
    with enable_wrap(wrapper_cls=FSDP, sharding_strategy=ShardingStrategy.FULL_SHARD):
        for i, block in enumerate(model.blocks):
            model.blocks[i] = wrap(block)
        return wrap(model)


def test_enable_wrap_and_wrap_nest_units_by_hand_and_train_like_the_reference():
    from hpcfsdp.distributed.fsdp.wrap import enable_wrap, wrap
    model = _blocks()
    assert wrap(model.blocks[0]) is model.blocks[0]  # outside enable_wrap: unchanged
    with enable_wrap(wrapper_cls=FSDP):
        with pytest.raises(NotImplementedError, match="nested autowrap"):
            with enable_wrap(wrapper_cls=FSDP):
                pass
    assert wrap(nn.Linear(2, 2)).__class__ is nn.Linear  # the context has ended
    fsdp = _wrapped_by_hand()
    assert isinstance(fsdp, FSDP) and all(isinstance(b, FSDP) for b in fsdp.module.blocks)
    ref = _blocks()
    _train_parity(fsdp, ref, steps=3)
    # the state dict holds every parameter under the unwrapped model's names (inner wrappers are transparent)
    sd, rsd = fsdp.state_dict(), ref.state_dict()
    assert list(sd) == list(rsd)
    for k in rsd:
        np.testing.assert_allclose(sd[k].numpy(), rsd[k].numpy(), atol=2e-5, rtol=2e-4, err_msg=k)
    other = _wrapped_by_hand(seed=5)
    other.load_state_dict(sd)
    for k, v in other.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), sd[k].numpy(), err_msg=k)


def _trained(steps=3, seed=0):
    """An auto-wrapped FSDP model and an unsharded reference, both trained ``steps`` steps with Adam."""
    fsdp, ref = FSDP(_blocks(seed), auto_wrap_policy=_wrap_policy()), _blocks(seed)
    opt, ropt = hp.optim.Adam(fsdp.parameters(), lr=1e-2), hp.optim.Adam(ref.parameters(), lr=1e-2)
    for x in _batches(steps):
        fsdp(hp.tensor(local(x))).backward()
        opt.step()
        opt.zero_grad()
        ref(hp.tensor(x)).backward()
        ropt.step()
        ropt.zero_grad()
    return fsdp, opt, ref, ropt


def _by_name(rosd, ref):
    """An index-keyed optimizer state dict of ``ref``'s optimizer keyed by ``ref``'s parameter names."""
    names = [n for n, _ in ref.named_parameters()]
    return {"state": {names[i]: v for i, v in rosd["state"].items()},
            "param_groups": [dict(g, params=[names[i] for i in g["params"]]) for g in rosd["param_groups"]]}


def _assert_same_optim_state(osd, rosd):
    assert set(osd["state"]) == set(rosd["state"]) and [g["params"] for g in osd["param_groups"]] == \
        [g["params"] for g in rosd["param_groups"]]
    for k, entry in rosd["state"].items():
        for name, v in entry.items():
            np.testing.assert_allclose(np.asarray(hp._backend.to_numpy(osd["state"][k][name]._data)),
                                       v.numpy(), atol=2e-5, rtol=2e-4, err_msg=f"{k} {name}")


def test_full_optim_state_dict_is_the_unsharded_optimizers_and_scatters_back():
    """FSDP1's older optimizer-state API (PyTorch's FSDP tutorials save with it): the full state keyed by
    parameter name (PyTorch's keys; it was keyed by index) equals the unsharded optimizer's state dict, Adam's
    step 0-dim; scattered into a fresh model, training continues as the reference does."""
    rank = dist.get_rank()
    fsdp, opt, ref, ropt = _trained()
    with pytest.warns(FutureWarning, match="full_optim_state_dict"):
        full_osd = FSDP.full_optim_state_dict(fsdp, opt)
    if rank == 0:
        _assert_same_optim_state(full_osd, _by_name(ropt.state_dict(), ref))
        assert all(tuple(e["step"].shape) == () for e in full_osd["state"].values())
    else:
        assert full_osd == {}
    with pytest.warns(FutureWarning):
        everyone = FSDP.full_optim_state_dict(fsdp, opt, rank0_only=False)
    _assert_same_optim_state(everyone, _by_name(ropt.state_dict(), ref))
    assert all(tuple(e["step"].shape) == () for e in everyone["state"].values())
    # into a fresh model with the trained parameters: by scatter (rank 0's) and by shard (every rank's)
    for how in ("scatter", "shard"):
        fresh = FSDP(_blocks(3), auto_wrap_policy=_wrap_policy())
        fresh.load_state_dict(_full_state(fsdp))
        fopt = hp.optim.Adam(fresh.parameters(), lr=1e-2)
        with pytest.warns(FutureWarning):
            if how == "scatter":
                sharded = FSDP.scatter_full_optim_state_dict(full_osd if rank == 0 else None, fresh)
            else:
                sharded = FSDP.shard_full_optim_state_dict(everyone, fresh)
        fopt.load_state_dict(sharded)
        rcopy = _blocks(3)
        rcopy.load_state_dict(ref.state_dict())
        rcopt = hp.optim.Adam(rcopy.parameters(), lr=1e-2)
        rcopt.load_state_dict(ropt.state_dict())
        for x in _batches(2, seed=11):
            loss = fresh(hp.tensor(local(x)))
            loss.backward()
            fopt.step()
            fopt.zero_grad()
            rl = rcopy(hp.tensor(x))
            rl.backward()
            rcopt.step()
            rcopt.zero_grad()
            np.testing.assert_allclose(global_mean(loss.item()), rl.item(), rtol=1e-4, err_msg=how)


def _full_state(fsdp):
    return {k: v for k, v in fsdp.state_dict().items()}


def test_rekey_sharded_optim_state_dict_fsdp_modules_and_check_is_root():
    from hpcfsdp.distributed.fsdp import OptimStateKeyType
    fsdp, opt, ref, ropt = _trained(steps=2)
    with pytest.warns(FutureWarning):
        full_osd = FSDP.full_optim_state_dict(fsdp, opt, rank0_only=False)
    names = [n for n, _ in ref.named_parameters()]
    assert set(full_osd["state"]) == set(names) and full_osd["param_groups"][0]["params"] == names
    by_id = FSDP.rekey_optim_state_dict(full_osd, OptimStateKeyType.PARAM_ID, fsdp)
    assert by_id["param_groups"][0]["params"] == list(range(len(names))) and set(by_id["state"]) <= set(range(len(names)))
    back = FSDP.rekey_optim_state_dict(by_id, OptimStateKeyType.PARAM_NAME, fsdp)
    assert back["param_groups"][0]["params"] == sorted(names)  # PyTorch's rekey sorts each group's keys
    assert FSDP.rekey_optim_state_dict(full_osd, OptimStateKeyType.PARAM_NAME, fsdp) is full_osd
    with pytest.warns(FutureWarning):  # an index-keyed full state dict still scatters
        sharded = FSDP.shard_full_optim_state_dict(by_id, fsdp)
    assert sorted(sharded["state"]) == sorted(by_id["state"])
    with pytest.raises(TypeError, match="OptimStateKeyType"):
        FSDP.rekey_optim_state_dict(full_osd, "names", fsdp)
    with pytest.warns(FutureWarning, match="`optim_input` argument is deprecated"):  # PyTorch's: accepted, warns
        with_input = FSDP.full_optim_state_dict(fsdp, opt, optim_input=list(fsdp.parameters()), rank0_only=False)
    assert sorted(with_input["state"]) == sorted(full_osd["state"])
    with pytest.warns(FutureWarning):
        sharded = FSDP.sharded_optim_state_dict(fsdp, opt)
    assert all(isinstance(v, DTensor) for e in sharded["state"].values() for k, v in e.items() if k != "step")
    with pytest.warns(FutureWarning):
        opt.load_state_dict(FSDP.flatten_sharded_optim_state_dict(sharded, fsdp, opt))
    # hand-nested instances: the outer one is the root
    outer = _wrapped_by_hand()
    inner = [m for m in outer.module.blocks]
    assert FSDP.fsdp_modules(outer) == [outer, *inner] and FSDP.fsdp_modules(outer, root_only=True) == [outer]
    assert outer.check_is_root() and not any(m.check_is_root() for m in inner)
    assert fsdp.check_is_root() and FSDP.fsdp_modules(nn.Linear(2, 2)) == []
