"""FSDP1 argument checks, re-expressed from PyTorch's test_fsdp_misc.py, test_fsdp_ignored_modules.py,
test_fsdp_hybrid_shard.py, test_fsdp_meta.py and test_fsdp_apply.py (the raises / warns cases)."""
import pytest

from _common import fsdp1_cpu, randn
from _framework import FSDP, ShardingStrategy, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))


def test_ignored_modules_with_fsdp_instance_raises():
    """test_fsdp_ignored_modules.py::test_ignored_modules_not_under_wrapped_root / _nested: an FSDP instance
    in ignored_modules raises ValueError."""
    model = _model()
    model[0] = FSDP(model[0], device_id=fsdp1_cpu())
    with pytest.raises(ValueError, match="should not include FSDP modules"):
        FSDP(model, ignored_modules=[model[0]], device_id=fsdp1_cpu())


def test_ignored_modules_with_parameters_raises():
    """ignored_modules takes modules only: bare parameters raise ValueError (test_ignored_modules_invalid)."""
    model = _model()
    with pytest.raises(ValueError, match="nn.Module"):
        FSDP(model, ignored_modules=list(model[0].parameters()), device_id=fsdp1_cpu())


def test_ignore_root_warns():
    """Ignoring the module FSDP wraps warns that all parameters are ignored (test_diff_ignored_modules_*)."""
    model = _model()
    with pytest.warns(UserWarning, match="Trying to ignore the top-level module") as rec:
        FSDP(model, ignored_modules=[model], device_id=fsdp1_cpu())
    assert any("all parameters being ignored" in str(r.message) for r in rec)


def test_hybrid_shard_without_process_group_or_policy_raises():
    """test_fsdp_hybrid_shard.py::test_raises_manual_wrap_hybrid_shard_when_none_policy."""
    with pytest.raises(ValueError, match="requires explicit specification of process group or device_mesh"):
        FSDP(_model(), sharding_strategy=ShardingStrategy.HYBRID_SHARD, device_id=fsdp1_cpu())


def test_param_init_fn_not_callable_raises():
    """A meta model with param_init_fn=42: ValueError naming it (test_fsdp_meta / misc bad param_init_fn)."""
    with torch.device("meta"):
        model = _model()
    with pytest.raises(ValueError, match="callable"):
        FSDP(model, param_init_fn=42, device_id=fsdp1_cpu())


def test_apply_in_summon_raises():
    """test_fsdp_apply.py::test_apply_in_summon_raises_error: apply() inside summon_full_params raises."""
    fsdp = FSDP(_model(), device_id=fsdp1_cpu())
    fsdp(randn(2, 4))
    with FSDP.summon_full_params(fsdp):
        with pytest.raises(ValueError, match="expected to be in states"):
            fsdp.apply(lambda m: None)


def test_apply_initializes_full_params():
    """test_fsdp_apply.py::test_nested_module_apply: apply() sees full parameters and writes them back."""
    fsdp = FSDP(_model(), device_id=fsdp1_cpu())

    def init(m):
        if isinstance(m, nn.Linear):
            with torch.no_grad():
                m.weight.fill_(1.0)
                m.bias.fill_(0.5)

    fsdp.apply(init)
    with FSDP.summon_full_params(fsdp):
        for n, p in fsdp.named_parameters():
            expected = 1.0 if n.endswith("weight") else 0.5
            assert tuple(p.shape) in ((4, 4), (4,)), (n, p.shape)
            assert float(p.detach().min()) == expected == float(p.detach().max()), n


def test_device_mesh_and_process_group_raises():
    """test_fsdp_misc.py::test_fsdp_device_mesh_and_process_group (both given): ValueError."""
    from _framework import dist, init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    with pytest.raises(ValueError, match="Cannot pass both process_group and device_mesh"):
        FSDP(_model(), process_group=dist.group.WORLD, device_mesh=mesh, device_id=fsdp1_cpu())
