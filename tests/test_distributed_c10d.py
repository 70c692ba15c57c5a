"""torch.distributed-style collectives on Tensors (hpcfsdp.distributed): process groups, all_reduce, all_gather,
reduce_scatter_tensor, broadcast, the object collectives, bad input, the default group's lifecycle, and the
backend and launcher queries."""
import datetime
import os

import numpy as np
import pytest

import hpcfsdp.distributed as dist
from _c10d_util import DTYPES, OPS, T, close, data, reduced
from hpcfsdp._tensor import Tensor
from hpcfsdp.distributed import _c10d_groups
from hpcfsdp.distributed import distributed_c10d as c10d


def _groups():
    """The default group and, collectively, a sub-group of world ranks {0, last} (others: non-member)."""
    n = dist.get_world_size()
    sub = dist.new_group([0, n - 1])
    return [None, sub]


@pytest.mark.mpi(min_size=2)
def test_all_reduce_all_ops_dtypes_groups():
    for g in _groups():
        if g is dist.GroupMember.NON_GROUP_MEMBER:
            assert dist.get_rank(g) == -1
            continue
        ranks = dist.get_process_group_ranks(g if g is not None else dist.group.WORLD)
        me = dist.get_rank()
        for async_op in (False, True):
            for dt in DTYPES:
                for op in OPS:
                    for shape in [(0,), (1,), (3, 5)]:
                        t = T(data(me, shape, dt, 1))
                        w = dist.all_reduce(t, op=op, group=g, async_op=async_op)
                        if async_op:
                            w.wait()
                        ref = reduced(op, [data(r, shape, dt, 1) for r in ranks])
                        assert close(t._data, ref, dt, len(ranks)), (g, dt, op, shape)


@pytest.mark.mpi(min_size=2)
def test_all_gather_into_tensor_reduce_scatter_tensor_all_gather():
    n, me = dist.get_world_size(), dist.get_rank()
    for dt in DTYPES:
        for rows in (0, 1, 3):
            x = T(data(me, (rows, 2), dt, 2))
            full = np.concatenate([data(r, (rows, 2), dt, 2) for r in range(n)])
            cat = T(np.zeros((n * rows, 2), dt))
            dist.all_gather_into_tensor(cat, x)
            assert np.array_equal(cat._data.view(np.uint8), full.view(np.uint8))
            stacked = T(np.zeros((n, rows, 2), dt))
            dist.all_gather_into_tensor(stacked, x, async_op=True).wait()
            assert np.array_equal(stacked._data.reshape(-1, 2).view(np.uint8), full.view(np.uint8))
            outs = [T(np.zeros((rows, 2), dt)) for _ in range(n)]
            w = dist.all_gather(outs, x, async_op=True)
            w.wait()
            for r in range(n):
                assert np.array_equal(outs[r]._data.view(np.uint8), data(r, (rows, 2), dt, 2).view(np.uint8))
            for op in OPS:
                inp = T(data(me, (n * rows, 2), dt, 3))
                out = T(np.zeros((rows, 2), dt))
                dist.reduce_scatter_tensor(out, inp, op=op)
                ref = reduced(op, [data(r, (n * rows, 2), dt, 3) for r in range(n)])[me * rows:(me + 1) * rows]
                assert close(out._data, ref, dt, n), (dt, op, rows)


@pytest.mark.mpi(min_size=2)
def test_broadcast_objects_barrier_and_subgroup_ranks():
    n, me = dist.get_world_size(), dist.get_rank()
    for src in range(n):
        t = T(data(me, (4,), np.float32, 4))
        dist.broadcast(t, src=src)
        assert np.array_equal(t._data, data(src, (4,), np.float32, 4))
    sub = dist.new_group([n - 1, 0])  # order does not matter: ranks are sorted
    if me in (0, n - 1):
        assert dist.get_world_size(sub) == 2 and dist.get_rank(sub) == (0 if me == 0 else 1)
        assert dist.get_process_group_ranks(sub) == [0, n - 1]
        assert dist.get_global_rank(sub, 1) == n - 1 and dist.get_group_rank(sub, n - 1) == 1
        t = T(np.full(3, float(me)))
        dist.broadcast(t, src=n - 1, group=sub)  # src is a global rank
        assert np.all(t._data == n - 1)
        t2 = T(np.full(3, float(me)))
        dist.broadcast(t2, group=sub, group_src=0)
        assert np.all(t2._data == 0)
        with pytest.raises(ValueError, match=f"src={n} is not a rank of .*ranks: \\[0, {n - 1}\\]"):
            dist.broadcast(t, src=n, group=sub)
        with pytest.raises(ValueError, match="group_src=2: outside the group"):
            dist.broadcast(t, group=sub, group_src=2)
    else:
        assert sub is dist.GroupMember.NON_GROUP_MEMBER
        assert dist.get_world_size(sub) == -1
        with pytest.raises(ValueError, match="not a member"):
            dist.all_reduce(T(np.ones(1)), group=sub)
    objs = [None] * n
    dist.all_gather_object(objs, {"r": me, "tup": (me, "x")})
    assert objs == [{"r": r, "tup": (r, "x")} for r in range(n)]
    lst = [1, "a", (2, 3)] if me == 0 else [None, None, None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == [1, "a", (2, 3)]
    assert dist.barrier() is None
    assert dist.barrier(async_op=True).wait()


@pytest.mark.mpi(min_size=2)
def test_bad_input_errors():
    n = dist.get_world_size()
    with pytest.raises(ValueError, match=f"output has {3 * n + 1} elements, expected input size 3 x group size {n}"):
        dist.all_gather_into_tensor(T(np.zeros(3 * n + 1, np.float32)), T(np.zeros(3, np.float32)))
    with pytest.raises(TypeError, match="output dtype float64 != input dtype float32"):
        dist.all_gather_into_tensor(T(np.zeros(3 * n)), T(np.zeros(3, np.float32)))
    with pytest.raises(ValueError, match="input has 7 elements, expected output size 2"):
        dist.reduce_scatter_tensor(T(np.zeros(2)), T(np.zeros(7)))
    with pytest.raises(TypeError, match="expected a hpcfsdp Tensor, got numpy.ndarray"):
        dist.all_reduce(np.zeros(2))
    with pytest.raises(ValueError, match="contiguous"):
        dist.all_reduce(Tensor._wrap(np.zeros((3, 4))[:, 1]))
    with pytest.raises(ValueError, match=f"rank {n} is outside the world of {n} ranks"):
        dist.new_group([0, n])
    with pytest.raises(ValueError, match=f"src={n} is not a rank of"):
        dist.broadcast(T(np.zeros(1)), src=n)
    with pytest.raises(ValueError, match=f"tensor_list has 1 entries, expected the group size {n}"):
        dist.all_gather([T(np.zeros(1))], T(np.zeros(1)))
    with pytest.raises(ValueError, match="tensor_list\\[0\\] is float32"):
        dist.all_gather([T(np.zeros(1, np.float32))] * n, T(np.zeros(1)))
    with pytest.raises(ValueError, match="object_list has 0 entries"):
        dist.all_gather_object([], 1)


def test_default_group_lifecycle_and_init_checks():
    dist.destroy_process_group()
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="backend='tcp'"):
        dist.init_process_group("tcp")
    with pytest.raises(ValueError, match="world_size=5 but the MPI communicator has 1"):
        dist.init_process_group("mpi", world_size=5)
    from mpi4py import MPI

    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=30), comm=MPI.COMM_SELF)
    assert dist.is_initialized() and dist.get_world_size() == 1 and dist.get_rank() == 0
    from hpcfsdp.distributed.process_group import comm_timeout

    assert comm_timeout() == 30.0
    with pytest.raises(RuntimeError, match="twice"):
        dist.init_process_group()
    assert dist.group.WORLD is _c10d_groups.default_group() and dist.get_backend() == "nccl"  # the name given
    assert dist.get_backend(dist.new_group([0])) == "nccl"  # inherited, as PyTorch
    assert dist.get_backend(dist.new_group([0], backend="GLOO")) == "gloo"
    with pytest.raises(ValueError, match="backend='tcp'"):
        dist.new_group([0], backend="tcp")
    t = T(np.arange(4.0))
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    assert np.array_equal(t._data, np.arange(4.0))
    dist.destroy_process_group()
    assert comm_timeout() == float(os.environ.get("HPCFSDP_COMM_TIMEOUT", "600"))  # back to the environment
    assert dist.get_world_size() == 1  # re-initialised lazily on first use


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



def test_distributed_c10d_holds_exactly_its_parts():
    """distributed_c10d (PyTorch's path) re-exports every public name of its parts, and hpcfsdp.distributed all of
    them; the parts import only lower layers (tests/test_layering.py: no cycle back into distributed_c10d)."""
    from hpcfsdp.distributed import (_c10d_backends, _c10d_collectives, _c10d_groups, _c10d_objects, _c10d_p2p,
                                     _c10d_rooted)

    parts = (_c10d_groups, _c10d_collectives, _c10d_rooted, _c10d_p2p, _c10d_objects, _c10d_backends)
    names = [n for part in parts for n in part.__all__]
    assert sorted(names) == sorted(c10d.__all__) and len(set(names)) == len(names)
    for part in parts:
        for name in part.__all__:
            assert getattr(c10d, name) is getattr(part, name) is getattr(dist, name) and name in dist.__all__, name
