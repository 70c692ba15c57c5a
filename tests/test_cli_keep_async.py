"""`hpcfsdp train --async-checkpoint --keep-last K`: a background save is linked (and older ones pruned) only once
every rank's save has committed; a job killed with a save in flight leaves `latest` at a complete checkpoint and
resumes bit for bit. See [Note: Keeping the last K] in hpcfsdp/cli/_keep.py."""
import concurrent.futures
import json
import os
import re
import subprocess
import sys

import pytest

from hpcfsdp.cli import _keep
from hpcfsdp.cli import train as train_cli

HPC = [sys.executable, "-m", "hpcfsdp.cli.main"]
TINY = ["--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--block-size", "16", "--batch-size", "4",
        "--steps", "12", "--log-interval", "1", "--lr", "3e-3", "--warmup-steps", "2", "--checkpoint-interval", "2"]


def _job(tmp, args, env=None):
    e = {k: v for k, v in os.environ.items() if k not in (train_cli.CRASH_ENV, train_cli.PROGRESS_ENV)}
    e.update(env or {})
    cmd = HPC + ["launch", "-n", "2", "--timeout", "240", "--", sys.executable, "-m", "hpcfsdp.cli.main", "train", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=e, cwd=tmp, timeout=300)


def _losses(path):
    with open(path) as f:
        return [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, f) if "loss" in r]


def _kept(ckpt):
    """The step checkpoints (links to their committed directories), not the temporaries of unfinished saves."""
    return sorted(n for n in os.listdir(ckpt) if re.fullmatch(r"step-\d{8}", n))


def _step_of(path):
    from hpcfsdp.distributed.checkpoint import read_metadata

    return read_metadata(str(path)).extras["skeleton"]["step"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    r = _job(d, TINY + ["--out-dir", str(d / "run"), "--checkpoint-dir", str(d / "ck")])
    assert r.returncode == 0, r.stdout + r.stderr
    return _losses(d / "run" / "metrics.jsonl")


@pytest.mark.timeout(400)
def test_async_saves_with_keep_last_keep_k_complete_checkpoints(reference, tmp_path):
    d, ckpt = tmp_path / "run", tmp_path / "ck"
    r = _job(tmp_path, TINY + ["--out-dir", str(d), "--checkpoint-dir", str(ckpt), "--async-checkpoint",
                               "--keep-last", "2"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert _kept(ckpt) == ["step-00000010", "step-00000012"]
    assert os.readlink(ckpt / "latest") == "step-00000012" and _step_of(ckpt / "latest") == 12
    assert [_step_of(ckpt / n) for n in _kept(ckpt)] == [10, 12]
    targets = {os.path.basename(os.path.realpath(ckpt / n)) for n in _kept(ckpt)}
    assert {n for n in os.listdir(ckpt) if n not in _kept(ckpt) and n != "latest"} == targets  # nor temporaries
    assert _losses(d / "metrics.jsonl") == reference  # saving in the background changes no step


@pytest.mark.timeout(400)
def test_killed_with_an_async_save_in_flight_resumes_from_a_complete_one_bit_for_bit(reference, tmp_path):
    d, ckpt = tmp_path / "run", tmp_path / "ck"
    args = TINY + ["--out-dir", str(d), "--checkpoint-dir", str(ckpt), "--async-checkpoint", "--keep-last", "2"]
    r = _job(tmp_path, args, env={train_cli.CRASH_ENV: "8"})  # killed right after step 8's save was started
    assert r.returncode == 137, r.stdout + r.stderr
    at = _step_of(ckpt / "latest")  # complete: a save in flight never moves `latest`
    assert at in (6, 8) and os.readlink(ckpt / "latest") == _keep.step_name(at)
    assert all(_step_of(ckpt / n) == int(n[5:]) for n in _kept(ckpt))  # every kept one is complete
    assert len(_kept(ckpt)) >= 2  # the K kept are pruned only after a newer one committed
    r = _job(tmp_path, args + ["--resume"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"at step {at}" in r.stdout
    assert _losses(d / "metrics.jsonl") == reference


# ----------------------------------------------------------------------------------- at 2 ranks, in process


class _Session:
    """A session whose background save finishes when the test says so (rank 0 then writes the step directory)."""

    def __init__(self, directory, comm):
        self.step, self.directory, self.comm, self.futures = 0, directory, comm, []

    def save(self, path, asynchronous=False):
        fut = concurrent.futures.Future()
        self.futures.append((fut, path))
        if not asynchronous:
            self.complete()
            return None
        return fut

    def complete(self, error=None):
        fut, path = self.futures[-1]
        if self.comm.Get_rank() == 0 and error is None:
            os.makedirs(path, exist_ok=True)
        self.comm.Barrier()
        fut.set_exception(error) if error is not None else fut.set_result(None)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_async_save_is_linked_and_older_ones_pruned_only_once_committed(tmp_path):
    import types

    from mpi4py import MPI

    from hpcfsdp.cli.runtime import Agreed

    comm = MPI.COMM_WORLD
    directory = comm.bcast(str(tmp_path), root=0)
    cfg = types.SimpleNamespace(checkpoint_dir=directory, keep_last=1, async_checkpoint=True)
    ctx = types.SimpleNamespace(comm=comm, rank=comm.Get_rank())
    session = _Session(directory, comm)
    ckpts = _keep.CheckpointDir(cfg, ctx, session)
    session.step = 2
    ckpts.save(final=True)  # synchronous: linked at once
    comm.Barrier()
    assert os.readlink(os.path.join(directory, "latest")) == "step-00000002" and ckpts.saved_step == 2
    session.step = 4
    ckpts.save()  # in the background
    assert ckpts.pending() and ckpts.busy()
    comm.Barrier()
    assert _kept(directory) == ["step-00000002"]  # nothing pruned, `latest` unmoved while the save runs
    assert os.readlink(os.path.join(directory, "latest")) == "step-00000002" and ckpts.saved_step == 2
    assert "holds step 2" in ckpts.describe()
    comm.Barrier()  # every rank has looked before rank 0 writes step 4's directory
    session.complete()
    assert not ckpts.busy() and ckpts.pending()
    ckpts.finish()
    comm.Barrier()
    assert os.readlink(os.path.join(directory, "latest")) == "step-00000004" and _kept(directory) == ["step-00000004"]
    assert ckpts.saved_step == 4 and not ckpts.pending()
    # a background save that fails on one rank fails on every rank, and costs nothing already kept
    session.step = 6
    ckpts.save()
    comm.Barrier()
    session.complete(OSError("disk full") if comm.Get_rank() == 1 else None)
    with pytest.raises(Agreed, match="rank 1: checkpoint at step 6 .*disk full"):
        ckpts.finish()
    comm.Barrier()
    assert os.readlink(os.path.join(directory, "latest")) == "step-00000004" and ckpts.saved_step == 4
    assert "step-00000004" in _kept(directory)
