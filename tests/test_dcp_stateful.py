"""dcp.save/load/async_save with Stateful values (PyTorch's AppState pattern) on FSDP2 models at 2 and 4 ranks."""
import os
import shutil
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

import hpcfsdp as hp
import hpcfsdp.distributed.checkpoint as dcp
from hpcfsdp.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from hpcfsdp.distributed.checkpoint.stateful import Stateful
from hpcfsdp.distributed.fsdp import fully_shard

from _fsdp_util import gpt_batches, local, tiny_gpt, world


class AppState(Stateful):
    """PyTorch's DCP tutorial wrapper: the model and optimizer state dicts through get/set_state_dict."""

    def __init__(self, model, optimizer=None):
        self.model = model
        self.optimizer = optimizer

    def state_dict(self):
        model_state_dict, optimizer_state_dict = get_state_dict(self.model, self.optimizer)
        return {"model": model_state_dict, "optim": optimizer_state_dict}

    def load_state_dict(self, state_dict):
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])


class Counter:
    """Stateful by shape only (no base class): a tensor and a Python value; records the calls it gets."""

    def __init__(self, t, n):
        self.t, self.n, self.calls = t, n, []

    def state_dict(self):
        self.calls.append("state_dict")
        return {"t": self.t, "n": self.n}

    def load_state_dict(self, state_dict):
        self.calls.append("load_state_dict")
        self.loaded = state_dict
        self.n = state_dict["n"]


@pytest.fixture
def shared_dir():
    comm = MPI.COMM_WORLD
    d = tempfile.mkdtemp(prefix="hpcfsdp-stateful-", dir=os.getcwd()) if comm.rank == 0 else None
    d = comm.bcast(d)
    yield d
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(d, ignore_errors=True)


def test_stateful_is_a_runtime_checkable_protocol():
    assert isinstance(Counter(None, 0), Stateful) and isinstance(AppState(None), Stateful)
    assert isinstance(hp.nn.Linear(2, 2), Stateful)  # Modules and Optimizers are Stateful, as in PyTorch
    assert not isinstance({}, Stateful) and not isinstance(hp.zeros(2), Stateful)
    assert dcp.Stateful is Stateful


def _model(seed=0):
    model = tiny_gpt(seed)
    for b in model.transformer.h:
        fully_shard(b)
    fully_shard(model)
    return model, hp.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def _step(model, opt, x, y):
    _, loss = model(hp.tensor(local(x)), hp.tensor(local(y)))
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def _snapshot(model, opt):
    """Host copies of this rank's pieces of every parameter and optimizer state tensor, and the other state."""
    out = {}
    for name, p in model.named_parameters():
        out[name] = np.array(hp._backend.to_numpy(p.to_local()._data), copy=True)
    names = {id(p): n for n, p in model.named_parameters()}
    for p, st in opt.state.items():
        for k, v in st.items():
            if hasattr(v, "_data"):
                arr = v.to_local()._data if hasattr(v, "to_local") else v._data
                out[f"optim.{names[id(p)]}.{k}"] = np.array(hp._backend.to_numpy(arr), copy=True)
            else:
                out[f"optim.{names[id(p)]}.{k}"] = v
    return out


def _assert_same(got, want):
    assert sorted(got) == sorted(want)
    for k in want:
        if isinstance(want[k], np.ndarray):
            assert got[k].dtype == want[k].dtype, k
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)  # bit for bit (no tolerance)
        else:
            assert got[k] == want[k], k


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["save", "async_save"])
def test_app_state_save_train_load_resumes_bit_for_bit(shared_dir, how):
    w, _ = world()
    batches = gpt_batches(6, 4 * w + 1)
    model, opt = _model()
    for x, y in batches[:3]:
        _step(model, opt, x, y)
    want = _snapshot(model, opt)
    path = os.path.join(shared_dir, "ck")
    state = {"app": AppState(model, opt), "step": 3}
    if how == "save":
        dcp.save(state, checkpoint_id=path)
    else:
        dcp.async_save(state, checkpoint_id=path).result(timeout=60)
    assert isinstance(state["app"], AppState)  # save does not replace the object in the caller's dict
    uninterrupted = _step(model, opt, *batches[3])  # the next step of the uninterrupted run
    _step(model, opt, *batches[4])  # train on: parameters and optimizer state move away from the checkpoint
    assert not np.array_equal(_snapshot(model, opt)["transformer.wte.weight"], want["transformer.wte.weight"])

    state = {"app": AppState(model, opt), "step": 0}
    dcp.load(state, checkpoint_id=path)
    assert isinstance(state["app"], AppState) and state["step"] == 3
    _assert_same(_snapshot(model, opt), want)
    assert _step(model, opt, *batches[3]) == uninterrupted


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(180)
def test_app_state_loads_into_a_fresh_model(shared_dir):
    """A restarted job: a new model (different init) and an optimizer without state yet."""
    w, _ = world()
    batches = gpt_batches(4, 4 * w + 1)
    model, opt = _model()
    for x, y in batches[:2]:
        _step(model, opt, x, y)
    want = _snapshot(model, opt)
    path = os.path.join(shared_dir, "ck")
    dcp.save({"app": AppState(model, opt)}, checkpoint_id=path)
    uninterrupted = [_step(model, opt, x, y) for x, y in batches[2:]]

    model2, opt2 = _model(seed=5)
    dcp.load({"app": AppState(model2, opt2)}, checkpoint_id=path)
    _assert_same(_snapshot(model2, opt2), want)
    assert [_step(model2, opt2, x, y) for x, y in batches[2:]] == uninterrupted


@pytest.mark.mpi(min_size=2)
def test_stateful_values_next_to_plain_ones(shared_dir):
    """Only top-level Stateful values are converted; plain values are replaced by the loaded ones; objects get
    load_state_dict with the state dict they returned, filled in place."""
    rank = MPI.COMM_WORLD.rank
    path = os.path.join(shared_dir, "ck")
    a, b = Counter(hp.arange(6.0), 7), Counter(hp.full((2, 3), 2.0), "x")
    dcp.save({"b": b, "a": a, "plain": {"v": hp.ones(3), "k": 1}, "step": 5}, checkpoint_id=path)
    assert a.calls == ["state_dict"] and b.calls == ["state_dict"]
    sk = dcp.read_metadata(path).extras["skeleton"]
    assert sk["a"]["n"] == 7 and sk["b"]["n"] == "x" and sk["step"] == 5

    a2, b2 = Counter(hp.zeros(6), 0), Counter(hp.zeros(2, 3), "")
    t_a, v = a2.t, hp.zeros(3)
    sd = {"b": b2, "a": a2, "plain": {"v": v, "k": 0}, "step": 0}
    dcp.load(sd, checkpoint_id=path)
    assert sd["a"] is a2 and sd["b"] is b2 and sd["step"] == 5 and sd["plain"]["k"] == 1
    assert a2.calls == ["state_dict", "load_state_dict"] and a2.n == 7 and b2.n == "x"
    assert a2.loaded["t"] is t_a  # loaded in place into the tensor state_dict() returned
    np.testing.assert_array_equal(a2.t.numpy(), np.arange(6.0))
    np.testing.assert_array_equal(b2.t.numpy(), np.full((2, 3), 2.0))
    assert sd["plain"]["v"] is v and v.numpy().tolist() == [1.0, 1.0, 1.0]
    assert rank == MPI.COMM_WORLD.rank


@pytest.mark.mpi(min_size=2)
def test_load_calls_load_state_dict_in_sorted_key_order(shared_dir):
    order = []

    class Rec(Counter):
        def __init__(self, name):
            super().__init__(hp.zeros(2), 0)
            self.name = name

        def load_state_dict(self, state_dict):
            order.append(self.name)

    path = os.path.join(shared_dir, "ck")
    dcp.save({k: Rec(k) for k in ("c", "a", "b")}, checkpoint_id=path)
    dcp.load({k: Rec(k) for k in ("c", "a", "b")}, checkpoint_id=path)
    assert order == ["a", "b", "c"]


def test_filesystem_writer_reader_and_default_planners_select_the_directory(shared_dir):
    path = os.path.join(shared_dir, "fs")
    t = hp.arange(8, dtype=hp.float32) + 1  # plain tensors are replicated: the same on every rank
    dcp.save({"t": t, "n": 3}, storage_writer=dcp.FileSystemWriter(path), planner=dcp.DefaultSavePlanner())
    out = {"t": hp.zeros(8), "n": 0}
    dcp.load(out, storage_reader=dcp.FileSystemReader(path), planner=dcp.DefaultLoadPlanner())
    np.testing.assert_array_equal(out["t"].numpy(), t.numpy())
    assert out["n"] == 3
    # checkpoint_id wins over the storage object's path, as PyTorch's reset(checkpoint_id)
    other = os.path.join(shared_dir, "other")
    dcp.save({"t": t * 2}, checkpoint_id=other, storage_writer=dcp.FileSystemWriter(path))
    got = {"t": hp.zeros(8)}
    dcp.load(got, checkpoint_id=other)
    np.testing.assert_array_equal(got["t"].numpy(), (t * 2).numpy())
    # a key the checkpoint lacks: an error, unless the planner allows a partial load
    partial = {"t": hp.zeros(8), "extra": hp.ones(2)}
    with pytest.raises(Exception, match="extra"):
        dcp.load(partial, checkpoint_id=path)
    dcp.load(partial, checkpoint_id=path, planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    np.testing.assert_array_equal(partial["extra"].numpy(), np.ones(2, np.float32))
    np.testing.assert_array_equal(partial["t"].numpy(), t.numpy())
    with pytest.raises(TypeError, match="planner"):
        dcp.save({"t": t}, checkpoint_id=path, planner=object())
    with pytest.raises(TypeError, match="storage_reader"):
        dcp.load({"t": t}, storage_reader=object())
    with pytest.raises(ValueError, match="checkpoint_id` must be specified"):
        dcp.save({"t": t})
