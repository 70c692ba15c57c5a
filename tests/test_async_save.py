"""dcp.async_save at 2 ranks: same bytes as save, a private host copy, training while it writes, one save in
flight at a time, background errors raised on every rank, the previous checkpoint kept until the commit."""
import glob
import os
import shutil
import tempfile
import threading

import numpy as np
import pytest
from mpi4py import MPI

import hpcfsdp as hp
import hpcfsdp.distributed.checkpoint as dcp
from hpcfsdp.distributed.checkpoint import _format
from hpcfsdp.distributed.fsdp import fully_shard

from _fsdp_util import full, gpt_batches, local, tiny_gpt, world

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


@pytest.fixture
def shared_dir():
    comm = MPI.COMM_WORLD
    d = tempfile.mkdtemp(prefix="hpcfsdp-async-", dir=os.getcwd()) if comm.rank == 0 else None
    d = comm.bcast(d)
    yield d
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def hook():
    """Install a fault hook of _format for one test (it runs on the background thread of async_save)."""
    def install(fn):
        _format._fault_hook = fn
    yield install
    _format._fault_hook = None


def _trained(steps=2, seed=0):
    w, _ = world()
    model = tiny_gpt(seed)
    for b in model.transformer.h:
        fully_shard(b)
    fully_shard(model)
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in gpt_batches(steps, 4 * w + 1):
        _step(model, opt, x, y)
    return model, opt


def _step(model, opt, x, y):
    _, loss = model(hp.tensor(local(x)), hp.tensor(local(y)))
    loss.backward()
    opt.step()
    opt.zero_grad()


def _state(model, opt, step):
    return {"model": dcp.get_model_state_dict(model), "optim": dcp.get_optimizer_state_dict(model, opt),
            "step": step}


def _local_arrays(sd, prefix=""):
    out = {}
    for k, v in sd.items():
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(_local_arrays(v, name))
        elif hasattr(v, "_data"):
            arr = v.to_local()._data if hasattr(v, "to_local") else v._data
            out[name] = np.array(hp._backend.to_numpy(arr), copy=True)
    return out


def _zero(model):
    with hp.no_grad():
        for p in model.parameters():
            p._data[...] = 0.0


def test_async_save_loads_bit_for_bit_like_save(shared_dir):
    model, opt = _trained()
    want = _local_arrays(_state(model, opt, 2))
    sync_path, async_path = os.path.join(shared_dir, "sync"), os.path.join(shared_dir, "async")
    dcp.save(_state(model, opt, 2), checkpoint_id=sync_path)
    fut = dcp.async_save(_state(model, opt, 2), checkpoint_id=async_path)
    _zero(model)  # the save holds its own host copy: changing the model now must not reach the file
    assert fut.result(timeout=60) is None
    for path in (sync_path, async_path):
        model2, opt2 = _trained(steps=1, seed=1)
        sd = _state(model2, opt2, 0)
        dcp.load(sd, checkpoint_id=path)
        got = _local_arrays(sd)
        assert sd["step"] == 2 and sorted(got) == sorted(want)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{path}: {k}")
    # same shard files byte for byte
    for f in sorted(glob.glob(os.path.join(os.path.realpath(sync_path), "rank_*.safetensors"))):
        g = os.path.join(os.path.realpath(async_path), os.path.basename(f))
        assert open(f, "rb").read() == open(g, "rb").read(), os.path.basename(f)


def test_training_continues_while_it_writes_and_the_old_checkpoint_stays(shared_dir, hook):
    model, opt = _trained()
    w, _ = world()
    path = os.path.join(shared_dir, "ck")
    dcp.save(_state(model, opt, 2), checkpoint_id=path)
    before = os.path.realpath(path)
    release, writing = threading.Event(), threading.Event()

    def block(stage):
        if stage == "write":
            writing.set()
            assert release.wait(60)

    hook(block)
    fut = dcp.async_save(_state(model, opt, 3), checkpoint_id=path)
    assert writing.wait(30)
    ref = full(model.lm_head.weight).copy()
    for x, y in gpt_batches(2, 4 * w + 1, seed=7):  # FSDP collectives on the training communicator
        _step(model, opt, x, y)
    assert not fut.done()
    assert not np.array_equal(full(model.lm_head.weight), ref)  # it trained
    assert os.path.realpath(path) == before and dcp.read_metadata(path).extras["skeleton"]["step"] == 2
    release.set()
    fut.result(timeout=60)
    assert os.path.realpath(path) != before and dcp.read_metadata(path).extras["skeleton"]["step"] == 3
    assert not os.path.exists(before)  # the previous checkpoint was replaced, not left behind


def test_a_second_async_save_waits_for_the_first(shared_dir, hook):
    model, opt = _trained()
    calls, release = [], threading.Event()

    def block(stage):
        if stage == "write":
            calls.append(stage)
            if len(calls) == 1:
                assert release.wait(60)

    hook(block)
    p1, p2 = os.path.join(shared_dir, "a"), os.path.join(shared_dir, "b")
    f1 = dcp.async_save(_state(model, opt, 1), checkpoint_id=p1)
    timer = threading.Timer(0.3, release.set)
    timer.start()
    f2 = dcp.async_save(_state(model, opt, 2), checkpoint_id=p2)
    assert f1.done() and f1.exception() is None  # async_save returned only after the first was committed
    f2.result(timeout=60)
    timer.join()
    assert dcp.read_metadata(p1).extras["skeleton"]["step"] == 1
    assert dcp.read_metadata(p2).extras["skeleton"]["step"] == 2


def test_a_background_error_is_raised_at_result_on_every_rank(shared_dir, hook):
    model, opt = _trained()
    path = os.path.join(shared_dir, "ck")
    dcp.save(_state(model, opt, 2), checkpoint_id=path)
    before = os.path.realpath(path)
    rank = MPI.COMM_WORLD.rank

    def fail(stage):
        if stage == "write" and rank == 1:
            raise OSError(28, "No space left on device")

    hook(fail)
    fut = dcp.async_save(_state(model, opt, 3), checkpoint_id=path)
    with pytest.raises(RuntimeError, match=r"nothing was committed: rank 1: OSError.*No space left"):
        fut.result(timeout=60)
    assert os.path.realpath(path) == before and dcp.read_metadata(path).extras["skeleton"]["step"] == 2
    MPI.COMM_WORLD.Barrier()
    assert glob.glob(os.path.join(shared_dir, "ck.tmp-*")) == []
    # the next save works
    _format._fault_hook = None
    dcp.async_save(_state(model, opt, 4), checkpoint_id=path).result(timeout=60)
    assert dcp.read_metadata(path).extras["skeleton"]["step"] == 4


def test_async_save_refuses_what_it_does_not_do(shared_dir):
    with pytest.raises(ValueError, match="checkpoint_id"):
        dcp.async_save({})
    with pytest.raises(ValueError, match="storage_writer"):
        dcp.async_save({}, checkpoint_id=shared_dir, storage_writer=object())
    with pytest.raises(ValueError, match="async_checkpointer_type"):
        dcp.async_save({}, checkpoint_id=shared_dir, async_checkpointer_type="process")
    with pytest.raises(TypeError, match="dict"):
        dcp.async_save([1], checkpoint_id=shared_dir)


def test_below_thread_multiple_the_save_finishes_before_returning(shared_dir, monkeypatch):
    """Without MPI_THREAD_MULTIPLE no second thread may call MPI: async_save writes and commits on the caller."""
    from hpcfsdp.distributed import _mpi

    monkeypatch.setattr(_mpi, "thread_level", lambda: MPI.THREAD_SERIALIZED)
    model, opt = _trained()
    want = _local_arrays(_state(model, opt, 2))
    path = os.path.join(shared_dir, "ck")
    fut = dcp.async_save(_state(model, opt, 2), checkpoint_id=path)
    assert fut.done() and fut.result() is None
    sd = _state(*_trained(steps=1, seed=1), 0)
    dcp.load(sd, checkpoint_id=path)
    got = _local_arrays(sd)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
