"""The error-feedback residual of QuantizedReduceScatter as state (See [Note: Residual state]), at 2 and 4 ranks on
simulated hosts: what the hops still owe, moved to its owners, completes the applied running sum to the true one
(float32 rounding, far below a quantization step); a run that reads its state and a run loaded from it continue
bit for bit; a state saved under one layout loads under another with the same total."""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp import nn
from hpcfsdp.distributed import checkpoint as dcp
from hpcfsdp.distributed.device_mesh import init_device_mesh
from hpcfsdp.distributed.fsdp import (QuantizedReduceScatter, fully_shard, get_residual_state_dict,
                                      set_residual_state_dict)
from hpcfsdp.distributed.process_group import ReduceOp

pytestmark = pytest.mark.mpi(min_size=2)


def _rows(k, n, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, k)) * np.exp(rng.uniform(-2, 2, (n, k)))).astype(np.float32)


def _hosts(monkeypatch, per_host):
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", str(per_host))
    return dist.new_group(list(range(dist.get_world_size())))  # made under the override


@pytest.mark.timeout(60)
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.AVG])
def test_owed_residual_completes_the_cross_host_running_sum(monkeypatch, op):
    n = dist.get_world_size()
    g = _hosts(monkeypatch, max(1, n // 2))
    r, k = g.rank(), 384
    comm = QuantizedReduceScatter("int4", block_size=64)
    applied, true = np.zeros(k), np.zeros(k)
    for t in range(5):
        inputs = [_rows(k, n, 100 * t + src) for src in range(n)]
        out = np.empty(k, np.float32)
        comm(out, inputs[r].reshape(-1).copy(), g, op)
        applied += out
        exact = sum(x[r].astype(np.float64) for x in inputs)
        true += exact / n if op is ReduceOp.AVG else exact
    gap = np.abs(true - applied).max()
    owed = comm.take_residual(k)
    assert gap > 1e-3  # the hop really rounded
    np.testing.assert_allclose(applied + owed, true, rtol=0, atol=2e-5 * np.abs(true).max())
    assert comm.residuals == {} and comm.take_residual(k) is owed  # moved once; reading again owes the same


@pytest.mark.mpi(min_size=4)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("per_host", [1, 2])
def test_owed_residual_completes_the_hsdp_running_mean(monkeypatch, per_host):
    """Shard groups of 2 (across hosts with one rank per host, inside a host with two), replicas across hosts:
    the reduce-scatter's and the replicate hop's residuals together owe the mean's gap."""
    n = dist.get_world_size()
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", str(per_host))
    mesh = init_device_mesh("cpu", (n // 2, 2), mesh_dim_names=("replicate", "shard"))
    shard, rep = mesh.get_group("shard"), mesh.get_group("replicate")
    r, k = dist.get_rank(), 300
    comm = QuantizedReduceScatter("int8", block_size=32)
    applied, true = np.zeros(k), np.zeros(k)
    for t in range(4):
        inputs = [_rows(k, 2, 10 * t + src) for src in range(n)]
        out = np.empty(k, np.float32)
        comm(out, inputs[r].reshape(-1).copy(), shard, ReduceOp.AVG)
        comm.all_reduce(out, rep, ReduceOp.AVG)
        applied += out
        true += sum(x[shard.rank()].astype(np.float64) for x in inputs) / n
    hops = {key[0] for key in comm.residuals}
    assert hops == ({"rs", "ar", "ar-sum"} if per_host == 1 else {"ar", "ar-sum"})
    assert np.abs(true - applied).max() > 1e-4
    owed = comm.take_residual(k)
    np.testing.assert_allclose(applied + owed, true, rtol=0, atol=2e-5 * np.abs(true).max())


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        hp.manual_seed(5)
        self.a = nn.Linear(12, 40)
        self.b = nn.Linear(40, 12)

    def forward(self, x):
        return self.b(self.a(x).tanh())


def _sharded(mesh=None, kind="int4"):
    model = _Net()
    for m in (model.a, model.b, model):
        fully_shard(m, mesh=mesh)
        m.set_custom_reduce_scatter(QuantizedReduceScatter(kind, block_size=32))
    return model, hp.optim.AdamW(model.parameters(), lr=1e-2)


def _steps(model, opt, steps, start):
    r = dist.get_rank()
    out = []
    for t in range(start, start + steps):
        rng = np.random.default_rng(7 * t + r)
        x = hp.tensor(rng.standard_normal((6, 12)).astype(np.float32))
        loss = ((model(x) - x.flip(1)) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def _full(state):
    return {name: v.full_tensor().numpy().copy() for name, v in state.items()}


class _Linear(nn.Module):
    """loss = sum(w * c): the gradient is c whatever w is, so SGD's path is the applied gradients' sum."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(hp.zeros(40, 12))
        self.v = nn.Parameter(hp.zeros(33))

    def forward(self, c, d):
        return (self.w * c).sum() + (self.v * d).sum()


@pytest.mark.timeout(60)
def test_what_reading_the_state_owes_reaches_the_next_step(monkeypatch):
    n = dist.get_world_size()
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", str(max(1, n // 2)))
    model = _Linear()
    fully_shard(model)
    model.set_custom_reduce_scatter(QuantizedReduceScatter("int4", block_size=32))
    opt = hp.optim.SGD(model.parameters(), lr=0.5)
    true = {"w": np.zeros((40, 12)), "v": np.zeros(33)}
    for t in range(6):
        cs = [_rows(12, 40, 30 * t + src) for src in range(n)]
        ds = [_rows(33, 1, 30 * t + 17 + src)[0] for src in range(n)]
        r = dist.get_rank()
        model(hp.tensor(cs[r]), hp.tensor(ds[r])).backward()
        opt.step()
        opt.zero_grad()
        true["w"] += sum(c.astype(np.float64) for c in cs) / n
        true["v"] += sum(d.astype(np.float64) for d in ds) / n
        if t == 2:
            get_residual_state_dict(model)  # moves the hops' residuals into what the next step owes
    owed = _full(get_residual_state_dict(model))
    for name, p in model.state_dict().items():
        got = p.full_tensor().numpy().astype(np.float64)
        assert np.abs(got + 0.5 * true[name]).max() > 1e-3  # the steps applied rounded sums
        np.testing.assert_allclose(got - 0.5 * owed[name], -0.5 * true[name], rtol=0, atol=1e-4, err_msg=name)


@pytest.mark.timeout(120)
def test_a_run_loaded_from_its_state_continues_bit_for_bit(monkeypatch, tmp_path):
    n = dist.get_world_size()
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", str(max(1, n // 2)))
    path = _same(str(tmp_path.parent / "residual-ckpt") if dist.get_rank() == 0 else None)
    model, opt = _sharded()
    _steps(model, opt, 3, 0)
    state = {"model": dcp.get_model_state_dict(model), "optim": dcp.get_optimizer_state_dict(model, opt),
             "residual": get_residual_state_dict(model)}
    saved = _full(state["residual"])
    assert set(saved) == {"a.weight", "a.bias", "b.weight", "b.bias"}
    assert all(saved[name].shape == tuple(p.shape) for name, p in model.named_parameters())
    assert max(np.abs(v).max() for v in saved.values()) > 0  # something is owed
    dcp.save(state, checkpoint_id=path)
    after = _steps(model, opt, 3, 3)
    final = {k: v.full_tensor().numpy() for k, v in model.state_dict().items()}

    other, other_opt = _sharded()
    loaded = {"model": dcp.get_model_state_dict(other), "optim": dcp.get_optimizer_state_dict(other, other_opt),
              "residual": get_residual_state_dict(other)}
    dcp.load(loaded, checkpoint_id=path)
    dcp.set_model_state_dict(other, loaded["model"])
    dcp.set_optimizer_state_dict(other, other_opt, loaded["optim"])
    set_residual_state_dict(other, loaded["residual"])
    assert _steps(other, other_opt, 3, 3) == after
    for name, v in other.state_dict().items():
        np.testing.assert_array_equal(v.full_tensor().numpy(), final[name], err_msg=name)


def _same(value):
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@pytest.mark.mpi(min_size=4)
@pytest.mark.timeout(120)
def test_state_saved_under_one_layout_loads_under_another_with_the_same_total(monkeypatch, tmp_path):
    """Saved by FULL_SHARD over 4 ranks on 2 hosts, loaded by HSDP (2 replicas x 2): each rank owes its new
    piece, and the owed total reads back equal to the saved one."""
    n = dist.get_world_size()
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", str(n // 2))
    path = _same(str(tmp_path.parent / "residual-reshard") if dist.get_rank() == 0 else None)
    model, opt = _sharded()
    _steps(model, opt, 2, 0)
    state = {"residual": get_residual_state_dict(model)}
    saved = _full(state["residual"])
    dcp.save(state, checkpoint_id=path)

    mesh = init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("replicate", "shard"))
    other, other_opt = _sharded(mesh)
    loaded = {"residual": get_residual_state_dict(other)}
    assert all(not np.abs(v).any() for v in _full(loaded["residual"]).values())  # a fresh run owes nothing
    dcp.load(loaded, checkpoint_id=path)
    set_residual_state_dict(other, loaded["residual"])
    again = _full(get_residual_state_dict(other))
    for name in saved:
        np.testing.assert_array_equal(again[name], saved[name], err_msg=name)
    losses = _steps(other, other_opt, 2, 2)  # and it trains on from there
    assert all(np.isfinite(losses))


@pytest.mark.timeout(60)
def test_bad_residual_state_is_named():
    model, _ = _sharded()
    with pytest.raises(KeyError, match="nope"):
        set_residual_state_dict(model, {"nope": hp.zeros(3)})
    state = get_residual_state_dict(model)
    wrong = dict(state, **{"a.bias": hp.zeros(7)})
    with pytest.raises(ValueError, match=r"residual of a.bias: shape \(7,\), the parameter's is \(40,\)"):
        set_residual_state_dict(model, wrong)


@pytest.mark.timeout(60)
def test_one_instance_with_error_feedback_serves_one_unit():
    model = _Net()
    fully_shard(model.a)
    fully_shard(model)
    comm = QuantizedReduceScatter("int8")
    model.a.set_custom_reduce_scatter(comm)
    model.a.set_custom_reduce_scatter(comm)  # the same unit again is fine
    with pytest.raises(ValueError, match="already reduces another FSDP unit's gradients"):
        model.set_custom_reduce_scatter(comm)
    shared = QuantizedReduceScatter("int8", error_feedback=False)  # stateless: may serve several
    model.a.set_custom_reduce_scatter(shared)
    model.set_custom_reduce_scatter(shared)
    assert model.a._get_fsdp_state()._all_param_groups()[0].reduce_scatter_comm is shared
