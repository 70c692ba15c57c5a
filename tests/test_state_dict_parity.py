"""PyTorch's checkpoint.state_dict behaviour on sharded models: meta-device loads, rank-0 broadcast, assign=True."""
import warnings
from dataclasses import fields

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp.distributed.checkpoint import state_dict as dsd
from hpcfsdp.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from hpcfsdp.distributed.fsdp import fully_shard
from hpcfsdp.distributed.tensor import DTensor, distribute_tensor

from _fsdp_util import full, gpt_batches, local, tiny_gpt, world

pytestmark = pytest.mark.mpi(min_size=2)

FULL_BCAST = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)


def _shard(model):
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def _meta_model(seed=1):
    with hp.device("meta"):
        return _shard(tiny_gpt(seed))


def _train(model, opt, batches):
    losses = []
    for x, y in batches:
        _, loss = model(hp.tensor(local(x)), hp.tensor(local(y)))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.item()))
    return losses


def _reference():
    """An unsharded model's full state dict (the same on every rank)."""
    ref = tiny_gpt(seed=0)
    return {k: v.numpy().copy() for k, v in ref.state_dict().items()}


@pytest.mark.mpi(min_size=1)
def test_options_have_pytorchs_fields_and_defaults():
    want = {"full_state_dict": False, "cpu_offload": False, "ignore_frozen_params": False,
            "keep_submodule_prefixes": True, "strict": True, "broadcast_from_rank0": False,
            "flatten_optimizer_state_dict": False, "dsd_fqn_modifiers": "_fqn_modifiers"}
    o = StateDictOptions()
    assert {f.name: getattr(o, f.name) for f in fields(StateDictOptions)} == want
    with pytest.raises(ValueError, match="full_state_dict must be True when broadcast_from_rank0"):
        set_model_state_dict(tiny_gpt(), {}, options=StateDictOptions(broadcast_from_rank0=True))
    import hpcfsdp.distributed.checkpoint as dcp
    assert dcp.set_model_state_dict is dsd.set_model_state_dict and dcp.StateDictOptions is StateDictOptions
    assert callable(dsd._init_optim_state)


@pytest.mark.timeout(120)
def test_broadcast_from_rank0_into_meta_model_materialises_the_shards():
    _, rank = world()
    ref = _reference()
    model = _meta_model()
    sd = {k: hp.tensor(v) for k, v in ref.items()} if rank == 0 else {}
    set_model_state_dict(model, sd, options=FULL_BCAST)
    got = get_model_state_dict(model)
    assert set(got) == set(ref)
    for k, v in got.items():
        assert isinstance(v, DTensor) and not hp._backend.is_meta_array(v._data), k
        np.testing.assert_array_equal(full(v), ref[k], err_msg=k)
    # it trains exactly like the unsharded reference
    refm = tiny_gpt(seed=0)
    w, _ = world()
    batches = gpt_batches(2, 4 * w + 1)
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2)
    ropt = hp.optim.AdamW(refm.parameters(), lr=1e-2)
    losses = _train(model, opt, batches)
    for x, y in batches:
        _, loss = refm(hp.tensor(x), hp.tensor(y))
        loss.backward()
        ropt.step()
        ropt.zero_grad()
    for k, v in get_model_state_dict(model).items():
        np.testing.assert_allclose(full(v), refm.state_dict()[k].numpy(), rtol=2e-4, atol=2e-5, err_msg=k)
    assert all(np.isfinite(losses))


@pytest.mark.timeout(120)
def test_full_state_dict_on_every_rank_into_meta_model():
    ref = _reference()
    model = _meta_model()
    res = set_model_state_dict(model, {k: hp.tensor(v) for k, v in ref.items()},
                               options=StateDictOptions(full_state_dict=True))
    assert list(res.missing_keys) == [] and list(res.unexpected_keys) == []
    for k, v in get_model_state_dict(model).items():
        np.testing.assert_array_equal(full(v), ref[k], err_msg=k)


@pytest.mark.timeout(120)
def test_broadcast_errors_are_raised_on_every_rank():
    _, rank = world()
    ref = _reference()
    model = _meta_model()
    bad = {k: hp.tensor(v) for k, v in ref.items() if k != "lm_head.weight"} if rank == 0 else {}
    with pytest.raises(RuntimeError, match="lm_head.weight"):
        set_model_state_dict(model, bad, options=FULL_BCAST)
    wrong = {k: hp.tensor(v[:1] if v.ndim else v) for k, v in ref.items()} if rank == 0 else {}
    with pytest.raises(RuntimeError, match="size mismatch"):
        set_model_state_dict(model, wrong, options=FULL_BCAST)
    notadict = [1] if rank == 0 else {}
    with pytest.raises(TypeError, match="rank 0"):
        set_model_state_dict(model, notadict, options=FULL_BCAST)
    # the ranks are still in step: a good load works afterwards
    set_model_state_dict(model, {k: hp.tensor(v) for k, v in ref.items()} if rank == 0 else {}, options=FULL_BCAST)
    for k, v in get_model_state_dict(model).items():
        np.testing.assert_array_equal(full(v), ref[k], err_msg=k)


def _trained(seed=0, steps=2):
    w, _ = world()
    model = _shard(tiny_gpt(seed))
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2)
    _train(model, opt, gpt_batches(steps, 4 * w + 1))
    return model, opt


@pytest.mark.timeout(120)
def test_optimizer_broadcast_from_rank0_with_empty_dict_elsewhere():
    w, rank = world()
    model, opt = _trained()
    full_osd = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    full_msd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    # a fresh meta model and optimizer, loaded from rank 0 only
    new = _meta_model(seed=5)
    set_model_state_dict(new, full_msd if rank == 0 else {}, options=FULL_BCAST)
    nopt = hp.optim.AdamW(new.parameters(), lr=1e-2)
    set_optimizer_state_dict(new, nopt, full_osd if rank == 0 else {}, options=FULL_BCAST)
    got = get_optimizer_state_dict(new, nopt, options=StateDictOptions(full_state_dict=True))
    assert got["param_groups"] == full_osd["param_groups"]
    assert set(got["state"]) == set(full_osd["state"])
    for name, entry in full_osd["state"].items():
        for k, v in entry.items():
            g = got["state"][name][k]
            if isinstance(v, hp.Tensor):
                np.testing.assert_array_equal(full(g), full(v), err_msg=f"{name}.{k}")
            else:
                assert g == v
    # the next steps match the uninterrupted run bit for bit
    batches = gpt_batches(2, 4 * w + 1, seed=7)
    assert _train(new, nopt, batches) == _train(model, opt, batches)


@pytest.mark.timeout(120)
def test_optimizer_broadcast_error_on_rank0_is_raised_everywhere():
    _, rank = world()
    model, opt = _trained(steps=1)
    with pytest.raises(ValueError, match="rank 0"):
        set_optimizer_state_dict(model, opt, {"oops": 1} if rank == 0 else {}, options=FULL_BCAST)
    # still in step
    osd = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    set_optimizer_state_dict(model, opt, osd if rank == 0 else {}, options=FULL_BCAST)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("meta", [True, False])
def test_load_state_dict_assign_is_adopted_by_fsdp(meta):
    ref = _reference()
    model = _meta_model() if meta else _shard(tiny_gpt(seed=3))
    mesh = next(p for p in model.parameters() if isinstance(p, DTensor)).device_mesh
    local_sd = model.state_dict()
    sd = {}
    for k, like in local_sd.items():
        t = hp.tensor(ref[k])
        sd[k] = hp.nn.Parameter(distribute_tensor(t, mesh, like.placements)) if isinstance(like, DTensor) else t
    res = model.load_state_dict(sd, strict=False, assign=True)
    assert list(res.missing_keys) == [] and list(res.unexpected_keys) == []
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(full(v), ref[k], err_msg=k)
    # the forward uses the assigned weights (not stale or meta shards)
    refm = tiny_gpt(seed=0)
    w, _ = world()
    x, y = gpt_batches(1, 4 * w + 1)[0]
    _, loss = model(hp.tensor(local(x)), hp.tensor(local(y)))
    _, rloss = refm(hp.tensor(x), hp.tensor(y))
    total = hp.tensor(np.array([float(loss.item())]))
    dist.all_reduce(total)
    np.testing.assert_allclose(total.numpy()[0] / w, float(rloss.item()), rtol=1e-5)


@pytest.mark.timeout(60)
def test_assign_of_a_plain_tensor_to_a_sharded_parameter_is_refused():
    ref = _reference()
    model = _shard(tiny_gpt(seed=3))
    with pytest.raises(RuntimeError, match="needs a DTensor"):
        model.load_state_dict({k: hp.tensor(v) for k, v in ref.items()}, assign=True)


@pytest.mark.timeout(60)
def test_copy_into_meta_warns_like_pytorch():
    model = _meta_model()
    sd = {k: DTensor.from_local(hp.tensor(np.zeros(v._data.shape, v.dtype)), v.device_mesh, v.placements,
                                shape=v.shape) if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        model.load_state_dict(sd)
    assert any("copying from a non-meta parameter" in str(r.message) for r in rec)


@pytest.mark.timeout(60)
def test_numpy_arrays_load_through_set_model_state_dict():
    ref = _reference()
    model = _shard(tiny_gpt(seed=3))
    set_model_state_dict(model, ref, options=StateDictOptions(full_state_dict=True))
    for k, v in get_model_state_dict(model).items():
        np.testing.assert_array_equal(full(v), ref[k], err_msg=k)


@pytest.mark.timeout(60)
def test_broadcast_keeps_bfloat16_and_refuses_dtensors_on_rank0():
    _, rank = world()
    with hp.device("meta"):
        m = hp.nn.Sequential(hp.nn.Linear(3, 5), hp.nn.Linear(5, 2)).to(hp.bfloat16)
    fully_shard(m)
    rng = np.random.default_rng(0)
    ref = {k: rng.standard_normal(tuple(v.shape)).astype(np.float32) for k, v in m.state_dict().items()}
    sd = {k: hp.tensor(v).to(hp.bfloat16) for k, v in ref.items()}
    set_model_state_dict(m, sd if rank == 0 else {}, options=FULL_BCAST)
    for k, v in get_model_state_dict(m).items():
        assert v.dtype == hp.bfloat16
        np.testing.assert_array_equal(full(v), sd[k].numpy(), err_msg=k)
    sharded = get_model_state_dict(m)
    with pytest.raises(TypeError, match="DTensor; rank 0 must hold full tensors"):
        set_model_state_dict(m, sharded if rank == 0 else {}, options=FULL_BCAST)


@pytest.mark.timeout(120)
def test_flattened_optimizer_state_dict_round_trips_and_submodules_filter():
    w, _ = world()
    model, opt = _trained(steps=1)
    flat_opts = StateDictOptions(flatten_optimizer_state_dict=True)
    flat = get_optimizer_state_dict(model, opt, options=flat_opts)
    assert "state.transformer.wte.weight.exp_avg" in flat and "param_groups.transformer.h.0.attn.c_attn.weight.lr" in flat
    assert all(isinstance(k, str) for k in flat)
    want = {k: (full(v) if isinstance(v, hp.Tensor) else v) for k, v in flat.items()}
    new = _shard(tiny_gpt(seed=9))
    nopt = hp.optim.AdamW(new.parameters(), lr=0.5)
    set_optimizer_state_dict(new, nopt, flat, options=flat_opts)
    got = get_optimizer_state_dict(new, nopt, options=flat_opts)
    assert set(got) == set(want)
    for k, v in got.items():
        if isinstance(v, hp.Tensor):
            np.testing.assert_array_equal(full(v), want[k], err_msg=k)
        else:
            assert v == want[k], k
    block = model.blocks[0]
    with pytest.warns(FutureWarning, match="deprecated"):
        sub = get_model_state_dict(model, submodules={block})
    assert sub and all(k.startswith("transformer.h.0.") for k in sub)
    with pytest.warns(FutureWarning):
        short = get_model_state_dict(model, submodules={block},
                                     options=StateDictOptions(keep_submodule_prefixes=False))
    assert sorted(short) == sorted(k[len("transformer.h.0."):] for k in sub)


class _WithExtra(hp.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = hp.nn.Linear(4, 6)
        self.tag = "fresh"

    def get_extra_state(self):
        return {"tag": self.tag}

    def set_extra_state(self, state):
        self.tag = state["tag"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("broadcast", [True, False])
def test_full_load_carries_extra_state(broadcast):
    _, rank = world()
    hp.manual_seed(0)  # the same source on every rank
    src = _WithExtra()
    src.tag = "saved"
    sd = src.state_dict()
    with hp.device("meta"):
        m = _WithExtra()
    fully_shard(m)
    opts = FULL_BCAST if broadcast else StateDictOptions(full_state_dict=True)
    set_model_state_dict(m, sd if (rank == 0 or not broadcast) else {}, options=opts)
    assert m.tag == "saved"
    for k, v in get_model_state_dict(m).items():
        if k != "_extra_state":
            np.testing.assert_array_equal(full(v), sd[k].numpy(), err_msg=k)


@pytest.mark.timeout(120)
def test_get_and_set_state_dict_with_two_optimizers():
    w, _ = world()
    model = _shard(tiny_gpt(seed=0))
    params = list(model.named_parameters())
    first = [p for n, p in params if n.startswith("transformer.h.")]
    rest = [p for n, p in params if not n.startswith("transformer.h.")]
    opts = [hp.optim.AdamW(first, lr=1e-2), hp.optim.SGD(rest, lr=1e-2, momentum=0.9)]
    batches = gpt_batches(3, 4 * w + 1)
    for x, y in batches[:2]:
        _, loss = model(hp.tensor(local(x)), hp.tensor(local(y)))
        loss.backward()
        for o in opts:
            o.step()
            o.zero_grad()
    msd, osd = dsd.get_state_dict(model, opts)
    assert len(osd["param_groups"]) == 2 and set(osd["state"]) == {n for n, _ in params}
    new = _shard(tiny_gpt(seed=4))
    nparams = dict(new.named_parameters())
    nopts = [hp.optim.AdamW([nparams[n] for n, _ in params if n.startswith("transformer.h.")], lr=1.0),
             hp.optim.SGD([nparams[n] for n, _ in params if not n.startswith("transformer.h.")], lr=1.0)]
    res = dsd.set_state_dict(new, nopts, model_state_dict=msd, optim_state_dict=osd)
    assert list(res.missing_keys) == [] and list(res.unexpected_keys) == []
    assert nopts[0].param_groups[0]["lr"] == 1e-2 and nopts[1].param_groups[0]["momentum"] == 0.9

    def step(m, os_, x, y):
        _, loss = m(hp.tensor(local(x)), hp.tensor(local(y)))
        loss.backward()
        for o in os_:
            o.step()
            o.zero_grad()
        return float(loss.item())

    x, y = batches[2]
    assert step(new, nopts, x, y) == step(model, opts, x, y)
    for n, p in model.named_parameters():
        np.testing.assert_array_equal(full(nparams[n]), full(p), err_msg=n)
