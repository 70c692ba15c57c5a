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
    with pytest.raises(TypeError, match="storage_writer"):
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


def _shard_bytes(path):
    real = os.path.realpath(path)
    return {os.path.basename(f): open(f, "rb").read()
            for f in sorted(glob.glob(os.path.join(real, "rank_*.safetensors")))}


def _odd_state(rank, seed=0):
    """Plain tensors that stage at unaligned file offsets: odd-length int8, float64 after it, a
    non-contiguous (transposed) float32, bfloat16 and a 0-d float64; replicated, so rank 0 writes them,
    plus one per-rank entry each rank writes itself."""
    rng = np.random.default_rng(seed)
    t = hp.tensor(rng.standard_normal((5, 3)).astype(np.float32)).t()
    assert not t._data.flags.c_contiguous
    return {"a": hp.tensor(rng.integers(-100, 100, 7).astype(np.int8)),
            "b": hp.tensor(rng.standard_normal(9), dtype=hp.float64),
            "c": t,
            "d": hp.tensor(rng.standard_normal(11).astype(np.float32)).to(hp.bfloat16),
            "e": hp.tensor(np.array(2.5), dtype=hp.float64),
            f"rank{rank}": hp.tensor(rng.standard_normal(1000 + rank).astype(np.float32)),
            "n": 3}


def test_unaligned_and_strided_pieces_give_the_same_files_as_save(shared_dir):
    rank = MPI.COMM_WORLD.rank
    sync_path, async_path = os.path.join(shared_dir, "sync"), os.path.join(shared_dir, "async")
    dcp.save(_odd_state(rank), checkpoint_id=sync_path)
    dcp.async_save(_odd_state(rank), checkpoint_id=async_path).result(timeout=60)
    want, got = _shard_bytes(sync_path), _shard_bytes(async_path)
    assert sorted(want) == sorted(got) and len(want) == MPI.COMM_WORLD.size
    for name in want:
        assert got[name] == want[name], name
    dcp.verify_checkpoint(async_path)  # every block CRC in metadata.json matches the bytes
    sd = {k: (hp.zeros_like(v) if hasattr(v, "_data") else 0) for k, v in _odd_state(rank, seed=1).items()}
    sd["c"] = hp.zeros(3, 5)
    dcp.load(sd, checkpoint_id=async_path)
    ref = _odd_state(rank)
    for k, v in ref.items():
        if hasattr(v, "_data"):
            np.testing.assert_array_equal(np.asarray(sd[k]._data), np.asarray(v._data), err_msg=k)
    assert sd["n"] == 3


def test_the_staging_buffer_is_reused_and_grows_with_the_state(shared_dir):
    from hpcfsdp.distributed.checkpoint import _async

    model, opt = _trained()
    dcp.async_save(_state(model, opt, 1), checkpoint_id=os.path.join(shared_dir, "a")).result(timeout=60)
    buf = _async._STAGING["buf"]
    addr = _async._STAGING["arr"].ctypes.data
    assert addr % _async._ALIGN == 0
    for step in (2, 3):  # training changed the values, not the sizes: the same buffer, no new memory
        for x, y in gpt_batches(1, 4 * world()[0] + 1, seed=step):
            _step(model, opt, x, y)
        dcp.async_save(_state(model, opt, step), checkpoint_id=os.path.join(shared_dir, "a")).result(timeout=60)
        assert _async._STAGING["buf"] is buf and _async._STAGING["arr"].ctypes.data == addr
    # and each of those saves holds the values of its own step, like a synchronous save
    dcp.save(_state(model, opt, 3), checkpoint_id=os.path.join(shared_dir, "s"))
    assert _shard_bytes(os.path.join(shared_dir, "a")) == _shard_bytes(os.path.join(shared_dir, "s"))
    big = {"x": hp.tensor(np.ones(len(_async._STAGING["arr"]) // 4 + 1, np.float32))}
    dcp.async_save(big, checkpoint_id=os.path.join(shared_dir, "big")).result(timeout=60)
    if MPI.COMM_WORLD.rank == 0:  # rank 0 writes the replicated tensor: its buffer had to grow
        assert len(_async._STAGING["arr"]) >= 4 * big["x"].numel()
    sd = {"x": hp.zeros(big["x"].numel())}
    dcp.load(sd, checkpoint_id=os.path.join(shared_dir, "big"))
    assert np.all(np.asarray(sd["x"]._data) == 1.0)


def test_the_writer_thread_runs_at_a_lower_priority(shared_dir, hook):
    from hpcfsdp.distributed.checkpoint import _async

    seen = {}

    def record(stage):
        if stage == "write":
            tid = threading.get_native_id()
            seen["thread"] = threading.current_thread().name
            seen["nice"] = os.getpriority(os.PRIO_PROCESS, tid)

    hook(record)
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    dcp.async_save({"w": hp.ones(4)}, checkpoint_id=os.path.join(shared_dir, "ck")).result(timeout=60)
    assert seen["thread"] == "hpcfsdp-async-save"
    assert seen["nice"] == min(19, mine + _async._NICE) and os.getpriority(
        os.PRIO_PROCESS, threading.get_native_id()) == mine  # the caller's own priority is untouched


def test_a_staging_error_is_raised_at_result_on_every_rank(shared_dir, monkeypatch):
    from hpcfsdp.distributed.checkpoint import _async

    path = os.path.join(shared_dir, "ck")
    dcp.save({"w": hp.ones(4), "rank": hp.ones(2)}, checkpoint_id=path)
    before = os.path.realpath(path)
    if MPI.COMM_WORLD.rank == 1:
        def boom(*a, **k):
            raise MemoryError("cannot allocate the staging buffer")

        monkeypatch.setattr(_async, "_staging", boom)
    state = {"w": hp.ones(4), f"r{MPI.COMM_WORLD.rank}": hp.ones(2)}  # every rank has something to stage
    fut = dcp.async_save(state, checkpoint_id=path)
    with pytest.raises(RuntimeError, match=r"rank 1: MemoryError: cannot allocate the staging buffer"):
        fut.result(timeout=60)
    assert os.path.realpath(path) == before
    MPI.COMM_WORLD.Barrier()
    assert glob.glob(os.path.join(shared_dir, "ck.tmp-*")) == []


def test_direct_and_ordinary_writes_give_the_same_file(shared_dir, monkeypatch):
    """The image is written with O_DIRECT where the file system takes it; where it refuses (EINVAL at open,
    or at a write), ordinary writes of the same bytes. Every path gives the same file, of its exact size."""
    from hpcfsdp.distributed.checkpoint import _async

    rank = MPI.COMM_WORLD.rank
    size = 3 * _async._ALIGN + 123 + (5 << 20)
    img = _async._staging(size)
    img[:size] = np.random.default_rng(rank).integers(0, 256, size, dtype=np.uint8)
    want = img[:size].tobytes()
    real_open, real_pwrite = os.open, os.pwrite
    o_direct = getattr(os, "O_DIRECT", 0)

    def check(name, direct=True):
        p = os.path.join(shared_dir, f"{name}-{rank}.bin")
        used = _async._write_image(p, img, size, True, direct=direct)
        assert os.path.getsize(p) == size and open(p, "rb").read() == want, name
        return used

    check("plain", direct=False)
    check("direct")  # O_DIRECT on the repository's disk, or ordinary writes where it is refused

    def open_refusing_direct(path, flags, *a):
        if flags & o_direct:
            raise OSError(22, "Invalid argument")
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", open_refusing_direct)
    assert check("refused-at-open") is False
    monkeypatch.setattr(os, "open", real_open)
    calls = []

    def pwrite_refusing_second(fd, data, off):
        calls.append(off)
        if len(calls) == 2 and o_direct:
            raise OSError(22, "Invalid argument")
        return real_pwrite(fd, data, off)

    monkeypatch.setattr(_async, "_CHUNK", 1 << 20)
    monkeypatch.setattr(os, "pwrite", pwrite_refusing_second)
    assert check("refused-at-write") is False


class _DeviceArray:
    """Stands for a CuPy array: shape, dtype and get(out=) (a device-to-host copy into ``out``)."""

    def __init__(self, host):
        self._host, self.shape, self.dtype = host, host.shape, host.dtype
        self.copies = 0

    def get(self, out=None):
        assert out is not None and out.shape == self.shape and out.dtype == self.dtype
        out[...] = self._host
        self.copies += 1
        return out


def test_device_arrays_are_copied_once_into_the_staging_image():
    from hpcfsdp.distributed.checkpoint import _async, _storage

    rng = np.random.default_rng(0)
    host = [rng.standard_normal((3, 700)).astype(np.float32), rng.integers(0, 9, 5).astype(np.int8)]
    arrays = [_DeviceArray(host[0]), host[1], _DeviceArray(host[0][:, ::2].copy())]
    plan = [("w", (3, 700), "float32", (0, 0), (3, 700)), ("b", (5,), "int8", (0,), (5,)),
            ("v", (6, 350), "float32", (3, 0), (3, 350))]
    img, size, placed = _async._stage(plan, arrays, [0, 1, 2], 1024)
    prefix, starts = _storage.shard_file_header(
        [("w|0,0", (3, 700), np.float32), ("b|0", (5,), np.int8), ("v|3,0", (3, 350), np.float32)])
    want = prefix + host[0].tobytes() + host[1].tobytes() + host[0][:, ::2].tobytes()
    assert size == len(want) and img[:size].tobytes() == want
    assert [p[:3] for p in placed] == [("w|0,0", starts[0], 8400), ("b|0", starts[1], 5),
                                       ("v|3,0", starts[2], 4200)]
    for (_, start, n, crcs) in placed:  # the CRCs of the staged bytes, per 1024-byte block
        assert crcs == _storage.block_crcs(np.frombuffer(want, np.uint8)[start:start + n], 1024)
    assert arrays[0].copies == 1 and arrays[2].copies == 1


def test_a_write_failing_half_way_keeps_the_previous_checkpoint(shared_dir, monkeypatch):
    """Disk full after the first chunk of rank 0's file: nothing is committed, on any rank, and the
    previous checkpoint stays, whole and readable."""
    from hpcfsdp.distributed.checkpoint import _async

    model, opt = _trained()
    path = os.path.join(shared_dir, "ck")
    dcp.save(_state(model, opt, 2), checkpoint_id=path)
    before = os.path.realpath(path)
    real_pwrite, calls = os.pwrite, []

    def pwrite_full_disk(fd, data, off):
        calls.append(off)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_pwrite(fd, data, off)

    monkeypatch.setattr(_async, "_CHUNK", 4096)  # several write calls even for the tiny model
    if MPI.COMM_WORLD.rank == 0:
        monkeypatch.setattr(os, "pwrite", pwrite_full_disk)
    fut = dcp.async_save(_state(model, opt, 3), checkpoint_id=path)
    with pytest.raises(RuntimeError, match=r"rank 0: OSError.*No space left"):
        fut.result(timeout=60)
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    assert os.path.realpath(path) == before
    dcp.verify_checkpoint(path)
    assert dcp.read_metadata(path).extras["skeleton"]["step"] == 2
    MPI.COMM_WORLD.Barrier()
    assert glob.glob(os.path.join(shared_dir, "ck.tmp-*")) == []
