"""DeviceMesh / init_device_mesh: layout, groups per dimension, sub-meshes, node checks, errors."""
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import hpcfsdp.distributed as dist
from hpcfsdp.distributed.device_mesh import DeviceMesh, init_device_mesh
from hpcfsdp.distributed.process_group import ReduceOp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mesh_2d():
    n = dist.get_world_size()
    shape = (2, n // 2)
    return init_device_mesh("cpu", shape, mesh_dim_names=("rep", "shard")), shape


@pytest.mark.mpi(min_size=2)
def test_1d_mesh_groups_and_coordinates():
    n, me = dist.get_world_size(), dist.get_rank()
    m = init_device_mesh("cpu", (n,), mesh_dim_names=("dp",))
    assert m.ndim == 1 and m.shape == (n,) and m.size() == n and m.size("dp") == n
    assert m.get_coordinate() == [me] and m.get_local_rank() == me and m.get_rank() == me
    g = m.get_group()
    assert g is m.get_group("dp") is m.get_group(0) and g.size() == n and g.rank() == me
    assert np.array_equal(m.mesh, np.arange(n))
    assert m["dp"].get_group() is g
    assert repr(m) == f"DeviceMesh('cpu', {list(range(n))}, mesh_dim_names=('dp',))"


@pytest.mark.mpi(min_size=2)
def test_2d_mesh_dims_are_row_major_and_collectives_on_both_dims():
    # (2, 1) at 2 ranks, (2, 2) at 4 ranks
    n, me = dist.get_world_size(), dist.get_rank()
    m, shape = _mesh_2d()
    ref = np.arange(n).reshape(shape)
    assert np.array_equal(m.mesh, ref) and m.shape == shape
    i, j = map(int, np.argwhere(ref == me)[0])
    assert m.get_coordinate() == [i, j]
    assert m.get_local_rank("rep") == i and m.get_local_rank("shard") == j
    rep, shard = m.get_group("rep"), m.get_group("shard")
    assert rep.world_ranks == tuple(ref[:, j]) and shard.world_ranks == tuple(ref[i, :])  # shard: consecutive
    for g, members in ((rep, ref[:, j]), (shard, ref[i, :])):
        for dt in (np.float32, np.float16, ml_dtypes.bfloat16, np.int64, np.float64):
            for op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.AVG):
                a = np.full(5, me + 1, dt)
                g.all_reduce_(a, op, async_op=True).wait()
                vals = np.array([r + 1 for r in members], np.float64)
                expect = {ReduceOp.SUM: vals.sum(), ReduceOp.MAX: vals.max(),
                          ReduceOp.AVG: vals.sum() // len(vals) if np.dtype(dt).kind == "i" else vals.mean()}[op]
                assert np.allclose(a.astype(np.float64), expect, rtol=1e-2), (g, dt, op)
            out = np.empty(3 * g.size(), dt)
            g.all_gather_into(out, np.full(3, me, dt))
            assert np.array_equal(out.astype(np.int64), np.repeat(members, 3))
            rs = np.empty(2, dt)
            g.reduce_scatter_into(rs, np.arange(2 * g.size()).astype(dt) * (me + 1))
            k = g.rank()
            assert np.allclose(rs.astype(np.float64), np.arange(2 * k, 2 * k + 2) * sum(r + 1 for r in members),
                               rtol=1e-2)
    # sub-meshes reuse the root's communicators
    sm = m["shard"]
    assert sm.ndim == 1 and sm.get_group() is shard and np.array_equal(sm.mesh, ref[i, :])
    assert sm.get_coordinate() == [j]
    both = m[("shard", "rep")]
    assert both.shape == (shape[1], shape[0]) and np.array_equal(both.mesh, ref.T)
    assert both.get_group("rep") is rep and both.get_coordinate() == [j, i]
    flat = m._flatten()
    assert flat.get_group().size() == n and flat.get_group().rank() == me
    a = np.ones(1)
    flat.get_group().all_reduce_(a)
    assert a[0] == n


@pytest.mark.mpi(min_size=2)
def test_mesh_errors():
    n = dist.get_world_size()
    with pytest.raises(ValueError, match=f"mesh_shape=\\({n + 1},\\) has {n + 1} ranks but the world size is {n}"):
        init_device_mesh("cpu", (n + 1,))
    with pytest.raises(ValueError, match="duplicate names \\['a'\\]"):
        init_device_mesh("cpu", (1, n), mesh_dim_names=("a", "a"))
    with pytest.raises(ValueError, match="has 1 names for a 2-d mesh"):
        init_device_mesh("cpu", (1, n), mesh_dim_names=("a",))
    with pytest.raises(ValueError, match="device_type='tpu'"):
        init_device_mesh("tpu", (n,))
    with pytest.raises(ValueError, match="expected positive integers"):
        init_device_mesh("cpu", (0, n))
    m = init_device_mesh("cpu", (1, n), mesh_dim_names=("a", "b"))
    with pytest.raises(KeyError, match="mesh dimension 'c' not found"):
        m["c"]
    with pytest.raises(KeyError, match="mesh dimension 'c' not found"):
        m.get_group("c")
    with pytest.raises(RuntimeError, match="give mesh_dim"):
        m.get_group()
    with pytest.raises(ValueError, match="ranks must be unique"):
        DeviceMesh("cpu", [0, 0])
    with pytest.raises(ValueError, match="must lie in"):
        DeviceMesh("cpu", [n])


def test_cuda_mesh_without_cupy_is_a_clear_error():
    from hpcfsdp import _backend

    if _backend.cupy_available():
        pytest.fail("this check expects a machine where CuPy sees no GPU")
    with pytest.raises(RuntimeError, match="init_device_mesh.*needs (CuPy.*cuda12|a CUDA GPU: CuPy .* installed)"):
        init_device_mesh("cuda", (dist.get_world_size(),))


NODE_CHECK = """
    import hpcfsdp.distributed as dist
    from hpcfsdp.distributed.device_mesh import init_device_mesh
    n = dist.get_world_size()
    m = init_device_mesh("cpu", (2, 2), mesh_dim_names=("rep", "shard"), node_local_dim="shard")
    print("OK-SHARD", m.get_group("shard").world_ranks, flush=True)
    try:
        init_device_mesh("cpu", (2, 2), mesh_dim_names=("rep", "shard"), node_local_dim="rep")
    except ValueError as e:
        print("ERR", e, flush=True)
"""


def test_node_local_dim_check_with_simulated_nodes():
    env = dict(os.environ, HPCFSDP_RANKS_PER_NODE="2", OPENBLAS_NUM_THREADS="1")
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    p = subprocess.run([mpiexec, "-n", "4", sys.executable, "-c", textwrap.dedent(NODE_CHECK)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("OK-SHARD") == 4
    assert "ERR mesh dimension 'rep' (size 2) would span nodes [0, 1]: its group of ranks [0, 2]" in p.stdout
