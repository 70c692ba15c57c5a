"""Re-expresses PyTorch's test/distributed/fsdp/test_fsdp_optim_state.py on CPU, the cases on its NestedModel: a
non-FSDP root holding hand-nested FSDP instances, several param groups, optimizers listing the parameters in other
orders, loading into a group of half the ranks, unmanaged parameters, ranks missing state, ``optim_input``."""
import copy

import pytest

from _common import assert_close, fsdp1_cpu, randn, to_np, world
from _framework import (
    FSDP,
    FullOptimStateDictConfig,
    IS_TORCH,
    FullStateDictConfig,
    OptimStateKeyType,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    StateDictType,
    dist,
    nn,
    torch,
)

pytestmark = pytest.mark.mpi(min_size=2)

CPU = fsdp1_cpu()


# ---------------------------------------------------------------------------------------------- the model
class Bias(nn.Module):
    def __init__(self, dim):
        super().__init__()
        torch.manual_seed(0)
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        return x + self.bias


class BlockA(nn.Module):
    """bias_module0, weight, bias_module1 (registration order)."""

    def __init__(self, in_dim, out_dim):
        super().__init__()
        torch.manual_seed(0)
        self.bias_module0 = Bias(out_dim)
        self.weight = nn.Parameter(torch.randn(in_dim, out_dim))
        self.bias_module1 = Bias(out_dim)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.bias_module1(self.relu(self.bias_module0(x @ self.weight)))


class BlockB(nn.Module):
    """weight, bias_module0, bias_module1 (registration order)."""

    def __init__(self, in_dim, out_dim):
        super().__init__()
        torch.manual_seed(0)
        self.weight = nn.Parameter(torch.randn(in_dim, out_dim))
        self.bias_module0 = Bias(out_dim)
        self.bias_module1 = Bias(out_dim)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.bias_module1(self.relu(self.bias_module0(x @ self.weight)))


class NestedModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.block0 = BlockB(5, 3)
        self.block1 = BlockB(3, 7)
        self.bias = nn.Parameter(torch.randn(5))
        self.block2 = nn.Sequential(BlockA(7, 9), BlockA(9, 9), BlockB(9, 5))
        self.relu = nn.ReLU()

    def forward(self, x):
        x = self.relu(self.block0(x))
        x = self.relu(self.block1(x))
        x = self.relu(self.block2(x))
        return x + self.bias

    def param_group0(self):  # block1 first: not model.parameters() order
        return list(self.block1.parameters())

    def param_group1(self):  # block2 before block0; the root's own bias in neither group
        return list(self.block2.parameters()) + list(self.block0.parameters())


def _wrap(model, group=None, ignore_modules=False, **kw):
    """PyTorch's NestedModel.wrap: block1 (its bias_module0 first), block2[1] (both bias modules first) and
    block2[2] FSDP instances; the root, block0 and block2[0] stay plain."""
    kw = dict(process_group=group, device_id=CPU, **kw)
    model.block1.bias_module0 = FSDP(model.block1.bias_module0, **kw)
    model.block1 = FSDP(model.block1, **kw)
    model.block2[1].bias_module0 = FSDP(model.block2[1].bias_module0, **kw)
    model.block2[1].bias_module1 = FSDP(model.block2[1].bias_module1, **kw)
    model.block2[1] = FSDP(model.block2[1], **kw)
    ignored = [model.block2[2].bias_module0] if ignore_modules else None
    model.block2[2] = FSDP(model.block2[2], ignored_modules=ignored, **kw)
    return model


def _wrap_alt(model, group=None, **kw):
    """PyTorch's NestedModel.wrap_alt: only block0 (its bias_module0 first)."""
    kw = dict(process_group=group, device_id=CPU, **kw)
    model.block0.bias_module0 = FSDP(model.block0.bias_module0, **kw)
    model.block0 = FSDP(model.block0, **kw)
    return model


def _nested(wrap=True, wrap_alt=False, group=None, multiple_groups=False, diff_inputs=False, **fsdp_kw):
    """(model, Adam, optim_input) as PyTorch's _init_nested_model; ``diff_inputs``: odd ranks list the
    parameters (of each group) in reverse."""
    model = NestedModel()
    if wrap:
        model = _wrap_alt(model, group, **fsdp_kw) if wrap_alt else _wrap(model, group, **fsdp_kw)
    if multiple_groups:
        optim_input = [{"params": model.param_group0()}, {"params": model.param_group1(), "weight_decay": 0.9}]
    else:
        optim_input = list(model.parameters())
    if diff_inputs and dist.get_rank() % 2 == 1:
        if multiple_groups:
            for g in optim_input:
                g["params"] = list(reversed(g["params"]))
        else:
            optim_input = list(reversed(optim_input))
    return model, torch.optim.Adam(optim_input, lr=0.01), optim_input


def _step(model, optim, iters=2):
    """Forward, backward and step on the same batch on every rank; returns the losses."""
    losses = []
    for it in range(iters):
        optim.zero_grad()
        loss = model(randn(8, 5, seed=100 + it)).sum()
        losses.append(float(loss.item()))
        loss.backward()
        optim.step()
    return losses


def _bcast(osd, group=None):
    box = [osd]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def _value(v):
    """A state value comparable across frameworks: tensors as float64 NumPy (DTensor / ShardedTensor gathered)."""
    if type(v).__name__ == "ShardedTensor":
        from torch.distributed._state_dict_utils import _gather_state_dict

        v = _gather_state_dict({"v": v})["v"]
    return to_np(v) if isinstance(v, torch.Tensor) else v


def _check_same_state(osd, ref, exact=False):
    """The "state" parts hold the same keys and values (PyTorch's _check_same_state, check_same_param_keys)."""
    assert sorted(osd["state"], key=str) == sorted(ref["state"], key=str), (list(osd["state"]), list(ref["state"]))
    for key, st in osd["state"].items():
        assert sorted(st) == sorted(ref["state"][key]), (key, sorted(st), sorted(ref["state"][key]))
        for name, v in st.items():
            a, b = _value(v), _value(ref["state"][key][name])
            if exact:
                assert_close(a, b, rtol=0, atol=0, msg=f"{key}.{name}")
            elif hasattr(a, "shape"):
                assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"{key}.{name}")
            else:
                assert a == b, (key, name, a, b)
    return len(osd["state"])


def _check_same_param_groups(osd, ref):
    assert len(osd["param_groups"]) == len(ref["param_groups"])
    for g, rg in zip(osd["param_groups"], ref["param_groups"]):
        assert sorted(g) == sorted(rg), (sorted(g), sorted(rg))
        for k, v in g.items():
            assert v == rg[k], (k, v, rg[k])


def _new_group(halve):
    """Even ranks (every rank takes part in creating it), or the default group."""
    if not halve:
        return None, True
    ranks = [r for r in range(world()[0]) if r % 2 == 0]
    return dist.new_group(ranks=ranks), dist.get_rank() in ranks


# ---------------------------------------------------------------------------------------------- halve the world size
@pytest.mark.parametrize("use_optim_input", [False, True])
@pytest.mark.parametrize("method", ["shard", "scatter"])
def test_full_optim_state_dict_nested_halve_world_size(method, use_optim_input):
    """test_shard_full_optim_state_dict_nested_halve_world_size / test_scatter_..._halve_world_size: the full
    optimizer state dict of a model over every rank, sharded (every rank of the new group holds it) or scattered
    (its rank 0 does) for a model wrapped otherwise (wrap_alt) over the even ranks, with two param groups and
    optimizers listing the parameters in other orders, equals that model's own optimizer state dict after the
    same steps; so does its own full state dict sharded back; and it loads and trains on."""
    model1, optim1, input1 = _nested(multiple_groups=True)
    _step(model1, optim1)
    osd1 = FSDP.full_optim_state_dict(model1, optim1, input1) if use_optim_input else \
        FSDP.full_optim_state_dict(model1, optim1)
    assert bool(osd1) == (dist.get_rank() == 0)
    group, member = _new_group(halve=True)
    if not member:
        return
    model2, optim2, input2 = _nested(wrap_alt=True, group=group, multiple_groups=True, diff_inputs=True)
    _step(model2, optim2)
    osd2 = FSDP.full_optim_state_dict(model2, optim2, input2, group=group) if use_optim_input else \
        FSDP.full_optim_state_dict(model2, optim2, group=group)
    which = {"optim_input": input2} if use_optim_input else {"optim": optim2}
    if method == "shard":
        sharded1 = FSDP.shard_full_optim_state_dict(_bcast(osd1, group), model2, **which)
        sharded2 = FSDP.shard_full_optim_state_dict(_bcast(osd2, group), model2, **which)
    else:
        first = dist.get_rank() == 0
        sharded1 = FSDP.scatter_full_optim_state_dict(osd1 if first else None, model2, group=group, **which)
        sharded2 = FSDP.scatter_full_optim_state_dict(osd2 if first else None, model2, group=group, **which)
    local2 = optim2.state_dict()
    for sharded in (sharded2, sharded1):
        _check_same_param_groups(sharded, local2)
        assert _check_same_state(sharded, local2) == len(local2["state"]) > 0
    optim2.load_state_dict(sharded1)
    losses = _step(model2, optim2, iters=1)
    assert all(abs(x) < 1e6 for x in losses)


def _load_with_optim_state_dict(settings, halve, wrap_alt, multiple_groups=False, diff_inputs=False,
                                **fsdp_kw):
    """PyTorch's _test_load_optim_state_with_optim_state_dict: optim_state_dict of a model over every rank,
    optim_state_dict_to_load into one over the (possibly halved) group, compared with that model's optimizer."""
    sd_type, sd_cfg, osd_cfg = settings
    model1, optim1, _ = _nested(multiple_groups=multiple_groups, **fsdp_kw)
    FSDP.set_state_dict_type(model1, sd_type, sd_cfg, osd_cfg)
    _step(model1, optim1)
    osd1 = FSDP.optim_state_dict(model1, optim1)
    group, member = _new_group(halve)
    if not member:
        return None
    model2, optim2, _ = _nested(wrap_alt=wrap_alt, group=group, multiple_groups=multiple_groups,
                                diff_inputs=diff_inputs, **fsdp_kw)
    FSDP.set_state_dict_type(model2, sd_type, sd_cfg, osd_cfg)
    _step(model2, optim2)
    osd2 = FSDP.optim_state_dict(model2, optim2, group=group)
    sharded2 = FSDP.optim_state_dict_to_load(model2, optim2, osd2, group=group)
    local2 = optim2.state_dict()
    _check_same_param_groups(sharded2, local2)
    n = _check_same_state(sharded2, local2)
    sharded1 = FSDP.optim_state_dict_to_load(model2, optim2, osd1, group=group)
    _check_same_param_groups(sharded1, local2)
    assert _check_same_state(sharded1, local2) == n == len(local2["state"]) > 0
    optim2.load_state_dict(sharded2)
    _step(model2, optim2, iters=1)
    return n


_FULL = (StateDictType.FULL_STATE_DICT, FullStateDictConfig(), FullOptimStateDictConfig())
_FULL_RANK0 = (StateDictType.FULL_STATE_DICT, FullStateDictConfig(), FullOptimStateDictConfig(rank0_only=True))
_SHARDED = (StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(), ShardedOptimStateDictConfig())


@pytest.mark.parametrize(("settings", "halve", "wrap_alt"), [
    ("full", True, False), ("full_rank0", True, True), ("full_rank0", False, False), ("sharded", False, True),
])
def test_use_orig_params(settings, halve, wrap_alt):
    """optim_state_dict / optim_state_dict_to_load with use_orig_params=True: FULL (also with rank0_only, read on
    the group's rank 0 and broadcast) into the same or a halved group, SHARDED into the same one (PyTorch cannot
    halve it), the second model wrapped as the first or otherwise (4 of upstream's 10 subtests: both FULL
    settings into a halved group, rank0_only also into the same one, wrap_alt both ways)."""
    s = {"full": _FULL, "full_rank0": _FULL_RANK0, "sharded": _SHARDED}[settings]
    if IS_TORCH and settings != "sharded":
        # PyTorch 2.13 on CPU: with use_orig_params=True its FULL optim_state_dict gathers other values than the
        # optimizer holds (its own round trip differs, test_fsdp1_optim_state.py::test_use_orig_params_round_trip
        # shows it on one instance); see FSDP1.md
        try:
            n = _load_with_optim_state_dict(s, halve, wrap_alt, use_orig_params=True)
        except AssertionError as e:
            assert "exp_avg" in str(e), e
            return
        assert n is None, "PyTorch's use_orig_params FULL round trip now holds: drop this branch"
        return
    n = _load_with_optim_state_dict(s, halve, wrap_alt, use_orig_params=True)
    assert n > 0 if n is not None else halve and dist.get_rank() % 2 == 1


def test_optim_state_dict_nested_halve_world_size_param_groups():
    """The optim_state_dict half of test_shard_full_optim_state_dict_nested_halve_world_size (and of the scatter
    one, with rank0_only): two param groups, other parameter orders per rank, a halved group, wrap_alt."""
    for settings in (_FULL, _FULL_RANK0):
        n = _load_with_optim_state_dict(settings, halve=True, wrap_alt=True, multiple_groups=True, diff_inputs=True)
        assert n > 0 if n is not None else dist.get_rank() % 2 == 1


# ---------------------------------------------------------------------------------------------- invalid / unmanaged
def test_full_optim_state_dict_nested_invalid():
    """full_optim_state_dict raises (on every rank) when the other ranks' optimizers miss a parameter that rank 0's
    has: PyTorch's RuntimeError, naming the parameter each rank misses."""
    model = _wrap(NestedModel())
    params = list(model.parameters())
    if dist.get_rank() != 0:
        params = params[:-1]
    optim = torch.optim.Adam(params, lr=1e-3)
    _step(model, optim)
    with pytest.raises(RuntimeError, match="FSDP currently requires each rank to have at least the optimizer "
                                           "states needed by rank 0's optimizer but some ranks are missing") as e:
        FSDP.full_optim_state_dict(model, optim)
    assert "block2.2.bias_module1.bias" in str(e.value)


@pytest.mark.parametrize(("sd_type", "use_optim_input"), [("full", False), ("full", True), ("sharded", False)])
def test_shard_full_optim_state_dict_unmanaged_params(sd_type, use_optim_input):
    """A parameter FSDP does not manage (registered on the plain root before wrapping) is left out of the sharded
    optimizer state dict (no error, its index skipped in the param group); with its entry added by hand the state
    dict loads, and the managed parameters' state is the saved one (add_to_fsdp_module=True: flat, see FSDP1.md)."""
    model, optim, optim_input = _nested()
    _step(model, optim, iters=1)
    if sd_type == "full":
        osd = FSDP.full_optim_state_dict(model, optim, optim_input, rank0_only=False) if use_optim_input else \
            FSDP.full_optim_state_dict(model, optim, rank0_only=False)
    else:
        osd = FSDP.sharded_optim_state_dict(model, optim)
    new = NestedModel()
    unmanaged = nn.Parameter(torch.randn(5, 5))
    new.register_parameter("unmanaged_param", unmanaged)
    new = _wrap(new)
    new_input = list(new.parameters())
    new_optim = torch.optim.Adam(new_input, lr=1e-3)
    if sd_type == "full":
        flat = FSDP.shard_full_optim_state_dict(osd, new, optim_input=new_input) if use_optim_input else \
            FSDP.shard_full_optim_state_dict(osd, new, optim=new_optim)
    else:
        flat = FSDP.flatten_sharded_optim_state_dict(osd, new, optim=new_optim)
    pos = next(i for i, p in enumerate(new_input) if p is unmanaged)
    ids = flat["param_groups"][0]["params"]
    assert pos not in ids and pos not in flat["state"] and len(ids) == len(new_input) - 1, (pos, ids)
    flat["state"][pos] = {"step": torch.tensor(1.0), "exp_avg": torch.randn(5, 5), "exp_avg_sq": torch.randn(5, 5)}
    flat["param_groups"][0]["params"] = sorted(ids + [pos])
    new_optim.load_state_dict(flat)
    again = FSDP.full_optim_state_dict(new, new_optim, rank0_only=False)
    full = osd if sd_type == "full" else FSDP.full_optim_state_dict(model, optim, rank0_only=False)
    assert sorted(again["state"]) == sorted(list(full["state"]) + ["unmanaged_param"])
    again["state"].pop("unmanaged_param")
    assert _check_same_state(again, full) == len(full["state"]) > 0


def test_optim_input_warning():
    """Every optimizer-state API taking ``optim_input`` warns that it is deprecated (a FutureWarning on PyTorch
    2.13); the results are as without it."""
    model, optim, optim_input = _nested()
    _step(model, optim, iters=2)
    match = "`optim_input` argument is deprecated"
    with pytest.warns(FutureWarning, match=match):
        osd = FSDP.full_optim_state_dict(model, optim, optim_input=optim_input, rank0_only=False)
    _check_same_state(osd, FSDP.full_optim_state_dict(model, optim, rank0_only=False), exact=True)
    with pytest.warns(FutureWarning, match=match):
        sharded = FSDP.shard_full_optim_state_dict(osd, model, optim_input=optim_input)
    with pytest.warns(FutureWarning, match=match):
        scattered = FSDP.scatter_full_optim_state_dict(osd, model, optim_input=optim_input)
    _check_same_state(sharded, optim.state_dict(), exact=True)
    _check_same_state(scattered, optim.state_dict(), exact=True)
    plain, plain_optim, plain_input = _nested(wrap=False)
    with pytest.warns(FutureWarning, match=match):
        by_id = FSDP.rekey_optim_state_dict(osd, OptimStateKeyType.PARAM_ID, plain, optim_input=plain_input)
    assert sorted(by_id["state"]) == list(range(len(plain_input)))
    _step(plain, plain_optim, iters=2)
    with pytest.warns(FutureWarning, match=match):
        by_name = FSDP.rekey_optim_state_dict(plain_optim.state_dict(), OptimStateKeyType.PARAM_NAME, plain,
                                              optim_input=plain_input)
    assert sorted(by_name["state"]) == sorted(n for n, _ in plain.named_parameters())
    plain_optim.load_state_dict(copy.deepcopy(by_id))
    _check_same_state(plain_optim.state_dict(), by_id, exact=True)
