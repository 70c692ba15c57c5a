"""A rank killed without a Python traceback is named (rank, host, pid, signal) and the job ends."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from hpcfsdp.cli import rankwrap

HPC = [sys.executable, "-m", "hpcfsdp.cli.main"]


@pytest.mark.timeout(120)
def test_kill_9_of_one_rank_ends_the_job_naming_it(tmp_path):
    prog = tmp_path / "worker.py"
    prog.write_text("import os, time\nfrom mpi4py import MPI\n"
                    f"open(os.path.join({str(tmp_path)!r}, f'pid{{MPI.COMM_WORLD.Get_rank()}}'), 'w').write(str(os.getpid()))\n"
                    "while True:\n    MPI.COMM_WORLD.Barrier()\n    time.sleep(0.2)\n")
    launcher = subprocess.Popen(HPC + ["launch", "-n", "4", "--", sys.executable, str(prog)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 60
        while not all((tmp_path / f"pid{r}").exists() and (tmp_path / f"pid{r}").read_text() for r in range(4)):
            assert time.monotonic() < end and launcher.poll() is None, launcher.communicate(timeout=5)
            time.sleep(0.1)
        victim = int((tmp_path / "pid2").read_text())
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        out, err = launcher.communicate(timeout=30)
        assert time.monotonic() - t0 < 30
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert launcher.returncode != 0
    assert f"rank 2 (host {socket.gethostname()}, pid {victim}) killed by SIGKILL (signal 9)" in err, err
    assert err.count("killed by SIGKILL") == 1, err  # only the lost rank is named, not the ones cleaned up after it


def test_describe_status_decodes_signals_and_codes():
    assert rankwrap.describe_status(-9) == "killed by SIGKILL (signal 9)"
    assert rankwrap.describe_status(-11) == "killed by SIGSEGV (signal 11)"
    assert rankwrap.describe_status(2) == "exited with status 2"


def test_wrapper_reports_a_segfault_and_keeps_the_status(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "HPCFSDP_RANK_ENV_PID")}
    env.update(PMI_RANK="3", PMI_SIZE="4")
    res = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.rankwrap", "--", sys.executable, "-c",
                          "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 128 + signal.SIGSEGV
    assert "rank 3 (host" in res.stderr and "killed by SIGSEGV (signal 11)" in res.stderr
    ok = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.rankwrap", "--", sys.executable, "-c", "raise SystemExit(4)"],
                        capture_output=True, text=True, timeout=60, env=env)
    assert ok.returncode == 4 and "killed" not in ok.stderr
