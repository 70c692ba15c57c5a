"""torch.distributed's rooted collectives (reduce, gather, scatter), the list forms (reduce_scatter, all_to_all,
all_to_all_single), object gather/scatter and monitored_barrier (_c10d_rooted.py, _c10d_collectives.py,
_c10d_objects.py): values against NumPy, groups, bad input, and the device path, at 2 and 4 ranks."""
import datetime

import numpy as np
import pytest

import hpcfsdp.distributed as dist
from _c10d_util import DTYPES, OPS, T, all_raise, close, data, reduced, still_works, subgroups, wait
from hpcfsdp._tensor import Tensor

pytestmark = pytest.mark.mpi(min_size=2)


# -- rooted collectives and list forms ---------------------------------------------------------------

def test_reduce_every_op_dtype_root_and_group():
    me = dist.get_rank()
    for g, ranks in subgroups():
        for dst in ranks:
            for async_op in (False, True):
                for dt in DTYPES:
                    for op in OPS:
                        for shape in [(0,), (3, 5)]:
                            mine = data(me, shape, dt, 1)
                            t = T(mine.copy())
                            wait(dist.reduce(t, dst=dst, op=op, group=g, async_op=async_op), async_op)
                            if me == dst:
                                ref = reduced(op, [data(r, shape, dt, 1) for r in ranks])
                                assert close(t._data, ref, dt, len(ranks)), (g, dst, dt, op, shape)
                            else:  # the other ranks' tensors are left as they were
                                assert np.array_equal(t._data, mine), (g, dst, dt, op)
        # group_dst names the destination by its rank in the group
        t = T(np.full(4, me + 1.0))
        dist.reduce(t, group=g, group_dst=len(ranks) - 1)
        if me == ranks[-1]:
            assert np.all(t._data == sum(r + 1.0 for r in ranks))


def test_gather_and_scatter_every_root_dtype_and_group():
    me = dist.get_rank()
    for g, ranks in subgroups():
        n = len(ranks)
        for root in ranks:
            for async_op in (False, True):
                for dt in DTYPES:
                    for shape in [(0,), (2, 3)]:
                        # gather: root's list gets every group rank's tensor (any shape of the same size)
                        lst = [T(np.zeros((6,) if shape == (2, 3) else shape, dt)) for _ in ranks] \
                            if me == root else None
                        w = dist.gather(T(data(me, shape, dt, 2)), lst, dst=root, group=g, async_op=async_op)
                        wait(w, async_op)
                        if me == root:
                            for i, r in enumerate(ranks):
                                assert np.array_equal(lst[i]._data.reshape(shape), data(r, shape, dt, 2)), (root, i)
                        # scatter: rank ranks[i] gets the root's scatter_list[i]
                        sl = [T(data(root, shape, dt, 10 + i)) for i in range(n)] if me == root else None
                        out = T(np.full(shape, 7, dt))
                        wait(dist.scatter(out, sl, src=root, group=g, async_op=async_op), async_op)
                        i = ranks.index(me)
                        assert np.array_equal(out._data, data(root, shape, dt, 10 + i)), (root, dt)
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
    for g, ranks in subgroups():
        n = len(ranks)
        for async_op in (False, True):
            for dt in DTYPES:
                for op in OPS:
                    ins = [T(data(me, (2, 3), dt, 20 + i)) for i in range(n)]
                    out = T(np.zeros((2, 3), dt))
                    wait(dist.reduce_scatter(out, ins, op=op, group=g, async_op=async_op), async_op)
                    i = ranks.index(me)
                    ref = reduced(op, [data(r, (2, 3), dt, 20 + i) for r in ranks])
                    assert close(out._data, ref, dt, n), (g, dt, op)


def _piece(src, dst, rows, cols=2):
    """The block global rank ``src`` sends to ``dst`` in the all-to-all tests."""
    return (np.arange(rows * cols, dtype=np.float64).reshape(rows, cols) + 100 * src + 10 * dst)


def test_all_to_all_lists_with_uneven_sizes():
    me = dist.get_rank()
    for g, ranks in subgroups():
        n = len(ranks)
        rows = lambda s, d: (s + 2 * d) % 3  # noqa: E731 (rows global rank s sends to d; 0 included)
        for async_op in (False, True):
            ins = [T(_piece(me, d, rows(me, d))) for d in ranks]
            outs = [T(np.full((rows(s, me), 2), -1.0)) for s in ranks]
            wait(dist.all_to_all(outs, ins, group=g, async_op=async_op), async_op)
            for i, s in enumerate(ranks):
                assert np.array_equal(outs[i]._data, _piece(s, me, rows(s, me))), (g, s)
        # equal sizes, int dtype
        ins = [T(np.full(3, 10 * me + d, np.int32)) for d in range(n)]
        outs = [T(np.zeros(3, np.int32)) for _ in range(n)]
        dist.all_to_all(outs, ins, group=g)
        assert [o._data.tolist() for o in outs] == [[10 * s + ranks.index(me)] * 3 for s in ranks]


def test_all_to_all_single_equal_and_split_sizes():
    me = dist.get_rank()
    for g, ranks in subgroups():
        n = len(ranks)
        for async_op in (False, True):
            # equal splits: input rows [i*k:(i+1)*k] go to group rank i
            k = 2
            inp = T(np.concatenate([_piece(me, d, k) for d in ranks]))
            out = T(np.zeros((n * k, 2)))
            wait(dist.all_to_all_single(out, inp, group=g, async_op=async_op), async_op)
            assert np.array_equal(out._data, np.concatenate([_piece(s, me, k) for s in ranks]))
            # explicit split sizes (some zero)
            rows = lambda s, d: (2 * s + d) % 3  # noqa: E731
            in_splits = [rows(me, d) for d in ranks]
            out_splits = [rows(s, me) for s in ranks]
            inp = T(np.concatenate([_piece(me, d, rows(me, d)) for d in ranks]))
            out = T(np.full((sum(out_splits), 2), -1.0))
            wait(dist.all_to_all_single(out, inp, out_splits, in_splits, group=g, async_op=async_op), async_op)
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


# -- objects -----------------------------------------------------------------------------------------

def test_gather_object_and_scatter_object_list():
    me = dist.get_rank()
    for g, ranks in subgroups():
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
    all_raise(lambda: dist.gather_object(object(), lst, dst=me), TypeError, "no pickle")


# -- monitored_barrier -------------------------------------------------------------------------------

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


# -- bad input ---------------------------------------------------------------------------------------

def test_bad_input_raises_before_communicating():
    n, me = dist.get_world_size(), dist.get_rank()
    t = T(np.ones(4, np.float32))
    nxt = (me + 1) % n
    # every rank raises locally (each its own root where the check is on the root)
    all_raise(lambda: dist.reduce(t, dst=n), ValueError, f"reduce: dst={n} is not a rank of")
    all_raise(lambda: dist.reduce(t), ValueError, "give dst (a global rank) or group_dst")
    all_raise(lambda: dist.reduce(t, dst=0, group_dst=0), ValueError, "give only one of dst=0 and group_dst=0")
    all_raise(lambda: dist.reduce(t, group_dst=n), ValueError, f"group_dst={n}: outside the group")
    all_raise(lambda: dist.reduce(np.ones(4), dst=0), TypeError, "expected a hpcfsdp Tensor")
    all_raise(lambda: dist.gather(t, [T(np.ones(4, np.float32))] * (n + 1), dst=me), ValueError,
               f"gather_list has {n + 1} entries, expected the group size {n}")
    all_raise(lambda: dist.gather(t, [T(np.ones(3, np.float32))] * n, dst=me), ValueError,
               "gather_list[0] has 3 elements [3], expected 4")
    all_raise(lambda: dist.gather(t, [T(np.ones(4, np.float64))] * n, dst=me), ValueError,
               "tensors of different dtypes: gather_list[0] is float64, expected float32")
    all_raise(lambda: dist.gather(t, None, dst=me), ValueError, "``gather_list`` must be specified on destination")
    all_raise(lambda: dist.gather(t, [t] * n, dst=nxt) if n > 1 else None, ValueError,
               "must NOT be specified on non-destination ranks")
    all_raise(lambda: dist.scatter(t, [T(np.ones(4, np.float32))] * (n - 1), src=me), ValueError,
               f"scatter_list has {n - 1} entries")
    all_raise(lambda: dist.scatter(t, [T(np.ones(5, np.float32))] * n, src=me), ValueError, "has 5 elements")
    all_raise(lambda: dist.scatter(t, None, src=me), ValueError, "``scatter_list`` must be specified on source")
    all_raise(lambda: dist.scatter(t, [t] * n, src=n + 3), ValueError, f"scatter: src={n + 3} is not a rank of")
    all_raise(lambda: dist.reduce_scatter(t, [t] * (n + 1)), ValueError, f"input_list has {n + 1} entries")
    all_raise(lambda: dist.reduce_scatter(t, [T(np.ones(2, np.float32))] * n), ValueError,
               "input_list[0] has 2 elements")
    all_raise(lambda: dist.all_to_all([t] * (n + 1), [t] * n), ValueError, f"output_tensor_list has {n + 1} entries")
    all_raise(lambda: dist.all_to_all([t] * n, [t] * (n - 1)), ValueError, f"input_tensor_list has {n - 1} entries")
    all_raise(lambda: dist.all_to_all([T(np.ones(4))] * n, [t] * n), ValueError, "tensors of different dtypes")
    a8 = T(np.ones((2 * n, 2), np.float32))
    all_raise(lambda: dist.all_to_all_single(a8, a8, [1] * (n + 1), None), ValueError,
               "Number of tensor splits not equal to group size")
    all_raise(lambda: dist.all_to_all_single(a8, a8, None, [3] * n), ValueError,
               "Split sizes doesn't match total dim 0 size")
    all_raise(lambda: dist.all_to_all_single(a8, a8, None, [-1, 2 * n + 1] + [0] * (n - 2)), ValueError,
               "expected non-negative ints")
    odd = T(np.ones((2 * n + 1, 2), np.float32))
    all_raise(lambda: dist.all_to_all_single(odd, odd), ValueError, f"must divide equally by the group size {n}")
    all_raise(lambda: dist.all_to_all_single(T(np.ones((2 * n, 3), np.float32)), a8), ValueError,
               "must have the same size")
    all_raise(lambda: dist.all_to_all_single(T(np.ones(2 * n)), a8), ValueError, "tensors of different dtypes")
    # objects
    all_raise(lambda: dist.gather_object(1, None, dst=me), ValueError, "must be specified on destination rank")
    all_raise(lambda: dist.gather_object(1, [None] * (n + 2), dst=me), ValueError,
               f"object_gather_list has {n + 2} entries")
    all_raise(lambda: dist.gather_object(1, [None] * n, dst=nxt) if n > 1 else None, ValueError,
               "must NOT be specified on non-destination ranks")
    all_raise(lambda: dist.scatter_object_list([], [1] * n, src=me), ValueError, "of size at least 1")
    all_raise(lambda: dist.scatter_object_list([None], None, src=me), ValueError, "must provide non-None")
    all_raise(lambda: dist.scatter_object_list([None], [1] * (n + 1), src=me), ValueError,
               f"has {n + 1} entries, expected the group size {n}")
    all_raise(lambda: dist.monitored_barrier(timeout=-1.0), ValueError, "positive duration")
    all_raise(lambda: dist.monitored_barrier(timeout="1s"), TypeError, "timedelta")
    still_works()


def test_all_to_all_ranks_that_disagree_on_sizes_all_raise():
    n, me = dist.get_world_size(), dist.get_rank()
    # every rank sends 1 element to each, but rank n-1 expects 2 from rank 0
    ins = [T(np.ones(1, np.float32)) for _ in range(n)]
    outs = [T(np.zeros(2 if (me == n - 1 and s == 0) else 1, np.float32)) for s in range(n)]
    all_raise(lambda: dist.all_to_all(outs, ins), ValueError,
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
    msg = all_raise(lambda: pg.reduce_(np.ones(2), dst=min(r, 1)), RuntimeError, "is the first rank whose call")
    assert "reduce(count=2, dtype=float64, op=SUM, src=1)" in msg
    pg.destroy()


# -- device arrays (the simulated device in CI, or a real GPU) ---------------------------------------

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
