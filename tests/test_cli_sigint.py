"""Ctrl-C under `hpcfsdp launch` at 2 ranks: a final checkpoint, exit 130 and one line; --resume continues bit for
bit; a second Ctrl-C stops at once, also in one line. See [Note: Ctrl-C] in hpcfsdp/cli/runtime.py."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from hpcfsdp.cli import launch
from hpcfsdp.cli.runtime import INTERRUPTED_EXIT, STOPPED_EXIT, stop_exit_status
from test_signals import _wait_for

HPC = [sys.executable, "-m", "hpcfsdp.cli.main"]
TINY = ["--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--block-size", "16", "--batch-size", "4",
        "--steps", "24", "--log-interval", "1", "--lr", "3e-3", "--warmup-steps", "2"]
_STEP_LINE = re.compile(r"step \d+/\d+  ")


def _env():
    drop = ("HPCFSDP_TRAIN_CRASH_AFTER_STEP", "HPCFSDP_PROGRESS", "RANK", "WORLD_SIZE", "LOCAL_RANK",
            "LOCAL_WORLD_SIZE")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _start(d, extra=()):
    """`hpcfsdp launch -n 2 -- hpcfsdp train TINY` in a session of its own, as a terminal's foreground job is."""
    args = TINY + ["--out-dir", str(d), "--checkpoint-dir", str(d / "ckpt"), *extra]
    cmd = HPC + ["launch", "-n", "2", "--timeout", "300", "--", sys.executable, "-m", "hpcfsdp.cli.main", "train", *args]
    return subprocess.Popen(cmd, env=_env(), cwd=d.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _after_steps(proc, d, n):
    metrics = d / "metrics.jsonl"
    ok = _wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= n, 200, proc)
    assert ok, proc.communicate(timeout=30)


def _losses(path):
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return [(r["step"], r["loss"], r["grad_norm"]) for r in recs if "loss" in r]


def _said(out, err):
    """The lines besides the per-step log: what the job said about itself."""
    return [ln for ln in (out + err).splitlines() if ln.strip() and not _STEP_LINE.match(ln)]


def _latest_step(d):
    from hpcfsdp.distributed.checkpoint import read_metadata

    return read_metadata(str(d / "ckpt" / "latest")).extras["skeleton"]["step"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref") / "run"
    d.mkdir()
    proc = _start(d)
    out, err = proc.communicate(timeout=330)
    assert proc.returncode == 0, f"{out}\n{err}"
    return _losses(d / "metrics.jsonl")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("to", ["launcher", "process-group"])
def test_ctrl_c_checkpoints_exits_130_in_one_line_and_resumes_bit_for_bit(reference, tmp_path, to):
    d = tmp_path / "run"
    d.mkdir()
    proc = _start(d, ["--requeue"])  # never for a Ctrl-C: not even the line saying there is no Slurm job to requeue
    _after_steps(proc, d, 3)
    if to == "launcher":
        proc.send_signal(signal.SIGINT)
    else:  # Ctrl-C in a terminal: SIGINT to the foreground process group
        os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=330)
    assert proc.returncode == INTERRUPTED_EXIT, f"exit {proc.returncode}\n{out}\n{err}"
    said = _said(out, err)
    assert len(said) == 1 and err == "", said
    assert said[0].startswith("SIGINT: stopped after step"), said
    at = _latest_step(d)
    assert 3 <= at < 24
    assert said[0] == (f"SIGINT: stopped after step {at}/24; checkpoint {d / 'ckpt' / 'latest'} holds step {at}: "
                       f"rerun with --resume to continue; exit {INTERRUPTED_EXIT}"), said
    assert [s for s, _, _ in _losses(d / "metrics.jsonl")] == list(range(1, at + 1))  # every step run is saved
    proc = _start(d, ["--requeue", "--resume"])
    out, err = proc.communicate(timeout=330)
    assert proc.returncode == 0, f"{out}\n{err}"
    assert f"resumed from {d / 'ckpt' / 'latest'} at step {at}" in out
    assert _losses(d / "metrics.jsonl") == reference  # interrupted + resumed == uninterrupted, bit for bit


@pytest.mark.timeout(600)
def test_second_ctrl_c_stops_at_once_in_one_line_naming_the_checkpoint_left(tmp_path):
    # a model whose checkpoint takes a while to write: the second Ctrl-C comes while the final one is written; if
    # that checkpoint was done (and the run gone) before the second one could be sent, again with a larger model
    for width in ("384", "768"):
        d = tmp_path / f"run{width}"
        d.mkdir()
        proc = _start(d, ["--n-layer", "4", "--n-embd", width, "--n-head", "4", "--block-size", "64", "--batch-size",
                          "8", "--checkpoint-interval", "3", "--steps", "400"])
        _after_steps(proc, d, 4)
        os.killpg(proc.pid, signal.SIGINT)
        ckpt = d / "ckpt"
        saving = _wait_for(lambda: any(".tmp-" in n for n in os.listdir(ckpt)), 60, proc)
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:  # the final checkpoint was written first: no second Ctrl-C to test here
            proc.communicate(timeout=120)
            continue
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=120)
        if any(line.startswith("SIGINT: stopped after step") for line in _said(out, err)):
            continue  # it had stopped on the first one when the second arrived
        break
    else:
        pytest.fail("the run ended before a second Ctrl-C could reach it, twice")
    assert saving, f"{out}\n{err}"
    assert time.monotonic() - t0 < 20  # at once: not after --grace (60 s)
    assert proc.returncode == INTERRUPTED_EXIT, f"exit {proc.returncode}\n{out}\n{err}"
    said = _said(out, err)
    assert len(said) == 1 and err == "", said
    m = re.fullmatch(r"SIGINT again: stopped at once, without a final checkpoint; checkpoint (\S+) holds step (\d+): "
                     rf"rerun with --resume to continue; exit {INTERRUPTED_EXIT}", said[0])
    assert m, said
    assert m[1] == str(ckpt / "latest") and int(m[2]) == _latest_step(d) and int(m[2]) % 3 == 0
    steps = [s for s, _, _ in _losses(d / "metrics.jsonl")]
    assert int(m[2]) <= steps[-1] < 400


# ----------------------------------------------------------------------------------- serial


_STOPPER = """
import os, signal, sys
from hpcfsdp.cli.runtime import StopRequest
stop = StopRequest().install()
stop.last_words = lambda: "checkpoint X holds step 7: rerun with --resume to continue"
os.kill(os.getpid(), signal.SIGINT)
print("first", stop.signal == signal.SIGINT, stop.interrupts, flush=True)
stop.settle()
stop.restore()
os.kill(os.getpid(), signal.SIGTERM)  # ignored once settled
os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C: out at once
print("not reached", flush=True)
"""


@pytest.mark.timeout(60)
def test_stop_request_takes_sigint_and_a_second_one_ends_the_process_in_one_line():
    r = subprocess.run([sys.executable, "-c", _STOPPER], env=_env(), capture_output=True, text=True, timeout=50)
    assert r.returncode == INTERRUPTED_EXIT, (r.stdout, r.stderr)
    assert r.stderr == ""
    assert r.stdout.splitlines() == [
        "first True 1",
        "SIGINT again: stopped at once, without a final checkpoint; checkpoint X holds step 7: rerun with --resume "
        f"to continue; exit {INTERRUPTED_EXIT}"]


@pytest.mark.timeout(30)
def test_exit_status_of_a_stop():
    assert stop_exit_status(signal.SIGINT) == 130 == INTERRUPTED_EXIT == 128 + signal.SIGINT
    assert stop_exit_status(signal.SIGTERM) == stop_exit_status(signal.SIGUSR1) == STOPPED_EXIT == 75


def _relay(chunks, stopping):
    r, w = os.pipe()
    pending = iter(chunks)
    launch.relay_stdout(lambda: next(pending, b""), w, stopping=lambda: stopping)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        return f.read()


@pytest.mark.timeout(30)
def test_relay_drops_hydras_ctrl_c_lines_and_the_exit_codes_of_ranks_that_stopped():
    chat = (b"step 3/24  loss 5.3\n[mpiexec@vm] Sending Ctrl-C to processes as requested\n"
            b"[mpiexec@vm] Press Ctrl-C again to force abort\n")
    stopped = b"[mpiexec@vm] Exit codes: [vm] 33280,0\n"  # 130 and 0
    failed = b"[mpiexec@vm] Exit codes: [vm] 33280,256\n"  # 130 and 1: a rank failed while stopping
    assert _relay([chat, stopped], stopping=True) == b"step 3/24  loss 5.3\n"
    assert _relay([chat, failed], stopping=True) == b"step 3/24  loss 5.3\nhpcfsdp launch: rank exits by host: vm: 130, 1\n"
    assert _relay([stopped], stopping=False) == b"hpcfsdp launch: rank exits by host: vm: 130, 0\n"
    banner = (b"\n" + b"=" * 83 + b"\n=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n=   PID 8067 RUNNING AT vm\n"
              b"=   EXIT CODE: 9\n=   CLEANING UP REMAINING PROCESSES\n=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES\n"
              + b"=" * 83 + b"\nYOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)\n"
              b"This typically refers to a problem with your application.\n"
              b"Please see the FAQ page for debugging suggestions\n")
    killed = b"[mpiexec@vm] Exit codes: [vm] 9,33280\n"  # killed by mpiexec as the other rank exited 130
    assert _relay([b"SIGINT: stopped\n", banner[:50], banner[50:], killed], stopping=True) == b"SIGINT: stopped\n"
    assert _relay([banner], stopping=False) == banner  # not after a stop: passed on as it came


@pytest.mark.timeout(600)
def test_ctrl_c_in_the_demo_then_demo_resume_continues_it(tmp_path):
    def demo(out, *extra):
        return subprocess.Popen(HPC + ["demo", "-n", "2", "--steps", "40", "--out-dir", str(out), *extra], env=_env(),
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)

    ref = demo(tmp_path / "ref")
    out, err = ref.communicate(timeout=300)
    assert ref.returncode == 0, out + err
    d = tmp_path / "demo"
    proc = demo(d)
    _after_steps(proc, d, 3)  # logged every 4 steps
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == INTERRUPTED_EXIT, out + err
    said = [ln for ln in _said(out, err) if not ln.startswith("hpcfsdp demo: training")]
    assert len(said) == 1 and err == "" and said[0].startswith("SIGINT: stopped after step "), said
    assert said[0].endswith(": rerun with --resume to continue; exit 130"), said
    proc = demo(d, "--resume")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    assert f"resumed from {d / 'checkpoints' / 'latest'} at step" in out
    ours, theirs = dict((s, rest) for s, *rest in _losses(d / "metrics.jsonl")), \
        dict((s, rest) for s, *rest in _losses(tmp_path / "ref" / "metrics.jsonl"))
    assert 40 in ours and len(set(ours) & set(theirs)) >= 8
    assert all(ours[s] == theirs[s] for s in set(ours) & set(theirs))  # bit for bit where both logged


def _caught(pid, sig):
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(ln.split()[1], 16) for ln in f if ln.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(mask >> (sig - 1) & 1)


@pytest.mark.timeout(300)
def test_ctrl_c_while_a_rank_starts_is_kept_for_its_first_step_boundary(tmp_path):
    """The rank wrapper holds a SIGINT while its child imports hpcfsdp (see [Note: Ctrl-C while a rank starts]):
    no KeyboardInterrupt traceback, a checkpoint at step 1, exit 130, one line."""
    d = tmp_path / "run"
    cmd = [sys.executable, "-m", "hpcfsdp.cli.rankwrap", "--", sys.executable, "-m", "hpcfsdp.cli.main", "train", *TINY,
           "--out-dir", str(d), "--checkpoint-dir", str(d / "ckpt")]
    proc = subprocess.Popen(cmd, env=_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert _wait_for(lambda: _caught(proc.pid, signal.SIGUSR2), 60, proc)  # the wrapper's handlers are in place
    proc.send_signal(signal.SIGINT)  # its child is still importing
    out, err = proc.communicate(timeout=250)
    assert proc.returncode == INTERRUPTED_EXIT, (out, err)
    said = _said(out, err)
    assert err == "" and len(said) == 1, said
    assert said[0] == (f"SIGINT: stopped after step 1/24; checkpoint {d / 'ckpt' / 'latest'} holds step 1: "
                       f"rerun with --resume to continue; exit {INTERRUPTED_EXIT}"), said
    assert _latest_step(d) == 1
