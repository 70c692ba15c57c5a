"""The NCCL path for CuPy arrays ([Note: GPU collectives] in hpcfsdp/distributed/_nccl.py): values against NumPy in
float64, stream ordering (Work.wait orders the caller's stream, nothing else does), the choice of path and its errors,
and the watchdog. On the simulated device (HPCFSDP_CUDA_SIM=1) every process simulates GPUs of its own, and the
simulated NCCL runs each collective as a kernel on the NCCL stream (hpcfsdp/testing/_sim_nccl.py)."""
import ml_dtypes
import numpy as np
import pytest

import hpcfsdp.distributed as dist
from hpcfsdp import _backend
from hpcfsdp.distributed import _nccl
from hpcfsdp.distributed.process_group import ProcessGroup

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), np.dtype(np.float16), BF16, np.dtype(np.int64)]


@pytest.fixture
def cp():
    import cupy

    before = cupy.cuda.runtime.getDevice()
    r = dist.get_rank() if dist.is_initialized() else 0
    cupy.cuda.Device(r % cupy.cuda.runtime.getDeviceCount()).use()
    yield cupy
    cupy.cuda.Device(before).use()


def _group(monkeypatch, mode="auto", shared=False):
    """A fresh group over every rank (its path is chosen at its first device collective) under ``mode``."""
    monkeypatch.setenv("HPCFSDP_GPU_COMM", mode)
    monkeypatch.setenv("HPCFSDP_CUDA_SIM_SHARED_GPUS", "1" if shared else "0")
    return ProcessGroup(name=f"nccl-test-{mode}")


def _values(dt, shape, seed):
    rng = np.random.default_rng(seed)
    if np.issubdtype(dt, np.integer):
        return rng.integers(-50, 50, shape).astype(dt)
    return rng.standard_normal(shape).astype(np.float32).astype(dt)


def _tol(dt):
    return {np.dtype(np.float16): 2e-3, BF16: 1.6e-2}.get(np.dtype(dt), 1e-6)


@pytest.mark.gpu_per_rank
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["SUM", "AVG", "MAX"])
def test_nccl_collectives_match_numpy(cp, monkeypatch, dt, op):
    pg = _group(monkeypatch, "nccl")
    n, r = pg.size(), pg.rank()
    k = 6
    every = [_values(dt, n * k, seed) for seed in range(n)]  # every rank's input, known to all
    ref = np.stack([e.astype(np.float64) for e in every])
    red = {"SUM": ref.sum(0), "AVG": ref.sum(0) / n, "MAX": ref.max(0)}[op]
    if op == "AVG" and np.issubdtype(dt, np.integer):
        red = np.floor_divide(ref.sum(0), n)  # the MPI path's meaning: floor division
    tol = _tol(dt) * max(1.0, float(np.abs(ref).max()) * n)

    out = cp.empty(n * k, dtype=dt)
    pg.all_gather_into(out, cp.asarray(every[r][:k]))
    np.testing.assert_array_equal(out.get().astype(np.float64), np.concatenate([e[:k] for e in every]).astype(float))
    rs = cp.empty(k, dtype=dt)
    pg.reduce_scatter_into(rs, cp.asarray(every[r]), op=op)
    np.testing.assert_allclose(rs.get().astype(np.float64), red[r * k:(r + 1) * k], atol=tol, rtol=0)
    ar = cp.asarray(every[r])
    pg.all_reduce_(ar, op=op)
    np.testing.assert_allclose(ar.get().astype(np.float64), red, atol=tol, rtol=0)
    b = cp.asarray(every[r])
    pg.broadcast_(b, src=n - 1)
    np.testing.assert_array_equal(b.get(), every[n - 1])
    assert pg.gpu_comm[0] == "nccl" and "HPCFSDP_GPU_COMM=nccl" in pg.gpu_comm[1]
    pg.destroy()


@pytest.mark.gpu_per_rank
@pytest.mark.mpi(min_size=2)
def test_nccl_in_place_all_gather_and_aliased_reduce_scatter(cp, monkeypatch):
    pg = _group(monkeypatch, "nccl")
    n, r = pg.size(), pg.rank()
    out = cp.zeros(n * 3, dtype=np.float32)
    out[r * 3:(r + 1) * 3] = r + 1.0
    pg.all_gather_into(out, out[r * 3:(r + 1) * 3])  # in place: the input is this rank's slot
    np.testing.assert_array_equal(out.get(), np.repeat(np.arange(1, n + 1, dtype=np.float32), 3))
    buf = cp.arange(n * 2, dtype=np.float32)
    pg.reduce_scatter_into(buf[:2], buf)  # the output overlaps the input: reduced from a copy
    np.testing.assert_array_equal(buf[:2].get(), n * np.arange(r * 2, r * 2 + 2, dtype=np.float32))
    pg.destroy()


@pytest.mark.gpu_sim
@pytest.mark.mpi(min_size=2)
def test_nccl_work_wait_orders_the_callers_stream_only(cp, monkeypatch):
    from hpcfsdp.testing.cuda_sim import CudaSimError

    assert _backend.cuda_simulated()  # gpu_sim: conftest leaves it to the simulation
    pg = _group(monkeypatch, "nccl")
    n = pg.size()
    x = cp.ones(4, dtype=np.float32)
    out = cp.empty(4 * n, dtype=np.float32)
    w = pg.all_gather_into(out, x, async_op=True)
    assert isinstance(w, _nccl.NcclWork)
    with pytest.raises(CudaSimError, match="NCCL allGather"):
        out.get()  # before wait(): the NCCL stream's write is not ordered before this stream
    side = cp.cuda.Stream(non_blocking=True)
    assert w.wait() is True  # no host wait: the caller's stream waits for the NCCL stream
    with side, pytest.raises(CudaSimError, match="NCCL allGather"):
        out * 2  # another stream was not ordered by wait()
    doubled = out * 2  # the waiting stream may read
    np.testing.assert_array_equal(doubled.get(), np.full(4 * n, 2, np.float32))
    # that blocking copy synchronised the caller's stream, so the host knows the collective complete, and
    # work the host enqueues after it on any stream is ordered after it
    with side:
        np.testing.assert_array_equal((out * 3).get(stream=side), np.full(4 * n, 3, np.float32))
    w2 = pg.all_gather_into(out, x * 5, async_op=True)
    w2.synchronize()  # the host waited for the collective itself: every stream may read now
    with side:
        np.testing.assert_array_equal((out + 0).get(stream=side), np.full(4 * n, 5, np.float32))
    pg.destroy()


@pytest.mark.gpu_sim
@pytest.mark.mpi(min_size=2)
def test_nccl_input_written_after_issue_is_a_race(cp, monkeypatch):
    """The NCCL stream waits for the caller's current stream only: an input written on another stream that the
    caller never waited for is a race, and the simulated NCCL kernel reports it."""
    from hpcfsdp.testing.cuda_sim import CudaSimError

    assert _backend.cuda_simulated()  # gpu_sim: conftest leaves it to the simulation
    pg = _group(monkeypatch, "nccl")
    n = pg.size()
    x = cp.zeros(4, dtype=np.float32)
    side = cp.cuda.Stream(non_blocking=True)
    side.wait_event(cp.cuda.get_current_stream().record())  # the side stream may write x ...
    with side:
        x += 1  # ... and does, but the caller's stream never waits for it
    out = cp.empty(4 * n, dtype=np.float32)
    with pytest.raises(CudaSimError, match="NCCL allGather"):
        pg.all_gather_into(out, x)
    side.synchronize()
    pg.all_gather_into(out, x)  # collective again on every rank, now ordered
    np.testing.assert_array_equal(out.get(), np.ones(4 * n, np.float32))
    pg.destroy()


@pytest.mark.gpu_sim
@pytest.mark.mpi(min_size=2)
def test_auto_takes_nccl_with_a_gpu_per_rank_and_falls_back_when_shared(cp, monkeypatch):
    assert _backend.cuda_simulated()  # gpu_sim: sharing GPUs between ranks is set up on the simulation
    pg = _group(monkeypatch, "auto")
    a = cp.ones(3, dtype=np.float32)
    pg.all_reduce_(a)
    assert pg.gpu_comm[0] == "nccl" and "own GPU" in pg.gpu_comm[1]
    assert float(a[0].get()) == pg.size()
    pg.destroy()
    cp.cuda.Device(0).use()  # every rank on GPU 0 of a shared host: NCCL cannot run
    monkeypatch.setenv("HPCFSDP_CUDA_AWARE", "0")
    from hpcfsdp.distributed import _mpi

    monkeypatch.setattr(_mpi, "_CUDA_AWARE", None)  # re-probe under the variable above
    pg = _group(monkeypatch, "auto", shared=True)
    a = cp.ones(3, dtype=np.float32)
    pg.all_reduce_(a)
    path, why = pg.gpu_comm
    assert path == "staged" and "share the GPU" in why and "not CUDA-aware" in why, why
    assert float(a[0].get()) == pg.size()
    pg.destroy()


@pytest.mark.gpu_sim
@pytest.mark.mpi(min_size=2)
def test_nccl_on_a_shared_gpu_is_an_error_naming_it(cp, monkeypatch):
    assert _backend.cuda_simulated()  # gpu_sim: sharing GPUs between ranks is set up on the simulation
    cp.cuda.Device(0).use()
    pg = _group(monkeypatch, "nccl", shared=True)
    with pytest.raises(RuntimeError, match=r"HPCFSDP_GPU_COMM=nccl.*ranks \[0, 1.*share the GPU 0000:01:00.0"):
        pg.all_reduce_(cp.ones(2, dtype=np.float32))
    pg.destroy()


@pytest.mark.gpu_per_rank
@pytest.mark.mpi(min_size=2)
def test_gpu_comm_mpi_needs_a_cuda_aware_mpi(cp, monkeypatch):
    from hpcfsdp.distributed import _mpi

    monkeypatch.setattr(_mpi, "_CUDA_AWARE", (False, "test"))
    pg = _group(monkeypatch, "mpi")
    with pytest.raises(RuntimeError, match="HPCFSDP_GPU_COMM=mpi needs a CUDA-aware MPI"):
        pg.all_reduce_(cp.ones(2, dtype=np.float32))
    monkeypatch.setattr(_mpi, "_CUDA_AWARE", (True, "test"))
    a = cp.ones(2, dtype=np.float32)
    pg.all_reduce_(a)  # the choice was not cached by the error: the device pointer goes to MPI now
    assert pg.gpu_comm[0] == "mpi" and float(a[1].get()) == pg.size()
    pg.destroy()


@pytest.mark.gpu_per_rank
@pytest.mark.mpi(min_size=2)
def test_watchdog_aborts_on_an_async_nccl_error_and_the_next_call_raises(cp, monkeypatch):
    pg = _group(monkeypatch, "nccl")
    a = cp.ones(2, dtype=np.float32)
    pg.all_reduce_(a)
    ng = pg._gpu.nccl
    real = ng.comm

    class Failing:
        def __getattr__(self, name):
            return getattr(real, name)

        def check_async_error(self):
            raise RuntimeError("ncclRemoteError: a peer vanished")

    monkeypatch.setattr(_nccl.NcclWork, "is_completed", lambda self: False)
    monkeypatch.setattr(_nccl._EventFlag, "is_set", lambda self: False)  # the collective seems to hang
    ng.comm = Failing()
    w = pg.all_reduce_(a, async_op=True)
    import time

    deadline = time.monotonic() + 10
    while ng.failed is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ng.failed is not None and "ncclRemoteError" in ng.failed and "all_reduce_" in ng.failed
    with pytest.raises(RuntimeError, match="asynchronous error"):
        w.wait()
    with pytest.raises(RuntimeError, match="ncclRemoteError"):
        pg.all_reduce_(a)
    ng.comm = None  # aborted: destroy() must not touch it
    real.destroy()
    pg.destroy()


def test_nccl_collectives_at_world_size_one(cp):
    """One rank, one GPU: the NCCL communicator itself (a size-1 group never calls it through the process
    group, whose size-1 collectives are copies), each collective and dtype against NumPy."""
    nccl, why = _nccl.nccl_status()
    assert nccl is not None, why
    pg = _self_group()
    ng = _nccl.NcclGroup(pg, cp.cuda.runtime.getDevice(), nccl)
    for dt in DTYPES:
        x = cp.asarray(_values(dt, 8, 1))
        out = cp.empty(8, dtype=dt)
        _nccl.all_gather(ng, out, x, False, 8, False, "ag")
        np.testing.assert_array_equal(out.get(), x.get())
        for op in ("SUM", "AVG", "MAX"):
            y = cp.empty(8, dtype=dt)
            assert _nccl.reduce_scatter(ng, y, x, 8, op, False, "rs") is None
            np.testing.assert_array_equal(y.get(), x.get())
            z = x.copy()
            _nccl.all_reduce(ng, z, op, False, "ar")
            np.testing.assert_array_equal(z.get(), x.get())
        b = x.copy()
        _nccl.broadcast(ng, b, 0, False, "bc")
        np.testing.assert_array_equal(b.get(), x.get())
    ng.destroy()
    pg.destroy()


def _self_group():
    from hpcfsdp.distributed._mpi import get_mpi

    return ProcessGroup(get_mpi().COMM_SELF, name="self")


@pytest.mark.gpu_per_rank
@pytest.mark.mpi(min_size=2)
def test_async_work_keeps_its_arrays_until_wait(cp, monkeypatch):
    """An array dropped while its collective may still run stays alive in the Work (CuPy's pool would hand its
    block to the next allocation); after wait() the Work lets it go (the caller's stream is ordered after)."""
    pg = _group(monkeypatch, "nccl")
    n = pg.size()
    out = cp.empty(4 * n, dtype=np.float32)
    x = cp.ones(4, dtype=np.float32)
    w = pg.all_gather_into(out, x, async_op=True)  # (cupy.ndarray takes no weak references: ask the Work)
    kept = {a.data.ptr for a in w._keep}  # flat views of the caller's arrays
    assert kept == {out.data.ptr, x.data.ptr}
    assert not isinstance(w._desc, str)  # the lazy description holds them too, until...
    w.wait()
    assert w._keep == () and isinstance(w._desc, str)  # ... wait() lets both go
    watched = []
    real_watch = _nccl._watch
    monkeypatch.setattr(_nccl, "_watch", lambda work: (watched.append(work), real_watch(work)))
    y = cp.ones(4, dtype=np.float32)
    pg.all_reduce_(y)  # blocking: the caller's stream already waits, nothing is kept
    (last,) = watched  # the watchdog still watches it, without its arrays
    assert last._keep == () and isinstance(last._desc, str) and "all_reduce_" in last._desc
    pg.destroy()
