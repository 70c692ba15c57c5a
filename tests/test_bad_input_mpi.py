"""Misuse across ranks (MPI counterparts of test_bad_input.py, at 2 and 4 ranks): every rank raises the same
clear error and none hangs; HPCFSDP_DEBUG=1 catches ranks that disagree on a collective and names the first."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from _c10d_util import all_raise

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp import nn
from hpcfsdp.distributed import _buffers as B
from hpcfsdp.distributed import _failure as F
from hpcfsdp.distributed.fsdp import FSDP, ShardingStrategy
from hpcfsdp.distributed.fsdp.wrap import ModuleWrapPolicy
from hpcfsdp.distributed.process_group import ProcessGroup, ReduceOp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _debug_group(monkeypatch):
    from mpi4py import MPI

    monkeypatch.setenv("HPCFSDP_DEBUG", "1")
    pg = ProcessGroup(MPI.COMM_WORLD, name="dbg")
    assert pg._debug and pg._check_comm is not None
    return pg


@pytest.mark.mpi(min_size=2)
def test_new_group_with_ranks_outside_the_world():
    n = dist.get_world_size()
    assert all_raise(lambda: dist.new_group([0, n]), ValueError, f"new_group: rank {n} is outside the world of {n} ranks")
    assert all_raise(lambda: dist.new_group([0, 0]), ValueError, "contain duplicates")
    g = dist.new_group([0, n - 1])  # still consistent afterwards
    if dist.get_rank() in (0, n - 1):
        t = hp.ones(2)
        dist.all_reduce(t, group=g)
        assert np.all(t.numpy() == 2)


@pytest.mark.mpi(min_size=2)
def test_mesh_shape_not_matching_world_size():
    n = dist.get_world_size()
    assert all_raise(lambda: dist.init_device_mesh("cpu", (n + 1,)), ValueError,
               f"mesh_shape=({n + 1},) has {n + 1} ranks but the world size is {n}")
    assert all_raise(lambda: dist.init_device_mesh("cpu", (2, n)), ValueError, f"has {2 * n} ranks but the world size is {n}")


@pytest.mark.mpi(min_size=4)
def test_hsdp_mesh_crossing_nodes(monkeypatch):
    # Two simulated nodes of 2 ranks: a shard dimension of 4 ranks would span both.
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", "2")
    n = dist.get_world_size()
    assert all_raise(lambda: dist.init_device_mesh("cpu", (n // 4, 4), mesh_dim_names=("replicate", "shard"),
                                             node_local_dim="shard"),
               ValueError, "mesh dimension 'shard' (size 4) would span nodes [0, 1]")
    mesh = dist.init_device_mesh("cpu", (n // 4, 4), mesh_dim_names=("replicate", "shard"))  # no check asked
    assert all_raise(lambda: FSDP(nn.Sequential(nn.Linear(2, 2)), sharding_strategy=ShardingStrategy.HYBRID_SHARD,
                            device_mesh=mesh), ValueError, "would span nodes")
    # ranks-per-node that does not tile the world: HYBRID_SHARD without a mesh refuses too
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", "3")
    assert all_raise(lambda: FSDP(nn.Sequential(nn.Linear(2, 2)), sharding_strategy=ShardingStrategy.HYBRID_SHARD,
                            auto_wrap_policy=ModuleWrapPolicy({nn.Linear})),
               ValueError, "HYBRID_SHARD needs the same number of ranks on every node")
    # without a group, a mesh or a policy: PyTorch's refusal of hand-wrapped hybrid instances
    assert all_raise(lambda: FSDP(nn.Sequential(nn.Linear(2, 2)), sharding_strategy=ShardingStrategy.HYBRID_SHARD),
               ValueError, "Manual wrapping with ShardingStrategy.HYBRID_SHARD requires explicit specification")


@pytest.mark.mpi(min_size=2)
def test_debug_mode_names_the_first_rank_that_differs(monkeypatch):
    pg = _debug_group(monkeypatch)
    n, r = pg.size(), pg.rank()
    # different element counts on rank 1: every rank raises the same error before the data collective
    a = np.ones(8 if r != 1 else 16, np.float32)
    msg = all_raise(lambda: pg.all_reduce_(a, ReduceOp.SUM, async_op=True).wait(), RuntimeError,
                     "group rank 1 (world rank 1) is the first rank whose call differs")
    assert "it calls #1 all_reduce(count=16, dtype=float32, op=SUM), but group rank 0 (world rank 0) calls " \
           "#1 all_reduce(count=8, dtype=float32, op=SUM)" in msg
    assert np.all(a == 1)  # the data collective never ran
    # dtype differs on the last rank
    b = np.ones(4, np.float32 if r != n - 1 else np.float64)
    msg = all_raise(lambda: pg.all_reduce_(b), RuntimeError, f"group rank {n - 1} (world rank {n - 1}) is the first")
    assert "dtype=float64" in msg and "dtype=float32" in msg
    # different kinds of collective
    c = np.ones(4, np.float32)
    call = (lambda: pg.broadcast_(c, src=0)) if r == 1 else (lambda: pg.all_reduce_(c))
    msg = all_raise(call, RuntimeError, "it calls #3 broadcast(count=4, dtype=float32, src=0)")
    # different ops and different roots
    msg = all_raise(lambda: pg.all_reduce_(c, ReduceOp.MAX if r else ReduceOp.SUM), RuntimeError, "op=MAX")
    msg = all_raise(lambda: pg.broadcast_(c, src=min(r, 1)), RuntimeError, "src=1")
    # objects: only the kind is compared (sizes legitimately differ)
    out = np.empty(4 * n, np.float32)
    call = (lambda: pg.all_gather_object(r)) if r == 0 else (lambda: pg.all_gather_into(out, c))
    msg = all_raise(call, RuntimeError, "calls #6 all_gather_object()")
    # and the group still works: the same calls pass the check and give the right values
    d = np.full(3, r, np.float64)
    pg.all_reduce_(d)
    assert np.all(d == sum(range(n)))
    assert pg.all_gather_object({"r": r}) == [{"r": q} for q in range(n)]
    assert pg.broadcast_object("x" * (r + 1), src=n - 1) == "x" * n
    pg.all_gather_into(out, np.full(4, r, np.float32), async_op=True).wait()
    assert np.array_equal(out, np.repeat(np.arange(n, dtype=np.float32), 4))
    pg.barrier()
    sub = pg.split(r % 2)
    assert sub.size() == len(range(r % 2, n, 2)) and sub._debug
    pg.destroy()


@pytest.mark.mpi(min_size=2)
def test_debug_mode_is_off_by_default_and_costs_no_communicator(monkeypatch):
    from mpi4py import MPI

    monkeypatch.delenv("HPCFSDP_DEBUG", raising=False)
    pg = ProcessGroup(MPI.COMM_WORLD)
    assert not pg._debug and pg._check_comm is None
    pg.destroy()


@pytest.mark.mpi(min_size=2)
def test_watchdog_peer_report_names_missing_and_elsewhere_ranks():
    # Drive the watchdog's report directly (no abort): every rank reports "stuck in #seq"; rank 1 claims another
    # collective number, so the collectors (group ranks 0 and 1) must name it; with 4 ranks, rank 3 stays silent.
    from mpi4py import MPI

    from hpcfsdp.distributed._failure import CollectiveRecord

    pg = ProcessGroup(MPI.COMM_WORLD, name="wd")
    n, r = pg.size(), pg.rank()
    pg.barrier()
    silent = 3 if n >= 4 else None
    seq = 7 if r != 1 else 8
    meta = CollectiveRecord(seq, "all_reduce", 4, "float32", "SUM", -1, pg)
    if r != silent:
        report, linger = F.peer_report(meta, 1.0, 9.0)
    pg.barrier()
    if r > 1 and r != silent:
        assert (report, linger) == ("", 9.0)
    elif r == 0:
        assert linger == 0.0
        assert ("group rank 1 (world rank 1) is stuck in #8 all_reduce of this group instead (all_reduce of 4 "
                "float32 (op=SUM))") in report
        if silent is not None:
            assert "computing elsewhere): 3 (world rank 3)" in report
    elif r == 1:
        assert "group rank 0 (world rank 0) is stuck in #7 all_reduce of this group instead" in report
    _drain_watchdog_reports(pg)


def _drain_watchdog_reports(pg):
    from mpi4py import MPI

    st = MPI.Status()
    while pg.comm.Iprobe(MPI.ANY_SOURCE, F.WATCHDOG_TAG, st):  # nothing should be left; never leave it behind
        pg.comm.Recv([np.empty(st.Get_count(MPI.BYTE), np.uint8), MPI.BYTE], st.Get_source(), F.WATCHDOG_TAG)
    pg.barrier()
    pg.destroy()


@pytest.mark.mpi(min_size=2)
def test_watchdog_peer_report_compares_kind_size_dtype_and_op():
    # Every rank is stuck at #5, but rank 1 in a different call: not "an MPI-level hang", the ranks disagree.
    from mpi4py import MPI

    from hpcfsdp.distributed._failure import CollectiveRecord

    pg = ProcessGroup(MPI.COMM_WORLD, name="wd2")
    n, r = pg.size(), pg.rank()
    pg.barrier()
    if r == 1:
        meta = CollectiveRecord(5, "all_gather", 4096, np.dtype(np.float32), "", -1, pg)
    else:
        meta = CollectiveRecord(5, "reduce_scatter", 8192, np.dtype(np.float32), "AVG", -1, pg)
    report, linger = F.peer_report(meta, 1.0, 9.0)
    pg.barrier()
    if r == 0:
        assert ("group rank 1 (world rank 1) waits in all_gather of 4096 float32 while group rank 0 (world rank 0) "
                "waits in reduce_scatter of 8192 float32 (op=AVG), both #5 of this group: the ranks issued "
                "different collectives") in report, report
        assert "MPI-level hang" not in report and "not waiting" not in report, report
    elif r == 1:
        for q in range(n):
            if q != 1:
                assert (f"group rank {q} (world rank {q}) waits in reduce_scatter of 8192 float32 (op=AVG) while "
                        f"group rank 1 (world rank 1) waits in all_gather of 4096 float32") in report, report
    else:
        assert (report, linger) == ("", 9.0)
    _drain_watchdog_reports(pg)


@pytest.mark.mpi(min_size=2)
def test_watchdog_peer_report_same_call_everywhere_is_an_mpi_level_hang():
    from mpi4py import MPI

    from hpcfsdp.distributed._failure import CollectiveRecord

    pg = ProcessGroup(MPI.COMM_WORLD, name="wd3")
    pg.barrier()
    meta = CollectiveRecord(2, "all_reduce", 1, np.dtype(np.float64), "SUM", -1, pg)
    report, _ = F.peer_report(meta, 1.0, 9.0)
    pg.barrier()
    if pg.rank() <= 1:
        assert report == ("\n  every rank of the group reports waiting on #2 all_reduce of 1 float64 (op=SUM) "
                          "(the same call everywhere: an MPI-level hang)"), report
    _drain_watchdog_reports(pg)


# -- serial: jobs that abort ------------------------------------------------------------------------------------

MISMATCH_JOB = """
import sys
import numpy as np
import hpcfsdp as hp
import hpcfsdp.distributed as dist
t = hp.ones(1024 if dist.get_rank() != 2 else 1000)
dist.all_reduce(t)
print("UNREACHABLE", flush=True)
"""


def test_debug_mode_mismatched_sizes_abort_the_job():
    env = dict(os.environ, HPCFSDP_DEBUG="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=ROOT)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "launch", "-n", "4", "--timeout", "60", "--",
                        "python", "-c", MISMATCH_JOB], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)
    out = p.stdout + p.stderr
    assert p.returncode not in (0, 124) and time.monotonic() - t0 < 30, out
    assert "UNREACHABLE" not in out
    assert "is aborting the job (MPI_Abort)" in out
    assert ("HPCFSDP_DEBUG: ranks disagree on the collective issued on group 'default' (size 4, world ranks "
            "[0, 1, 2, 3]): group rank 2 (world rank 2) is the first rank whose call differs: it calls #1 all_reduce("
            "count=1000, dtype=float32, op=SUM), but group rank 0 (world rank 0) calls #1 all_reduce(count=1024, "
            "dtype=float32, op=SUM)") in out


def test_fingerprints_are_deterministic_and_compare_fields():
    a = B.fingerprint(3, "all_reduce", 10, "float32", "SUM")
    assert a.dtype == np.int64 and a.shape == (B.FP_LEN,)
    assert np.array_equal(a, B.fingerprint(3, "all_reduce", 10, "float32", "SUM"))
    assert B.describe_fingerprint(a) == "#3 all_reduce(count=10, dtype=float32, op=SUM)"
    rows = np.stack([a, a, a])
    assert B.fingerprint_mismatch(rows, (0, 1, 2)) is None
    rows[2] = B.fingerprint(3, "all_reduce", 11, "float32", "SUM")
    rows[1] = B.fingerprint(3, "all_reduce", 12, "float32", "SUM")
    msg = B.fingerprint_mismatch(rows, (4, 5, 6))
    assert msg.startswith("group rank 1 (world rank 5) is the first rank whose call differs: it calls "
                          "#3 all_reduce(count=12, dtype=float32, op=SUM), but group rank 0 (world rank 4)")
    assert "(2 ranks differ: group ranks [1, 2])" in msg
    # dtypes outside the table differ only in the hash
    x, y = B.fingerprint(1, "broadcast", 4, "float8_e4m3", root=0), B.fingerprint(1, "broadcast", 4, "float8_e5m2",
                                                                                root=0)
    assert x[4] == y[4] == -1 and x[0] != y[0]
    assert "same fields, different hash" in B.fingerprint_mismatch(np.stack([x, y]), (0, 1))
