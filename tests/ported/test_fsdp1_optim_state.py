"""Re-expresses PyTorch's test/distributed/fsdp/test_fsdp_optim_state.py (FSDP1 optimizer state dicts) on CPU."""
import copy

import pytest

from _common import assert_close, fsdp1_clean, fsdp1_cpu, local, randn, to_np, world
from _framework import (
    FSDP,
    IS_TORCH,
    FullOptimStateDictConfig,
    ModuleWrapPolicy,
    OptimStateKeyType,
    StateDictType,
    nn,
    torch,
)

pytestmark = pytest.mark.mpi(min_size=2)


class Block(nn.Module):
    def __init__(self, dim=4):
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x):
        return self.lin(x).relu()


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(Block(), Block(), nn.Linear(4, 4))


def _fsdp(seed=0, **kw):
    return FSDP(_model(seed), auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=fsdp1_cpu(), **kw)


def _train(model, optim, steps=2, seed=0):
    w, _ = world()
    for it in range(steps):
        x = randn(2 * w, 4, seed=seed + it)
        model(local(x)).sum().backward()
        optim.step()
        optim.zero_grad()


def _reference_state(steps=2):
    """{name: {state key: float64 array}} of an unsharded Adam on the global batch (the expected full state)."""
    w, _ = world()
    ref = _model()
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for it in range(steps):
        x = randn(2 * w, 4, seed=it)
        (ref(x).sum() / w).backward()
        opt.step()
        opt.zero_grad()
    names = [n for n, _ in ref.named_parameters()]
    return {names[i]: {k: to_np(v) for k, v in st.items()} for i, st in opt.state_dict()["state"].items()}


def _check_state(state_by_name, expected):
    assert sorted(state_by_name) == sorted(expected), (sorted(state_by_name), sorted(expected))
    for name, st in expected.items():
        for k, v in st.items():
            assert_close(state_by_name[name][k], v, rtol=1e-4, atol=1e-5, msg=f"{name}.{k}")
    return len(expected)


@pytest.mark.parametrize("rank0_only", [False, True])
def test_full_optim_state_dict_keys_and_values(rank0_only):
    """full_optim_state_dict: the unsharded optimizer's state under parameter names (PyTorch keys the FSDP1
    full optimizer state dict by fully qualified name), Adam's ``step`` a 0-dim tensor, values equal to an
    unsharded Adam's (test_full_optim_state_dict_keys, _test_optim_state_dict)."""
    _, r = world()
    model = _fsdp()
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    _train(model, optim)
    osd = FSDP.full_optim_state_dict(model, optim, rank0_only=rank0_only)
    if rank0_only and r != 0:
        assert osd == {}
        return
    keys = list(osd["state"])
    assert all(isinstance(k, str) for k in keys), keys
    state = {fsdp1_clean(k): v for k, v in osd["state"].items()}
    for name, st in state.items():
        assert tuple(st["step"].shape) == (), (name, st["step"].shape)
    _check_state(state, _reference_state())
    assert sorted(fsdp1_clean(k) for g in osd["param_groups"] for k in g["params"]) == sorted(state)


@pytest.mark.parametrize("scatter", [False, True])
def test_shard_full_optim_state_dict_round_trip(scatter):
    """shard_full_optim_state_dict / scatter_full_optim_state_dict: the full state dict loads into a new
    FSDP model's optimizer, which then holds the same state and steps as the original
    (test_shard_full_optim_state_dict_nested, test_scatter_full_optim_state_dict_nested)."""
    _, r = world()
    model = _fsdp()
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    _train(model, optim)
    full = FSDP.full_optim_state_dict(model, optim, rank0_only=scatter)
    new_model = _fsdp(seed=1)
    new_optim = torch.optim.Adam(new_model.parameters(), lr=1e-2)
    if scatter:
        sharded = FSDP.scatter_full_optim_state_dict(full if r == 0 else None, new_model)
    else:
        sharded = FSDP.shard_full_optim_state_dict(full, new_model)
    new_optim.load_state_dict(sharded)
    again = FSDP.full_optim_state_dict(new_model, new_optim, rank0_only=False)
    expected = _reference_state()
    _check_state({fsdp1_clean(k): v for k, v in again["state"].items()}, expected)
    assert new_optim.state and sorted(fsdp1_clean(k) for k in again["state"]) == sorted(expected)  # all arrived


def test_shard_full_optim_state_dict_different_param_order():
    """Ranks whose optimizers take the parameters in different orders (PyTorch's use_diff_optim_inputs):
    shard_full_optim_state_dict(optim=...) maps each rank's own order; every rank loads the same state."""
    _, r = world()
    model = _fsdp()
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    _train(model, optim)
    full = FSDP.full_optim_state_dict(model, optim, rank0_only=False)
    new_model = _fsdp(seed=1)
    params = list(new_model.parameters())
    if r % 2 == 1:
        params = params[::-1]
    new_optim = torch.optim.Adam(params, lr=1e-2)
    new_optim.load_state_dict(FSDP.shard_full_optim_state_dict(full, new_model, optim=new_optim))
    again = FSDP.full_optim_state_dict(new_model, new_optim, rank0_only=False)
    n = _check_state({fsdp1_clean(k): v for k, v in again["state"].items()}, _reference_state())
    assert n == len(full["state"]) > 0  # every saved state back, whichever order this rank's optimizer holds


def test_rekey_optim_state_dict():
    """rekey_optim_state_dict turns a full state dict keyed by name into one keyed by index and back
    (test_rekey_optim_state_dict_to_ids, _to_names); the id-keyed one loads into an unwrapped optimizer."""
    model = _fsdp()
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    _train(model, optim)
    full = FSDP.full_optim_state_dict(model, optim, rank0_only=False)
    plain = _model(seed=1)  # as PyTorch's test: rekeyed against the unwrapped model
    by_id = FSDP.rekey_optim_state_dict(full, OptimStateKeyType.PARAM_ID, plain)
    assert all(isinstance(k, int) for k in by_id["state"])
    plain_optim = torch.optim.Adam(plain.parameters(), lr=1e-2)
    plain_optim.load_state_dict(by_id)
    names = [n for n, _ in plain.named_parameters()]
    state = {names[i]: {k: to_np(v) for k, v in st.items()} for i, st in plain_optim.state_dict()["state"].items()}
    _check_state(state, _reference_state())
    by_name = FSDP.rekey_optim_state_dict(by_id, OptimStateKeyType.PARAM_NAME, plain)
    assert sorted(fsdp1_clean(k) for k in by_name["state"]) == sorted(names)


@pytest.mark.parametrize("sd_type", ["full", "sharded"])
def test_optim_state_dict_round_trip(sd_type):
    """FSDP.optim_state_dict / optim_state_dict_to_load under FULL and SHARDED state-dict types: the state
    comes back keyed by name and reloads into a new model's optimizer (test_optim_state_dict_*)."""
    model = _fsdp()
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    _train(model, optim)
    sd_t = StateDictType.FULL_STATE_DICT if sd_type == "full" else StateDictType.SHARDED_STATE_DICT
    osd_cfg = FullOptimStateDictConfig(rank0_only=False) if sd_type == "full" else None
    with FSDP.state_dict_type(model, sd_t, optim_state_dict_config=osd_cfg):
        osd = FSDP.optim_state_dict(model, optim)
    assert all(isinstance(k, str) for k in osd["state"])
    new_model = _fsdp(seed=1)
    new_optim = torch.optim.Adam(new_model.parameters(), lr=1e-2)
    with FSDP.state_dict_type(new_model, sd_t, optim_state_dict_config=osd_cfg):
        new_optim.load_state_dict(FSDP.optim_state_dict_to_load(new_model, new_optim, osd))
    again = FSDP.full_optim_state_dict(new_model, new_optim, rank0_only=False)
    _check_state({fsdp1_clean(k): v for k, v in again["state"].items()}, _reference_state())


# ---------------------------------------------------------------------------------------------- TestDummyModel cases
class DummyModel(nn.Module):
    """test_fsdp_optim_state.py's TestDummyModel (``no_grad``: net1 frozen)."""

    def __init__(self, no_grad=False):
        super().__init__()
        torch.manual_seed(0)
        self.net1 = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.net1[0].weight.requires_grad = not no_grad
        self.net1[0].bias.requires_grad = not no_grad
        self.net2 = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.net3 = nn.Linear(32, 64)
        self.net4 = nn.Sequential(nn.ReLU(), nn.Linear(64, 8))

    def forward(self, x):
        return self.net4(self.net3(self.net2(self.net1(x))))


def _dummy_step(model, optim, it=0):
    _, r = world()
    model(randn(8, 8, seed=10 * it + r)).sum().backward()
    optim.step()


def _same_local_state(osd, ref, exact=True):
    """Two ``optim.state_dict()``-style dicts hold the same state (keys, state names, values)."""
    assert sorted(osd["state"], key=str) == sorted(ref["state"], key=str), (list(osd["state"]), list(ref["state"]))
    for key, st in osd["state"].items():
        assert sorted(st) == sorted(ref["state"][key]), key
        for name, v in st.items():
            w = ref["state"][key][name]
            if isinstance(v, torch.Tensor):
                assert_close(to_np(v), to_np(w), rtol=0 if exact else 1e-5, atol=0 if exact else 1e-6,
                             msg=f"{key}.{name}")
            else:
                assert v == w, (key, name, v, w)
    return len(osd["state"])


def test_with_empty_optimizer_state():
    """Before any step the optimizer has no state: optim_state_dict's "state" is empty too."""
    model = FSDP(DummyModel(), device_id=fsdp1_cpu())
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    assert optim.state_dict()["state"] == {}
    osd = FSDP.optim_state_dict(model, optim)
    assert osd["state"] == optim.state_dict()["state"] == {}
    assert len(osd["param_groups"]) == 1


def test_interface_arguments():
    """optim_state_dict(optim_state_dict=...) converts the given state dict (equal to converting the optimizer's
    own); optim_state_dict_to_load(load_directly=True) loads it into the optimizer; by default (FULL) the values
    are plain tensors; SHARDED gives sharded values (PyTorch: ShardedTensor, hpcfsdp: DTensor; upstream's
    is_cuda / ShardedTensor checks are not ported); FULL with rank0_only gives the other ranks {}."""
    from _framework import FullStateDictConfig, ShardedOptimStateDictConfig, ShardedStateDictConfig

    _, r = world()
    model = FSDP(DummyModel(), device_id=fsdp1_cpu())
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    _dummy_step(model, optim)
    original = copy.deepcopy(optim.state_dict())
    osd = FSDP.optim_state_dict(model, optim, optim_state_dict=original)
    _check_state({fsdp1_clean(k): {n: to_np(x) for n, x in v.items()} for k, v in osd["state"].items()},
                 {fsdp1_clean(k): {n: to_np(x) for n, x in v.items()}
                  for k, v in FSDP.optim_state_dict(model, optim)["state"].items()})
    _dummy_step(model, optim, it=1)
    FSDP.optim_state_dict_to_load(model, optim, osd, load_directly=True)
    assert _same_local_state(optim.state_dict(), original) == len(original["state"]) > 0
    for st in osd["state"].values():
        for v in st.values():
            assert type(v).__name__ not in ("DTensor", "ShardedTensor"), type(v)
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(),
                              ShardedOptimStateDictConfig(offload_to_cpu=False)):
        osd = FSDP.optim_state_dict(model, optim, optim_state_dict=original)
    kinds = {type(v).__name__ for st in osd["state"].values() for v in st.values() if v.dim() > 0}
    assert kinds and kinds <= {"DTensor", "ShardedTensor"}, kinds
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(),
                              FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=True)):
        osd = FSDP.optim_state_dict(model, optim, optim_state_dict=original)
    if r > 0:
        assert osd == {}
    else:
        kinds = {type(v).__name__ for st in osd["state"].values() for v in st.values() if v.dim() > 0}
        assert kinds == {"Tensor"}, kinds


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("use_orig_params", [False, True])
def test_state_dict_with_none_tensor_state(use_orig_params, optimizer):
    """Non-tensor entries of a parameter's state (a float, None) pass through optim_state_dict and
    optim_state_dict_to_load unchanged."""
    model = FSDP(DummyModel(), device_id=fsdp1_cpu(), use_orig_params=use_orig_params)
    cls = torch.optim.Adam if optimizer == "adam" else torch.optim.SGD
    optim = cls(model.parameters(), lr=1e-2)
    _dummy_step(model, optim)
    original = copy.deepcopy(optim.state_dict())
    for st in original["state"].values():
        st["value1"] = 2.74
        st["value2"] = None
    osd = FSDP.optim_state_dict(model, optim, optim_state_dict=original)
    to_load = FSDP.optim_state_dict_to_load(model, optim, osd)
    assert len(to_load["state"]) == len(original["state"])
    for st in to_load["state"].values():
        assert st["value1"] == 2.74 and st["value2"] is None, st


@pytest.mark.parametrize("use_orig_params", [False, True])
def test_with_no_shard(use_orig_params):
    """NO_SHARD: optim_state_dict then optim_state_dict_to_load gives back exactly the optimizer's state dict."""
    from _framework import ShardingStrategy

    model = FSDP(DummyModel(), device_id=fsdp1_cpu(), sharding_strategy=ShardingStrategy.NO_SHARD,
                 use_orig_params=use_orig_params)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    _dummy_step(model, optim)
    original = copy.deepcopy(optim.state_dict())
    osd = FSDP.optim_state_dict(model, optim)
    optim.load_state_dict(FSDP.optim_state_dict_to_load(model, optim, osd))
    new = optim.state_dict()
    assert _same_local_state(new, original) == len(original["state"]) > 0
    assert new["param_groups"] == original["param_groups"]


def test_no_grad():
    """use_orig_params with net1 frozen on even iterations (no state until it first trains, then state not
    stepped): every iteration optim_state_dict -> optim_state_dict_to_load(load_directly) keeps the state. On
    PyTorch the test asserts its CPU defect instead (test_use_orig_params_round_trip)."""
    model = FSDP(DummyModel(no_grad=True), device_id=fsdp1_cpu(), use_orig_params=True)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    counts = []
    for i in range(5):
        for p in (model.net1[0].weight, model.net1[0].bias):
            p.requires_grad = i % 2 == 1
        _dummy_step(model, optim, it=i)
        before = copy.deepcopy(optim.state_dict())
        FSDP.optim_state_dict_to_load(model, optim, FSDP.optim_state_dict(model, optim), load_directly=True)
        if IS_TORCH:  # PyTorch 2.13 on CPU mixes up the state tensors with use_orig_params (FSDP1.md)
            with pytest.raises(AssertionError, match="exp_avg"):
                _same_local_state(optim.state_dict(), before)
            return
        counts.append(_same_local_state(optim.state_dict(), before))
    assert 0 < counts[0] < counts[1] == counts[2] == counts[3] == counts[4], counts


def test_optim_state_without_param_groups():
    """A state dict without "param_groups" converts to one without them (both ways); with the groups added back
    it loads, and the optimizer then holds the saved state and groups."""
    class Simple(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net1 = nn.Sequential(nn.Linear(2, 4), nn.ReLU())

        def forward(self, x):
            return self.net1(x)

    _, r = world()
    model = FSDP(Simple(), device_id=fsdp1_cpu())
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    batch = randn(3, 2, seed=r)

    def zero_grad_step():
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        optim.step()
        model(batch).sum().backward()

    zero_grad_step()
    original = copy.deepcopy(optim.state_dict())
    no_groups = copy.deepcopy(original)
    groups = copy.deepcopy(no_groups.pop("param_groups"))
    osd = copy.deepcopy(FSDP.optim_state_dict(model, optim, optim_state_dict=no_groups))
    assert osd.get("param_groups") is None and osd["state"]
    zero_grad_step()
    to_load = FSDP.optim_state_dict_to_load(model, optim, osd)
    assert "param_groups" not in to_load
    to_load["param_groups"] = groups
    optim.load_state_dict(to_load)
    assert _same_local_state(optim.state_dict(), original) == len(original["state"]) > 0
    assert optim.state_dict()["param_groups"] == original["param_groups"] == groups
    again = FSDP.optim_state_dict(model, optim)
    _check_state({k: {n: to_np(x) for n, x in v.items()} for k, v in osd["state"].items()},
                 {k: {n: to_np(x) for n, x in v.items()} for k, v in again["state"].items()})


@pytest.mark.parametrize("sd_type", ["full", "sharded"])
def test_save_load_without_0th_param_state(sd_type):
    """The optimizer's first parameters (an FSDP instance never run) have no state: saving and loading still
    works (Adam's load checks the 0th parameter's "step"), the others' state comes back, and a step follows."""
    class TwoLinears(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin1 = nn.Linear(5, 5)
            self.lin2 = nn.Linear(5, 5)
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.relu(self.lin2(x))  # lin1 unused

    _, r = world()
    model = TwoLinears()
    model.lin1 = FSDP(model.lin1, device_id=fsdp1_cpu())
    model.lin2 = FSDP(model.lin2, device_id=fsdp1_cpu())
    fsdp_model = FSDP(model, device_id=fsdp1_cpu())
    optim = torch.optim.Adam(fsdp_model.parameters(), lr=1e-2)
    fsdp_model(randn(2, 5, seed=r)).sum().backward()
    optim.step()
    saved = copy.deepcopy(optim.state_dict())
    if sd_type == "full":
        osd = FSDP.full_optim_state_dict(fsdp_model, optim, rank0_only=False)
        flat = FSDP.shard_full_optim_state_dict(osd, fsdp_model)
    else:
        osd = FSDP.sharded_optim_state_dict(fsdp_model, optim)
        flat = FSDP.flatten_sharded_optim_state_dict(osd, fsdp_model, optim)
    assert not any("lin1" in fsdp1_clean(k) for k in osd["state"]), list(osd["state"])
    assert 0 not in flat["state"] and flat["state"]
    optim.load_state_dict(flat)
    assert _same_local_state(optim.state_dict(), saved) == len(saved["state"]) > 0
    fsdp_model(randn(2, 5, seed=r + 7)).sum().backward()
    optim.step()
    assert all(int(st["step"]) == 2 for st in optim.state_dict()["state"].values())


def test_use_orig_params_round_trip():
    """One FSDP instance with use_orig_params=True: FULL optim_state_dict then optim_state_dict_to_load gives back
    the optimizer's own state. PyTorch 2.13 on CPU fails this (the loaded exp_avg holds exp_avg_sq's values), so
    on PyTorch the test asserts the mismatch (see FSDP1.md); test_fsdp1_optim_state_nested.py::test_use_orig_params
    runs the upstream flows."""
    model = FSDP(DummyModel(), device_id=fsdp1_cpu(), use_orig_params=True)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    for it in range(3):
        _dummy_step(model, optim, it)
        optim.zero_grad()
    back = FSDP.optim_state_dict_to_load(model, optim, FSDP.optim_state_dict(model, optim))
    if IS_TORCH:
        with pytest.raises(AssertionError, match="exp_avg"):
            _same_local_state(back, optim.state_dict(), exact=False)
        swapped = {k: v["exp_avg_sq"] for k, v in optim.state_dict()["state"].items()}
        for k, st in back["state"].items():
            assert_close(to_np(st["exp_avg"]), to_np(swapped[k]), rtol=1e-5, atol=1e-8, msg=str(k))
        return
    assert _same_local_state(back, optim.state_dict(), exact=False) == len(list(model.parameters()))
