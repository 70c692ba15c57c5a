"""Open MPI across simulated hosts (system tier): `hpcfsdp train` as under MPICH, and ULFM's shrink across hosts.

The Open MPI is that of the environment `ompi_python` names ($HPCFSDP_OMPI_PYTHON, default .venv-ompi;
tests/run_all.py passes the one .ci/run builds); its mpirun reaches the hosts through the harness's ssh
stand-in (see [Note: Open MPI on simulated hosts] in tests/cluster/harness.py). The ULFM jobs run under
`mpirun --with-ft ulfm` through tests/cluster/ompi_job.py, which kills mpirun's process tree if it does
not end after its ranks have (a known PRRTE 5.0.x hang, see [Note: Open MPI jobs that lose ranks]): such
a run fails here, saying so.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from cluster.ompi_job import OmpiJob

pytestmark = pytest.mark.system

HERE = os.path.dirname(os.path.abspath(__file__))
ULFM_JOB = os.path.join(HERE, "cluster", "_ulfm_job.py")
PY = sys.executable
TINY = ["--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--block-size", "16", "--batch-size", "4",
        "--steps", "6", "--log-interval", "1", "--lr", "3e-3", "--warmup-steps", "2"]
MPI_ERR_PROC_FAILED, MPI_ERR_PROC_FAILED_PENDING, MPI_ERR_REVOKED = 75, 76, 77  # Open MPI's (mpi-ext.h)
DETECT_LIMIT = 15.0  # seconds from the kill to the last survivor's error, on a loaded 2-core machine


def _train(cluster, mpi, out_dir):
    out, sent = cluster.launch(2, 2, [PY, "-m", "hpcfsdp.cli.main", "train", *TINY, "--out-dir", str(out_dir)],
                               timeout=400, mpi=mpi)
    assert out.returncode == 0, f"train under {mpi} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    with open(out_dir / "metrics.jsonl") as f:
        recs = [json.loads(ln) for ln in f if ln.strip()]
    return [r for r in recs if "loss" in r], sent


@pytest.mark.timeout(900)
def test_train_under_open_mpi_matches_mpich_on_2_hosts_x_2(cluster, ompi_python, tmp_path):
    lib = subprocess.run([ompi_python, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
                         capture_output=True, text=True, timeout=60).stdout
    assert "Open MPI" in lib, lib
    ompi, ompi_sent = _train(cluster, "openmpi", tmp_path / "openmpi")
    mpich, mpich_sent = _train(cluster, "mpich", tmp_path / "mpich")
    assert [r["step"] for r in ompi] == [r["step"] for r in mpich] == list(range(1, 7))
    assert ompi[0]["world_size"] == mpich[0]["world_size"] == 4
    for key in ("loss", "grad_norm", "lr"):
        np.testing.assert_allclose([r[key] for r in ompi], [r[key] for r in mpich], rtol=1e-6, err_msg=key)
    # both jobs crossed the two hosts' links (the gradients' reduce-scatter at least), the other hosts stayed idle
    for sent in (ompi_sent, mpich_sent):
        assert min(sent[:2]) > 100_000 and max(sent[2:]) < 4096, (ompi_sent, mpich_sent)


def _survivors(res):
    return [json.loads(ln.split(" ", 1)[1]) for ln in res.stdout.splitlines() if ln.startswith("SURVIVOR ")]


def _check_shrunk(res, job, dead, limit):
    why = f"(exit {res.returncode}, {res.seconds:.0f} s):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    assert not res.hung, f"mpirun did not end {job.linger:g} s after every rank had: its tree was killed {why}"
    assert not res.timed_out, f"the job did not end within {job.timeout:g} s {why}"
    assert res.returncode == 0 and res.seconds < limit, why
    surv = _survivors(res)
    alive = sorted(set(range(job.size)) - set(dead))
    assert sorted(s["rank"] for s in surv) == alive, why
    assert {s["error_class"] for s in surv} <= {MPI_ERR_PROC_FAILED, MPI_ERR_PROC_FAILED_PENDING, MPI_ERR_REVOKED}, surv
    assert any(s["error_class"] == MPI_ERR_PROC_FAILED for s in surv), surv  # some survivor saw the failure itself
    assert all(s["sums_before_ok"] and s["agreed"] == 1 for s in surv), json.dumps(surv)
    assert all(s["size"] == len(alive) and s["sum"] == sum(alive) for s in surv), surv
    assert sorted(s["new_rank"] for s in surv) == list(range(len(alive))), surv
    assert {s["host"] for s in surv} == set(job.cluster.hosts[:job.nhosts]), surv  # every host kept ranks
    return surv


@pytest.mark.timeout(300)
def test_ulfm_survivors_of_a_self_killed_rank_shrink_across_3_hosts(cluster, ompi_python, tmp_path):
    victim = 3  # the second rank of host 1
    job = OmpiJob(cluster, 3, 2, ["python", ULFM_JOB, str(victim), "40", str(tmp_path)], timeout=240)
    with job:
        assert job.ranks()[victim].host == 1
        res = job.wait()
    surv = _check_shrunk(res, job, [victim], 240)
    killed = float((tmp_path / f"killed{victim}").read_text())
    detect = max(s["seen"] for s in surv) - killed
    print(f"ULFM: kill -> last survivor's error {detect * 1e3:.0f} ms, first "
          f"{(min(s['seen'] for s in surv) - killed) * 1e3:.0f} ms; job {res.seconds:.1f} s")
    assert 0 < detect < DETECT_LIMIT, (detect, surv)


@pytest.mark.timeout(300)
def test_ulfm_survivors_of_a_rank_killed_from_outside_shrink(cluster, ompi_python, tmp_path):
    # nobody kills itself (rank -1): the harness's OmpiJob kills rank 4 (host 2) by its pid
    job = OmpiJob(cluster, 3, 2, ["python", ULFM_JOB, "-1", "0", str(tmp_path)], timeout=240)
    with job:
        ranks = job.ranks()
        assert [ranks[r].host for r in range(6)] == [0, 0, 1, 1, 2, 2], ranks
        job.wait_for(r"^READY \d+$", count=6, timeout=180)  # every rank is in its all-reduce loop
        job.kill_rank(4, after=0.5)
        res = job.wait()
    surv = _check_shrunk(res, job, [4], 240)
    (when, rank, pid, sig), = res.kills
    assert (rank, pid) == (4, ranks[4].pid)
    detect = max(s["seen"] for s in surv) - when
    print(f"ULFM: external kill -> last survivor's error {detect * 1e3:.0f} ms; job {res.seconds:.1f} s")
    assert 0 < detect < DETECT_LIMIT, (detect, surv)
