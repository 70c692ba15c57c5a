"""Re-expresses PyTorch's test/distributed/fsdp/test_fsdp_state_dict.py (FSDP1 state-dict types) on CPU."""
import numpy as np
import pytest

from _common import (
    assert_close,
    copy_model,
    fsdp1_check_params,
    fsdp1_clean,
    fsdp1_cpu,
    fsdp1_train_parity,
    randn,
    to_np,
    world,
)
from _framework import (
    FSDP,
    DTensor,
    FullStateDictConfig,
    ModuleWrapPolicy,
    ShardedStateDictConfig,
    StateDictType,
    nn,
    torch,
)

pytestmark = pytest.mark.mpi(min_size=2)


class Block(nn.Module):
    def __init__(self, dim=4):
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.register_buffer("buf", torch.arange(dim).float())

    def forward(self, x):
        return self.lin(x).relu() + self.buf


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(Block(), Block(), nn.Linear(4, 4))


def _wrapped(model, nested="policy", **kw):
    kw.setdefault("device_id", fsdp1_cpu())
    if nested == "policy":
        return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), **kw)
    if nested == "by_hand":
        model[0] = FSDP(model[0], **kw)
        model[1] = FSDP(model[1], **kw)
    return FSDP(model, **kw)


def _expected(ref):
    return {k: to_np(v) for k, v in ref.state_dict().items()}


def _check_full(sd, ref, check_values=True):
    exp = _expected(ref)
    got = {fsdp1_clean(k): v for k, v in sd.items()}
    assert sorted(got) == sorted(exp), (sorted(got), sorted(exp))
    for k, v in got.items():
        assert not isinstance(v, DTensor), f"{k} is a DTensor in a FULL state dict"
        assert tuple(v.shape) == exp[k].shape, k
        if check_values:
            assert_close(v, exp[k], msg=k)
    return len(got)


@pytest.mark.parametrize("nested", ["policy", "by_hand"])
@pytest.mark.parametrize("rank0_only", [False, True])
def test_full_state_dict(nested, rank0_only):
    """FULL_STATE_DICT: the unsharded model's keys (without wrapper components) and full values; with
    rank0_only (and offload_to_cpu) only rank 0 gets them, the others an empty dict (test_basic_save_and_load,
    test_state_dict_rank0_offload_save_load)."""
    _, r = world()
    ref = _model()
    fsdp = _wrapped(copy_model(ref), nested)
    cfg = FullStateDictConfig(rank0_only=rank0_only)  # offload_to_cpu on CPU: PyTorch frees the copy
    with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT, cfg):
        sd = fsdp.state_dict()
    if rank0_only and r != 0:
        assert len(sd) == 0
    else:
        _check_full(sd, ref)


def test_plain_root_holding_fsdp_children():
    """A plain module whose children are FSDP instances: its state_dict() under FULL_STATE_DICT holds full
    tensors (each instance's hooks), rank0_only leaves the other ranks without them."""
    _, r = world()
    ref = _model()
    model = copy_model(ref)
    model[0] = FSDP(model[0], device_id=fsdp1_cpu())
    model[1] = FSDP(model[1], device_id=fsdp1_cpu())
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
        sd = model.state_dict()
    _check_full(sd, ref)
    cfg = FullStateDictConfig(rank0_only=True)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, cfg):
        sd = model.state_dict()
    wrapped = {k for k in (fsdp1_clean(k) for k in sd) if k.startswith(("0.", "1."))}
    if r == 0:
        _check_full(sd, ref)
    else:
        assert not wrapped, sorted(wrapped)
        assert not any(isinstance(v, DTensor) for v in sd.values())


def test_state_dict_prefix():
    """state_dict(prefix=...) puts the prefix in front of every key (test_state_dict_with_prefix)."""
    ref = _model()
    fsdp = _wrapped(copy_model(ref))
    for sd_type in (StateDictType.FULL_STATE_DICT, StateDictType.SHARDED_STATE_DICT):
        with FSDP.state_dict_type(fsdp, sd_type):
            sd = fsdp.state_dict(prefix="foo.")
        assert sd and all(k.startswith("foo.") for k in sd), sorted(sd)
        assert sorted(fsdp1_clean(k[4:]) for k in sd) == sorted(ref.state_dict())


@pytest.mark.parametrize("nested", ["policy", "by_hand"])
def test_local_state_dict_round_trip(nested):
    """LOCAL_STATE_DICT: every instance's local shards (nested ones included) and a round trip restores the
    trained parameters (test_state_dict_load_into_local_module / _test_local_state_dict)."""
    w, _ = world()
    fsdp = _wrapped(_model(), nested)
    fsdp1_train_parity(_model(), fsdp, lambda it: randn(2 * w, 4, seed=it), iters=1)
    with FSDP.state_dict_type(fsdp, StateDictType.LOCAL_STATE_DICT):
        sd = fsdp.state_dict()
        saved = {k: v.clone() if not isinstance(v, DTensor) else v for k, v in sd.items()}
    nested_keys = [k for k in sd if k.startswith(("0.", "1."))]
    assert nested_keys, sorted(sd)
    expected = _full_params(fsdp)
    other = _wrapped(_model(seed=1), nested)
    with FSDP.state_dict_type(other, StateDictType.LOCAL_STATE_DICT):
        other.load_state_dict(saved)
    got = _full_params(other)
    assert sorted(got) == sorted(expected)
    for n, v in expected.items():
        assert_close(got[n], v, msg=n)


def _full_params(model):
    with FSDP.summon_full_params(model, writeback=False):
        return {fsdp1_clean(n): to_np(p) for n, p in model.named_parameters()}


@pytest.mark.parametrize("nested", ["policy", "by_hand"])
def test_sharded_state_dict_round_trip(nested):
    """SHARDED_STATE_DICT: sharded values (PyTorch's FSDP1: ShardedTensor without a device mesh; hpcfsdp:
    DTensor); loading into a differently initialised model restores it."""
    fsdp = _wrapped(_model(), nested)
    with FSDP.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig()):
        sd = fsdp.state_dict()
    params = [k for k in sd if not k.endswith("buf")]
    assert params and all(type(sd[k]).__name__ in ("DTensor", "ShardedTensor") for k in params), sd
    other = _wrapped(_model(seed=1), nested)
    with FSDP.state_dict_type(other, StateDictType.SHARDED_STATE_DICT):
        other.load_state_dict(sd)
    fsdp1_check_params(_model(), other)


def test_full_state_dict_load_into_fsdp_and_local_module():
    """A FULL state dict saved from FSDP loads into an unwrapped module and back into FSDP
    (test_state_dict_load_into_local_module, test_save_and_load_after_forward_state_dict)."""
    w, _ = world()
    fsdp = _wrapped(_model())
    ref = _model()
    fsdp1_train_parity(ref, fsdp, lambda it: randn(2 * w, 4, seed=it), iters=2)
    with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT):
        sd = {fsdp1_clean(k): v for k, v in fsdp.state_dict().items()}
    blank = _model(seed=3)
    blank.load_state_dict(sd)
    for n, p in ref.named_parameters():
        assert_close(dict(blank.named_parameters())[n], p, msg=n)
    other = _wrapped(_model(seed=3))
    with FSDP.state_dict_type(other, StateDictType.FULL_STATE_DICT):
        with torch.no_grad():
            other.load_state_dict(_with_wrapper_keys(other, sd))
    fsdp1_check_params(ref, other)


def _with_wrapper_keys(model, clean_sd):
    """``clean_sd`` under the keys ``model.state_dict()`` uses (PyTorch's may hold wrapper components)."""
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
        keys = list(model.state_dict())
    return {k: clean_sd[fsdp1_clean(k)] for k in keys}


def test_buffers_in_full_state_dict_are_the_module_buffers():
    """A FULL state dict's buffers share the modules' storage (PyTorch returns them as they are, no copy):
    writing through the state dict changes the buffer."""
    fsdp = _wrapped(_model())
    fsdp(randn(2, 4)).sum().backward()
    with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT):
        sd = fsdp.state_dict()
    key = next(k for k in sd if fsdp1_clean(k) == "0.buf")
    before = to_np(fsdp.module[0].buf).copy()
    sd[key].add_(1.0)
    assert_close(fsdp.module[0].buf, before + 1.0)


def test_state_dict_after_training_matches_reference():
    """FULL state dict after training equals the reference's (buffers included)."""
    w, _ = world()
    fsdp = _wrapped(_model())
    ref = _model()
    before = {n: to_np(p).copy() for n, p in ref.named_parameters()}
    fsdp1_train_parity(ref, fsdp, lambda it: randn(2 * w, 4, seed=it), iters=2)
    assert any(not np.array_equal(to_np(p), before[n]) for n, p in ref.named_parameters())  # it trained
    with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT):
        assert _check_full(fsdp.state_dict(), ref) == len(_expected(ref))


def test_state_dict_type():
    """Leaving a ``state_dict_type`` context gives every FSDP instance of the tree its previous type back
    (FULL_STATE_DICT by default); PyTorch's test reads the private ``_state_dict_type``, here the public
    get_state_dict_type of each instance."""
    from _framework import LocalStateDictConfig, enable_wrap, wrap

    with enable_wrap(wrapper_cls=FSDP, device_id=fsdp1_cpu()):
        inner = wrap(nn.Linear(4, 4))
        fsdp = wrap(nn.Sequential(inner, nn.Linear(4, 4)))
    instances = FSDP.fsdp_modules(fsdp)
    assert len(instances) == 2
    with FSDP.state_dict_type(fsdp, StateDictType.LOCAL_STATE_DICT):
        for m in instances:
            settings = FSDP.get_state_dict_type(m)
            assert settings.state_dict_type == StateDictType.LOCAL_STATE_DICT
            assert isinstance(settings.state_dict_config, LocalStateDictConfig)
    for m in instances:
        assert FSDP.get_state_dict_type(m).state_dict_type == StateDictType.FULL_STATE_DICT


def test_wrong_state_dict_config():
    """A config of another state-dict type is refused (RuntimeError "Expected state_dict_config of type")."""
    from _framework import LocalStateDictConfig

    model = _wrapped(_model())
    with pytest.raises(RuntimeError, match="Expected state_dict_config of type"):
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, LocalStateDictConfig()):
            pass
    assert FSDP.get_state_dict_type(model).state_dict_type == StateDictType.FULL_STATE_DICT


@pytest.mark.parametrize("nested", ["policy", "by_hand"])
def test_full_state_dict_missing_unexpected_keys_cleaned(nested):
    """load_state_dict(strict=False) of a FULL state dict with one key removed and one added reports exactly
    those two, under the unwrapped names (no ``_fsdp_wrapped_module``), and loads the rest."""
    model = _wrapped(_model(), nested)
    sd = model.state_dict()
    first = next(iter(sd))
    sd.pop(first)
    sd["unexpected"] = torch.ones(1)
    other = _wrapped(_model(seed=1), nested)
    missing, unexpected = other.load_state_dict(sd, strict=False)
    assert [fsdp1_clean(k) for k in missing] == [fsdp1_clean(first)] and list(unexpected) == ["unexpected"], (
        missing, unexpected)
    assert not any("_fsdp_wrapped_module" in k for k in list(missing) + list(unexpected)), (missing, unexpected)
    got, expected = _full_params(other), _full_params(model)
    for n, v in expected.items():
        if n != fsdp1_clean(first):
            assert_close(got[n], v, msg=n)
