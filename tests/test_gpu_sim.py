"""The simulated CUDA device keeps CUDA's rules, and catches the ordering and device faults it exists for.

The first part drives hpcfsdp.testing.cuda_sim directly (no environment needed). The `gpu`-marked MPI tests
run on the device hpcfsdp uses (HPCFSDP_CUDA_SIM=1 in CI): each reintroduces, by monkeypatching, a faulty
ordering the comm layer once had and shows the simulation fails it, then shows the code as it is passes.
"""
import threading

import ml_dtypes
import numpy as np
import pytest

from hpcfsdp.testing import cuda_sim as cs

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(autouse=True)
def _device0():
    cs.Device(0).use()
    yield
    for d in range(cs.cuda.runtime.getDeviceCount()):  # a planted fault leaves device work unsynchronised on
        cs.Device(d).synchronize()                     # purpose: none of it may reach the next test
    cs.Device(0).use()


def test_arrays_compute_like_numpy_and_refuse_implicit_conversion():
    a = cs.arange(6, dtype=np.float32).reshape(2, 3)
    b = cs.exp(a) @ a.T + 1
    np.testing.assert_allclose(b.get(), np.exp(np.arange(6.0).reshape(2, 3)) @ np.arange(6.0).reshape(2, 3).T + 1,
                               rtol=1e-6)
    assert isinstance(b, cs.ndarray) and b.device.id == 0 and float(b.sum()) == pytest.approx(float(b.get().sum()))
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(a)
    with pytest.raises(TypeError, match="NumPy array"):
        cs.add(a, np.ones((2, 3), np.float32))
    x = cs.ones((2, 2), dtype=BF16)
    assert (x @ x).dtype == BF16 and cs.matmul(x, x).dtype == BF16  # as CuPy: bfloat16 products stay bfloat16


def test_work_on_a_stream_is_ordered_only_after_sync_event_or_wait():
    a = cs.ones(4, dtype=np.float32)
    side = cs.cuda.Stream(non_blocking=True)
    with side, pytest.raises(cs.CudaSimError, match="ones"):
        a * 2  # the side stream does not wait for the null stream's write of a
    cs.cuda.get_current_stream().synchronize()
    with side:
        b = a * 2  # queued on the side stream
    with pytest.raises(cs.CudaSimError, match="mul.*not synchronised") as e:
        b + 1  # the null stream does not wait for a non-blocking stream
    assert "test_gpu_sim.py" in str(e.value)  # the stack of the write
    ev = cs.cuda.Event()
    with side:
        c = a * 3
        ev.record()
    cs.cuda.get_current_stream().wait_event(ev)  # device-side ordering
    np.testing.assert_array_equal((c + 1).get(), np.full(4, 4, np.float32))
    side.synchronize()  # host-side ordering
    np.testing.assert_array_equal((b + 1).get(), np.full(4, 3, np.float32))


def test_blocking_streams_sync_with_the_legacy_null_stream():
    a = cs.ones(3)
    blocking = cs.cuda.Stream()
    with blocking:
        b = a + 1
    np.testing.assert_array_equal((b * 2).get(), np.full(3, 4.0))  # null stream waits for blocking streams


def test_current_device_is_per_host_thread_and_arrays_belong_to_one_device():
    cs.Device(1).use()
    a = cs.ones(3)
    assert a.device.id == 1
    seen, errors = [], []

    def other():
        seen.append(cs.cuda.runtime.getDevice())
        try:
            a + 1
        except cs.CudaSimError as e:
            errors.append(str(e))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == [0] and errors and "device 1" in errors[0] and "current device is 0" in errors[0]
    with cs.cuda.Device(1):
        assert (a + 1).device.id == 1


def test_mpi_reads_need_host_synchronised_writes_on_the_current_device():
    a = cs.ones(4, dtype=np.float32)
    with pytest.raises(cs.CudaSimError, match="MPI Allreduce.*ones"):
        cs.mpi_access(a, "MPI Allreduce")
    cs.cuda.get_current_stream().synchronize()
    cs.mpi_access(a, "MPI Allreduce")
    assert a.__cuda_array_interface__["data"][0] == a.data.ptr
    cs.Device(1).use()
    with pytest.raises(cs.CudaSimError, match="current device is cuda:1"):
        cs.mpi_access(a, "MPI Allreduce")


def test_staged_copies_into_pinned_memory_are_pending_until_synchronised():
    a = cs.arange(8, dtype=np.float32)
    host = np.frombuffer(cs.cuda.alloc_pinned_memory(32), np.uint8, 32).view(np.float32)
    assert cs.is_pinned(host) and cs.is_pinned(host[2:]) and not cs.is_pinned(np.zeros(8, np.float32))
    s = cs.cuda.Stream(non_blocking=True)
    cs.cuda.get_current_stream().synchronize()
    a.get(stream=s, out=host)
    with pytest.raises(cs.CudaSimError, match="pinned host"):
        cs.mpi_access(host, "MPI Allgather")
    s.synchronize()
    cs.mpi_access(host, "MPI Allgather")
    np.testing.assert_array_equal(host, np.arange(8, dtype=np.float32))


# ------------------------------------------------------------------------------------------------
# the faults, on the device hpcfsdp uses (HPCFSDP_CUDA_SIM=1); at 2 ranks both ranks fail alike

def _sim_only():
    from hpcfsdp import _backend

    assert _backend.cuda_simulated()  # gpu_sim: conftest leaves these to the simulation


def _mpi_group(monkeypatch, aware: bool):
    """A fresh group over every rank whose device arrays take the MPI path: the device pointer itself to MPI
    (aware; the simulated device's memory is host memory, so a host-only MPI reads it correctly), or staged
    through pinned host memory. (A group's path is chosen at its first device collective, see _nccl.py.)"""
    from hpcfsdp.distributed import _mpi
    from hpcfsdp.distributed.process_group import ProcessGroup

    monkeypatch.setattr(_mpi, "_CUDA_AWARE", (aware, "test"))
    monkeypatch.setenv("HPCFSDP_GPU_COMM", "mpi" if aware else "staged")
    return ProcessGroup(name=f"sim-fault-{'mpi' if aware else 'staged'}")


@pytest.fixture
def cuda_aware(monkeypatch):
    return _mpi_group(monkeypatch, True)


@pytest.mark.gpu
@pytest.mark.gpu_sim
@pytest.mark.mpi(min_size=2)
def test_half_reduction_fallback_converts_before_mpi_reads(cuda_aware, monkeypatch):
    _sim_only()
    import cupy as cp

    from hpcfsdp.distributed import _buffers as B

    pg = cuda_aware
    w, r = pg.size(), pg.rank()
    assert B.reduce_plan(BF16)[1] == np.float32, "this MPI has BFLOAT16_T: the float32 fallback is not taken"
    a = cp.full(6, r + 1, dtype=BF16)
    pg.all_reduce_(a)
    np.testing.assert_array_equal(a.get().astype(np.float32), np.full(6, w * (w + 1) / 2, np.float32))
    monkeypatch.setattr(B, "complete", lambda stream: None)  # the conversion no longer waited for
    b = cp.full(6, r + 1, dtype=BF16)
    with pytest.raises(cs.CudaSimError, match="astype.*not synchronised"):
        pg.all_reduce_(b)
    out, inp = cp.empty(3, dtype=BF16), cp.ones(3 * w, dtype=BF16)
    with pytest.raises(cs.CudaSimError, match="astype.*not synchronised"):
        pg.reduce_scatter_into(out, inp)


@pytest.mark.gpu
@pytest.mark.gpu_sim
@pytest.mark.mpi(min_size=2)
def test_comm_thread_runs_on_the_issuing_threads_device(cuda_aware, monkeypatch):
    _sim_only()
    import cupy as cp

    from hpcfsdp.distributed import _comm_thread as CT

    pg = cuda_aware
    w = pg.size()
    pg.all_reduce_(cp.ones(2, dtype=np.float32), async_op=True).wait()  # comm thread now on device 0
    cp.cuda.Device(1).use()  # every rank on GPU 1, as a rank seeing all of a node's GPUs may be
    try:
        out = cp.empty(2 * w, dtype=np.float32)
        pg.all_gather_into(out, cp.ones(2, dtype=np.float32), async_op=True).wait()  # MPI reads device 1 memory
        np.testing.assert_array_equal(out.get(), np.ones(2 * w, np.float32))
        cp.cuda.Device(0).use()
        pg.all_reduce_(cp.ones(2, dtype=np.float32), async_op=True).wait()  # comm thread back on device 0
        cp.cuda.Device(1).use()
        monkeypatch.setattr(CT, "_issuer_device", lambda: None)  # the comm thread keeps its own device
        with pytest.raises(cs.CudaSimError, match="current device is cuda:0"):
            pg.all_gather_into(out, cp.ones(2, dtype=np.float32), async_op=True).wait()
    finally:
        cp.cuda.Device(0).use()


@pytest.mark.gpu
@pytest.mark.gpu_sim
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("aware", [False, True], ids=["staged", "cuda_aware"])
def test_event_covers_the_copy_that_breaks_aliasing(aware, monkeypatch):
    _sim_only()
    import cupy as cp

    from hpcfsdp.distributed import _buffers as B

    pg = _mpi_group(monkeypatch, aware)
    w, r = pg.size(), pg.rank()
    k = 3
    j = (r + 1) % w  # another rank's slot: aliased but not in place, so the input is copied first

    def gather():
        out = cp.zeros(k * w, dtype=np.float32)
        out[j * k:(j + 1) * k] = r + 1
        cp.cuda.get_current_stream().synchronize()
        early = cp.cuda.Event()
        early.record()
        return out, early

    out, _ = gather()
    pg.all_gather_into(out, out[j * k:(j + 1) * k])
    np.testing.assert_array_equal(out.get(), np.repeat(np.arange(1, w + 1, dtype=np.float32), k))
    out, early = gather()
    monkeypatch.setattr(B, "record_event", lambda a: early)  # the event taken before the copy
    with pytest.raises(cs.CudaSimError, match="copy.*not synchronised"):
        pg.all_gather_into(out, out[j * k:(j + 1) * k])


@pytest.mark.gpu
@pytest.mark.gpu_sim
@pytest.mark.mpi(min_size=2)
def test_staged_path_waits_for_its_device_to_host_copy(monkeypatch):
    _sim_only()
    import cupy as cp

    from hpcfsdp.distributed import _buffers as B

    pg = _mpi_group(monkeypatch, False)
    w, r = pg.size(), pg.rank()
    out = cp.empty(4 * w, dtype=np.float32)
    pg.all_gather_into(out, cp.full(4, r, dtype=np.float32))
    np.testing.assert_array_equal(out.get(), np.repeat(np.arange(w, dtype=np.float32), 4))

    def to_host_unsynchronised(self, a, slot):  # the copy into pinned memory, not waited for
        host = self.host_buffer(slot, a.nbytes, a.device.id).view(a.dtype).reshape(a.shape)
        with cp.cuda.Device(a.device.id):
            a.get(stream=self.stream(a.device.id), out=host)
        return host

    monkeypatch.setattr(B.HostStager, "to_host", to_host_unsynchronised)
    with pytest.raises(cs.CudaSimError, match="MPI Allgather reads pinned host"):
        pg.all_gather_into(out, cp.full(4, r, dtype=np.float32))


@pytest.mark.gpu
@pytest.mark.gpu_sim
@pytest.mark.mpi(min_size=2)
def test_mpi4py_moves_device_arrays_through_dlpack(monkeypatch):
    _sim_only()
    import cupy as cp

    from hpcfsdp.distributed import _mpi

    comm = _mpi.get_mpi().COMM_WORLD.Dup()
    try:
        w, r = comm.Get_size(), comm.Get_rank()

        def no_cai(self):
            raise AssertionError("mpi4py read __cuda_array_interface__: DLPack comes first")

        monkeypatch.setattr(cs.ndarray, "__cuda_array_interface__", property(no_cai))
        calls = []
        real = cs.ndarray.__dlpack__

        def dlpack(self, **kw):
            calls.append(kw.get("stream"))
            return real(self, **kw)

        monkeypatch.setattr(cs.ndarray, "__dlpack__", dlpack)
        send, recv = cp.full(3, r + 1, dtype=np.float32), cp.zeros(3 * w, dtype=np.float32)
        cp.cuda.get_current_stream().synchronize()
        comm.Allgather(send, recv)  # mpi4py: PyObject_GetBuffer fails, then __dlpack__(stream=-1, ...)
        np.testing.assert_array_equal(recv.get(), np.repeat(np.arange(1, w + 1, dtype=np.float32), 3))
        assert calls and set(calls) == {-1}
        late = cp.full(3, r + 1, dtype=np.float32)  # written on the stream, not synchronised
        with pytest.raises(cs.CudaSimError, match=r"__dlpack__\(stream=-1\).*full.*not synchronised"):
            comm.Allgather(late, recv)
        cp.cuda.get_current_stream().synchronize()
        comm.Allgather(late, recv)  # every rank raised before MPI was entered: the ranks still pair up
    finally:
        comm.Free()
