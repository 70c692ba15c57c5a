"""torch.distributed's rooted collectives, all-to-all, point-to-point, object gather/scatter, monitored_barrier
and backend queries (hpcfsdp.distributed, _c10d_more.py): values against NumPy, orderings that must not
deadlock, and bad input, at 2 and 4 ranks."""
import datetime

import ml_dtypes
import numpy as np
import pytest

import hpcfsdp.distributed as dist
from hpcfsdp._tensor import Tensor
from hpcfsdp.distributed import _comm_thread as CT
from hpcfsdp.distributed import _p2p

pytestmark = pytest.mark.mpi(min_size=2)

DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16),
          np.dtype(np.int64)]
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT]
BIG = 1 << 20  # float32 elements: 4 MiB, far above any eager-protocol threshold


def T(a):
    return Tensor._wrap(np.ascontiguousarray(a))


def _data(rank, shape, dtype, salt=0):
    rng = np.random.default_rng(1000 * rank + salt)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-4, 5, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _ref(op, arrays):
    """op over ``arrays`` in float64 / int64, as the ranks should see it."""
    dt = arrays[0].dtype
    acc = np.stack([a.astype(np.int64 if dt.kind == "i" else np.float64) for a in arrays])
    return {
        dist.ReduceOp.SUM: lambda: acc.sum(0),
        dist.ReduceOp.AVG: lambda: acc.sum(0) // len(arrays) if dt.kind == "i" else acc.sum(0) / len(arrays),
        dist.ReduceOp.MAX: lambda: acc.max(0),
        dist.ReduceOp.MIN: lambda: acc.min(0),
        dist.ReduceOp.PRODUCT: lambda: acc.prod(0),
    }[op]()


def _close(got, ref, dt, n):
    if dt.kind == "i":
        return np.array_equal(got, ref)
    tol = 2e-2 if dt.itemsize == 2 else 1e-5
    return bool(np.all(np.abs(got.astype(np.float64) - ref) <= tol * n * np.maximum(1, np.abs(ref))))


def _groups():
    """(group, its global ranks) for the default group and, collectively, a sub-group: world ranks {1, n-1} at
    4 ranks (group rank 0 is global rank 1), {0, 1} at 2; other ranks skip the sub-group."""
    n = dist.get_world_size()
    ranks = [1, n - 1] if n > 2 else [0, 1]
    sub = dist.new_group(ranks)
    out = [(None, list(range(n)))]
    if sub is not dist.GroupMember.NON_GROUP_MEMBER:
        out.append((sub, ranks))
    return out


def _all_raise(fn, exc, fragment):
    """fn() raises exc with fragment on this rank; then every rank checks that every rank did (no hang)."""
    msg = None
    try:
        fn()
    except exc as e:
        msg = str(e)
    ok = msg is not None and fragment in msg
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, ok)
    assert all(flags), (flags, msg, fragment)
    return msg


def _wait(w, async_op):
    if async_op:
        assert isinstance(w, dist.Work)
        w.wait()
    else:
        assert w is None


# -- collectives ------------------------------------------------------------------------------------

def test_reduce_every_op_dtype_root_and_group():
    me = dist.get_rank()
    for g, ranks in _groups():
        for dst in ranks:
            for async_op in (False, True):
                for dt in DTYPES:
                    for op in OPS:
                        for shape in [(0,), (3, 5)]:
                            mine = _data(me, shape, dt, 1)
                            t = T(mine.copy())
                            _wait(dist.reduce(t, dst=dst, op=op, group=g, async_op=async_op), async_op)
                            if me == dst:
                                ref = _ref(op, [_data(r, shape, dt, 1) for r in ranks])
                                assert _close(t._data, ref, dt, len(ranks)), (g, dst, dt, op, shape)
                            else:  # the other ranks' tensors are left as they were
                                assert np.array_equal(t._data, mine), (g, dst, dt, op)
        # group_dst names the destination by its rank in the group
        t = T(np.full(4, me + 1.0))
        dist.reduce(t, group=g, group_dst=len(ranks) - 1)
        if me == ranks[-1]:
            assert np.all(t._data == sum(r + 1.0 for r in ranks))


def test_gather_and_scatter_every_root_dtype_and_group():
    me = dist.get_rank()
    for g, ranks in _groups():
        n = len(ranks)
        for root in ranks:
            for async_op in (False, True):
                for dt in DTYPES:
                    for shape in [(0,), (2, 3)]:
                        # gather: root's list gets every group rank's tensor (any shape of the same size)
                        lst = [T(np.zeros((6,) if shape == (2, 3) else shape, dt)) for _ in ranks] \
                            if me == root else None
                        w = dist.gather(T(_data(me, shape, dt, 2)), lst, dst=root, group=g, async_op=async_op)
                        _wait(w, async_op)
                        if me == root:
                            for i, r in enumerate(ranks):
                                assert np.array_equal(lst[i]._data.reshape(shape), _data(r, shape, dt, 2)), (root, i)
                        # scatter: rank ranks[i] gets the root's scatter_list[i]
                        sl = [T(_data(root, shape, dt, 10 + i)) for i in range(n)] if me == root else None
                        out = T(np.full(shape, 7, dt))
                        _wait(dist.scatter(out, sl, src=root, group=g, async_op=async_op), async_op)
                        i = ranks.index(me)
                        assert np.array_equal(out._data, _data(root, shape, dt, 10 + i)), (root, dt)
        # group_dst / group_src
        last = ranks[-1]
        lst = [T(np.zeros(2)) for _ in ranks] if me == last else None
        dist.gather(T(np.full(2, float(me))), lst, group=g, group_dst=n - 1)
        if me == last:
            assert [x._data.tolist() for x in lst] == [[float(r)] * 2 for r in ranks]
        out = T(np.zeros(1))
        dist.scatter(out, [T(np.array([10.0 * i])) for i in range(n)] if me == last else None, group=g,
                     group_src=n - 1)
        assert out._data[0] == 10.0 * ranks.index(me)


def test_gather_and_scatter_default_to_global_rank_0():
    n, me = dist.get_world_size(), dist.get_rank()
    lst = [T(np.zeros(3, np.int64)) for _ in range(n)] if me == 0 else None
    dist.gather(T(np.full(3, me * me, np.int64)), lst)
    if me == 0:
        assert [x._data.tolist() for x in lst] == [[r * r] * 3 for r in range(n)]
    out = T(np.zeros(2, np.float32))
    dist.scatter(out, [T(np.full(2, r + 0.5, np.float32)) for r in range(n)] if me == 0 else None)
    assert np.all(out._data == me + 0.5)


def test_reduce_scatter_list_form():
    me = dist.get_rank()
    for g, ranks in _groups():
        n = len(ranks)
        for async_op in (False, True):
            for dt in DTYPES:
                for op in OPS:
                    ins = [T(_data(me, (2, 3), dt, 20 + i)) for i in range(n)]
                    out = T(np.zeros((2, 3), dt))
                    _wait(dist.reduce_scatter(out, ins, op=op, group=g, async_op=async_op), async_op)
                    i = ranks.index(me)
                    ref = _ref(op, [_data(r, (2, 3), dt, 20 + i) for r in ranks])
                    assert _close(out._data, ref, dt, n), (g, dt, op)


def _piece(src, dst, rows, cols=2):
    """The block global rank ``src`` sends to ``dst`` in the all-to-all tests."""
    return (np.arange(rows * cols, dtype=np.float64).reshape(rows, cols) + 100 * src + 10 * dst)


def test_all_to_all_lists_with_uneven_sizes():
    me = dist.get_rank()
    for g, ranks in _groups():
        n = len(ranks)
        rows = lambda s, d: (s + 2 * d) % 3  # noqa: E731 (rows global rank s sends to d; 0 included)
        for async_op in (False, True):
            ins = [T(_piece(me, d, rows(me, d))) for d in ranks]
            outs = [T(np.full((rows(s, me), 2), -1.0)) for s in ranks]
            _wait(dist.all_to_all(outs, ins, group=g, async_op=async_op), async_op)
            for i, s in enumerate(ranks):
                assert np.array_equal(outs[i]._data, _piece(s, me, rows(s, me))), (g, s)
        # equal sizes, int dtype
        ins = [T(np.full(3, 10 * me + d, np.int32)) for d in range(n)]
        outs = [T(np.zeros(3, np.int32)) for _ in range(n)]
        dist.all_to_all(outs, ins, group=g)
        assert [o._data.tolist() for o in outs] == [[10 * s + ranks.index(me)] * 3 for s in ranks]


def test_all_to_all_single_equal_and_split_sizes():
    me = dist.get_rank()
    for g, ranks in _groups():
        n = len(ranks)
        for async_op in (False, True):
            # equal splits: input rows [i*k:(i+1)*k] go to group rank i
            k = 2
            inp = T(np.concatenate([_piece(me, d, k) for d in ranks]))
            out = T(np.zeros((n * k, 2)))
            _wait(dist.all_to_all_single(out, inp, group=g, async_op=async_op), async_op)
            assert np.array_equal(out._data, np.concatenate([_piece(s, me, k) for s in ranks]))
            # explicit split sizes (some zero)
            rows = lambda s, d: (2 * s + d) % 3  # noqa: E731
            in_splits = [rows(me, d) for d in ranks]
            out_splits = [rows(s, me) for s in ranks]
            inp = T(np.concatenate([_piece(me, d, rows(me, d)) for d in ranks]))
            out = T(np.full((sum(out_splits), 2), -1.0))
            _wait(dist.all_to_all_single(out, inp, out_splits, in_splits, group=g, async_op=async_op), async_op)
            assert np.array_equal(out._data, np.concatenate([_piece(s, me, rows(s, me)) for s in ranks]))
        # only the input split given: the output is split equally
        inp = T(np.concatenate([np.full((1 + ranks.index(me) if d == ranks[0] else 1, 3), me, np.int64)
                                for d in ranks]))
        in_splits = [1 + ranks.index(me) if d == ranks[0] else 1 for d in ranks]
        if me == ranks[0]:  # receives 1 + i rows from group rank i: not equal, so give both
            out_splits = [1 + i for i in range(n)]
            out = T(np.zeros((sum(out_splits), 3), np.int64))
            dist.all_to_all_single(out, inp, out_splits, in_splits, group=g)
            assert out._data[:, 0].tolist() == [r for i, r in enumerate(ranks) for _ in range(1 + i)]
        else:
            out = T(np.zeros((n, 3), np.int64))
            dist.all_to_all_single(out, inp, None, in_splits, group=g)
            assert out._data[:, 0].tolist() == ranks


def test_groups_of_one_rank():
    n, me = dist.get_world_size(), dist.get_rank()
    for r in range(n):  # collectively: every rank alone in a group of its own
        g = dist.new_group([r])
        if r != me:
            continue
        t = T(np.arange(3.0))
        dist.reduce(t, dst=me, op=dist.ReduceOp.AVG, group=g)
        lst = [T(np.zeros(3))]
        dist.gather(t, lst, dst=me, group=g, async_op=True).wait()
        out = T(np.zeros(3))
        dist.scatter(out, [T(np.full(3, 4.0))], src=me, group=g)
        a2a = T(np.zeros(3))
        dist.all_to_all_single(a2a, t, [3], [3], group=g)
        objs = [None]
        dist.gather_object({"me": me}, objs, dst=me, group=g)
        one = [None]
        dist.scatter_object_list(one, ["x"], src=me, group=g)
        dist.monitored_barrier(g, timeout=1.0)
        assert t._data.tolist() == [0.0, 1.0, 2.0] and lst[0]._data.tolist() == [0.0, 1.0, 2.0]
        assert out._data.tolist() == [4.0] * 3 and a2a._data.tolist() == [0.0, 1.0, 2.0]
        assert objs == [{"me": me}] and one == ["x"]
        with pytest.raises(ValueError, match="sends 3 elements to itself but expects 2"):
            dist.all_to_all_single(T(np.zeros(2)), t, [2], [3], group=g)


# -- point-to-point ---------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_send_recv_in_both_orders_with_large_messages():
    n, me = dist.get_world_size(), dist.get_rank()
    peer = me ^ 1
    if peer >= n:  # an odd world: the last rank has no partner
        return
    a = T(np.full(BIG, me, np.float32))
    b = T(np.zeros(BIG, np.float32))
    for _ in range(2):  # rank 0 sends then receives, rank 1 receives then sends; then each way again
        if me % 2 == 0:
            dist.send(a, peer)
            assert dist.recv(b, peer) == peer
        else:
            assert dist.recv(b, peer) == peer
            dist.send(a, peer)
        assert np.all(b._data == peer)
        b._data[:] = 0


@pytest.mark.timeout(60)
def test_isend_irecv_both_ranks_send_first_then_receive():
    n, me = dist.get_world_size(), dist.get_rank()
    right, left = (me + 1) % n, (me - 1) % n
    a = T(np.full(BIG, me, np.float32))
    b = T(np.zeros(BIG, np.float32))
    ws = dist.isend(a, right)  # every rank sends first: blocking sends on the comm thread would deadlock
    wr = dist.irecv(b, left)
    assert isinstance(ws, dist.Work) and isinstance(wr, dist.Work)
    wr.wait()
    ws.wait()
    assert np.all(b._data == left) and wr.result() == left and ws.is_completed()
    # the same with the waits in the other order, and receives posted first on odd ranks
    b._data[:] = -1
    if me % 2:
        wr, ws = dist.irecv(b, left), dist.isend(a, right)
    else:
        ws, wr = dist.isend(a, right), dist.irecv(b, left)
    ws.wait()
    wr.wait()
    assert np.all(b._data == left)


@pytest.mark.timeout(60)
def test_pending_send_does_not_hold_back_a_later_collective():
    n, me = dist.get_world_size(), dist.get_rank()
    a = T(np.full(BIG, me + 1, np.float32))
    b = T(np.zeros(BIG, np.float32))
    s = T(np.full(2, me + 1.0))
    if me == 0:  # the receive on rank n-1 is posted only after the all_reduce, which rank 0 must reach
        w = dist.isend(a, n - 1)
        dist.all_reduce(s)
        w.wait()
    elif me == n - 1:
        dist.all_reduce(s)
        assert dist.recv(b, 0) == 0
        assert np.all(b._data == 1)
    else:
        dist.all_reduce(s)
    assert np.all(s._data == n * (n + 1) / 2)
    # and an irecv posted long before its message arrives does not block collectives either
    if me == n - 1:
        w = dist.irecv(b, 0, tag=5)
    for _ in range(3):
        dist.all_reduce(s)
        dist.barrier()
    if me == 0:
        dist.send(a, n - 1, tag=5)
    if me == n - 1:
        w.wait()
        assert np.all(b._data == 1)


@pytest.mark.timeout(60)
def test_recv_from_any_source_tags_order_and_self():
    n, me = dist.get_world_size(), dist.get_rank()
    # any source: rank 0 hears from every other rank and learns who sent what
    if me == 0:
        got = {}
        for _ in range(n - 1):
            t = T(np.zeros(3, np.int64))
            src = dist.recv(t)
            got[src] = t._data.tolist()
        assert got == {r: [r] * 3 for r in range(1, n)}
    else:
        dist.send(T(np.full(3, me, np.int64)), 0)
    # messages between one pair match in issue order; tags select among them
    if me in (0, 1):
        peer = 1 - me
        if me == 0:
            ws = [dist.isend(T(np.full(4, float(i))), peer, tag=i % 2) for i in range(4)]
            for w in ws:
                w.wait()
        else:
            outs = [T(np.zeros(4)) for _ in range(4)]
            odd = [dist.irecv(outs[i], peer, tag=1) for i in (1, 3)]  # tag 1 first: sent 2nd and 4th
            even = [dist.irecv(outs[i], peer, tag=0) for i in (0, 2)]
            for w in odd + even:
                w.wait()
            assert [o._data[0] for o in outs] == [0.0, 1.0, 2.0, 3.0]
    # isend/irecv to oneself
    x, y = T(np.arange(5.0)), T(np.zeros(5))
    wr = dist.irecv(y, me, tag=3)
    dist.isend(x, me, tag=3).wait()
    wr.wait()
    assert np.array_equal(y._data, np.arange(5.0))
    dist.barrier()


@pytest.mark.timeout(60)
def test_p2p_on_a_subgroup_uses_global_or_group_ranks():
    me = dist.get_rank()
    for g, ranks in _groups():
        if g is None:
            continue
        other = ranks[1 - ranks.index(me)]
        t = T(np.zeros(2))
        w = dist.isend(T(np.full(2, float(me))), other, group=g)
        assert dist.recv(t, other, group=g) == other  # src is a global rank; the result too
        w.wait()
        assert np.all(t._data == other)
        w = dist.isend(T(np.full(2, 2.0 * me)), group=g, group_dst=1 - ranks.index(me))
        assert dist.recv(t, group=g, group_src=1 - ranks.index(me)) == other
        w.wait()
        assert np.all(t._data == 2.0 * other)
        if me == ranks[0]:  # from any rank of the group
            assert dist.recv(t, group=g) == ranks[1]
        else:
            assert dist.send(T(np.ones(2)), ranks[0], group=g) is None


@pytest.mark.timeout(60)
def test_batch_isend_irecv_ring_in_any_order():
    n, me = dist.get_world_size(), dist.get_rank()
    right, left = (me + 1) % n, (me - 1) % n
    send = T(np.arange(6, dtype=np.float32) + 10 * me)
    recv = T(np.zeros(6, np.float32))
    ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, recv, left)]
    if me % 2:
        ops.reverse()
    works = dist.batch_isend_irecv(ops)
    assert len(works) == 2
    for w in works:
        w.wait()
    assert np.array_equal(recv._data, np.arange(6, dtype=np.float32) + 10 * left)
    assert "isend" in repr(ops[0]) or "irecv" in repr(ops[0])
    # large messages, both directions, several per pair
    a = [T(np.full(BIG // 4, 4 * me + i, np.float32)) for i in range(2)]
    b = [T(np.zeros(BIG // 4, np.float32)) for _ in range(4)]
    ops = [dist.P2POp(dist.irecv, b[0], left), dist.P2POp(dist.irecv, b[1], left),
           dist.P2POp(dist.irecv, b[2], right), dist.P2POp(dist.irecv, b[3], right),
           dist.P2POp(dist.isend, a[0], right), dist.P2POp(dist.isend, a[1], right),
           dist.P2POp(dist.isend, a[0], left), dist.P2POp(dist.isend, a[1], left)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    if n > 2:
        assert [x._data[0] for x in b] == [4 * left, 4 * left + 1, 4 * right, 4 * right + 1]
    else:  # left == right: the messages from the one neighbour arrive in issue order
        assert [x._data[0] for x in b] == [4 * left, 4 * left + 1, 4 * left, 4 * left + 1]


@pytest.mark.timeout(60)
def test_recv_of_the_wrong_size_raises():
    me = dist.get_rank()
    if me == 0:
        dist.send(T(np.ones(4, np.float32)), 1)
        dist.send(T(np.ones(4, np.float32)), 1)
    elif me == 1:
        with pytest.raises(RuntimeError, match="received 16 bytes from group rank 0, expected 20"):
            dist.recv(T(np.zeros(5, np.float32)), 0)
        with pytest.raises(RuntimeError, match="larger than the receive buffer"):
            dist.recv(T(np.zeros(3, np.float32)), 0)
    dist.barrier()


@pytest.mark.timeout(60)
def test_p2p_without_a_communication_thread(monkeypatch):
    n, me = dist.get_world_size(), dist.get_rank()
    dist.barrier()
    monkeypatch.setattr(CT, "comm_thread", lambda: None)  # MPI below THREAD_SERIALIZED: the caller drives
    right, left = (me + 1) % n, (me - 1) % n
    a, b = T(np.full(BIG, me, np.float32)), T(np.zeros(BIG, np.float32))
    ws, wr = dist.isend(a, right), dist.irecv(b, left)
    assert isinstance(ws, _p2p._Driven) and isinstance(wr, _p2p._Driven)
    wr.wait()
    ws.wait()
    assert np.all(b._data == left) and wr.result() == left and ws.is_completed()
    monkeypatch.undo()
    dist.barrier()


# -- objects ----------------------------------------------------------------------------------------

def test_gather_object_and_scatter_object_list():
    me = dist.get_rank()
    for g, ranks in _groups():
        n = len(ranks)
        for root in ranks:
            lst = [None] * n if me == root else None
            obj = {"rank": me, "t": (me, "x" * me), "a": np.arange(me + 1)}
            assert dist.gather_object(obj, lst, dst=root, group=g) is None
            if me == root:
                for i, r in enumerate(ranks):
                    assert lst[i]["rank"] == r and lst[i]["t"] == (r, "x" * r)
                    assert np.array_equal(lst[i]["a"], np.arange(r + 1))
            out = ["keep", "rest"]
            src_objs = [{"for": r, "data": [r] * (r + 1)} for r in ranks] if me == root else None
            dist.scatter_object_list(out, src_objs, src=root, group=g)
            assert out == [{"for": me, "data": [me] * (me + 1)}, "rest"]
        lst = [None] * n if me == ranks[-1] else None
        dist.gather_object(me, lst, group=g, group_dst=n - 1)
        if me == ranks[-1]:
            assert lst == ranks
        out = [None]
        dist.scatter_object_list(out, list(range(100, 100 + n)) if me == ranks[0] else None, group=g, group_src=0)
        assert out == [100 + ranks.index(me)]


def test_object_collectives_refuse_what_they_cannot_send_without_pickle():
    me = dist.get_rank()
    lst = [None] * dist.get_world_size()
    _all_raise(lambda: dist.gather_object(object(), lst, dst=me), TypeError, "no pickle")


# -- monitored_barrier ------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_monitored_barrier_passes_when_everyone_arrives():
    n = dist.get_world_size()
    g = dist.new_group(list(range(n)))
    for _ in range(3):
        assert dist.monitored_barrier(g, timeout=datetime.timedelta(seconds=20)) is None
    dist.monitored_barrier(timeout=20.0, wait_all_ranks=True)
    dist.destroy_process_group(g)


@pytest.mark.timeout(60)
def test_monitored_barrier_names_the_ranks_that_did_not_arrive():
    n, me = dist.get_world_size(), dist.get_rank()
    # the last rank never arrives: rank 0 names it, the ranks that arrived are told
    g = dist.new_group(list(range(n)))
    if me == 0:
        with pytest.raises(RuntimeError, match=f"^\\[Rank 0\\]: Rank {n - 1} failed to pass monitoredBarrier in 500 ms$"):
            dist.monitored_barrier(g, timeout=0.5)
    elif me != n - 1:
        with pytest.raises(RuntimeError, match=f"Rank {me} successfully reached monitoredBarrier, but received errors "
                                               f"while waiting for send/recv from rank 0.*Rank 0 reports: Rank {n - 1} "
                                               "failed to pass monitoredBarrier in 500 ms"):
            dist.monitored_barrier(g, timeout=0.5)
    dist.barrier()
    # all call the next one, but the last rank is one barrier behind: it is named again, and told so
    if me == 0:
        with pytest.raises(RuntimeError, match=f"\\[Rank 0\\]: Rank {n - 1} failed"):
            dist.monitored_barrier(g, timeout=0.3)
    else:
        with pytest.raises(RuntimeError, match=f"Rank 0 reports: Rank {n - 1} failed to pass monitoredBarrier"):
            dist.monitored_barrier(g, timeout=0.3)
    dist.barrier()
    dist.destroy_process_group(g)
    # only rank 0 arrives: wait_all_ranks names them all, else the first
    for wait_all in (False, True):
        g = dist.new_group(list(range(n)))
        if me == 0:
            missing = ", ".join(str(r) for r in range(1, n)) if wait_all else "1"
            word = "Ranks" if wait_all and n > 2 else "Rank"
            with pytest.raises(RuntimeError, match=f"\\[Rank 0\\]: {word} {missing} failed to pass monitoredBarrier"):
                dist.monitored_barrier(g, timeout=datetime.timedelta(milliseconds=300), wait_all_ranks=wait_all)
        dist.barrier()
        dist.destroy_process_group(g)
    # rank 0 never arrives: the others give up after the timeout
    g = dist.new_group(list(range(n)))
    if me != 0:
        with pytest.raises(RuntimeError, match="no answer from rank 0 within 600 ms"):
            dist.monitored_barrier(g, timeout=0.3)
    dist.barrier()
    dist.destroy_process_group(g)


# -- bad input ----------------------------------------------------------------------------------------

def test_bad_input_raises_before_communicating():
    n, me = dist.get_world_size(), dist.get_rank()
    t = T(np.ones(4, np.float32))
    nxt = (me + 1) % n
    # every rank raises locally (each its own root where the check is on the root)
    _all_raise(lambda: dist.reduce(t, dst=n), ValueError, f"reduce: dst={n} is not a rank of")
    _all_raise(lambda: dist.reduce(t), ValueError, "give dst (a global rank) or group_dst")
    _all_raise(lambda: dist.reduce(t, dst=0, group_dst=0), ValueError, "give only one of dst=0 and group_dst=0")
    _all_raise(lambda: dist.reduce(t, group_dst=n), ValueError, f"group_dst={n}: outside the group")
    _all_raise(lambda: dist.reduce(np.ones(4), dst=0), TypeError, "expected a hpcfsdp Tensor")
    _all_raise(lambda: dist.gather(t, [T(np.ones(4, np.float32))] * (n + 1), dst=me), ValueError,
               f"gather_list has {n + 1} entries, expected the group size {n}")
    _all_raise(lambda: dist.gather(t, [T(np.ones(3, np.float32))] * n, dst=me), ValueError,
               "gather_list[0] has 3 elements [3], expected 4")
    _all_raise(lambda: dist.gather(t, [T(np.ones(4, np.float64))] * n, dst=me), ValueError,
               "tensors of different dtypes: gather_list[0] is float64, expected float32")
    _all_raise(lambda: dist.gather(t, None, dst=me), ValueError, "``gather_list`` must be specified on destination")
    _all_raise(lambda: dist.gather(t, [t] * n, dst=nxt) if n > 1 else None, ValueError,
               "must NOT be specified on non-destination ranks")
    _all_raise(lambda: dist.scatter(t, [T(np.ones(4, np.float32))] * (n - 1), src=me), ValueError,
               f"scatter_list has {n - 1} entries")
    _all_raise(lambda: dist.scatter(t, [T(np.ones(5, np.float32))] * n, src=me), ValueError, "has 5 elements")
    _all_raise(lambda: dist.scatter(t, None, src=me), ValueError, "``scatter_list`` must be specified on source")
    _all_raise(lambda: dist.scatter(t, [t] * n, src=n + 3), ValueError, f"scatter: src={n + 3} is not a rank of")
    _all_raise(lambda: dist.reduce_scatter(t, [t] * (n + 1)), ValueError, f"input_list has {n + 1} entries")
    _all_raise(lambda: dist.reduce_scatter(t, [T(np.ones(2, np.float32))] * n), ValueError,
               "input_list[0] has 2 elements")
    _all_raise(lambda: dist.all_to_all([t] * (n + 1), [t] * n), ValueError, f"output_tensor_list has {n + 1} entries")
    _all_raise(lambda: dist.all_to_all([t] * n, [t] * (n - 1)), ValueError, f"input_tensor_list has {n - 1} entries")
    _all_raise(lambda: dist.all_to_all([T(np.ones(4))] * n, [t] * n), ValueError, "tensors of different dtypes")
    a8 = T(np.ones((2 * n, 2), np.float32))
    _all_raise(lambda: dist.all_to_all_single(a8, a8, [1] * (n + 1), None), ValueError,
               "Number of tensor splits not equal to group size")
    _all_raise(lambda: dist.all_to_all_single(a8, a8, None, [3] * n), ValueError,
               "Split sizes doesn't match total dim 0 size")
    _all_raise(lambda: dist.all_to_all_single(a8, a8, None, [-1, 2 * n + 1] + [0] * (n - 2)), ValueError,
               "expected non-negative ints")
    odd = T(np.ones((2 * n + 1, 2), np.float32))
    _all_raise(lambda: dist.all_to_all_single(odd, odd), ValueError, f"must divide equally by the group size {n}")
    _all_raise(lambda: dist.all_to_all_single(T(np.ones((2 * n, 3), np.float32)), a8), ValueError,
               "must have the same size")
    _all_raise(lambda: dist.all_to_all_single(T(np.ones(2 * n)), a8), ValueError, "tensors of different dtypes")
    # point-to-point
    _all_raise(lambda: dist.send(t, me), ValueError, "Invalid destination rank")
    _all_raise(lambda: dist.send(t, n), ValueError, f"send: dst={n} is not a rank of")
    _all_raise(lambda: dist.isend(t), ValueError, "give dst (a global rank) or group_dst")
    _all_raise(lambda: dist.irecv(t, n + 1), ValueError, f"irecv: src={n + 1} is not a rank of")
    _all_raise(lambda: dist.isend(t, nxt, tag=-1), RuntimeError, "Tag must be nonnegative")
    _all_raise(lambda: dist.isend(t, nxt, tag=_p2p.RESERVED_TAGS[0]), ValueError, "is reserved by hpcfsdp")
    _all_raise(lambda: dist.isend(t, nxt, tag=1 << 40), ValueError, "exceeds this MPI library's MPI_TAG_UB")
    _all_raise(lambda: dist.isend(t, nxt, tag="a"), TypeError, "expected an int")
    _all_raise(lambda: dist.irecv(Tensor._wrap(np.ones(4)[::2]), nxt), ValueError, "contiguous")
    _all_raise(lambda: dist.P2POp(dist.send, t, nxt), ValueError, "Invalid ``op``")
    _all_raise(lambda: dist.P2POp(dist.isend, np.ones(2), nxt), TypeError, "tensor must be a Tensor")
    _all_raise(lambda: dist.P2POp(dist.isend, t), ValueError, "give peer")
    _all_raise(lambda: dist.batch_isend_irecv([]), ValueError, "p2p_op_list is empty")
    _all_raise(lambda: dist.batch_isend_irecv([1]), ValueError, "Invalid ``p2p_op_list``")
    # objects
    _all_raise(lambda: dist.gather_object(1, None, dst=me), ValueError, "must be specified on destination rank")
    _all_raise(lambda: dist.gather_object(1, [None] * (n + 2), dst=me), ValueError,
               f"object_gather_list has {n + 2} entries")
    _all_raise(lambda: dist.gather_object(1, [None] * n, dst=nxt) if n > 1 else None, ValueError,
               "must NOT be specified on non-destination ranks")
    _all_raise(lambda: dist.scatter_object_list([], [1] * n, src=me), ValueError, "of size at least 1")
    _all_raise(lambda: dist.scatter_object_list([None], None, src=me), ValueError, "must provide non-None")
    _all_raise(lambda: dist.scatter_object_list([None], [1] * (n + 1), src=me), ValueError,
               f"has {n + 1} entries, expected the group size {n}")
    _all_raise(lambda: dist.monitored_barrier(timeout=-1.0), ValueError, "positive duration")
    _all_raise(lambda: dist.monitored_barrier(timeout="1s"), TypeError, "timedelta")
    # nothing was left half-issued: the group still works
    s = T(np.ones(1))
    dist.all_reduce(s)
    assert s._data[0] == n


def test_all_to_all_ranks_that_disagree_on_sizes_all_raise():
    n, me = dist.get_world_size(), dist.get_rank()
    # every rank sends 1 element to each, but rank n-1 expects 2 from rank 0
    ins = [T(np.ones(1, np.float32)) for _ in range(n)]
    outs = [T(np.zeros(2 if (me == n - 1 and s == 0) else 1, np.float32)) for s in range(n)]
    _all_raise(lambda: dist.all_to_all(outs, ins), ValueError,
               f"group rank 0 sends 1 elements to group rank {n - 1}, which expects 2")
    s = T(np.ones(1))
    dist.all_reduce(s)
    assert s._data[0] == n


def test_debug_mode_checks_the_new_collectives(monkeypatch):
    from mpi4py import MPI

    from hpcfsdp.distributed.process_group import ProcessGroup

    monkeypatch.setenv("HPCFSDP_DEBUG", "1")
    pg = ProcessGroup(MPI.COMM_WORLD, name="dbg")
    n, r = pg.size(), pg.rank()
    a = np.full(3, r + 1.0)
    pg.reduce_(a, dst=0)
    assert r != 0 or np.all(a == n * (n + 1) / 2)
    out = np.zeros(2 * n) if r == 0 else None
    pg.gather_into(out, np.full(2, float(r)), dst=0)
    assert r != 0 or np.array_equal(out, np.repeat(np.arange(n, dtype=np.float64), 2))
    got = np.zeros(n)
    pg.all_to_all_into(got, np.full(n, float(r)))
    assert np.array_equal(got, np.arange(n, dtype=np.float64))
    assert pg.gather_object(r, dst=n - 1) == (list(range(n)) if r == n - 1 else None)
    assert pg.scatter_object(list(range(n)) if r == 0 else None, src=0) == r
    # ranks that call different roots: every rank raises before the data moves
    msg = _all_raise(lambda: pg.reduce_(np.ones(2), dst=min(r, 1)), RuntimeError, "is the first rank whose call")
    assert "reduce(count=2, dtype=float64, op=SUM, src=1)" in msg
    pg.destroy()


# -- queries --------------------------------------------------------------------------------------

def test_backend_and_launcher_queries(monkeypatch):
    import importlib.util

    has_nccl = importlib.util.find_spec("cupy") is not None and importlib.util.find_spec("nvidia.nccl") is not None
    assert dist.is_nccl_available() is has_nccl  # the cuda extra installs CuPy with the NCCL wheel
    assert dist.is_gloo_available() is True
    assert dist.get_default_backend_for_device("cpu") == "gloo"  # consistent: that backend name works
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert dist.is_torchelastic_launched() is False
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")
    assert dist.is_torchelastic_launched() is True
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert dist.get_node_local_rank() == 3 and dist.get_node_local_rank(fallback_rank=7) == 3
    monkeypatch.delenv("LOCAL_RANK")
    assert dist.get_node_local_rank(fallback_rank=7) == 7
    with pytest.raises(RuntimeError, match="LOCAL_RANK is not in the environment"):
        dist.get_node_local_rank()
    from hpcfsdp.distributed import distributed_c10d as c10d

    for name in ("reduce", "gather", "scatter", "reduce_scatter", "all_to_all", "all_to_all_single", "send", "recv",
                 "isend", "irecv", "P2POp", "batch_isend_irecv", "gather_object", "scatter_object_list",
                 "monitored_barrier", "is_nccl_available", "is_gloo_available", "is_torchelastic_launched",
                 "get_node_local_rank"):
        assert name in c10d.__all__ and name in dist.__all__ and getattr(c10d, name) is getattr(dist, name)


# -- device arrays (the simulated device in CI, or a real GPU) -------------------------------------------

@pytest.mark.gpu
@pytest.mark.timeout(60)
@pytest.mark.parametrize("aware", [False, True], ids=["staged", "cuda_aware"])
def test_device_tensors(aware, monkeypatch):
    import cupy as cp

    from hpcfsdp.distributed import _mpi

    monkeypatch.setattr(_mpi, "_CUDA_AWARE", (aware, "test"))
    n, me = dist.get_world_size(), dist.get_rank()
    right, left = (me + 1) % n, (me - 1) % n
    D = lambda a: Tensor._wrap(cp.asarray(np.ascontiguousarray(a)))  # noqa: E731
    a, b = D(np.full(1000, me, np.float32)), D(np.zeros(1000, np.float32))
    ws, wr = dist.isend(a, right), dist.irecv(b, left)
    ws.wait()
    wr.wait()
    assert np.all(b._data.get() == left)
    t = D(np.full(3, me + 1.0, np.float32))
    dist.reduce(t, dst=n - 1)
    if me == n - 1:
        assert np.all(t._data.get() == n * (n + 1) / 2)
    lst = [D(np.zeros(2, np.float32)) for _ in range(n)] if me == 0 else None
    dist.gather(D(np.full(2, me, np.float32)), lst, dst=0)
    if me == 0:
        assert [x._data.get().tolist() for x in lst] == [[r, r] for r in range(n)]
    out = D(np.zeros(2, np.float32))
    dist.scatter(out, [D(np.full(2, 5.0 * r, np.float32)) for r in range(n)] if me == 0 else None, src=0)
    assert np.all(out._data.get() == 5.0 * me)
    inp = D(np.arange(n, dtype=np.float32) + 10 * me)
    o = D(np.zeros(n, np.float32))
    dist.all_to_all_single(o, inp, [1] * n, [1] * n)
    assert o._data.get().tolist() == [10.0 * s + me for s in range(n)]
