"""The launcher: mpiexec discovery, per-vendor arguments, abort-on-exception, timeouts."""
import os
import subprocess
import sys
import time

import pytest

from hpcfsdp.cli import launch

HPC = [sys.executable, "-m", "hpcfsdp.cli.main"]


def test_openmpi_as_root_gets_oversubscribe_and_root_variables(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    argv, env = launch.build_command(4, ["python", "x.py"], mpiexec="/x/mpiexec", vendor="openmpi", env={})
    assert argv[:4] == ["/x/mpiexec", "-n", "4", "--oversubscribe"]
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert argv[4:7] == [sys.executable, "-m", "mpi4py"] and argv[-1] == "x.py"


def test_mpich_gets_nothing_extra(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    argv, env = launch.build_command(2, ["/usr/bin/python3", "-c", "pass"], mpiexec="m", vendor="mpich", env={})
    assert argv == ["m", "-n", "2", "-print-all-exitcodes", "/usr/bin/python3", "-m", "mpi4py", "-c", "pass"]
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in env


def test_non_python_commands_are_left_alone():
    argv, _ = launch.build_command(2, ["hostname"], mpiexec="m", vendor="openmpi", env={})
    assert argv[-1] == "hostname" and "mpi4py" not in argv


def test_bad_arguments():
    with pytest.raises(ValueError, match="positive number of ranks"):
        launch.build_command(0, ["x"], mpiexec="m", vendor="mpich", env={})
    with pytest.raises(ValueError, match="no command given"):
        launch.build_command(2, [], mpiexec="m", vendor="mpich", env={})
    with pytest.raises(ValueError, match="--ranks-per-node 3 must divide -n 4"):
        launch.launch(4, ["true"], ranks_per_node=3)


def test_missing_mpiexec_names_the_extras(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(FileNotFoundError, match=r"hpcfsdp\[mpich\]"):
        launch.find_mpiexec()


def test_vendor_detected_from_installed_mpiexec():
    assert launch.mpi_vendor(launch.find_mpiexec()) in ("mpich", "openmpi")


def test_one_failing_rank_aborts_the_job(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(
        "from mpi4py import MPI\n"
        "if MPI.COMM_WORLD.rank == 2:\n"
        "    raise RuntimeError('rank 2 fails on purpose')\n"
        "MPI.COMM_WORLD.Barrier()\n"
    )
    t0 = time.time()
    out = subprocess.run(HPC + ["launch", "-n", "4", "--", "python", str(script)], capture_output=True, text=True, timeout=60)
    assert time.time() - t0 < 15
    assert out.returncode != 0
    assert "rank 2 fails on purpose" in out.stderr and "Traceback" in out.stderr


def test_timeout_kills_the_job(tmp_path):
    t0 = time.time()
    out = subprocess.run(HPC + ["launch", "-n", "2", "--timeout", "2", "--", "python", "-c", "import time; time.sleep(60)"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 124 and time.time() - t0 < 20
    assert "--timeout" in out.stderr


def test_ranks_per_node_reaches_the_ranks():
    out = subprocess.run(HPC + ["launch", "-n", "2", "--ranks-per-node", "1", "--", "python", "-c",
                                "import os; os.write(1, ('RPN %s\\n' % os.environ['HPCFSDP_RANKS_PER_NODE']).encode())"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.count("RPN 1") == 2


def test_help_of_every_command():
    out = subprocess.run(HPC + ["launch", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--ranks-per-node" in out.stdout
