"""batch_isend_irecv of CUDA tensors on NCCL ([Note: GPU collectives] in hpcfsdp/distributed/_nccl.py): one
ncclGroupStart/ncclGroupEnd around the batch (sends listed before receives on every rank cannot deadlock), values
against NumPy, sends to oneself, stream ordering of the Works, that NCCL (not MPI) moved the bytes, the checks one
rank can make, and the staged path for the same batches. On the simulated device (HPCFSDP_CUDA_SIM=1) an ncclSend
outside a group returns only once its receive is posted, so a batch issued without the group would hang here."""
import ml_dtypes
import numpy as np
import pytest

import hpcfsdp.distributed as dist
from hpcfsdp import _backend
from hpcfsdp._tensor import Tensor
from hpcfsdp.distributed import _nccl, _p2p
from hpcfsdp.distributed.process_group import ProcessGroup

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
N = 1 << 18  # elements per message: 1 MiB of float32, above any eager threshold on a real GPU


@pytest.fixture
def cp():
    import cupy

    before = cupy.cuda.runtime.getDevice()
    r = dist.get_rank() if dist.is_initialized() else 0
    cupy.cuda.Device(r % cupy.cuda.runtime.getDeviceCount()).use()
    yield cupy
    cupy.cuda.Device(before).use()


def _group(monkeypatch, mode):
    """A fresh group over every rank under HPCFSDP_GPU_COMM=``mode``: its first call on CUDA tensors (the batch
    below) chooses the path."""
    monkeypatch.setenv("HPCFSDP_GPU_COMM", mode)
    monkeypatch.setenv("HPCFSDP_CUDA_SIM_SHARED_GPUS", "0")
    return ProcessGroup(name=f"nccl-p2p-{mode}")


def _msg(dt, rank, k, shape=(N // 64, 64)):
    """Rank ``rank``'s ``k``-th message: known to every rank, different for every (rank, k)."""
    rng = np.random.default_rng(100 * rank + k)
    return rng.standard_normal(shape).astype(np.float32).astype(dt)


def _T(a):
    return Tensor._wrap(a)


class _Recorder:
    """The group's NCCL communicator, recording the point-to-point calls (peer, count, datatype)."""

    def __init__(self, real, log):
        self._real, self._log = real, log

    def __getattr__(self, name):
        return getattr(self._real, name)

    def send(self, buf, count, datatype, peer, stream):
        self._log.append(("send", peer, count, datatype))
        return self._real.send(buf, count, datatype, peer, stream)

    def recv(self, buf, count, datatype, peer, stream):
        self._log.append(("recv", peer, count, datatype))
        return self._real.recv(buf, count, datatype, peer, stream)


def _record(monkeypatch, pg, log):
    """Record the group's NCCL calls (groupStart/groupEnd included), and make MPI point-to-point fail."""
    ng = pg._gpu.nccl
    monkeypatch.setattr(ng, "comm", _Recorder(ng.comm, log))
    for name in ("groupStart", "groupEnd"):
        real = getattr(ng.nccl, name)
        monkeypatch.setattr(ng.nccl, name, lambda real=real, name=name: (log.append((name,)), real())[1])

    def no_mpi(*a, **k):
        raise AssertionError("batch_isend_irecv of CUDA tensors went over MPI")
    monkeypatch.setattr(_p2p.PointToPoint, "isend", no_mpi)
    monkeypatch.setattr(_p2p.PointToPoint, "irecv", no_mpi)


def _ring_ops(cp, pg, dt, tags=(0, 0)):
    """Every rank sends to both neighbours, the sends listed first, then receives from both: (ops, recv buffers)."""
    n, me = pg.size(), pg.rank()
    right, left = (me + 1) % n, (me - 1) % n
    a_r, a_l = cp.asarray(_msg(dt, me, 0)), cp.asarray(_msg(dt, me, 1))
    b_l, b_r = cp.asarray(np.full(a_r.shape, -7, dt)), cp.asarray(np.full(a_l.shape, -7, dt))
    ops = [dist.P2POp(dist.isend, _T(a_r), group=pg, group_peer=right, tag=tags[0]),
           dist.P2POp(dist.isend, _T(a_l), group=pg, group_peer=left, tag=tags[0]),
           dist.P2POp(dist.irecv, _T(b_l), group=pg, group_peer=left, tag=tags[1]),
           dist.P2POp(dist.irecv, _T(b_r), group=pg, group_peer=right, tag=tags[1])]
    return ops, (b_l, b_r)


def _check_ring(pg, dt, b_l, b_r):
    """b_l holds the left neighbour's send to its right, b_r the right neighbour's send to its left (at 2 ranks
    both come from the one neighbour, matched in issue order: the same assignment)."""
    n, me = pg.size(), pg.rank()
    right, left = (me + 1) % n, (me - 1) % n
    np.testing.assert_array_equal(b_l.get().astype(np.float64), _msg(dt, left, 0).astype(np.float64))
    np.testing.assert_array_equal(b_r.get().astype(np.float64), _msg(dt, right, 1).astype(np.float64))


@pytest.mark.timeout(60)
@pytest.mark.gpu_per_rank
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dt", [np.dtype(np.float32), BF16], ids=lambda d: d.name)
def test_nccl_batch_ring_with_sends_first_goes_as_one_nccl_group(cp, monkeypatch, dt):
    pg = _group(monkeypatch, "nccl")
    n, me = pg.size(), pg.rank()
    right, left = (me + 1) % n, (me - 1) % n
    ops, (b_l, b_r) = _ring_ops(cp, pg, dt, tags=(3, 11))  # NCCL ignores tags (PyTorch too): they need not match
    works = dist.batch_isend_irecv(ops)  # the group's first CUDA call: chooses NCCL (every rank is here)
    assert pg.gpu_comm[0] == "nccl"
    assert len(works) == 4 and all(isinstance(w, _nccl.NcclWork) for w in works)
    for w in works:
        w.wait()
    _check_ring(pg, dt, b_l, b_r)
    assert [w.result() for w in works[2:]] == [left, right]  # a receive's result: its peer's group rank

    log = []  # again, recording what carried the bytes
    _record(monkeypatch, pg, log)
    ops, (b_l, b_r) = _ring_ops(cp, pg, dt)
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    _check_ring(pg, dt, b_l, b_r)
    t = pg._gpu.nccl.nccl.NCCL_BFLOAT16 if dt == BF16 else pg._gpu.nccl.nccl.NCCL_FLOAT32
    assert log == [("groupStart",), ("send", right, N, t), ("send", left, N, t), ("recv", left, N, t),
                   ("recv", right, N, t), ("groupEnd",)]
    assert pg.stats["send"] == 4 and pg.stats["recv"] == 4
    pg.destroy()


@pytest.mark.timeout(60)
@pytest.mark.gpu_per_rank
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dt", [np.dtype(np.float32), BF16], ids=lambda d: d.name)
def test_staged_path_runs_the_same_batch_over_mpi(cp, monkeypatch, dt):
    pg = _group(monkeypatch, "staged")
    ops, (b_l, b_r) = _ring_ops(cp, pg, dt)
    works = dist.batch_isend_irecv(ops)
    assert pg.gpu_comm[0] == "staged" and not any(isinstance(w, _nccl.NcclWork) for w in works)
    for w in works:
        w.wait()
    _check_ring(pg, dt, b_l, b_r)
    pg.destroy()


@pytest.mark.timeout(60)
@pytest.mark.gpu_per_rank
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["nccl", "staged"])
def test_batch_with_a_send_to_oneself(cp, monkeypatch, mode):
    """A send to oneself with its receive in the same batch (before it in the list), beside a ring exchange and a
    zero-byte pair."""
    pg = _group(monkeypatch, mode)
    n, me = pg.size(), pg.rank()
    right, left = (me + 1) % n, (me - 1) % n
    own = cp.asarray(_msg(np.float32, me, 5, (3, 7)))
    back = cp.zeros(21, dtype=np.float32)  # another shape, the same bytes
    ring_in = cp.zeros(5, dtype=np.int64)
    empty_in = cp.zeros(0, dtype=np.float32)
    ops = [dist.P2POp(dist.isend, _T(own), group=pg, group_peer=me),
           dist.P2POp(dist.isend, _T(cp.arange(5, dtype=np.int64) * (me + 1)), group=pg, group_peer=right),
           dist.P2POp(dist.isend, _T(cp.zeros(0, dtype=np.float32)), group=pg, group_peer=right),
           dist.P2POp(dist.irecv, _T(ring_in), group=pg, group_peer=left),
           dist.P2POp(dist.irecv, _T(empty_in), group=pg, group_peer=left),
           dist.P2POp(dist.irecv, _T(back), group=pg, group_peer=me)]
    works = dist.batch_isend_irecv(ops)
    assert pg.gpu_comm[0] == mode
    for w in works:
        w.wait()
    np.testing.assert_array_equal(back.get(), _msg(np.float32, me, 5, (3, 7)).reshape(-1))
    np.testing.assert_array_equal(ring_in.get(), np.arange(5) * (left + 1))
    pg.destroy()


@pytest.mark.timeout(60)
@pytest.mark.gpu_sim
@pytest.mark.mpi(min_size=2)
def test_nccl_batch_works_order_the_callers_stream_only(cp, monkeypatch):
    from hpcfsdp.testing.cuda_sim import CudaSimError

    assert _backend.cuda_simulated()  # gpu_sim: the simulation reports the races
    pg = _group(monkeypatch, "nccl")
    n, me = pg.size(), pg.rank()
    right, left = (me + 1) % n, (me - 1) % n
    x = cp.full(8, me + 1.0, dtype=np.float32)
    y = cp.zeros(8, dtype=np.float32)
    ws, wr = dist.batch_isend_irecv([dist.P2POp(dist.isend, _T(x), group=pg, group_peer=right),
                                     dist.P2POp(dist.irecv, _T(y), group=pg, group_peer=left)])
    # kept (flat views) until wait(): CuPy's pool must not hand their blocks to the next allocation
    assert [a.data.ptr for a in ws._keep] == [x.data.ptr] and [a.data.ptr for a in wr._keep] == [y.data.ptr]
    with pytest.raises(CudaSimError, match="NCCL recv"):
        y.get()  # before wait(): the NCCL stream's write is not ordered before the caller's stream
    with pytest.raises(CudaSimError, match="write-after-read.*NCCL send"):
        x[...] = 0  # the send buffer, overwritten before wait()
    side = cp.cuda.Stream(non_blocking=True)
    assert wr.wait() is True and ws.wait() is True  # no host wait: the caller's stream waits on the NCCL stream
    assert wr._keep == () and ws._keep == ()
    with side, pytest.raises(CudaSimError, match="NCCL recv"):
        y * 2  # another stream was not ordered by wait()
    doubled = y * 2  # a consumer on the waiting stream sees the data
    np.testing.assert_array_equal(doubled.get(), np.full(8, 2.0 * (left + 1), np.float32))
    x[...] = 0  # after wait() the send buffer may be reused
    pg.destroy()


@pytest.mark.timeout(60)
@pytest.mark.gpu_sim
@pytest.mark.mpi(min_size=2)
def test_nccl_batch_input_written_on_another_stream_is_a_race(cp, monkeypatch):
    """The batch waits for the caller's current stream only; the simulated NCCL reports the unordered send, and
    the failed group launches nothing (the next batch runs)."""
    from hpcfsdp.testing.cuda_sim import CudaSimError

    assert _backend.cuda_simulated()
    pg = _group(monkeypatch, "nccl")
    n, me = pg.size(), pg.rank()
    right, left = (me + 1) % n, (me - 1) % n
    x = cp.zeros(4, dtype=np.float32)
    y = cp.zeros(4, dtype=np.float32)
    side = cp.cuda.Stream(non_blocking=True)
    side.wait_event(cp.cuda.get_current_stream().record())
    with side:
        x += me + 1  # the caller's stream never waits for this
    ops = lambda: [dist.P2POp(dist.isend, _T(x), group=pg, group_peer=right),  # noqa: E731
                   dist.P2POp(dist.irecv, _T(y), group=pg, group_peer=left)]
    with pytest.raises(CudaSimError, match="NCCL send"):
        dist.batch_isend_irecv(ops())
    side.synchronize()
    for w in dist.batch_isend_irecv(ops()):
        w.wait()
    np.testing.assert_array_equal(y.get(), np.full(4, left + 1.0, np.float32))
    pg.destroy()


@pytest.mark.timeout(60)
@pytest.mark.gpu_per_rank
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["nccl", "staged"])
def test_bad_batches_raise_on_every_rank_before_communicating(cp, monkeypatch, mode):
    pg = _group(monkeypatch, mode)
    n, me = pg.size(), pg.rank()
    right = (me + 1) % n
    dev, host = _T(cp.ones(4, dtype=np.float32)), _T(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match=r"op 0 is a CUDA array .* op 1 a host array .* two batches"):
        dist.batch_isend_irecv([dist.P2POp(dist.isend, dev, group=pg, group_peer=right),
                                dist.P2POp(dist.irecv, host, group=pg, group_peer=right)])
    with pytest.raises(ValueError, match="1 isend and 0 irecv with this rank itself"):
        dist.batch_isend_irecv([dist.P2POp(dist.isend, dev, group=pg, group_peer=me)])
    with pytest.raises(ValueError, match="op 0 sends 16 bytes .* op 1, its receive, takes 12"):
        dist.batch_isend_irecv([dist.P2POp(dist.isend, dev, group=pg, group_peer=me),
                                dist.P2POp(dist.irecv, _T(cp.zeros(3, dtype=np.float32)), group=pg, group_peer=me)])
    with pytest.raises(ValueError, match="give peer"):
        dist.P2POp(dist.irecv, dev, group=pg)  # no receive from any source in a batch
    assert pg.gpu_comm is None  # nothing reached the path choice (a collective): no rank is left waiting
    x, y = cp.full(4, me, dtype=np.float32), cp.zeros(4, dtype=np.float32)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, _T(x), group=pg, group_peer=right),
                                     dist.P2POp(dist.irecv, _T(y), group=pg, group_peer=(me - 1) % n)]):
        w.wait()
    np.testing.assert_array_equal(y.get(), np.full(4, (me - 1) % n, np.float32))
    pg.destroy()


@pytest.mark.timeout(60)
def test_size_one_group_batch_copies_on_the_callers_stream(cp):
    """One rank: each send to itself lands in its receive (in list order), with no NCCL communicator."""
    from hpcfsdp.distributed._mpi import get_mpi

    pg = ProcessGroup(get_mpi().COMM_SELF, name="self")
    a = cp.asarray(_msg(BF16, 0, 1, (4, 6)))
    b = cp.asarray(_msg(BF16, 0, 2, (24,)))
    ra, rb = cp.asarray(np.zeros((6, 4), BF16)), cp.asarray(np.zeros(24, BF16))
    works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, _T(ra), group=pg, group_peer=0),
                                    dist.P2POp(dist.isend, _T(a), group=pg, group_peer=0),
                                    dist.P2POp(dist.isend, _T(b), group=pg, group_peer=0),
                                    dist.P2POp(dist.irecv, _T(rb), group=pg, group_peer=0)])
    for w in works:
        w.wait()
    assert pg.gpu_comm is None and works[0].result() == 0
    np.testing.assert_array_equal(ra.get().reshape(-1).astype(np.float64), _msg(BF16, 0, 1, (24,)).astype(np.float64))
    np.testing.assert_array_equal(rb.get().astype(np.float64), _msg(BF16, 0, 2, (24,)).astype(np.float64))
    with pytest.raises(ValueError, match="0 isend and 1 irecv"):
        dist.batch_isend_irecv([dist.P2POp(dist.irecv, _T(rb), group=pg, group_peer=0)])
    pg.destroy()
