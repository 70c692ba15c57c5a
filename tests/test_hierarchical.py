"""Node-aware (hierarchical) all-gather and reduce-scatter: same layout and results as the flat ones."""
import ml_dtypes
import numpy as np
import pytest

from hpcfsdp.distributed.process_group import ProcessGroup, ReduceOp

DTYPES = [np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.int64)]
SIZES = [0, 1, 7, 33]


@pytest.fixture(autouse=True)
def _mpi_started():
    """Start hpcfsdp's MPI before a test simulates nodes (its rank variables are checked at start)."""
    from hpcfsdp.distributed._mpi import get_mpi

    get_mpi()


def _pair(monkeypatch, key=None):
    """(hierarchical group, flat group) over the world with nodes of 2 ranks; ``key`` reorders ranks."""
    from mpi4py import MPI

    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", "2")
    world = MPI.COMM_WORLD
    comm = world.Split(0, world.Get_rank() if key is None else key(world.Get_rank(), world.Get_size()))
    monkeypatch.setenv("HPCFSDP_COMM_HIERARCHY", "auto")
    hier = ProcessGroup(comm, name="hier")
    monkeypatch.setenv("HPCFSDP_COMM_HIERARCHY", "flat")
    flat = ProcessGroup(comm, name="flat")
    comm.Free()
    assert hier.hierarchical and not flat.hierarchical
    assert hier.world_ranks == flat.world_ranks
    return hier, flat


def _interleaved(rank, n):
    """Group rank order that alternates nodes (world 0, 2, 1, 3 at 4 ranks): not node-major."""
    return (rank % 2) * (n // 2) + rank // 2


def _data(world_rank, size, dtype, salt, integral):
    rng = np.random.default_rng(100 * world_rank + 7 * size + salt)
    if dtype.kind == "i" or integral:  # integer values: every summation order gives the exact sum
        return rng.integers(-8, 9, size).astype(dtype)
    return (rng.standard_normal(size) * 2).astype(dtype)


@pytest.mark.mpi(min_size=4)
@pytest.mark.timeout(240)
@pytest.mark.parametrize("order", [None, _interleaved], ids=["node_major", "interleaved"])
def test_all_gather_bitwise_equals_flat(monkeypatch, order):
    hier, flat = _pair(monkeypatch, order)
    n, r = hier.size(), hier.rank()
    for async_op in (False, True):
        for dt in DTYPES:
            for k in SIZES:
                ins = [_data(w, k, dt, 1, False) for w in hier.world_ranks]
                got = np.full(k * n, 3, dt)
                ref = np.full(k * n, 5, dt)
                w = hier.all_gather_into(got, ins[r], async_op=async_op)
                if async_op:
                    w.wait()
                flat.all_gather_into(ref, ins[r])
                assert np.array_equal(got.view(np.uint8), ref.view(np.uint8)), (dt, k, async_op)
                assert np.array_equal(got.view(np.uint8), np.concatenate(ins).view(np.uint8))
    # in place: the input is this rank's slot of the output
    ins = [_data(w, 12, DTYPES[0], 2, False) for w in hier.world_ranks]
    out = np.zeros((n, 12), np.float32)
    out[r] = ins[r]
    hier.all_gather_into(out, out[r])
    assert np.array_equal(out, np.stack(ins))
    hier.destroy()
    flat.destroy()


@pytest.mark.mpi(min_size=4)
@pytest.mark.timeout(240)
@pytest.mark.parametrize("order", [None, _interleaved], ids=["node_major", "interleaved"])
def test_reduce_scatter_equals_flat(monkeypatch, order):
    hier, flat = _pair(monkeypatch, order)
    n, r = hier.size(), hier.rank()
    for dt in DTYPES:
        for op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX):
            for k in SIZES:
                # integral data: bit for bit against the flat collective (exact sums in any order)
                ins = [_data(w, k * n, dt, 3, True) for w in hier.world_ranks]
                got = np.full(k, 3, dt)
                ref = np.full(k, 5, dt)
                hier.reduce_scatter_into(got, ins[r], op)
                flat.reduce_scatter_into(ref, ins[r], op)
                assert np.array_equal(got.view(np.uint8), ref.view(np.uint8)), (dt, op, k)
                acc = np.stack([a.astype(np.float64) for a in ins])
                exp = {ReduceOp.SUM: acc.sum(0), ReduceOp.MAX: acc.max(0),
                       ReduceOp.AVG: (acc.sum(0) // n) if dt.kind == "i" else acc.sum(0) / n}[op]
                assert np.array_equal(got, exp[r * k:(r + 1) * k].astype(dt)), (dt, op, k)
                # random data: the float64 reference within the dtype's rounding
                if dt.kind == "f" or dt.name == "bfloat16":
                    ins = [_data(w, k * n, dt, 4, False) for w in hier.world_ranks]
                    hier.reduce_scatter_into(got, ins[r], op)
                    acc = np.stack([a.astype(np.float64) for a in ins])
                    exp = {ReduceOp.SUM: acc.sum(0), ReduceOp.MAX: acc.max(0), ReduceOp.AVG: acc.sum(0) / n}[op]
                    tol = {2: 2e-2, 4: 1e-5}[dt.itemsize]
                    e = exp[r * k:(r + 1) * k]
                    assert np.all(np.abs(got.astype(np.float64) - e) <= tol * n * np.maximum(np.abs(e), 1)), (dt, op)
    hier.destroy()
    flat.destroy()


@pytest.mark.mpi(min_size=4)
@pytest.mark.timeout(240)
def test_async_mix_keeps_issue_order(monkeypatch):
    """Hierarchical and flat, async and blocking calls interleaved: each lands where issued."""
    hier, flat = _pair(monkeypatch)
    n, r = hier.size(), hier.rank()
    k = 1000
    works, checks = [], []
    for i in range(12):
        ins = [np.full(k, 10 * i + w, np.float32) for w in hier.world_ranks]
        out = np.empty(k * n, np.float32)
        pg = hier if i % 2 == 0 else flat
        if i % 3 == 2:
            red = np.empty(k, np.float32)
            pg.reduce_scatter_into(red, np.concatenate(ins), ReduceOp.SUM)  # blocking between async ones
            assert np.all(red == n * (10 * i + hier.world_ranks[r]))  # every rank sent the same blocks
        works.append(pg.all_gather_into(out, ins[r], async_op=True))
        checks.append((out, np.concatenate(ins)))
    for w, (out, exp) in zip(works, checks):
        w.wait()
        assert np.array_equal(out, exp)
    hier.destroy()
    flat.destroy()


@pytest.mark.mpi(min_size=4)
@pytest.mark.timeout(120)
def test_automatic_choice(monkeypatch):
    from mpi4py import MPI

    w = MPI.COMM_WORLD
    n = w.Get_size()

    def make(rpn, mode):
        if rpn is None:
            monkeypatch.delenv("HPCFSDP_RANKS_PER_NODE", raising=False)
        else:
            monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", str(rpn))
        monkeypatch.setenv("HPCFSDP_COMM_HIERARCHY", mode)
        pg = ProcessGroup(w)
        got = pg.hierarchical
        pg.destroy()
        return got

    assert make(2, "auto") is True  # 2+ nodes of 2 ranks
    assert make(2, "flat") is False
    assert make(1, "auto") is False  # one rank per node: nothing to gain
    assert make(1, "hierarchical") is True
    assert make(n, "hierarchical") is False  # one node
    if n % 3:
        assert make(3, "hierarchical") is False  # nodes of unequal size: flat
    monkeypatch.setenv("HPCFSDP_COMM_HIERARCHY", "nodes")
    with pytest.raises(ValueError, match="HPCFSDP_COMM_HIERARCHY"):
        ProcessGroup(w)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_one_rank_per_node_forced_matches_numpy(monkeypatch):
    """At one rank per node the hierarchical path is cross-node only; still the flat layout."""
    from mpi4py import MPI

    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", "1")
    monkeypatch.setenv("HPCFSDP_COMM_HIERARCHY", "hierarchical")
    pg = ProcessGroup(MPI.COMM_WORLD)
    assert pg.hierarchical
    n, r = pg.size(), pg.rank()
    ins = [np.arange(5, dtype=np.float32) + 100 * w for w in range(n)]
    out = np.empty(5 * n, np.float32)
    pg.all_gather_into(out, ins[r])
    assert np.array_equal(out, np.concatenate(ins))
    red = np.empty(5, np.float32)
    full = np.arange(5 * n, dtype=np.float32) * (r + 1)
    pg.reduce_scatter_into(red, full, ReduceOp.AVG)
    exp = np.arange(5 * n, dtype=np.float64) * sum(range(1, n + 1)) / n
    assert np.allclose(red, exp[r * 5:(r + 1) * 5])
    pg.destroy()


@pytest.mark.mpi(min_size=4)
@pytest.mark.timeout(240)
@pytest.mark.parametrize("order", [None, _interleaved], ids=["node_major", "interleaved"])
def test_staged_in_flight_match_numpy(monkeypatch, order):
    """Collectives left in flight (issued inside independent()): node-aware and flat all-gathers and
    reduce-scatters, and all-reduces over a cross-node subgroup started after the reduce-scatter whose
    output they read, all outstanding at once, every result equal to NumPy's; a dependent collective
    issued outside independent() on an in-flight buffer sees it finished."""
    from mpi4py import MPI

    from hpcfsdp.distributed import _comm_thread as CT

    staged = []

    class Counted(CT.Staged):
        def __init__(self, resources, gen):
            staged.append(list(resources))
            super().__init__(resources, gen)

    monkeypatch.setattr(CT, "Staged", Counted)
    monkeypatch.setenv("HPCFSDP_COMM_STAGED", "1")
    hier, flat = _pair(monkeypatch, order)
    n, r = hier.size(), hier.rank()
    monkeypatch.setenv("HPCFSDP_COMM_HIERARCHY", "auto")
    # ranks with the same index on each simulated node (the HSDP replicate group), and one node's ranks
    w = MPI.COMM_WORLD.Get_rank()
    rep = ProcessGroup(MPI.COMM_WORLD.Split(w % 2, w), dup=False, name="rep")
    shard = ProcessGroup(MPI.COMM_WORLD.Split(w // 2, w), dup=False, name="shard")
    assert rep._link == "inter" and shard._link == "intra"
    k = 4099
    pending = []
    for i in range(6):
        pg = hier if i % 2 == 0 else flat
        ins = [_data(wr, k, np.dtype(np.float32), i, True) for wr in pg.world_ranks]
        out = np.full(k * n, -1, np.float32)
        full = [_data(wr, k * n, np.dtype(np.float32), 50 + i, True) for wr in pg.world_ranks]
        red = np.full(k, -1, np.float32)
        sfull = [_data(wr, k * shard.size(), np.dtype(np.float32), 90 + i, True) for wr in shard.world_ranks]
        sred = np.full(k, -1, np.float32)
        with CT.independent():
            ag = pg.all_gather_into(out, ins[r], async_op=True)
            rs = pg.reduce_scatter_into(red, full[r], ReduceOp.SUM, async_op=True)
            srs = shard.reduce_scatter_into(sred, sfull[shard.rank()], ReduceOp.AVG, async_op=True)
        with CT.independent(after=srs):
            ar = rep.all_reduce_(sred, ReduceOp.SUM, async_op=True)
        pending.append((ag, out, np.concatenate(ins)))
        pending.append((rs, red, np.sum(full, axis=0)[r * k:(r + 1) * k]))
        # the shard-group average of this node, summed over the nodes: every rank's data, averaged per node
        node_avg = {}
        for wr in range(MPI.COMM_WORLD.Get_size()):
            d = _data(wr, k * 2, np.dtype(np.float32), 90 + i, True).astype(np.float64)
            node_avg.setdefault(wr // 2, []).append(d)
        exp = sum(np.mean(v, axis=0) for v in node_avg.values())
        pending.append((ar, sred, exp[shard.rank() * k:(shard.rank() + 1) * k]))
    assert CT.COMM_THREAD is not None
    # outside independent(): waits for everything in flight before it reads the last all-reduce's buffer
    last = pending[-1][1]
    rep.all_reduce_(last, ReduceOp.SUM)
    pending[-1] = (pending[-1][0], last, pending[-1][2] * rep.size())
    for work, got, exp in pending:
        work.wait()
        np.testing.assert_allclose(got, exp, rtol=1e-6)
    # every collective issued inside independent() ran staged, with the stages of its path
    # (the shard group's reduce-scatter lies inside a node: not staged, a blocking call on the thread)
    assert staged == [["inter", "intra"], ["intra", "inter"], ["inter"], ["inter"], ["inter"], ["inter"]] * 3
    for pg in (hier, flat, rep, shard):
        pg.destroy()


@pytest.mark.mpi(min_size=4)
@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy", ["FULL_SHARD", "HYBRID_SHARD"])
def test_fsdp_staged_matches_unsharded_reference(monkeypatch, strategy):
    """FSDP training with HPCFSDP_COMM_STAGED=1 across 2 simulated nodes (node-aware all-gathers and
    reduce-scatters, HSDP's all-reduces left in flight) follows the unsharded model step for step."""
    import hpcfsdp as hp
    from hpcfsdp.distributed import _comm_thread as CT
    from hpcfsdp.distributed.fsdp import FSDP, ShardingStrategy
    from hpcfsdp.distributed.fsdp.wrap import ModuleWrapPolicy
    from hpcfsdp.models.gpt import Block

    from _fsdp_util import full, global_mean, gpt_batches, local, tiny_gpt, world

    staged = []

    class Counted(CT.Staged):
        def __init__(self, resources, gen):
            staged.append(tuple(resources))
            super().__init__(resources, gen)

    monkeypatch.setattr(CT, "Staged", Counted)
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", "2")
    monkeypatch.setenv("HPCFSDP_COMM_STAGED", "1")
    w, _ = world()
    ref = tiny_gpt()
    fsdp = FSDP(tiny_gpt(), sharding_strategy=ShardingStrategy[strategy], auto_wrap_policy=ModuleWrapPolicy({Block}))
    opt = hp.optim.AdamW(fsdp.parameters(), lr=1e-2, weight_decay=0.1)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    for x, y in gpt_batches(6, 4 * w + 1, B_per_rank=2):
        _, loss = fsdp(hp.tensor(local(x)), hp.tensor(local(y)))
        loss.backward()
        opt.step()
        opt.zero_grad()
        _, rl = ref(hp.tensor(x), hp.tensor(y))
        rl.backward()
        ropt.step()
        ropt.zero_grad()
        np.testing.assert_allclose(global_mean(loss.item()), rl.item(), rtol=1e-5, atol=1e-6)
    refp = dict(ref.named_parameters())
    for name, p in fsdp.named_parameters():
        np.testing.assert_allclose(full(p), refp[name].detach().numpy(), atol=2e-5, rtol=2e-4, err_msg=name)
    # FULL_SHARD: node-aware all-gathers and reduce-scatters; HSDP: the cross-node all-reduces
    expect = {("inter", "intra"), ("intra", "inter")} if strategy == "FULL_SHARD" else {("inter",)}
    assert staged and set(staged) == expect
