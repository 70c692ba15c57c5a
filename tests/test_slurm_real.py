"""The rendered Slurm scripts on a real Slurm (system tier, root): preemption, requeue and resume, and every template.

A private one-node Slurm (Debian's slurm-wlm + munge, tests/slurmsim/harness.py: started for this module,
always torn down) runs the scripts `hpcfsdp slurm render` writes, unchanged, with `srun --mpi=pmi2` and
the MPICH that mpi4py uses. The site sets `MpiDefault=none`. Each job runs the interpreter that rendered
it and imports this tree (PYTHONPATH, exported by sbatch).

One training job at a time: on the 2-core test machines a job started while another job's ranks busy-poll
both cores sometimes got no CPU for minutes (its ranks runnable, their CPU time still 0), and the test ran
past its timeout.
"""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from slurmsim.fixtures import private_slurm
from slurmsim.harness import FINAL_STATES

pytestmark = pytest.mark.system

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--block-size", "16", "--batch-size", "4",
        "--log-interval", "1", "--lr", "3e-3", "--warmup-steps", "2"]
STOPPED_EXIT = 75


@pytest.fixture(scope="module")
def slurm():
    yield from private_slurm()


def _env():
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": ROOT + (os.pathsep + path if path else "")}


def _render(d, *args):
    """`hpcfsdp slurm render ... > d/job.sbatch` (CPU-only job, log in d/slurm-JOB.out); returns the path."""
    os.makedirs(d, exist_ok=True)
    out = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "slurm", "render", "--gpus-per-node", "0",
                          "--sbatch-output", os.path.join(d, "slurm-%j.out"), *args],
                         env=dict(os.environ, **_env()), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    path = os.path.join(d, "job.sbatch")
    with open(path, "w") as f:
        f.write(out.stdout)
    return path


def _submit(slurm, d, *args):
    return slurm.sbatch(_render(d, *args), cwd=d, env=_env())


def _train_job(slurm, d, steps, *extra, tasks=4):
    return _submit(slurm, d, "--template", "single-node", "--ntasks-per-node", str(tasks), *TINY,
                   "--steps", str(steps), "--checkpoint-dir", os.path.join(d, "ckpt"),
                   "--out-dir", os.path.join(d, "out"), *extra)


def _log(d, job):
    path = os.path.join(d, f"slurm-{job}.out")
    if not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()


def _metrics(d):
    path = os.path.join(d, "out", "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = f.read().splitlines()
    recs = []
    for line in lines:
        try:
            recs.append(json.loads(line))
        except ValueError:  # a line being written
            pass
    return [(r["step"], r["loss"], r["grad_norm"]) for r in recs if "loss" in r]


def _trained(d, n):
    """At least ``n`` steps in the metrics: reads only the first ``n`` lines (a fast job writes thousands, and
    parsing them all at every poll starved the 2-core machine)."""
    path = os.path.join(d, "out", "metrics.jsonl")
    if not os.path.exists(path):
        return False
    with open(path) as f:
        lines = [line for _, line in zip(range(n), f)]
    return len(lines) == n and lines[-1].endswith("\n")


def _ckpt_step(d):
    from hpcfsdp.distributed.checkpoint import read_metadata

    md = read_metadata(os.path.join(d, "ckpt", "latest"))
    return md.extras["skeleton"]["step"]


def _until(cond, timeout, slurm, job, what):
    end = time.monotonic() + timeout
    polls = 0
    while time.monotonic() < end:
        if cond():
            return
        polls += 1
        if polls % 20 == 0:  # scontrol is slow on a loaded machine: ask now and then
            state = slurm.job(job).get("JobState")
            assert state in ("PENDING", "RUNNING", "CONFIGURING"), f"job {job} is {state} before {what}"
        time.sleep(0.1)
    pytest.fail(f"job {job}: {what} within {timeout} s; state {slurm.job(job)}")


def _stop_line(log, sig):
    m = re.findall(rf"{sig}: stopped after step (\d+)/\d+; checkpoint \S+ holds step (\d+): rerun with --resume to "
                   rf"continue; exit {STOPPED_EXIT}", log)
    assert len(m) == 1, f"expected one '{sig}: stopped after step' line:\n{log[-3000:]}"
    assert m[0][0] == m[0][1], m
    return int(m[0][0])


@pytest.mark.timeout(600)  # the first test also installs (if missing) and starts Slurm
def test_usr1_warning_checkpoints_requeues_and_resumes_losing_no_step(slurm, tmp_path):
    steps = 1000  # long enough that the signal sent after 5 steps cannot lose a race with the job's end
    ref_dir, run_dir = str(tmp_path / "ref"), str(tmp_path / "run")
    text = open(_render(run_dir, "--template", "single-node", "--ntasks-per-node", "4", "--mpi", "pmi2",
                        "--requeue", "--signal-seconds", "60", *TINY, "--steps", str(steps))).read()
    assert "#SBATCH --signal=B:USR1@60" in text and "#SBATCH --requeue" in text
    assert "srun --mpi=pmi2 " in text and f'PYTHON="${{PYTHON:-{sys.executable}}}"' in text
    job = _train_job(slurm, run_dir, steps, "--mpi", "pmi2", "--requeue", "--signal-seconds", "60")
    _until(lambda: _trained(run_dir, 5), 150, slurm, job, "5 steps trained")
    slurm.run("scancel", "--signal=USR1", "--batch", job)  # what --signal=B:USR1@60 does at the time
    info = slurm.wait(job, lambda i: int(i.get("Restarts", 0)) >= 1 or i.get("JobState") in FINAL_STATES, 120)
    assert int(info["Restarts"]) == 1, (info, _log(run_dir, job))
    if info["JobState"] == "PENDING":  # requeued, not started again yet: the final checkpoint of the first run
        stopped_at = _ckpt_step(run_dir)
        assert len(_metrics(run_dir)) == stopped_at
    info = slurm.wait(job, timeout=300)
    log = _log(run_dir, job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0" and info["Restarts"] == "1", (info, log)
    at = _stop_line(log, "SIGUSR1")
    assert 5 <= at < steps, log
    assert f"requeueing job {job}" in log and log.count("requeueing job") == 1, log
    assert re.search(rf"resumed from \S+/latest at step {at}\n", log), log
    assert f"over steps {at + 1}..{steps}" in log, log  # the second run trained only the rest
    assert _ckpt_step(run_dir) == steps
    ref = _train_job(slurm, ref_dir, steps, "--mpi", "pmi2")  # the uninterrupted job
    ref_info = slurm.wait(ref, timeout=300)
    assert ref_info["JobState"] == "COMPLETED", (ref_info, _log(ref_dir, ref))
    expected = _metrics(ref_dir)
    assert [s for s, _, _ in expected] == list(range(1, steps + 1))
    # no step lost or repeated: the same steps, losses and gradient norms as the uninterrupted job, bit for bit
    assert _metrics(run_dir) == expected


@pytest.mark.timeout(240)
def test_every_other_template_runs_to_completion(slurm, tmp_path):
    """multi-node and hsdp under srun --mpi=pmi2, bench-comm, and Hydra's mpiexec inside the allocation."""
    steps = 6
    rows = str(tmp_path / "bench-comm" / "rows.jsonl")
    jobs = [(name, template, n, extra + ["--steps", str(steps)])
            for name, template, n, extra in (("multi-node", "multi-node", 2, ["--mpi", "pmi2", "--strategy", "FULL_SHARD"]),
                                             ("hsdp", "hsdp", 4, ["--mpi", "pmi2", "--mesh", "2x2"]),
                                             ("mpiexec", "single-node", 2, ["--launcher", "mpiexec"]))]
    jobs.append(("bench-comm", "bench-comm", 2, ["--mpi", "pmi2", "--bench-args",
                                                 f"--min-bytes 1024 --max-bytes 4096 --iters 2 --warmup 1 --json {rows}"]))
    for name, template, n, extra in jobs:  # one at a time (see the module's docstring)
        d = str(tmp_path / name)
        train = [] if name == "bench-comm" else [*TINY, "--checkpoint-dir", os.path.join(d, "ckpt"),
                                                  "--out-dir", os.path.join(d, "out")]
        job = _submit(slurm, d, "--template", template, "--nodes", "1", "--ntasks-per-node", str(n), *train, *extra)
        info = slurm.wait(job, timeout=50)
        log = _log(d, job)
        assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (name, info, log)
        if name == "bench-comm":
            with open(rows) as f:
                recs = [json.loads(line) for line in f if line.strip()]
            assert {r["op"] for r in recs} >= {"all_gather", "reduce_scatter", "all_reduce"}, recs
            assert all(r["ranks"] == 2 and r["device"] == "cpu" for r in recs), recs
            assert "# ranks=2;" in log, log
        else:
            assert f"over steps 1..{steps}" in log, (name, log)
            with open(os.path.join(d, "out", "metrics.jsonl")) as f:  # one job of all its ranks, not copies
                assert {len(json.loads(line)["peak_mem_bytes"]) for line in f} == {n}, name
            assert [s for s, _, _ in _metrics(d)] == list(range(1, steps + 1)), name
            assert _ckpt_step(d) == steps, name


@pytest.mark.timeout(120)
def test_a_world_smaller_than_the_step_refuses_to_train_naming_the_fix(slurm, tmp_path):
    d = str(tmp_path / "nompi")
    job = _train_job(slurm, d, 20, tasks=2)  # no --mpi: this site's MpiDefault=none, so each task is alone
    info = slurm.wait(job, timeout=90)
    log = _log(d, job)
    assert info["JobState"] == "FAILED", (info, log)
    assert "MPI sees 1 rank(s) but srun started 2 tasks" in log, log
    assert "srun --mpi=pmi2" in log and "hpcfsdp slurm render --mpi pmi2" in log, log
    assert not os.path.exists(os.path.join(d, "out", "metrics.jsonl")) and not os.path.exists(os.path.join(d, "ckpt"))


@pytest.mark.timeout(300)  # above the sum of its waits, so that a slow Slurm fails with its logs
def test_scancel_and_term_leave_a_final_checkpoint(slurm, tmp_path):
    # scancel --signal=TERM: SIGTERM to the job's steps, every rank gets it. Plain scancel: SIGCONT and SIGTERM to
    # every process of the job, SIGKILL after KillWait (what Slurm does at the time limit, TIMEOUT, too): the
    # ranks get TERM and the batch shell forwards USR1, either may stop them first. (A real time limit with the
    # warning is not here: on this one-node Slurm the warning of a 1-minute job sometimes came only with the
    # limit's own kill, TIMEOUT with no checkpoint; see slurm/README.md.)
    for key, scancel, state, sig in (("term", ["--signal=TERM"], "FAILED", "SIGTERM"),
                                     ("cancel", [], "CANCELLED", "SIG(?:TERM|USR1)")):
        d = str(tmp_path / key)
        job = _train_job(slurm, d, 100000, "--mpi", "pmi2", tasks=2)
        _until(lambda: _trained(d, 5), 90, slurm, job, "5 steps trained")
        slurm.run("scancel", *scancel, job)
        info = slurm.wait(job, timeout=60)  # COMPLETING (not final) until every process of the job ended
        log = _log(d, job)
        assert info["JobState"] == state and info["ExitCode"] == f"{STOPPED_EXIT}:0", (key, info, log)
        at = _stop_line(log, sig)
        assert at >= 1 and _ckpt_step(d) == at, (key, log)
        assert [s for s, _, _ in _metrics(d)] == list(range(1, at + 1)), key  # every step run is in the checkpoint


@pytest.mark.timeout(240)
def test_setup_lines_run_and_a_resubmitted_job_resumes_if_a_checkpoint_exists(slurm, tmp_path):
    """`--setup` runs in the batch shell before the launch; paths rendered relative to the render directory
    are absolute in the script, so the job is submitted from elsewhere; `--resume-if-exists` (which render
    writes) starts the first job at step 0 and the second, rendered for more steps, from the first's latest."""
    d, elsewhere = tmp_path / "render", tmp_path / "submit"
    d.mkdir()
    elsewhere.mkdir()
    setup = f'export SITE_MARK=ready; echo "setup ran: $SITE_MARK"; cd {elsewhere}'
    logs = []
    for steps in (4, 6):
        out = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "slurm", "render", "--gpus-per-node", "0",
                              "--template", "single-node", "--ntasks-per-node", "2", "--mpi", "pmi2",
                              "--setup", setup, *TINY, "--steps", str(steps), "--checkpoint-dir", "ckpt",
                              "--out-dir", "out", "--sbatch-output", "slurm-%j.out"],
                             cwd=d, env=dict(os.environ, **_env()), capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        text = out.stdout
        assert subprocess.run(["bash", "-n"], input=text, text=True, timeout=30).returncode == 0
        assert f"--checkpoint-dir {d}/ckpt" in text and "--resume-if-exists" in text
        script = elsewhere / f"job{steps}.sbatch"
        script.write_text(text)
        job = slurm.sbatch(str(script), cwd=str(elsewhere), env=_env())
        info = slurm.wait(job, timeout=120)
        log = _log(str(d), job)
        logs.append(log)
        assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, log)
        assert log.index("setup ran: ready") < log.index("hpcfsdp: 1 node x 2 ranks"), log
    assert re.search(r"no checkpoint at \S+/ckpt/latest yet: starting from step 0\n", logs[0]), logs[0]
    assert "over steps 1..4" in logs[0], logs[0]
    assert re.search(rf"resumed from {d}/ckpt/latest at step 4\n", logs[1]), logs[1]
    assert "over steps 5..6" in logs[1], logs[1]
    assert [s for s, _, _ in _metrics(str(d))] == list(range(1, 7))
    assert _ckpt_step(str(d)) == 6 and not os.path.exists(elsewhere / "ckpt")
