"""Helpers for the torch.distributed tests (test_distributed_c10d*.py): tensors, per-rank data, reductions in
float64, and checks that every rank raised."""
import ml_dtypes
import numpy as np

import hpcfsdp.distributed as dist
from hpcfsdp._tensor import Tensor

DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16),
          np.dtype(np.int64)]
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT]
BIG = 1 << 20  # float32 elements: 4 MiB, far above any eager-protocol threshold


def T(a):
    return Tensor._wrap(np.ascontiguousarray(a))


def data(rank, shape, dtype, salt=0):
    """Rank ``rank``'s values (seeded by rank and salt): small integers, or normal floats."""
    rng = np.random.default_rng(1000 * rank + salt)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-4, 5, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def reduced(op, arrays):
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


def close(got, want, dt, n):
    """``got`` (of dtype ``dt``) equals the float64 ``want`` of a reduction over ``n`` ranks, to dt's precision."""
    if dt.kind == "i":
        return np.array_equal(got, want)
    tol = 2e-2 if dt.itemsize == 2 else 1e-5
    return bool(np.all(np.abs(got.astype(np.float64) - want) <= tol * n * np.maximum(1, np.abs(want))))


def all_raise(fn, exc, fragment):
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


def wait(w, async_op):
    """A call's result: a Work with ``async_op`` (waited for here), else None."""
    if async_op:
        assert isinstance(w, dist.Work)
        w.wait()
    else:
        assert w is None


def subgroups():
    """(group, its global ranks) for the default group and, collectively, a sub-group: world ranks {1, n-1} at
    4 ranks (group rank 0 is global rank 1), {0, 1} at 2; other ranks skip the sub-group."""
    n = dist.get_world_size()
    ranks = [1, n - 1] if n > 2 else [0, 1]
    sub = dist.new_group(ranks)
    out = [(None, list(range(n)))]
    if sub is not dist.GroupMember.NON_GROUP_MEMBER:
        out.append((sub, ranks))
    return out


def still_works():
    """Nothing was left half-issued: an all_reduce over the world still gives the world size."""
    s = T(np.ones(1))
    dist.all_reduce(s)
    assert s._data[0] == dist.get_world_size()
