"""DTensor, Shard, Replicate, distribute_tensor, full_tensor (FSDP2 chunk semantics), norm reduction."""
import math

import ml_dtypes
import numpy as np
import pytest

import hpcfsdp.distributed as dist
from hpcfsdp._tensor import Tensor
from hpcfsdp.distributed.device_mesh import init_device_mesh
from hpcfsdp.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from hpcfsdp.distributed.tensor._dtensor import _chunk_bounds


def _global(shape, dtype=np.float32, salt=0):
    return np.random.default_rng(salt).standard_normal(shape).astype(dtype)


def _torch_chunk(n, world):
    """torch.chunk's pieces of range(n) into `world` chunks (published semantics), padded with empties."""
    c = math.ceil(n / world) if n else 0
    pieces = [list(range(n))[i:i + c] for i in range(0, n, c)] if c else []
    return pieces + [[]] * (world - len(pieces))


# -- serial ----------------------------------------------------------------------------------------

def test_chunk_bounds_match_torch_chunk():
    for n in range(0, 12):
        for world in range(1, 6):
            for r, piece in enumerate(_torch_chunk(n, world)):
                a, b = _chunk_bounds(n, world, r)
                assert list(range(a, b)) == piece, (n, world, r)
    with pytest.raises(ValueError, match="rank 3 outside 0..2"):
        _chunk_bounds(5, 3, 3)


def test_placements_eq_hash_repr():
    assert Shard(0) == Shard(0) and Shard(0) != Shard(1) and Shard(1) != Replicate()
    assert hash(Shard(2)) == hash(Shard(2)) and len({Replicate(), Replicate(), Shard(0)}) == 2
    assert repr(Shard(1)) == "Shard(dim=1)" and repr(Replicate()) == "Replicate()"
    assert Shard(0).is_shard() and Shard(0).is_shard(0) and not Shard(0).is_shard(1)
    assert Replicate().is_replicate() and not Replicate().is_shard()
    with pytest.raises(TypeError, match="expected an int"):
        Shard("0")


def test_dtensor_on_one_rank():
    m = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
    x = _global((5, 3))
    d = distribute_tensor(Tensor._wrap(x), m, [Shard(0)])
    assert isinstance(d, DTensor) and isinstance(d, Tensor)
    assert d.shape == (5, 3) and d.size() == (5, 3) and d.size(0) == 5 and d.numel() == 15
    assert d.placements == (Shard(0),) and d.device_mesh is m
    assert np.array_equal(d.full_tensor()._data, x)
    loc = d.to_local()
    assert type(loc) is Tensor and loc._data is d._data
    assert "DTensor(local_tensor=" in repr(d) and "Shard(dim=0)" in repr(d)


# -- MPI -------------------------------------------------------------------------------------------

@pytest.mark.mpi(min_size=2)
def test_distribute_and_full_tensor_uneven_shapes_1d():
    n, me = dist.get_world_size(), dist.get_rank()
    m = init_device_mesh("cpu", (n,), mesh_dim_names=("dp",))
    for dt in (np.float32, np.float16, ml_dtypes.bfloat16, np.int64, np.float64):
        for shape in [(0, 3), (1,), (5, 3), (2 * n + 1, 2), (n - 1, 4), (3, 7)]:
            for dim in range(len(shape)):
                x = _global(shape, dt, salt=len(shape) * 10 + dim)
                d = distribute_tensor(Tensor._wrap(x), m, [Shard(dim)])
                a, b = _chunk_bounds(shape[dim], n, me)
                assert np.array_equal(d._data, np.take(x, range(a, b), axis=dim)), (dt, shape, dim)
                assert d.shape == shape
                full = d.full_tensor()
                assert type(full) is Tensor and np.array_equal(full._data.view(np.uint8), x.view(np.uint8))
        r = distribute_tensor(Tensor._wrap(_global((4,), dt)), m, [Replicate()])
        assert np.array_equal(r._data, _global((4,), dt)) and np.array_equal(r.full_tensor()._data, _global((4,), dt))


@pytest.mark.mpi(min_size=2)
def test_distribute_broadcasts_from_src_data_rank():
    n, me = dist.get_world_size(), dist.get_rank()
    m = init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("rep", "shard"))
    x = np.full((7, 2), float(me))  # different on every rank
    # src_data_rank is a group rank on every mesh dim: the rank at coordinate (1, 1) (or (1, 0) when the
    # second dim has size 1) owns the data
    src = int(m.mesh[1, min(1, n // 2 - 1)])
    d = distribute_tensor(Tensor._wrap(x), m, [Replicate(), Shard(0)], src_data_rank=1)
    assert np.all(d.full_tensor()._data == src)
    with pytest.raises(ValueError, match="src_data_rank=2 is a group rank on each mesh dimension"):
        distribute_tensor(Tensor._wrap(x), m, [Replicate(), Shard(0)], src_data_rank=2)


@pytest.mark.mpi(min_size=4)
def test_distribute_on_sub_mesh_uses_group_rank_zero():
    """distribute_tensor(t, mesh["tp"]) on the sub-mesh of ranks [2, 3]: the source is the sub-mesh's
    rank 0 (global rank 2), not global rank 0."""
    n, me = dist.get_world_size(), dist.get_rank()
    m = init_device_mesh("cpu", (n // 2, 2), mesh_dim_names=("dp", "tp"))
    tp = m["tp"]
    x = np.arange(10, dtype=np.float32).reshape(5, 2) + 100 * me  # different on every rank
    d = distribute_tensor(Tensor._wrap(x), tp, [Shard(0)])
    src = int(tp.mesh[0])
    want = np.arange(10, dtype=np.float32).reshape(5, 2) + 100 * src
    a, b = _chunk_bounds(5, 2, tp.get_local_rank(0))
    assert np.array_equal(d._data, want[a:b]) and np.array_equal(d.full_tensor()._data, want)
    r = distribute_tensor(Tensor._wrap(x), tp, [Replicate()], src_data_rank=1)
    assert np.array_equal(r._data, np.arange(10, dtype=np.float32).reshape(5, 2) + 100 * int(tp.mesh[1]))


@pytest.mark.mpi(min_size=2)
def test_2d_mesh_hsdp_and_nested_sharding():
    n = dist.get_world_size()
    shape = (2, n // 2)
    m = init_device_mesh("cpu", shape, mesh_dim_names=("rep", "shard"))
    i, j = m.get_coordinate()
    x = _global((11, 3), salt=5)
    # HSDP: replicated over "rep", sharded over "shard"
    d = distribute_tensor(Tensor._wrap(x), m, [Replicate(), Shard(0)])
    a, b = _chunk_bounds(11, shape[1], j)
    assert np.array_equal(d._data, x[a:b]) and np.array_equal(d.full_tensor()._data, x)
    # the same dim sharded by both mesh dims: nested chunks in mesh-dim order
    d2 = distribute_tensor(Tensor._wrap(x), m, [Shard(0), Shard(0)])
    a0, b0 = _chunk_bounds(11, shape[0], i)
    a1, b1 = _chunk_bounds(b0 - a0, shape[1], j)
    assert np.array_equal(d2._data, x[a0 + a1:a0 + b1])
    assert np.array_equal(d2.full_tensor()._data, x)
    # different dims per mesh dim
    d3 = distribute_tensor(Tensor._wrap(x), m, [Shard(1), Shard(0)])
    c0, c1 = _chunk_bounds(3, shape[0], i)
    assert np.array_equal(d3._data, x[a:b, c0:c1]) and np.array_equal(d3.full_tensor()._data, x)
    # from_local with an explicit global shape (FSDP's padded layout) round-trips
    fl = DTensor.from_local(Tensor._wrap(x[a:b].copy()), m, [Replicate(), Shard(0)], shape=(11, 3),
                            run_check=True)
    assert fl.shape == (11, 3) and np.array_equal(fl.full_tensor()._data, x)


@pytest.mark.mpi(min_size=2)
def test_from_local_even_default_shape_and_run_check_error():
    n, me = dist.get_world_size(), dist.get_rank()
    m = init_device_mesh("cpu", (n,), mesh_dim_names=("dp",))
    loc = Tensor._wrap(np.full((2, 3), float(me)))
    d = DTensor.from_local(loc, m, [Shard(0)])
    assert d.shape == (2 * n, 3) and d._data is loc._data
    assert np.array_equal(d.full_tensor()._data, np.repeat(np.arange(n, dtype=float), 2)[:, None] * np.ones(3))
    bad = Tensor._wrap(np.zeros((3 if me == 0 else 2, 3)))
    with pytest.raises(ValueError, match="rank 0 at mesh coordinate \\[0\\] has local shape \\(3, 3\\), which "
                                         "does not match the piece \\(2, 3\\)"):
        DTensor.from_local(bad, m, [Shard(0)], shape=(2 * n, 3), run_check=True)  # raises on every rank
    with pytest.raises(ValueError, match="placements .* have 2 entries for a 1-d mesh"):
        DTensor.from_local(loc, m, [Shard(0), Shard(0)])
    with pytest.raises(ValueError, match="Shard\\(dim=2\\) is out of range for a 2-d tensor"):
        DTensor.from_local(loc, m, [Shard(2)])


@pytest.mark.mpi(min_size=2)
def test_hp_reduce_norm_sums_over_shard_groups_only():
    n = dist.get_world_size()
    shape = (2, n // 2)
    m = init_device_mesh("cpu", shape, mesh_dim_names=("rep", "shard"))
    x = _global((9, 2), salt=9)
    d = distribute_tensor(Tensor._wrap(x), m, [Replicate(), Shard(0)])
    local2 = float((d._data.astype(np.float64) ** 2).sum())
    total = DTensor.__hp_reduce_norm__([d], local2, 2.0)
    assert np.isclose(total, (x.astype(np.float64) ** 2).sum())
    linf = float(np.abs(d._data).max()) if d._data.size else 0.0
    assert np.isclose(DTensor.__hp_reduce_norm__([d], linf, math.inf), np.abs(x).max())
    other = distribute_tensor(Tensor._wrap(x), m, [Shard(0), Replicate()])  # sharded over the other mesh dim
    # different shardings on one mesh (FSDP over TP): every piece counted once over the whole mesh
    both = DTensor.__hp_reduce_norm__([d, other], float("nan"), 2.0)
    assert np.isclose(both, 2 * (x.astype(np.float64) ** 2).sum())
    assert np.isclose(DTensor.__hp_reduce_norm__([d, other], float("nan"), math.inf), np.abs(x).max())
    m2 = init_device_mesh("cpu", (n,), mesh_dim_names=("dp",))
    elsewhere = distribute_tensor(Tensor._wrap(x), m2, [Shard(0)])
    # another mesh over the same ranks (FSDP1 instances of different strategies): each piece counted once
    apart = DTensor.__hp_reduce_norm__([d, elsewhere], float("nan"), 2.0)
    assert np.isclose(apart, 2 * (x.astype(np.float64) ** 2).sum())


def test_fsdp_layout_uses_the_dtensor_chunking_and_round_trips():
    """FSDP's flat layout puts each rank's DTensor piece (nested over several mesh dims) in front of its padded
    slot; packing a full array rank-major and gathering it back is the identity."""
    from hpcfsdp.distributed.fsdp._fully_shard._fsdp_param import ParamLayout
    from hpcfsdp.distributed.tensor._dtensor import _nested_chunk_bounds

    for rows in range(0, 12):
        for sizes in [(4,), (2, 2), (1, 2), (3, 2)]:
            world = int(np.prod(sizes))
            layouts = [ParamLayout(rows, (3,), world, r, sizes if len(sizes) > 1 else ()) for r in range(world)]
            for r, lay in enumerate(layouts):
                want = _nested_chunk_bounds(rows, sizes, np.unravel_index(r, sizes))
                assert (lay.start, lay.stop) == want, (rows, sizes, r)
                assert lay.padded == max(b - a for a, b in (
                    _nested_chunk_bounds(rows, sizes, np.unravel_index(q, sizes)) for q in range(world)))
            full = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
            lay = layouts[0]
            buf = np.full(world * lay.numel, np.nan, np.float32)
            lay.scatter_into(buf, lay.numel, full)
            assert not np.isnan(buf).any()  # padding is zeroed
            np.testing.assert_array_equal(lay.gathered(buf, lay.numel, np, np.float32), full)
            for r, other in enumerate(layouts):  # each rank's slot starts with exactly its piece
                slot = buf.reshape(world, -1)[r].reshape(lay.padded, 3)
                np.testing.assert_array_equal(slot[:other.stop - other.start], full[other.start:other.stop])
