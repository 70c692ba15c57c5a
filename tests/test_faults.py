"""Fault tests: a 4-rank training job fails on rank 2 in every way we know (tests/_fault_job.py); the job must
end within 30 s with a non-zero exit and a message naming the failing rank, and the checkpoint committed before
the fault must still load (here, at world size 1)."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from hpcfsdp.distributed.checkpoint import _format
from hpcfsdp.distributed.checkpoint._metadata import IncompleteCheckpointError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "tests", "_fault_job.py")

# mode -> fragments the job's output must contain (the failing rank and what failed)
EXPECTED = {
    "forward": ["hpcfsdp: rank 2 of 4 is aborting the job", "InjectedFault: forward hook failed on rank 2"],
    "backward": ["hpcfsdp: rank 2 of 4 is aborting the job", "tensor hook failed in backward on rank 2"],
    "comm": ["hpcfsdp: rank 2 of 4 is aborting the job", "in _run",  # the comm thread's frame
             "MPI all-gather failed on the communication thread of rank 2"],
    "save": ["is aborting the job", "checkpoint save failed, nothing was committed: rank 2: InjectedFault"],
    "save_crash": ["hpcfsdp: rank 2 of 4 is aborting the job", "_SimulatedCrash", "rank 2 died while saving"],
    "skip": ["collective timed out after 3 s (HPCFSDP_COMM_TIMEOUT): all_reduce_(float64[1] (cpu), op=SUM)",
             "group 'default' (size 4, world ranks [0, 1, 2, 3])",
             "group ranks not waiting on #4 all_reduce of this group",
             "computing elsewhere): 2 (world rank 2)",
             "collectives issued by rank ",  # each rank prints its own ring; who prints first varies
             "reduce_scatter(count=3104, dtype=float32, op=AVG) on group 'mesh_dim_0' (size 4, world ranks [0, 1, 2, 3])"],  # fully_shard's default mesh is unnamed, as PyTorch's
    # os._exit leaves no trace in the process; MPICH's Hydra reports the bad termination. See the report in
    # test_rank_that_exits: Hydra names the pid, not the rank (gap reported to the launcher's owner).
    "exit": ["BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES"],
}


def _run_job(mode, d):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    env.pop("HPCFSDP_COMM_TIMEOUT", None)
    env.pop("HPCFSDP_DEBUG", None)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "launch", "-n", "4", "--timeout", "60", "--",
                        "python", JOB, mode, str(d)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)
    return p.returncode, time.monotonic() - t0, p.stdout + p.stderr


def _check_committed_checkpoint(d):
    """The checkpoint saved after step 1 loads at world size 1 and equals what rank 0 recorded."""
    ckpt = os.path.join(d, "ckpt")
    md = _format.read_metadata(ckpt)
    assert md.world_size == 4 and md.extras["skeleton"]["step"] == 1
    ref = np.load(os.path.join(d, "ref.npz"))
    requests, outs = {}, {}
    for name, e in md.entries.items():
        outs[name] = np.full(e.shape, np.nan, e.dtype)
        requests[name] = (e.shape, e.dtype, (0,) * len(e.shape), outs[name])
    res = _format.load_pieces(ckpt, requests)
    assert res.missing_keys == [] and res.unexpected_keys == []
    assert sorted(outs) == sorted(f"model.{k}" for k in ref.files)
    for k in ref.files:
        np.testing.assert_array_equal(outs[f"model.{k}"], ref[k], err_msg=k)
    _format.verify_checkpoint(ckpt)
    return ckpt


@pytest.mark.parametrize("mode", ["forward", "backward", "comm", "save", "save_crash", "skip"])
def test_fault_on_rank_2_aborts_fast_and_names_it(mode, tmp_path):
    rc, elapsed, out = _run_job(mode, tmp_path)
    assert rc not in (0, 124), (rc, out[-3000:])
    assert elapsed < 30, (elapsed, out[-3000:])
    assert "UNREACHABLE" not in out
    for frag in EXPECTED[mode]:
        assert frag in out, (frag, out[-4000:])
    ckpt = _check_committed_checkpoint(tmp_path)
    tmps = [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    if mode == "save":  # every rank learnt of the failure: rank 0 removed the partial directory
        assert tmps == []
    if mode == "save_crash":  # rank 2 died mid-save: the partial directory stays and is recognised as such
        assert len(tmps) == 1
        with pytest.raises(IncompleteCheckpointError, match="incomplete checkpoint"):
            _format.read_metadata(os.path.join(tmp_path, tmps[0]))
        assert os.path.realpath(ckpt) != os.path.realpath(os.path.join(tmp_path, tmps[0]))


def test_rank_that_exits(tmp_path):
    rc, elapsed, out = _run_job("exit", tmp_path)
    assert rc not in (0, 124), (rc, out[-3000:])
    assert elapsed < 30, (elapsed, out[-3000:])
    assert "UNREACHABLE" not in out
    assert "rank 2" in out or all(f in out for f in EXPECTED["exit"]), out[-3000:]
    _check_committed_checkpoint(tmp_path)


# -- the comm layer's failure handling, unit by unit ---------------------------------------------------------

def test_comm_thread_exception_is_reraised_at_wait_with_its_traceback():
    from hpcfsdp.distributed import _comm_thread as CT
    from hpcfsdp.distributed import _failure as F

    def broken():
        raise ValueError("MPI_ERR_TRUNCATE on the comm thread")

    w = CT.submit("test collective", broken, async_op=True)
    with pytest.raises(ValueError, match="MPI_ERR_TRUNCATE on the comm thread") as info:
        w.wait()
    assert info.value is w.exception()
    assert "in broken" in w._tb and "in _run" in w._tb  # captured on the thread that ran it
    assert id(w) not in F.UNREPORTED  # retrieved: not reported again
    with pytest.raises(ValueError):  # every wait() re-raises
        w.wait()


def test_unwaited_failed_work_is_raised_at_the_next_collective():
    from mpi4py import MPI

    from hpcfsdp.distributed import _comm_thread as CT
    from hpcfsdp.distributed import process_group as P

    pg = P.ProcessGroup(MPI.COMM_SELF, name="self")
    w = CT.submit("lost all_gather", lambda: 1 / 0, async_op=True)
    while not w.is_completed():
        time.sleep(0.001)
    x = np.ones(3)
    with pytest.raises(RuntimeError, match="an earlier collective failed on the communication thread and nobody "
                                           "waited on it: lost all_gather: ZeroDivisionError") as info:
        pg.all_reduce_(x)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    pg.all_reduce_(x)  # reported once; the group goes on
    assert P.collective_counts().get("all_reduce", 0) >= 1
    with pytest.raises(ZeroDivisionError):  # and the Work itself still holds it
        w.wait()


def test_recent_collectives_ring():
    from mpi4py import MPI

    from hpcfsdp.distributed import _failure as F
    from hpcfsdp.distributed import process_group as P

    pg = P.ProcessGroup(MPI.COMM_SELF, name="ring")
    for i in range(F.HISTORY_LEN + 2):
        pg.all_reduce_(np.ones(i + 1, np.float32), P.ReduceOp.MAX)
    pg.broadcast_(np.ones(2, np.int64), src=0)
    hist = P.recent_collectives()
    assert len(hist) == F.HISTORY_LEN
    assert hist[-1] == "#11 broadcast(count=2, dtype=int64, src=0) on group 'ring' (size 1, world ranks [0]) [done]"
    assert hist[-2] == "#10 all_reduce(count=10, dtype=float32, op=MAX) on group 'ring' (size 1, world ranks [0]) [done]"


def test_debug_env_is_validated(monkeypatch):
    from hpcfsdp.distributed import process_group as P

    monkeypatch.delenv("HPCFSDP_DEBUG", raising=False)
    assert P.debug_enabled() is False
    for val, on in (("", False), ("0", False), ("1", True), (" 1 ", True), ("true", True), ("off", False)):
        monkeypatch.setenv("HPCFSDP_DEBUG", val)
        assert P.debug_enabled() is on
    monkeypatch.setenv("HPCFSDP_DEBUG", "maybe")
    with pytest.raises(ValueError, match="HPCFSDP_DEBUG='maybe': expected 1/true/yes/on or 0/false/no/off"):
        P.debug_enabled()


def _job(script, n=2, launcher=True, env=None):
    e = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONPATH=ROOT, **(env or {}))
    if launcher:
        argv = [sys.executable, "-m", "hpcfsdp.cli.main", "launch", "-n", str(n), "--timeout", "60", "--", "python",
                "-c", script]
    else:  # plain `mpiexec python -c`: no `python -m mpi4py` around the program
        argv = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", str(n), sys.executable, "-c", script]
    t0 = time.monotonic()
    p = subprocess.run(argv, cwd=ROOT, env=e, capture_output=True, text=True, timeout=90)
    return p.returncode, time.monotonic() - t0, p.stdout + p.stderr


RAISE_JOB = """
import sys, threading, time
import numpy as np
import hpcfsdp.distributed as dist
dist.barrier()
if dist.get_rank() == 1:
    if "{where}" == "thread":
        t = threading.Thread(target=lambda: 1 / 0, name="loader")
        t.start(); t.join(); time.sleep(60)
    else:
        raise KeyError("no such batch on rank 1")
dist.barrier()  # rank 0 waits here for a rank that never comes
print("UNREACHABLE", flush=True)
"""


@pytest.mark.parametrize("where,launcher", [("main", False), ("main", True), ("thread", False), ("thread", True)])
def test_uncaught_exception_aborts_the_job(where, launcher):
    # An uncaught exception on the main thread, or in any other thread, of one rank ends the job at once, with or
    # without `python -m mpi4py` (the launcher adds it; plain mpiexec and srun do not).
    rc, elapsed, out = _job(RAISE_JOB.replace("{where}", where), launcher=launcher)
    assert rc not in (0, 124) and elapsed < 30, (rc, elapsed, out[-3000:])
    assert "UNREACHABLE" not in out
    if where == "main":
        assert "hpcfsdp: rank 1 of 2 is aborting the job (MPI_Abort): uncaught KeyError on the main thread" in out
        assert "KeyError: 'no such batch on rank 1'" in out
    else:
        assert "hpcfsdp: rank 1 of 2 is aborting the job (MPI_Abort): uncaught ZeroDivisionError in thread " \
               "'loader'" in out
        assert "ZeroDivisionError: division by zero" in out


UNWAITED_JOB = """
import time
from hpcfsdp.distributed import _comm_thread as CT
import hpcfsdp.distributed as dist
dist.barrier()
if dist.get_rank() == 1:
    CT.submit("forgotten reduce_scatter", lambda: 1 / 0, async_op=True)  # never waited on
    time.sleep(0.2)
else:
    time.sleep(60)  # without the report at exit, rank 0 would sleep it out
"""


def test_unwaited_failed_work_is_reported_at_exit():
    rc, elapsed, out = _job(UNWAITED_JOB)
    assert rc not in (0, 124) and elapsed < 30, (rc, elapsed, out[-3000:])
    assert ("hpcfsdp: rank 1 of 2: a collective failed and its error was never retrieved (no wait()): "
            "forgotten reduce_scatter") in out
    assert "ZeroDivisionError: division by zero" in out
    assert "rank 1 of 2 is aborting the job (MPI_Abort): 1 failed collective(s) were never waited on" in out


STUCK_MAIN_JOB = """
import time
from mpi4py import MPI
from hpcfsdp.distributed import _comm_thread as CT
import hpcfsdp.distributed as dist
dist.barrier()
if dist.get_rank() == 1:
    CT.submit("reduce_scatter of the last bucket", lambda: 1 / 0, async_op=True)
    time.sleep(60)  # the main thread is busy elsewhere and never looks at the failed Work
else:
    MPI.COMM_WORLD.barrier()  # a raw mpi4py call: no watchdog sees it
print("UNREACHABLE", flush=True)
"""


def test_failed_work_nobody_retrieves_aborts_after_the_timeout():
    # Nobody retrieves rank 1's failed Work and rank 0 waits in a raw MPI call the watchdog cannot see: rank 1's
    # idle communication thread aborts the job after HPCFSDP_COMM_TIMEOUT.
    rc, elapsed, out = _job(STUCK_MAIN_JOB, env={"HPCFSDP_COMM_TIMEOUT": "2"})
    assert rc not in (0, 124) and elapsed < 30, (rc, elapsed, out[-3000:])
    assert "UNREACHABLE" not in out
    assert ("hpcfsdp: rank 1 of 2 is aborting the job (MPI_Abort): a collective failed on the communication thread "
            "and nobody retrieved its error within 2 s (HPCFSDP_COMM_TIMEOUT): reduce_scatter of the last bucket") in out
    assert "ZeroDivisionError: division by zero" in out
