"""`hpcfsdp launch --elastic`: Open MPI's failure handling on, a lost rank not the end of the job, and a guard
against an mpirun that outlives its ranks (see [Note: Elastic jobs] in hpcfsdp/cli/launch.py). The last test
runs a real elastic job under Open MPI (system tier)."""
import importlib.util
import os
import stat
import subprocess
import sys
import time

import pytest

from hpcfsdp.cli import launch as L

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_open_mpi_gets_failure_handling():
    argv, _ = L.build_command(4, ["hpcfsdp", "train", "--elastic"], mpiexec="mpirun", vendor="openmpi", env={},
                              elastic=True)
    i = argv.index("--with-ft")
    assert argv[i + 1] == "ulfm" and i < argv.index(sys.executable)
    plain, _ = L.build_command(4, ["hpcfsdp", "train"], mpiexec="mpirun", vendor="openmpi", env={})
    assert "--with-ft" not in plain


def test_elastic_needs_open_mpi_and_excludes_restarts():
    with pytest.raises(ValueError, match=r"--elastic needs Open MPI with ULFM .*--max-restarts"):
        L.build_command(2, ["true"], mpiexec="mpiexec", vendor="mpich", env={}, elastic=True)
    with pytest.raises(ValueError, match="--elastic and --max-restarts: give one"):
        L.launch(2, ["true"], elastic=True, max_restarts=1)


_FAKE_MPIRUN = """#!/bin/sh
# an Open MPI mpirun that runs its one rank and then never exits (PRRTE's teardown hang)
if [ "$1" = "--version" ]; then echo "mpirun (Open MPI) 5.0.11"; exit 0; fi
shift 2  # -n 1
while [ "${1#-}" != "$1" ]; do if [ "$1" = "--with-ft" ]; then shift; fi; shift; done
OMPI_COMM_WORLD_RANK=0 "$@"
exec sleep 600
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("status,want", [(0, 0), (3, 3), (None, 1)])
def test_an_mpirun_that_outlives_its_ranks_is_ended_with_their_status(tmp_path, monkeypatch, status, want, capfd):
    fake = tmp_path / "mpirun"
    fake.write_text(_FAKE_MPIRUN)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(L, "ELASTIC_LINGER", 1.0)
    # the rank reports its status as `hpcfsdp train --elastic` does (None: it says nothing, and exits 0)
    code = "import time; time.sleep(1)" if status is None else (
        f"import sys; from hpcfsdp.cli.rankwrap import report_status; sys.exit(report_status({status}))")
    t0 = time.monotonic()
    got = L.launch(1, [sys.executable, "-c", code], mpiexec=str(fake), elastic=True)
    took = time.monotonic() - t0
    assert got == want and took < 30, (got, took)
    err = capfd.readouterr().err
    assert "mpirun did not exit 1 s after this host's ranks had" in err and f"exit {want}" in err, err


# ------------------------------------------------------------------------------------ a real job (system tier)


@pytest.mark.system
@pytest.mark.timeout(400)
def test_a_rank_killed_under_launch_elastic_is_survived(ompi_python, tmp_path):
    spec = importlib.util.spec_from_file_location("elastic_bench", os.path.join(ROOT, "scripts", "elastic_bench.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "out"
    cmd = [ompi_python, "-m", "hpcfsdp.cli.main", "launch", "--elastic", "-n", "6", "--ranks-per-node", "2",
           "--timeout", "300", "--", "hpcfsdp", "train", "--elastic", *bench.MODEL, "--steps", "10",
           "--out-dir", str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.time() + 200
        while bench._last_step(str(out)) < 3 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        pids = bench._rank_pids(proc.pid)
        assert 4 in pids, (pids, proc.poll())
        os.kill(pids[4], 9)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
    assert "elastic: lost rank(s) 4 (" in stdout and "5 rank(s) go on" in stdout, stdout
    steps = [r["step"] for r in bench.records(str(out)) if "loss" in r]
    assert steps == list(range(1, 11)), steps
