"""Re-expresses PyTorch's test/distributed/_composable/fsdp/test_fully_shard_state_dict.py and the FSDP2 cases
of test/distributed/checkpoint/test_state_dict.py (get/set_model_state_dict, get/set_optimizer_state_dict)."""
import copy

import numpy as np
import pytest

from _common import MLP, Transformer, TransformerBlock, assert_close, copy_model, local, randn, to_np, world
from _framework import (
    CPUOffloadPolicy,
    DTensor,
    StateDictOptions,
    distribute_tensor,
    dist,
    fully_shard,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    nn,
    set_model_state_dict,
    set_optimizer_state_dict,
    torch,
)

pytestmark = pytest.mark.mpi(min_size=2)


def _check_state_dict_save_load(model):
    """state_dict values are DTensors holding the parameters' own storage; load_state_dict of new DTensors
    writes into the parameters."""
    _, r = world()
    for p in model.parameters():
        assert isinstance(p, DTensor)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
    sd = model.state_dict()
    assert set(sd) == {n for n, _ in model.named_parameters()}
    for name, t in sd.items():
        assert isinstance(t, DTensor), name
    with torch.no_grad():  # a write through the state dict is seen by the parameter: no copy was made
        for t in sd.values():
            t.to_local().fill_(7.0)
    for name, p in model.named_parameters():
        assert (to_np(p.to_local()) == 7.0).all(), f"{name}: state_dict() copied the parameter"
    new_sd = {k: v.detach().clone().fill_(42.0 + r) for k, v in sd.items()}
    model.load_state_dict(new_sd)
    for name, p in model.named_parameters():
        assert (to_np(p.to_local()) == 42.0 + r).all(), name


@pytest.mark.parametrize("mlp_dim", [3, 5])
def test_dp_state_dict_save_load(mlp_dim):
    """Sharded state dict save/load; reshard_after_forward=False: after a forward state_dict() reshards and
    gives the same DTensors as before it."""
    torch.manual_seed(42)
    base = nn.Sequential(MLP(mlp_dim), nn.Sequential(MLP(mlp_dim), nn.Linear(mlp_dim, mlp_dim)), MLP(mlp_dim))
    model1 = copy_model(base)
    for m in model1:
        fully_shard(m)
    fully_shard(model1)
    _check_state_dict_save_load(model1)
    model2 = copy_model(base)
    for m in model2:
        fully_shard(m, reshard_after_forward=False)
    fully_shard(model2, reshard_after_forward=False)
    ref_sd = {k: to_np(v) for k, v in model2.state_dict().items()}
    model2(randn(2, mlp_dim, seed=1))
    sd = model2.state_dict()
    assert set(sd) == set(ref_sd)
    for k, v in sd.items():
        assert isinstance(v, DTensor)
        np.testing.assert_array_equal(to_np(v), ref_sd[k])
    _check_state_dict_save_load(model2)


def test_dp_state_dict_cpu_offload():
    """CPU offload, meta init, loading the state dict piecewise (strict=False, assign=True); then forward runs
    and the state dict stays on the CPU with the loaded values."""
    torch.manual_seed(42)
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    policy = CPUOffloadPolicy(pin_memory=False)
    for m in model:
        fully_shard(m, offload_policy=policy)
    fully_shard(model, offload_policy=policy)
    fulls = {}
    for i, (name, dt) in enumerate(list(model.named_parameters())):
        full = randn(*dt.size(), seed=20 + i)
        fulls[name] = to_np(full)
        model.load_state_dict({name: distribute_tensor(full, dt.device_mesh, dt.placements)}, assign=True,
                              strict=False)
    model(randn(4, 4, seed=2)).sum()
    for name, t in model.state_dict().items():
        assert t.device.type == "cpu"
        np.testing.assert_array_equal(to_np(t), fulls[name])


def test_rank0_offload_full_state_dict():
    """full_tensor() of every sharded entry, kept on rank 0 only, equals the unsharded model's state dict."""
    w, r = world()
    torch.manual_seed(42)
    ref = Transformer(n_layers=2)
    model = copy_model(ref)
    for m in model.modules():
        if isinstance(m, TransformerBlock):
            fully_shard(m)
    fully_shard(model)
    full_sd = {}
    for name, t in model.state_dict().items():
        full = t.full_tensor()
        if r == 0:
            full_sd[name] = full.cpu()
    if r == 0:
        ref_sd = ref.state_dict()
        assert list(full_sd) == list(ref_sd)
        for k in ref_sd:
            assert full_sd[k].device.type == "cpu"
            np.testing.assert_array_equal(to_np(full_sd[k]), to_np(ref_sd[k]))
    else:
        assert full_sd == {}


# ------------------------------------------------------------------ test/distributed/checkpoint/test_state_dict.py


class UnitModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(10, 10)
        self.seq = nn.Sequential(nn.ReLU(), nn.Linear(10, 10), nn.ReLU())
        self.l2 = nn.Linear(10, 10)

    def forward(self, x):
        return self.l2(self.seq(self.l1(x)))


class CompositeParamModel(nn.Module):
    """A linear, two units, a bare parameter and a buffer (the role of common_dist_composable's model)."""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(10, 10)
        self.u1 = UnitModule()
        self.u2 = UnitModule()
        self.p = nn.Parameter(randn(10, 10, seed=5))
        self.register_buffer("buffer", randn(10, 10, seed=6), persistent=True)

    def forward(self, x):
        a = self.u2(self.u1(self.l(x)))
        b = self.p
        return a @ b


def _init_fsdp2(reshard_after_forward, optimizer_class):
    torch.manual_seed(0)
    orig = CompositeParamModel()
    orig_optim = optimizer_class(orig.parameters(), lr=1e-3)
    dist_model = copy_model(orig)
    for u in (dist_model.u1, dist_model.u2):
        fully_shard(u, reshard_after_forward=reshard_after_forward)
    fully_shard(dist_model, reshard_after_forward=reshard_after_forward)
    dist_optim = optimizer_class(dist_model.parameters(), lr=1e-3)
    return orig, orig_optim, dist_model, dist_optim


def _train_same_batch(model, optim, dist_model, dist_optim, steps=3):
    for i in range(steps):
        batch = randn(4, 10, seed=i)  # the same batch on every rank: the unsharded model is the reference
        for o in (optim, dist_optim):
            o.zero_grad()
        model(batch).sum().backward()
        dist_model(batch).sum().backward()
        optim.step()
        dist_optim.step()
    optim.zero_grad()
    dist_optim.zero_grad()


def _full(t):
    return to_np(t) if hasattr(t, "shape") else t


def _verify_msd(msd, dist_msd):
    assert set(msd) == set(dist_msd)
    for k, v in msd.items():
        np.testing.assert_allclose(_full(dist_msd[k]), to_np(v), rtol=1e-5, atol=1e-6, err_msg=k)


def _verify_osd(model, optim, dist_osd):
    """The distributed optimizer state (keyed by FQN) equals the unsharded optimizer's (keyed by index)."""
    osd = optim.state_dict()
    names = [n for n, _ in model.named_parameters()]
    for i, name in enumerate(names):
        for key, value in osd["state"][i].items():
            np.testing.assert_allclose(_full(dist_osd["state"][name][key]), _full(value), rtol=1e-5, atol=1e-6,
                                       err_msg=f"{name}.{key}")
    assert len(dist_osd["param_groups"]) == len(osd["param_groups"])
    for g, dg in zip(osd["param_groups"], dist_osd["param_groups"]):
        assert dg["lr"] == g["lr"]
        assert sorted(dg["params"]) == sorted(names)


@pytest.mark.parametrize("optimizer", ["Adam", "AdamW"])
@pytest.mark.parametrize("reshard_after_forward", [True, False])
def test_fsdp2(reshard_after_forward, optimizer):
    """get_state_dict of an FSDP2 model equals the unsharded model's; set_state_dict into a fresh one restores
    it; training on continues identically."""
    cls = getattr(torch.optim, optimizer)
    model, optim, dist_model, dist_optim = _init_fsdp2(reshard_after_forward, cls)
    _train_same_batch(model, optim, dist_model, dist_optim)
    msd = model.state_dict()
    dist_msd, dist_osd = get_state_dict(dist_model, optimizers=dist_optim)
    _verify_msd(msd, dist_msd)
    _verify_osd(model, optim, dist_osd)
    _, _, new_model, new_optim = _init_fsdp2(reshard_after_forward, cls)
    set_model_state_dict(new_model, model_state_dict=dist_msd)
    set_optimizer_state_dict(new_model, optimizers=new_optim, optim_state_dict=dist_osd)
    msd2, osd2 = get_state_dict(new_model, optimizers=new_optim)
    _verify_msd(msd, msd2)
    _verify_osd(model, optim, osd2)
    _train_same_batch(model, optim, new_model, new_optim, steps=1)
    _verify_msd(model.state_dict(), get_model_state_dict(new_model))


def test_strict():
    model = CompositeParamModel()
    fully_shard(model)
    sd = get_model_state_dict(model)
    sd["abc"] = torch.zeros(10)
    with pytest.raises(RuntimeError, match="(?i)unexpected key"):
        set_model_state_dict(model, model_state_dict=sd)
    key = next(k for k in sd if k != "abc")
    sd.pop(key)
    incompatible = set_model_state_dict(model, model_state_dict=sd, options=StateDictOptions(strict=False))
    assert list(incompatible.missing_keys) == [key]
    assert list(incompatible.unexpected_keys) == ["abc"]
    sd.pop("abc")
    with pytest.raises(RuntimeError, match="(?i)missing key"):
        set_model_state_dict(model, model_state_dict=sd)


def test_cpu_offload_full_state_dict():
    """cpu_offload and full_state_dict options: everything on the CPU, plain tensors, only rank 0 holds them."""
    _, r = world()
    model, optim, dist_model, dist_optim = _init_fsdp2(True, torch.optim.Adam)
    _train_same_batch(model, optim, dist_model, dist_optim, steps=1)
    msd, osd = get_state_dict(dist_model, dist_optim, options=StateDictOptions(cpu_offload=True))
    assert all(v.device.type == "cpu" for v in msd.values())
    msd, osd = get_state_dict(dist_model, dist_optim, options=StateDictOptions(full_state_dict=True))
    assert not any(isinstance(v, DTensor) for v in msd.values())
    assert not any(isinstance(v, DTensor) for s in osd["state"].values() for v in s.values())
    _verify_msd(model.state_dict(), msd)
    msd, osd = get_state_dict(dist_model, dist_optim,
                              options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if r == 0:
        assert all(v.device.type == "cpu" and not isinstance(v, DTensor) for v in msd.values())
        _verify_msd(model.state_dict(), msd)
        _verify_osd(model, optim, osd)
    else:
        assert msd == {} and osd == {}


def test_broadcast_from_rank0():
    """Full state dicts loaded from rank 0 only (broadcast_from_rank0): the model and optimizer come back; a
    missing key still raises."""
    _, r = world()
    model, optim, dist_model, dist_optim = _init_fsdp2(True, torch.optim.Adam)
    _train_same_batch(model, optim, dist_model, dist_optim, steps=1)
    full = StateDictOptions(full_state_dict=True)
    states = get_model_state_dict(model)
    optim_states = get_optimizer_state_dict(model, optim)

    def check(equal):
        fsd = get_model_state_dict(dist_model, options=full)
        same = all(np.allclose(to_np(fsd[k]), to_np(v), rtol=1e-5, atol=1e-6) for k, v in states.items())
        assert same == equal

    check(True)
    _train_same_batch(model.__class__(), torch.optim.Adam(model.__class__().parameters()), dist_model,
                      dist_optim, steps=1)
    check(False)
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(dist_model, model_state_dict=copy.deepcopy(states) if r == 0 else {}, options=opts)
    set_optimizer_state_dict(dist_model, dist_optim,
                             optim_state_dict=copy.deepcopy(optim_states) if r == 0 else {}, options=opts)
    check(True)
    _verify_osd(model, optim, get_optimizer_state_dict(dist_model, dist_optim, options=full))
    partial = copy.deepcopy(states)
    partial.pop(next(iter(partial)))
    with pytest.raises(RuntimeError, match="(?i)missing key"):
        set_model_state_dict(dist_model, model_state_dict=partial if r == 0 else {}, options=opts)


def test_flattened_osd():
    model, optim, dist_model, dist_optim = _init_fsdp2(True, torch.optim.AdamW)
    _train_same_batch(model, optim, dist_model, dist_optim, steps=1)
    osd1 = get_optimizer_state_dict(dist_model, dist_optim)
    osd2 = get_optimizer_state_dict(dist_model, dist_optim, options=StateDictOptions(flatten_optimizer_state_dict=True))
    assert any("." in k and k.startswith("state.") for k in osd2)
    for osd in (osd2, osd1):
        optim2 = torch.optim.AdamW(dist_model.parameters(), lr=1e-3)
        set_optimizer_state_dict(dist_model, optimizers=optim2, optim_state_dict=osd)
        _verify_osd(model, optim, get_optimizer_state_dict(dist_model, optim2))


def test_optim_state_dict_param_matching():
    """An LR scheduler's initial_lr in the full optimizer state dict reaches a new optimizer through
    broadcast_from_rank0."""
    _, r = world()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4, bias=False) for _ in range(2)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.optim.lr_scheduler.LambdaLR(optim, lr_lambda=[lambda epoch: 0.95 ** epoch])
    osd = get_optimizer_state_dict(model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if r == 0:
        assert "initial_lr" in osd["param_groups"][0]
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    assert "initial_lr" not in optim.param_groups[0]
    set_optimizer_state_dict(model, optim, optim_state_dict=osd,
                             options=StateDictOptions(broadcast_from_rank0=True, full_state_dict=True))
    if r == 0:
        assert "initial_lr" in optim.param_groups[0]


@pytest.mark.parametrize("broadcast_from_rank0", [False, True])
def test_setting_meta_device_model(broadcast_from_rank0):
    """A meta-device FSDP2 model takes a full CPU state dict (optionally from rank 0 only)."""
    _, r = world()
    torch.manual_seed(0)
    with torch.device("meta"):
        meta_model = nn.Sequential(*[nn.Linear(4, 4, bias=False) for _ in range(2)])
    for layer in meta_model:
        fully_shard(layer)
    fully_shard(meta_model)
    cpu_model = nn.Sequential(*[nn.Linear(4, 4, bias=False) for _ in range(2)])
    with torch.no_grad():  # values from NumPy: the same on every rank whatever the RNG did
        for i, p in enumerate(cpu_model.parameters()):
            p.copy_(randn(4, 4, seed=30 + i))
    full_sd = cpu_model.state_dict()
    load = full_sd  # every rank passes it, as PyTorch's test does (test_broadcast_from_rank0 passes {} off rank 0)
    set_model_state_dict(meta_model, model_state_dict=load,
                         options=StateDictOptions(full_state_dict=True, strict=False,
                                                  broadcast_from_rank0=broadcast_from_rank0))
    for k, v in meta_model.state_dict().items():
        np.testing.assert_array_equal(to_np(v), to_np(full_sd[k]))


def test_set_cpu_model_state_dict_broadcast_from_rank0():
    _, r = world()
    torch.manual_seed(42)
    model = nn.Linear(2, 2)
    expected = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    set_model_state_dict(model, expected if r == 0 else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    for (k, v), (ek, ev) in zip(model.state_dict().items(), expected.items()):
        assert k == ek
        np.testing.assert_array_equal(to_np(v), to_np(ev))


def test_shared_weight():
    """Tied embedding/decoder weights under fully_shard: the state dicts round-trip."""
    class TiedEmbeddingModel(nn.Module):
        def __init__(self, vocab, dim):
            super().__init__()
            self.embedding = nn.Embedding(vocab, dim)
            self.decoder = nn.Linear(dim, vocab)
            self.decoder.weight = self.embedding.weight

        def forward(self, ids):
            return self.decoder(self.embedding(ids))

    torch.manual_seed(0)
    model = TiedEmbeddingModel(20, 6)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dist_model = copy_model(model)
    fully_shard(dist_model)
    dist_optim = torch.optim.AdamW(dist_model.parameters(), lr=1e-3)
    ids = torch.tensor(np.arange(8).reshape(2, 4) % 20)
    for m, o in ((model, optim), (dist_model, dist_optim)):
        m(ids).sum().backward()
        o.step()
        o.zero_grad()
    msd, osd = get_state_dict(dist_model, optimizers=dist_optim)
    _verify_msd(model.state_dict(), msd)
    _verify_osd(model, optim, osd)
    set_state_args = (msd, osd)
    new_model = copy_model(TiedEmbeddingModel(20, 6))
    fully_shard(new_model)
    new_optim = torch.optim.AdamW(new_model.parameters(), lr=1e-3)
    set_model_state_dict(new_model, set_state_args[0])
    set_optimizer_state_dict(new_model, new_optim, set_state_args[1])
    _verify_msd(model.state_dict(), get_model_state_dict(new_model))
    assert new_model.decoder.weight is new_model.embedding.weight


def test_multi_param_groups():
    """Two parameter groups (one with its own lr, and an empty one): the optimizer state dict round-trips with
    every option combination."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    fully_shard(model[0])
    fully_shard(model[1])
    fully_shard(model)
    for kwargs in ({"params": [{"params": [model[0].weight]}, {"params": [model[1].weight], "lr": 0.2}], "lr": 0.1},
                   {"params": [{"params": [model[0].weight, model[1].weight]}, {"params": [], "lr": 0.2}],
                    "lr": 0.1}):
        for full_state_dict in (False, True):
            for broadcast in (False, True):
                if broadcast and not full_state_dict:
                    continue
                optim = torch.optim.AdamW(**kwargs)
                model(randn(4, 8, seed=1)).sum().backward()
                optim.step()
                optim.zero_grad()
                opts = StateDictOptions(full_state_dict=full_state_dict, broadcast_from_rank0=broadcast)
                osd = get_optimizer_state_dict(model, optim, options=opts)
                new_optim = torch.optim.AdamW(**kwargs)
                set_optimizer_state_dict(model, new_optim, osd, options=opts)
                assert [g["lr"] for g in new_optim.param_groups] == [g["lr"] for g in optim.param_groups]
                for p in optim.state:
                    for key, v in optim.state[p].items():
                        np.testing.assert_array_equal(_full(new_optim.state[p][key]), _full(v))
                for p in model.parameters():
                    p.grad = None


def test_extra_state_and_non_persistent_buffers():
    """get/set_model_state_dict keep a module's extra state and leave non-persistent buffers out."""
    class WithExtra(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.register_buffer("dont_save_me", torch.zeros(3), persistent=False)

        def get_extra_state(self):
            return "MyState"

        def set_extra_state(self, state):
            self.loaded = state

        def forward(self, x):
            return self.lin(x)

    model = WithExtra()
    sd = get_model_state_dict(model)
    assert sd["_extra_state"] == "MyState" and "dont_save_me" not in sd
    target = copy_model(model)
    set_model_state_dict(target, sd)
    assert target.loaded == "MyState"
    assert set(get_model_state_dict(target)) == set(model.state_dict())


def test_single_process_model():
    """An unsharded model: get_state_dict equals its own state_dict, and set restores after a change."""
    model, optim, _, _ = _init_fsdp2(True, torch.optim.Adam)
    model(randn(4, 10, seed=0)).sum().backward()
    optim.step()
    optim.zero_grad()
    msd, osd = get_state_dict(model, optim)
    _verify_msd(model.state_dict(), msd)
    _verify_osd(model, optim, osd)
    saved = {k: to_np(v) for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    set_model_state_dict(model, {k: torch.tensor(v.astype(np.float32)) for k, v in saved.items()})
    _verify_msd({k: torch.tensor(v) for k, v in saved.items()}, model.state_dict())
    assert dist.get_world_size() >= 2 and local is not None and assert_close is not None
