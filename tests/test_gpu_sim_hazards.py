"""The simulated CUDA device catches the hazards beyond read-after-write: write-after-read, write-after-write,
MPI's writes landing at completion and its ownership window, per-thread host visibility, and CuPy's memory
pool reusing a block another stream still uses.

The first part drives hpcfsdp.testing.cuda_sim directly. The MPI part runs on the device hpcfsdp uses
(HPCFSDP_CUDA_SIM=1): each test runs the code as it is (it passes), then plants one missing synchronisation by
monkeypatching the product (or, where the product is the user's own ordering, by leaving it out), and shows
that the simulation fails it with a CudaSimError naming the hazard. Every planted bug here passed the
simulation as it was before these hazards were modelled (it checked read-after-write only, with one host
knowledge shared by all threads).
"""
import threading
import time

import numpy as np
import pytest

from hpcfsdp.testing import _sim_mpi, _sim_runtime
from hpcfsdp.testing import cuda_sim as cs

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_sim]

POOL = cs.get_default_memory_pool()


@pytest.fixture(autouse=True)
def _clean_device():
    """Each test starts and ends with every device idle and known so, and no free pool block: the hazards a
    test plants stay in it (a freed block would carry them to another test's allocation)."""
    def settle():
        for d in range(cs.cuda.runtime.getDeviceCount()):
            with cs.cuda.Device(d):
                cs.cuda.Device(d).synchronize()
                POOL.free_all_blocks()
    cs.Device(0).use()
    settle()
    yield
    cs.Device(0).use()
    settle()


def _side():
    return cs.cuda.Stream(non_blocking=True)


def _null():
    return cs.cuda.get_current_stream()


# ------------------------------------------------------------------------------------------------
# streams: write-after-read and write-after-write

def test_a_write_must_be_ordered_after_other_streams_reads():
    a = cs.ones(1000, dtype=np.float32)
    _null().synchronize()
    side = _side()
    with side:
        b = a * 2  # the side stream reads a
    with pytest.raises(cs.CudaSimError, match=r"write-after-read: ndarray.fill writes float32\[1000\].*read by mul") as e:
        a.fill(0)  # the null stream overwrites a while the side stream may still read it
    assert "test_gpu_sim_hazards.py" in str(e.value)  # the stack of the read
    ev = side.record()
    _null().wait_event(ev)  # ordered on the device: fine
    a.fill(0)
    # reads of reads never conflict: two streams read the same buffer at once
    side2 = _side()
    side2.wait_event(_null().record())  # side2 sees the fill
    with side2:
        d = a * 3
    e2 = a * 4
    side.synchronize()
    side2.synchronize()
    np.testing.assert_array_equal((b + d + e2).get(), np.full(1000, 2 + 0 + 0, np.float32))


def test_a_write_must_be_ordered_after_other_streams_writes():
    a = cs.zeros(64, dtype=np.float32)
    _null().synchronize()
    side = _side()
    with side:
        a.fill(1)  # the side stream writes a
    with pytest.raises(cs.CudaSimError, match=r"write-after-write: ndarray.__setitem__ writes float32\[64\].*"
                                              r"write by ndarray.fill"):
        a[:8] = 2  # the null stream writes a too, unordered: which write lands last?
    side.synchronize()  # ordered through the host
    a[:8] = 2
    np.testing.assert_array_equal(a.get()[:9], [2] * 8 + [1])


# ------------------------------------------------------------------------------------------------
# MPI: the ownership window, writes at completion

def test_mpi_owns_its_buffers_until_the_call_completes():
    inp = cs.full(4, 3.0, dtype=np.float32)
    out = cs.zeros(8, dtype=np.float32)
    _null().synchronize()
    tok = _sim_mpi.begin([inp], [out], "MPI Iallgather")
    try:
        with pytest.raises(cs.CudaSimError, match=r"MPI ownership window: ndarray.sum reads float32\[8\].*MPI Iallgather "
                                                  r"\(still in flight"):
            out.sum()  # the output is written at completion
        with pytest.raises(cs.CudaSimError, match=r"MPI ownership window: ndarray.fill writes float32\[4\]"):
            inp.fill(0)  # MPI may still be reading its input
        assert float(inp.sum()) == 12.0  # reading the input is fine
        with pytest.raises(cs.CudaSimError, match="MPI ownership window"):
            _sim_mpi.begin([out], [], "MPI Isend")  # nor may another MPI call touch its output
    finally:
        _sim_mpi.end(tok)
    assert float(out.sum()) == 0.0  # completed, and this thread knows it: its writes are ordered now
    seen = []

    def other_thread(snapshot):
        if snapshot is not None:
            _sim_runtime.acquire(snapshot)
        try:
            with _side():  # a stream of its own (the null stream is ordered after the main thread's sum)
                out.sum()
            seen.append("ok")
        except cs.CudaSimError as e:
            seen.append(str(e))

    for snap in (None, _sim_runtime.publish()):
        t = threading.Thread(target=other_thread, args=(snap,), name="consumer")
        t.start()
        t.join()
    assert "read-after-write" in seen[0] and "MPI Iallgather" in seen[0] and "host thread 'MainThread'" in seen[0]
    assert seen[1] == "ok"  # after the hand-off from the thread that saw the call complete


# ------------------------------------------------------------------------------------------------
# host threads: each knows what it synchronised, and what was handed to it

def test_a_synchronize_counts_only_for_the_thread_that_made_it():
    a = cs.ones(16, dtype=np.float32)
    _null().synchronize()
    side = _side()
    with side:
        b = a * 5
    snaps = []

    def comm():  # the communication thread synchronises the side stream, then hands over what it knows
        side.synchronize()
        snaps.append(_sim_runtime.publish())

    t = threading.Thread(target=comm, name="comm")
    t.start()
    t.join()
    with pytest.raises(cs.CudaSimError, match=r"read-after-write: add reads float32\[16\].*not synchronised"):
        b + 1  # the main thread knows nothing of the other thread's synchronize
    _sim_runtime.acquire(snaps[0])
    np.testing.assert_array_equal((b + 1).get(), np.full(16, 6, np.float32))


# ------------------------------------------------------------------------------------------------
# CuPy's memory pool

def test_the_pool_counts_rounded_blocks_and_reuses_them_per_stream():
    dev = cs.cuda.runtime.getDevice()
    used0, total0 = POOL.used_bytes(), POOL.total_bytes()
    a = cs.empty(100, dtype=np.uint8)  # rounded up to 512 bytes
    b = cs.empty(513, dtype=np.uint8)  # 1024
    z = cs.empty(0, dtype=np.float32)  # no block
    assert POOL.used_bytes() - used0 == 512 + 1024 and POOL.total_bytes() - total0 == 512 + 1024
    del a, z
    assert POOL.used_bytes() - used0 == 1024 and POOL.total_bytes() - total0 == 512 + 1024
    assert POOL.free_bytes() == 512 and POOL.n_free_blocks() == 1
    c = cs.empty(400, dtype=np.uint8)  # same rounded size on the same stream: the freed block
    assert POOL.n_free_blocks() == 0 and POOL.total_bytes() - total0 == 512 + 1024
    side = _side()
    del c
    with side:
        d = cs.empty(512, dtype=np.uint8)  # another stream's arena: a new block
    assert POOL.n_free_blocks() == 1 and POOL.total_bytes() - total0 == 512 + 1024 + 512
    POOL.free_all_blocks()
    assert POOL.free_bytes() == 0 and POOL.total_bytes() - total0 == 1024 + 512
    del b, d
    with cs.cuda.Device(1 - dev):
        assert POOL.used_bytes() == 0  # the pool of the current device


def test_a_freed_block_carries_other_streams_pending_accesses_to_its_next_allocation():
    x = cs.ones(3000, dtype=np.float32)
    _null().synchronize()
    side = _side()
    with side:
        y = x * 2  # the side stream reads x
    del x  # freed to the null stream's arena while the side stream may still read it
    with pytest.raises(cs.CudaSimError, match=r"(?s)memory-pool reuse: ones writes float32\[3000\].*read by mul"
                                              r".*freed by another array") as e:
        cs.ones(3000, dtype=np.float32)  # the next allocation of that size on the null stream gets the block
    assert "12288-byte block" in str(e.value)
    side.synchronize()
    np.testing.assert_array_equal(y.get(), np.full(3000, 2, np.float32))
    # ordered before the reuse: an event of the side stream waited on the allocation stream
    x = cs.ones(3000, dtype=np.float32)
    _null().synchronize()
    with side:
        y = x * 2
    _null().wait_event(side.record())
    del x
    np.testing.assert_array_equal(cs.full(3000, 7, dtype=np.float32).get(), np.full(3000, 7, np.float32))
    # or known complete by the thread that frees it
    x = cs.ones(3000, dtype=np.float32)
    _null().synchronize()
    with side:
        y = x * 2
    side.synchronize()
    del x
    cs.zeros(3000, dtype=np.float32).fill(1)


def test_free_all_blocks_hands_fresh_memory_to_the_next_allocation():
    x = cs.ones(3000, dtype=np.float32)
    _null().synchronize()
    side = _side()
    with side:
        y = x * 2
    del x
    POOL.free_all_blocks()  # the block goes back to the device: the next allocation is another one
    assert float(cs.ones(3000, dtype=np.float32).sum()) == 3000.0
    side.synchronize()
    del y


def test_hpcfsdp_streams_free_a_tensor_used_on_another_stream_only_after_waiting_for_it(monkeypatch):
    """PyTorch's record_stream problem on hpcfsdp.cuda streams: the consumer stream must wait for the side
    stream before a tensor the side stream used is freed and its block reused."""
    import hpcfsdp as hp
    from hpcfsdp import _backend

    assert _backend.cuda_simulated()  # gpu_sim: conftest leaves these to the simulation

    def step(planted: bool):
        main, side = hp.cuda.current_stream(), hp.cuda.Stream()
        x = hp.ones(3000, device="cuda")  # (3000,) on the main stream
        side.wait_stream(main)
        with hp.cuda.stream(side):
            y = x * 2  # the side stream reads x
        if planted:
            monkeypatch.setattr(hp.cuda.Stream, "wait_stream", lambda self, other: None)
        main.wait_stream(side)  # orders the side stream's read (and y) before what main does next
        del x  # x's block goes back to the main stream's arena
        z = hp.zeros(3000, device="cuda")  # reuses it
        side.synchronize()
        return float((y + z).sum().item())

    assert step(planted=False) == 6000.0
    with pytest.raises(cs.CudaSimError, match=r"memory-pool reuse: zeros writes float32\[3000\].*read by mul"):
        step(planted=True)


# ------------------------------------------------------------------------------------------------
# the product's collectives (HPCFSDP_CUDA_SIM=1); at 2 ranks both ranks fail alike unless said otherwise

def _sim_only():
    from hpcfsdp import _backend

    assert _backend.cuda_simulated()  # gpu_sim: conftest leaves these to the simulation


def _mpi_group(monkeypatch, aware: bool):
    """A fresh group over every rank whose device arrays take the MPI path (not NCCL): the device pointer itself
    to MPI (aware: the simulated device's memory is host memory), or staged through pinned host memory. The
    default group is reset too, so FSDP (which runs on it) chooses its path again under this setting."""
    from hpcfsdp.distributed import _c10d_groups
    from hpcfsdp.distributed import _mpi
    from hpcfsdp.distributed.process_group import ProcessGroup

    monkeypatch.setattr(_mpi, "_CUDA_AWARE", (aware, "test"))
    monkeypatch.setenv("HPCFSDP_GPU_COMM", "mpi" if aware else "staged")
    monkeypatch.setattr(_c10d_groups.default_group(), "_gpu", None)
    return ProcessGroup(name=f"sim-hazard-{'mpi' if aware else 'staged'}")


@pytest.fixture
def cuda_aware(monkeypatch):
    return _mpi_group(monkeypatch, True)


@pytest.fixture
def staged(monkeypatch):
    return _mpi_group(monkeypatch, False)


def _started(work):
    """Test instrumentation: wait until the communication thread started ``work``'s MPI call (or finished it),
    without learning anything from it (no Work.wait)."""
    while not (_sim_mpi.INFLIGHT or work._done.is_set()):
        time.sleep(0.001)


@pytest.mark.mpi(min_size=2)
def test_mpi_overwriting_a_buffer_a_kernel_still_reads_is_a_write_after_read(cuda_aware, monkeypatch):
    _sim_only()
    import cupy as cp

    from hpcfsdp.distributed import _buffers as B

    pg = cuda_aware
    w, r = pg.size(), pg.rank()
    out, inp = cp.zeros(4 * w, dtype=np.float32), cp.full(4, r + 1, dtype=np.float32)
    cp.cuda.get_current_stream().synchronize()
    pg.all_gather_into(out, inp)
    total = out.sum()  # a kernel reading the output, still queued
    pg.all_gather_into(out, inp)  # the event recorded at issue orders that read before MPI overwrites out
    assert float(total) == float(out.sum().get()) == 4 * w * (w + 1) / 2
    total = out.sum()
    monkeypatch.setattr(B, "record_event", lambda a: None)  # planted: the comm side no longer waits for it
    with pytest.raises(cs.CudaSimError, match=r"write-after-read: MPI Allgather writes \w+\[\d+\].*read by ndarray.sum"):
        pg.all_gather_into(out, inp)
    del total


@pytest.mark.mpi(min_size=2)
def test_the_staged_copy_into_an_output_another_stream_still_writes_is_a_write_after_write(staged, monkeypatch):
    _sim_only()
    import cupy as cp

    from hpcfsdp.distributed import _buffers as B

    pg = staged
    w, r = pg.size(), pg.rank()
    inp = cp.full(4, r + 1, dtype=np.float32)
    cp.cuda.get_current_stream().synchronize()
    out = cp.zeros(4 * w, dtype=np.float32)  # its zeroing is still queued on the null stream
    pg.all_gather_into(out, inp)  # the event orders it before the comm stream copies the result in
    np.testing.assert_array_equal(out.get(), np.repeat(np.arange(1, w + 1, dtype=np.float32), 4))
    out = cp.zeros(4 * w, dtype=np.float32)
    monkeypatch.setattr(B, "record_event", lambda a: None)  # planted
    with pytest.raises(cs.CudaSimError, match=r"write-after-write: ndarray.set writes float32\[\d+\].*write by zeros"):
        pg.all_gather_into(out, inp)


@pytest.mark.mpi(min_size=2)
def test_an_all_gather_writes_its_output_at_completion(cuda_aware):
    _sim_only()
    import cupy as cp

    pg = cuda_aware
    w, r = pg.size(), pg.rank()
    out, inp = cp.zeros(4 * w, dtype=np.float32), cp.full(4, r + 1, dtype=np.float32)
    cp.cuda.get_current_stream().synchronize()
    work = pg.all_gather_into(out, inp, async_op=True)
    work.wait()  # Work.wait() hands over what the communication thread knows: MPI's write is ordered
    assert float(out.sum().get()) == 4 * w * (w + 1) / 2
    work = pg.all_gather_into(out, inp, async_op=True)
    _started(work)
    try:  # planted: the output read before Work.wait() (in flight, or done without this thread knowing it)
        with pytest.raises(cs.CudaSimError, match=r"(MPI ownership window|read-after-write): ndarray.sum reads "
                                                  r"float32\[\d+\].*MPI Allgather"):
            out.sum()
    finally:
        work.wait()
    assert float(out.sum().get()) == 4 * w * (w + 1) / 2


@pytest.mark.mpi(min_size=2)
def test_the_input_of_an_all_gather_in_flight_is_not_to_be_written(cuda_aware):
    _sim_only()
    import cupy as cp

    pg = cuda_aware
    w, r = pg.size(), pg.rank()
    out, inp = cp.zeros(4 * w, dtype=np.float32), cp.full(4, r + 1, dtype=np.float32)
    cp.cuda.get_current_stream().synchronize()
    work = pg.all_gather_into(out, inp, async_op=True)
    _started(work)
    try:  # planted: the next input written into the buffer MPI may still be sending from
        with pytest.raises(cs.CudaSimError, match=r"(MPI ownership window|write-after-read): ndarray.fill writes "
                                                  r"float32\[4\].*MPI Allgather"):
            inp.fill(0)
    finally:
        work.wait()
    inp.fill(r + 1)  # after the wait: fine
    pg.all_gather_into(out, inp)
    assert float(out.sum().get()) == 4 * w * (w + 1) / 2


@pytest.mark.mpi(min_size=2)
def test_a_receive_buffer_belongs_to_mpi_until_the_receive_completed(cuda_aware):
    _sim_only()
    import cupy as cp

    pg = cuda_aware
    r = pg.rank()
    buf = cp.zeros(8, dtype=np.float32)
    cp.cuda.get_current_stream().synchronize()
    if r == 1:
        work = pg.irecv(buf, 0)
        pg.barrier()  # after it, the receive is posted (the communication thread runs them in order)
        with pytest.raises(cs.CudaSimError, match=r"MPI ownership window: ndarray.sum reads float32\[8\].*MPI Irecv"):
            buf.sum()  # planted: the receive buffer read before its Work completed
        pg.barrier()
        work.wait()
        np.testing.assert_array_equal(buf.get(), np.arange(8, dtype=np.float32))
    elif r == 0:
        pg.barrier()
        src = cp.arange(8, dtype=np.float32)
        pg.barrier()
        pg.isend(src, 1).wait()
    else:
        pg.barrier()
        pg.barrier()


@pytest.mark.mpi(min_size=2)
def test_fsdp_uses_an_all_gather_only_after_waiting_for_it(staged, monkeypatch):
    """Per-thread host visibility: the communication thread synchronises its stream after copying the gathered
    parameters to the device; only Work.wait() makes that known to the main thread. Waiting "long enough"
    instead (planted) passed the simulation while one host knowledge was shared by all threads."""
    _sim_only()
    import cupy as cp

    import hpcfsdp as hp
    from hpcfsdp.distributed.device_mesh import init_device_mesh
    from hpcfsdp.distributed.fsdp import fully_shard
    from hpcfsdp.distributed.fsdp._fully_shard import _fsdp_collectives as C

    from _fsdp_util import gpt_batches, local, tiny_gpt, world

    w, r = world()
    before = cp.cuda.runtime.getDevice()
    cp.cuda.Device(r % cp.cuda.runtime.getDeviceCount()).use()  # this rank's GPU, as the other GPU tests
    mesh = init_device_mesh("cuda", (w,))
    monkeypatch.setattr(mesh.get_group(), "_gpu", None)  # its path chosen again: staged (the fixture)

    def forward():
        model = tiny_gpt().to("cuda")
        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
        x, y = next(iter(gpt_batches(1, 4 * w + 1)))
        _, loss = model(hp.tensor(local(x), device="cuda"), hp.tensor(local(y), device="cuda"))
        return float(loss.item())

    try:
        assert np.isfinite(forward())
        monkeypatch.setattr(C, "_wait", lambda works: time.sleep(0.3))  # planted: no Work.wait()
        with pytest.raises(cs.CudaSimError, match=r"read-after-write: .*write by ndarray.set .*not synchronised"):
            forward()
    finally:
        cp.cuda.Device(before).use()
