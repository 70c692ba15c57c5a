"""torch.distributed's point-to-point calls (send, recv, isend, irecv, P2POp, batch_isend_irecv: _c10d_p2p.py):
orderings that must not deadlock, large messages, tags, sub-groups, bad input, at 2 and 4 ranks."""
import numpy as np
import pytest

import hpcfsdp.distributed as dist
from _c10d_util import BIG, T, all_raise, still_works, subgroups
from hpcfsdp._tensor import Tensor
from hpcfsdp.distributed import _comm_thread as CT
from hpcfsdp.distributed import _p2p

pytestmark = pytest.mark.mpi(min_size=2)


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
    for g, ranks in subgroups():
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


def test_bad_input_raises_before_communicating():
    n, me = dist.get_world_size(), dist.get_rank()
    t = T(np.ones(4, np.float32))
    nxt = (me + 1) % n
    all_raise(lambda: dist.send(t, me), ValueError, "Invalid destination rank")
    all_raise(lambda: dist.send(t, n), ValueError, f"send: dst={n} is not a rank of")
    all_raise(lambda: dist.isend(t), ValueError, "give dst (a global rank) or group_dst")
    all_raise(lambda: dist.irecv(t, n + 1), ValueError, f"irecv: src={n + 1} is not a rank of")
    all_raise(lambda: dist.isend(t, nxt, tag=-1), RuntimeError, "Tag must be nonnegative")
    all_raise(lambda: dist.isend(t, nxt, tag=_p2p.RESERVED_TAGS[0]), ValueError, "is reserved by hpcfsdp")
    all_raise(lambda: dist.isend(t, nxt, tag=1 << 40), ValueError, "exceeds this MPI library's MPI_TAG_UB")
    all_raise(lambda: dist.isend(t, nxt, tag="a"), TypeError, "expected an int")
    all_raise(lambda: dist.irecv(Tensor._wrap(np.ones(4)[::2]), nxt), ValueError, "contiguous")
    all_raise(lambda: dist.P2POp(dist.send, t, nxt), ValueError, "Invalid ``op``")
    all_raise(lambda: dist.P2POp(dist.isend, np.ones(2), nxt), TypeError, "tensor must be a Tensor")
    all_raise(lambda: dist.P2POp(dist.isend, t), ValueError, "give peer")
    all_raise(lambda: dist.batch_isend_irecv([]), ValueError, "p2p_op_list is empty")
    all_raise(lambda: dist.batch_isend_irecv([1]), ValueError, "Invalid ``p2p_op_list``")
    still_works()
