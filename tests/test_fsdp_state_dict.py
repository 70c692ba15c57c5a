"""Model and optimizer state-dict types of sharded models: SHARDED, FULL, LOCAL, and the FSDP1 type API."""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed.checkpoint as dcp
from hpcfsdp.distributed.fsdp import (
    FSDP,
    FullOptimStateDictConfig,
    FullStateDictConfig,
    LocalStateDictConfig,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    StateDictSettings,
    StateDictType,
)
from hpcfsdp.distributed.fsdp.wrap import ModuleWrapPolicy
from hpcfsdp.distributed.process_group import collective_counts, reset_collective_counts
from hpcfsdp.distributed.tensor import DTensor
from hpcfsdp.models.gpt import Block

from _fsdp_util import full, gpt_batches, local, tiny_gpt, world

pytestmark = pytest.mark.mpi(min_size=2)


def _trained_fsdp(steps=2):
    w, _ = world()
    fsdp = FSDP(tiny_gpt(), auto_wrap_policy=ModuleWrapPolicy({Block}))
    opt = hp.optim.AdamW(fsdp.parameters(), lr=1e-2)
    for x, y in gpt_batches(steps, 4 * w + 1):
        _, loss = fsdp(hp.tensor(local(x)), hp.tensor(local(y)))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return fsdp, opt


def _perturb(model):
    with hp.no_grad():
        for p in model.parameters():
            p._data[...] = 0.0


def test_sharded_round_trip_needs_no_communication():
    fsdp, _ = _trained_fsdp()
    want = {k: full(v) for k, v in fsdp.module.state_dict().items()}
    reset_collective_counts()
    with FSDP.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT):
        sd = fsdp.state_dict()
        assert all(isinstance(v, DTensor) for v in sd.values())
        snapshot = {k: v.to_local().numpy().copy() for k, v in sd.items()}
        _perturb(fsdp)
        fsdp.load_state_dict({k: DTensor.from_local(hp.tensor(a), v.device_mesh, v.placements, shape=v.shape)
                              for (k, a), v in zip(snapshot.items(), sd.values())})
    assert collective_counts() == {}
    for k, v in fsdp.module.state_dict().items():
        np.testing.assert_array_equal(full(v), want[k])


def test_full_state_dict_rank0_only():
    w, rank = world()
    fsdp, _ = _trained_fsdp()
    want = {k: full(v) for k, v in fsdp.module.state_dict().items()}
    cfg = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT, cfg):
        sd = fsdp.state_dict()
    if rank == 0:
        assert set(sd) == set(want)
        for k, v in sd.items():
            assert not isinstance(v, DTensor)
            np.testing.assert_array_equal(v.numpy(), want[k])
    else:
        assert len(sd) == 0
    # a full state dict (every rank) loads back into the shards
    with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT):
        sd = fsdp.state_dict()
        _perturb(fsdp)
        fsdp.load_state_dict(sd)
    for k, v in fsdp.module.state_dict().items():
        np.testing.assert_array_equal(full(v), want[k])


def test_local_state_dict_round_trip():
    fsdp, _ = _trained_fsdp()
    want = {k: full(v) for k, v in fsdp.module.state_dict().items()}
    FSDP.set_state_dict_type(fsdp, StateDictType.LOCAL_STATE_DICT)
    assert FSDP.get_state_dict_type(fsdp) == StateDictSettings(
        StateDictType.LOCAL_STATE_DICT, LocalStateDictConfig(), FSDP.get_state_dict_type(fsdp).optim_state_dict_config)
    sd = fsdp.state_dict()
    assert all(v.ndim == 1 for k, v in sd.items() if k in sd._local_layout)
    _perturb(fsdp)
    fsdp.load_state_dict(sd)
    for k, v in fsdp.module.state_dict().items():
        np.testing.assert_array_equal(full(v), want[k])
    bad = dict(sd)
    first = next(iter(sd._local_layout))
    bad[first] = hp.zeros(sd[first].shape[0] + 1)
    with pytest.raises(RuntimeError, match="LOCAL state dict entry"):
        fsdp.load_state_dict(bad)


def test_state_dict_type_validates_config():
    fsdp, _ = _trained_fsdp(1)
    with pytest.raises(RuntimeError, match="Expected state_dict_config of type FullStateDictConfig"):
        FSDP.set_state_dict_type(fsdp, StateDictType.FULL_STATE_DICT, ShardedStateDictConfig())
    with pytest.raises(TypeError, match="must be a StateDictType"):
        FSDP.set_state_dict_type(fsdp, "FULL")


def test_optim_state_dict_by_name_survives_rewrapping():
    w, _ = world()
    fsdp, opt = _trained_fsdp()
    osd = FSDP.optim_state_dict(fsdp, opt)  # FULL by default: gathered, keyed by parameter name
    assert "transformer.wte.weight" in osd["state"]
    ex = osd["state"]["transformer.wte.weight"]["exp_avg"]
    assert not isinstance(ex, DTensor) and tuple(ex.shape) == (4 * w + 1, 16)
    # a freshly wrapped model, parameters in another order in the optimizer
    fsdp2 = FSDP(tiny_gpt(seed=7), auto_wrap_policy=ModuleWrapPolicy({Block}))
    opt2 = hp.optim.AdamW(list(fsdp2.parameters())[::-1], lr=1e-2)
    with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT):
        msd = fsdp.state_dict()
    with FSDP.state_dict_type(fsdp2, StateDictType.FULL_STATE_DICT):
        fsdp2.load_state_dict(msd)
    opt2.load_state_dict(FSDP.optim_state_dict_to_load(fsdp2, opt2, osd))
    a = dict(fsdp.named_parameters())
    for name, p in fsdp2.named_parameters():
        s1, s2 = opt.state[a[name]], opt2.state[p]
        np.testing.assert_array_equal(full(s1["exp_avg_sq"]), full(s2["exp_avg_sq"]))
        assert float(s1["step"].item()) == float(s2["step"].item())
    x, y = gpt_batches(1, 4 * w + 1, seed=9)[0]
    for m, o in ((fsdp, opt), (fsdp2, opt2)):
        _, loss = m(hp.tensor(local(x)), hp.tensor(local(y)))
        loss.backward()
        o.step()
    for name, p in fsdp2.named_parameters():
        np.testing.assert_array_equal(full(p), full(a[name]))
    # sharded optimizer state dict: DTensors, loadable the same way
    with FSDP.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT):
        sosd = FSDP.optim_state_dict(fsdp, opt)
    assert isinstance(sosd["state"]["transformer.wte.weight"]["exp_avg"], DTensor)


def test_dcp_helpers_full_and_broadcast_from_rank0():
    w, rank = world()
    fsdp, opt = _trained_fsdp()
    model = fsdp.module
    want = {k: full(v) for k, v in model.state_dict().items()}
    opts = dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)
    sd = dcp.get_model_state_dict(fsdp, options=opts)
    assert (len(sd) > 0) == (rank == 0)
    other = FSDP(tiny_gpt(seed=3), auto_wrap_policy=ModuleWrapPolicy({Block}))
    dcp.set_model_state_dict(other, sd, options=dcp.StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    for k, v in other.module.state_dict().items():
        np.testing.assert_array_equal(full(v), want[k])


def _osd_devices(osd):
    """Devices of the per-parameter state (not ``step``, a host scalar as in PyTorch's Adam)."""
    return {(v.to_local() if isinstance(v, DTensor) else v).device.type
            for e in osd["state"].values() for k, v in e.items() if isinstance(v, hp.Tensor) and k != "step"}


def test_full_optim_state_dict_config_rank0_only_and_offload():
    w, rank = world()
    fsdp, opt = _trained_fsdp(1)
    with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT):
        everyone = FSDP.optim_state_dict(fsdp, opt)
    cfg = FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=True)
    with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT, optim_state_dict_config=cfg):
        osd = FSDP.optim_state_dict(fsdp, opt)
    if rank != 0:
        assert osd == {}
        return
    assert _osd_devices(osd) == {"cpu"} and osd["param_groups"] == everyone["param_groups"]
    for name, entry in everyone["state"].items():
        for k, v in entry.items():
            np.testing.assert_array_equal(full(osd["state"][name][k]), full(v), err_msg=f"{name}.{k}")


@pytest.mark.gpu
@pytest.mark.parametrize("sd_type", [StateDictType.FULL_STATE_DICT, StateDictType.SHARDED_STATE_DICT])
def test_optim_state_dict_offload_to_cpu_moves_state_to_the_host(sd_type):
    w, _ = world()
    fsdp = FSDP(tiny_gpt().cuda(), auto_wrap_policy=ModuleWrapPolicy({Block}))
    opt = hp.optim.AdamW(fsdp.parameters(), lr=1e-2)
    x, y = gpt_batches(1, 4 * w + 1)[0]
    _, loss = fsdp(hp.tensor(local(x), device="cuda"), hp.tensor(local(y), device="cuda"))
    loss.backward()
    opt.step()
    cls = FullOptimStateDictConfig if sd_type == StateDictType.FULL_STATE_DICT else ShardedOptimStateDictConfig
    for offload, want in ((True, {"cpu"}), (False, {"cuda"})):
        with FSDP.state_dict_type(fsdp, sd_type, optim_state_dict_config=cls(offload_to_cpu=offload)):
            osd = FSDP.optim_state_dict(fsdp, opt)
        assert _osd_devices(osd) == want


def test_optim_state_dict_to_load_rank0_only_broadcasts_from_rank0():
    from hpcfsdp.distributed.fsdp import _state_dict_utils as sdu

    w, rank = world()
    fsdp, opt = _trained_fsdp(1)
    cfg = FullOptimStateDictConfig(rank0_only=True)
    with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT, optim_state_dict_config=cfg):
        osd = FSDP.optim_state_dict(fsdp, opt)
    assert (osd != {}) == (rank == 0)
    fsdp2 = FSDP(tiny_gpt(seed=7), auto_wrap_policy=ModuleWrapPolicy({Block}))
    opt2 = hp.optim.AdamW(fsdp2.parameters(), lr=1e-2)
    opt2.load_state_dict(sdu.optim_state_dict_to_load(fsdp2.module, opt2, osd, cfg))
    a = dict(fsdp.named_parameters())
    for name, p in fsdp2.named_parameters():
        for k in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_array_equal(full(opt2.state[p][k]), full(opt.state[a[name]][k]), err_msg=name)
    with pytest.raises(ValueError, match="rank 0"):
        sdu.optim_state_dict_to_load(fsdp2.module, opt2, {"bad": 1} if rank == 0 else {}, cfg)
