"""Signals under `hpcfsdp launch` at 4 ranks: a stop leaves no rank behind; the trainer checkpoints and resumes exactly."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hpcfsdp.cli import train as train_cli
from hpcfsdp.cli.runtime import STOPPED_EXIT

HPC = [sys.executable, "-m", "hpcfsdp.cli.main"]
TINY = ["--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--block-size", "16", "--batch-size", "4",
        "--steps", "30", "--log-interval", "1", "--lr", "3e-3", "--warmup-steps", "2"]


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _env():
    return {k: v for k, v in os.environ.items() if k not in (train_cli.CRASH_ENV, train_cli.PROGRESS_ENV)}


def _wait_for(cond, timeout, proc=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        if proc is not None and proc.poll() is not None:
            return cond()
        time.sleep(0.1)
    return False


@pytest.mark.timeout(120)
def test_sigterm_to_the_launcher_leaves_no_rank_alive(tmp_path):
    prog = tmp_path / "sleeper.py"
    prog.write_text("import os, sys, time\nfrom mpi4py import MPI\n"
                    f"open(os.path.join({str(tmp_path)!r}, f'pid{{MPI.COMM_WORLD.Get_rank()}}'), 'w').write(str(os.getpid()))\n"
                    "MPI.COMM_WORLD.Barrier()\ntime.sleep(300)\n")
    launcher = subprocess.Popen(HPC + ["launch", "-n", "4", "--", sys.executable, str(prog)], env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert _wait_for(lambda: all((tmp_path / f"pid{r}").exists() and (tmp_path / f"pid{r}").read_text()
                                     for r in range(4)), 60, launcher), launcher.communicate(timeout=5)
        pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(4)]
        assert all(_alive(p) for p in pids)
        launcher.send_signal(signal.SIGTERM)
        assert _wait_for(lambda: not any(_alive(p) for p in pids), 10), [p for p in pids if _alive(p)]
        launcher.wait(timeout=10)
        assert launcher.returncode != 0
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()


def _train(tmp, d, extra=(), signal_rank=None, sig=None):
    """Train TINY at 4 ranks; with `sig`, send it (to the launcher, or to one rank's process) once step 3 is logged."""
    args = TINY + ["--out-dir", str(d), "--checkpoint-dir", str(d / "ckpt"), *extra]
    cmd = HPC + ["launch", "-n", "4", "--timeout", "300", "--", sys.executable, "-m", "hpcfsdp.cli.main", "train", *args]
    proc = subprocess.Popen(cmd, env=_env(), cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if sig is not None:
        metrics = d / "metrics.jsonl"
        logged = _wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 3, 200, proc)
        assert logged, proc.communicate(timeout=30)
        if signal_rank is None:
            proc.send_signal(sig)
        else:  # one rank only: the others learn of it at the step boundary
            pids = subprocess.run(["pgrep", "-f", f"train .*--out-dir {d} "], capture_output=True, text=True).stdout
            ranks = [int(p) for p in pids.split() if _cmd_is_rank(int(p), d)]
            assert len(ranks) == 4, ranks
            os.kill(ranks[signal_rank], sig)
    out, err = proc.communicate(timeout=330)
    return proc.returncode, out, err


def _cmd_is_rank(pid, d):
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            argv = f.read().split("\0")
    except OSError:
        return False
    return "hpcfsdp.cli.rankwrap" not in argv and "launch" not in argv and "mpi4py" in argv


def _losses(path):
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return [(r["step"], r["loss"], r["grad_norm"]) for r in recs if "loss" in r]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref") / "run"
    code, out, err = _train(d.parent, d)
    assert code == 0, f"{out}\n{err}"
    return _losses(d / "metrics.jsonl")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig,to_rank", [(signal.SIGUSR1, None), (signal.SIGTERM, 2)], ids=["usr1-launcher", "term-rank2"])
def test_stop_signal_checkpoints_and_resume_loses_no_step(reference, tmp_path, sig, to_rank):
    from hpcfsdp.distributed.checkpoint import read_metadata

    d = tmp_path / "run"
    code, out, err = _train(tmp_path, d, signal_rank=to_rank, sig=sig)
    assert code == STOPPED_EXIT, f"exit {code}\n{out}\n{err}"
    assert f"{sig.name}: stopped after step" in out and out.count("stopped after step") == 1
    stopped = _losses(d / "metrics.jsonl")
    at = read_metadata(str(d / "ckpt" / "latest")).extras["skeleton"]["step"]
    assert 3 <= at < 30 and [s for s, _, _ in stopped] == list(range(1, at + 1))  # the checkpoint holds every step run
    code, out, err = _train(tmp_path, d, extra=["--resume"])
    assert code == 0, f"{out}\n{err}"
    assert f"at step {at}" in out
    assert _losses(d / "metrics.jsonl") == reference  # no step lost or repeated, bit for bit


@pytest.mark.timeout(120)
def test_a_job_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    prog = tmp_path / "stubborn.py"
    prog.write_text("import os, signal, time\nfrom mpi4py import MPI\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                    f"open(os.path.join({str(tmp_path)!r}, f'pid{{MPI.COMM_WORLD.Get_rank()}}'), 'w').write(str(os.getpid()))\n"
                    "time.sleep(300)\n")
    launcher = subprocess.Popen(HPC + ["launch", "-n", "2", "--grace", "3", "--", sys.executable, str(prog)], env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert _wait_for(lambda: all((tmp_path / f"pid{r}").exists() and (tmp_path / f"pid{r}").read_text()
                                     for r in range(2)), 60, launcher), launcher.communicate(timeout=5)
        pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=30)
        assert "did not end within --grace 3 s" in err, err
        assert _wait_for(lambda: not any(_alive(p) for p in pids), 10), [p for p in pids if _alive(p)]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()


@pytest.mark.timeout(30)
def test_settled_stop_request_ignores_later_stop_signals():
    """Once training has ended, a late SIGTERM/SIGUSR1 (srun ending the step as the first rank exits 75, Slurm's
    warning as the job exits) is ignored, also after restore(): the rank exits with its own status."""
    from hpcfsdp.cli.runtime import STOP_SIGNALS, StopRequest

    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    stop = StopRequest().install()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert _wait_for(lambda: stop.signal == signal.SIGUSR1, 5)  # recorded, not fatal
        stop.settle()
        stop.restore()
        for s in STOP_SIGNALS:
            assert signal.getsignal(s) == signal.SIG_IGN
            os.kill(os.getpid(), s)  # would end this process if not ignored
        time.sleep(0.2)
    finally:
        for s, h in before.items():
            signal.signal(s, h)
