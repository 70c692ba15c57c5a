"""Re-expresses PyTorch's test/distributed/fsdp/test_fsdp_optim_state.py (FSDP1 optimizer state dicts) on CPU."""
import pytest

from _common import assert_close, fsdp1_clean, fsdp1_cpu, local, randn, to_np, world
from _framework import (
    FSDP,
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
    _check_state({fsdp1_clean(k): v for k, v in again["state"].items()}, _reference_state())


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
