"""`hpcfsdp train` end to end under mpiexec: strategies, metrics, checkpoints, crash and resume, soak, bad flags."""
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from hpcfsdp.cli import _soak as soak_cli
from hpcfsdp.cli import runtime
from hpcfsdp.cli import train as train_cli
from hpcfsdp.cli.config import METRICS_FIELDS, TrainConfig
from hpcfsdp.cli.main import main as hpcfsdp_main
from hpcfsdp.data import DistributedSampler

HPC = [sys.executable, "-m", "hpcfsdp.cli.main"]
TINY = ["--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--block-size", "16", "--batch-size", "4",
        "--steps", "12", "--log-interval", "1", "--lr", "3e-3", "--warmup-steps", "2"]
LN_VOCAB = math.log(256)  # loss of a uniform prediction over the byte vocabulary: a fresh GPT's loss


def job(tmp, n, args, *, rpn=None, env=None, timeout=120):
    """Run `hpcfsdp launch -n N -- python -m hpcfsdp.cli.main train ARGS`; the CompletedProcess."""
    launch = HPC + ["launch", "-n", str(n), "--timeout", str(timeout)]
    if rpn:
        launch += ["--ranks-per-node", str(rpn)]
    e = {k: v for k, v in os.environ.items() if k not in (train_cli.CRASH_ENV, train_cli.PROGRESS_ENV)}
    e.update(env or {})
    return subprocess.run(launch + ["--", sys.executable, "-m", "hpcfsdp.cli.main", "train", *args],
                          capture_output=True, text=True, env=e, cwd=tmp, timeout=timeout + 30)


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def losses(path):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in records(path) if "loss" in r]


def ok(res):
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    return res


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Training jobs shared by several tests, each run once, on first use."""
    root = tmp_path_factory.mktemp("train")
    cache = {}

    def get(name, n, extra, rpn=None):
        if name not in cache:
            d = root / name
            args = TINY + ["--out-dir", str(d), "--checkpoint-dir", str(d / "ckpt"), "--checkpoint-interval", "4"]
            cache[name] = (d, ok(job(root, n, args + extra, rpn=rpn)))
        return cache[name]

    return get


def check_run(d, world, steps=12):
    """Every logged step has all metrics fields; the loss starts at ln(256) and falls; the checkpoint verifies."""
    recs = [r for r in records(d / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in recs] == list(range(1, steps + 1))
    for r in recs:
        assert set(METRICS_FIELDS) <= r.keys(), sorted(set(METRICS_FIELDS) - r.keys())
        assert len(r["peak_mem_bytes"]) == world and all(p > 0 for p in r["peak_mem_bytes"])
        assert r["tokens_per_s"] > 0 and r["step_time_s"] > 0 and 0 <= r["comm_time_s"] and r["grad_norm"] > 0
        assert r["lr"] == pytest.approx(TrainConfig(lr=3e-3, warmup_steps=2, steps=steps).lr_at(r["step"] - 1))
    assert abs(recs[0]["loss"] - LN_VOCAB) < 0.1  # GPT init (std 0.02): near-uniform predictions
    assert np.mean([r["loss"] for r in recs[-3:]]) < recs[0]["loss"] - 0.3
    assert hpcfsdp_main(["checkpoint", "verify", str(d / "ckpt" / "latest")]) == 0
    from hpcfsdp.distributed.checkpoint import read_metadata

    md = read_metadata(str(d / "ckpt" / "latest"))
    assert md.extras["skeleton"]["step"] == steps and md.world_size == world
    assert md.extras["skeleton"]["sampler"]["position"] > 0
    assert (d / "config.toml").read_text().count("n_layer = 2") == 1
    return recs


# ------------------------------------------------------------------------------------------- end to end


def test_two_ranks_full_shard(runs):
    d, res = runs("fsdp2", 2, [])
    check_run(d, world=2)
    assert "loss 5." in res.stdout and f"checkpoint: {d / 'ckpt' / 'latest'}" in res.stdout


def test_four_ranks_shard_grad_op_with_evaluation(runs):
    d, _ = runs("zero2x4", 4, ["--strategy", "SHARD_GRAD_OP", "--eval-interval", "6", "--eval-iters", "2"])
    check_run(d, world=4)
    vals = [r for r in records(d / "metrics.jsonl") if "val_loss" in r]
    assert [r["step"] for r in vals] == [6, 12]
    assert vals[1]["val_loss"] < vals[0]["val_loss"] < LN_VOCAB


def test_hsdp_2x2_on_simulated_nodes_matches_full_shard(runs):
    d, _ = runs("hsdp", 4, ["--strategy", "HYBRID_SHARD", "--mesh", "2x2"], rpn=2)
    hsdp = check_run(d, world=4)
    d4, _ = runs("zero2x4", 4, ["--strategy", "SHARD_GRAD_OP", "--eval-interval", "6", "--eval-iters", "2"])
    zero2 = [r for r in records(d4 / "metrics.jsonl") if "loss" in r]
    # Same init, same data at world size 4: the strategies differ only in the order of the sums.
    assert [r["loss"] for r in hsdp] == pytest.approx([r["loss"] for r in zero2], rel=1e-4)


def test_sublayer_units_train_like_block_units(runs):
    """--fsdp-units sublayer (each block's MLP a unit of its own) regroups the collectives, not the math."""
    d, _ = runs("sublayer", 2, ["--fsdp-units", "sublayer"])
    sub = check_run(d, world=2)
    d2, _ = runs("fsdp2", 2, [])
    block = [r for r in records(d2 / "metrics.jsonl") if "loss" in r]
    assert [r["loss"] for r in sub] == pytest.approx([r["loss"] for r in block], rel=1e-5)
    assert [r["grad_norm"] for r in sub] == pytest.approx([r["grad_norm"] for r in block], rel=1e-5)


def test_sublayer_units_with_activation_checkpointing(tmp_path):
    d = tmp_path / "ac"
    ok(job(tmp_path, 2, TINY + ["--out-dir", str(d), "--fsdp-units", "sublayer", "--activation-checkpointing"]))
    recs = [r for r in records(d / "metrics.jsonl") if "loss" in r]
    assert len(recs) == 12 and np.mean([r["loss"] for r in recs[-3:]]) < recs[0]["loss"] - 0.3


def test_evaluation_does_not_change_training(runs, tmp_path):
    d, _ = runs("zero2x4", 4, ["--strategy", "SHARD_GRAD_OP", "--eval-interval", "6", "--eval-iters", "2"])
    args = TINY + ["--strategy", "SHARD_GRAD_OP", "--out-dir", str(tmp_path / "r")]
    ok(job(tmp_path, 4, args))
    assert losses(tmp_path / "r" / "metrics.jsonl") == losses(d / "metrics.jsonl")


# ------------------------------------------------------------------------------------------- crash and resume


def test_killed_run_resumes_with_the_same_losses(runs, tmp_path):
    ref_dir, _ = runs("fsdp2", 2, [])
    d = tmp_path / "run"
    args = TINY + ["--out-dir", str(d), "--checkpoint-dir", str(d / "ckpt"), "--checkpoint-interval", "4"]
    crashed = job(tmp_path, 2, args, env={train_cli.CRASH_ENV: "6"})
    assert crashed.returncode != 0 and "exiting hard after step 6" in crashed.stdout
    assert [s for s, _, _ in losses(d / "metrics.jsonl")] == list(range(1, 7))
    from hpcfsdp.distributed.checkpoint import read_metadata

    assert read_metadata(str(d / "ckpt" / "latest")).extras["skeleton"]["step"] == 4  # the interval before 6
    res = ok(job(tmp_path, 2, args + ["--resume"]))
    assert "at step 4" in res.stdout and "over steps 5..12" in res.stdout
    # Steps 5..6 ran twice; the log keeps one record per step, and every value is bit-identical.
    assert losses(d / "metrics.jsonl") == losses(ref_dir / "metrics.jsonl")
    again = ok(job(tmp_path, 2, args + ["--resume"]))
    assert "nothing to train" in again.stdout
    assert losses(d / "metrics.jsonl") == losses(ref_dir / "metrics.jsonl")


def test_resume_at_another_world_size_continues_at_the_step(runs, tmp_path):
    src, _ = runs("fsdp2", 2, [])
    d = tmp_path / "r4"
    ckpt = tmp_path / "ckpt"
    args = TINY + ["--out-dir", str(d), "--checkpoint-dir", str(ckpt), "--steps", "14", "--resume"]
    shutil.copytree(os.path.realpath(src / "ckpt" / "latest"), ckpt / "latest")  # a checkpoint copied by hand
    res = ok(job(tmp_path, 4, args))
    assert "at step 12" in res.stdout
    recs = [r for r in records(d / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in recs] == [13, 14] and len(recs[0]["peak_mem_bytes"]) == 4
    assert recs[0]["loss"] < LN_VOCAB - 0.3  # trained weights, not a fresh model


def test_resume_refuses_another_model(runs, tmp_path):
    src, _ = runs("fsdp2", 2, [])
    args = TINY + ["--out-dir", str(tmp_path / "o"), "--checkpoint-dir", str(src / "ckpt"), "--resume",
                   "--n-layer", "3"]
    res = job(tmp_path, 2, args)
    assert res.returncode == 2
    assert res.stderr.count("n_layer=3, but the checkpoint") == 1, res.stderr  # once per job, by rank 0


def test_failed_resume_names_the_rank_that_failed_and_its_own_error(runs, tmp_path):
    """Rank 1's shard file is damaged: the one error line is rank 1's own, not rank 0's echo of it."""
    src, _ = runs("fsdp2", 2, [])
    ckpt = tmp_path / "ckpt"
    shutil.copytree(os.path.realpath(src / "ckpt" / "latest"), ckpt / "latest")  # a plain directory loads too
    shard = ckpt / "latest" / "rank_00001.safetensors"
    shard.unlink()
    shard.mkdir()
    res = job(tmp_path, 2, TINY + ["--out-dir", str(tmp_path / "o"), "--checkpoint-dir", str(ckpt), "--resume"])
    assert res.returncode == 2, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if "hpcfsdp train: error: " in ln]
    assert len(errors) == 1, res.stderr
    assert errors[0].startswith("hpcfsdp train: error: rank 1: resume from ") and \
        "rank_00001.safetensors is a directory, not a shard file" in errors[0], errors
    assert "another rank" not in res.stderr and "Abort" not in res.stderr


# ------------------------------------------------------------------------------------------- soak


def test_soak_passes(tmp_path):
    d = tmp_path / "soak"
    args = TINY + ["--out-dir", str(d), "--checkpoint-dir", str(d / "ckpt"), "--checkpoint-interval", "3",
                   "--soak", "--log-interval", "4"]
    res = ok(job(tmp_path, 2, args))
    assert "soak PASSED: 4 checkpoint/reload cycles over 12 steps on 2 ranks" in res.stdout
    assert res.stdout.count("equal the uninterrupted run") == 4
    summary = json.loads((d / "soak.json").read_text())
    assert summary["passed"] and summary["cycles"] == 4 and len(summary["rss_bytes"]) == 4


def test_soak_comparison_names_the_first_differing_step():
    ref = [{"step": i + 1, "loss": 5.0 - i / 10, "grad_norm": 1.0} for i in range(6)]
    same = [dict(r) for r in ref[3:]]
    assert soak_cli.compare_to_reference(same, ref) is None
    off = [dict(r) for r in ref[3:]]
    off[1]["loss"] = math.nextafter(off[1]["loss"], 0.0)  # one ulp is a failure: reloads must be exact
    msg = soak_cli.compare_to_reference(off, ref)
    assert msg.startswith("step 5: loss") and "uninterrupted" in msg
    nan = [dict(r, loss=float("nan")) for r in ref[:1]]
    assert "not finite" in soak_cli.compare_to_reference(nan, [dict(r, loss=float("nan")) for r in ref])


# ------------------------------------------------------------------------------------------- bad configuration


@pytest.mark.parametrize("flags,message", [
    (["--strategy", "BAD"], "argument --strategy: invalid choice: 'BAD'"),
    (["--n-head", "3", "--n-embd", "32"], "n_embd=32: expected a multiple of n_head=3"),
    (["--mesh", "3x3"], "mesh='3x3': its size 9 must equal the world size 4"),
    (["--data", "/nonexistent/tokens.bin"], "data='/nonexistent/tokens.bin': no such file"),
    (["--fsdp-units", "layer"], "argument --fsdp-units: invalid choice: 'layer'"),
])
def test_bad_flag_fails_on_every_rank_with_exit_2(tmp_path, flags, message):
    res = job(tmp_path, 4, ["--steps", "2", "--out-dir", str(tmp_path / "o"), *flags], timeout=60)
    assert res.returncode == 2, res.stderr
    # every rank reaches the verdict and exits 2; rank 0 alone prints it: once per job
    assert res.stderr.count("hpcfsdp train: error: ") == 1 and res.stderr.count(message) == 1, res.stderr
    assert "Abort" not in res.stderr and res.stderr.count("usage: hpcfsdp train") <= 1


def test_help_documents_every_flag(capsys):
    with pytest.raises(SystemExit) as e:
        hpcfsdp_main(["train", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for f in dataclasses.fields(TrainConfig):
        assert "--" + f.name.replace("_", "-") in text, f.name
    for word in (train_cli.CRASH_ENV, train_cli.PROGRESS_ENV, "--resume", "exit status", "uninterrupted"):
        assert word in text


# ------------------------------------------------------------------------------------------- pieces


def test_batches_resume_mid_epoch_and_across_epochs():
    class Rows:
        def __len__(self):
            return 10

        def get_batch(self, idx):
            return list(idx), None

    def stream(sampler, n):
        b = runtime.Batches(Rows(), sampler, 3)
        return [b.next()[0] for _ in range(n)]

    full = stream(DistributedSampler(10, 2, 0, seed=7), 8)  # 5 samples per epoch per rank: batches straddle epochs
    for k in range(1, 8):
        s = DistributedSampler(10, 2, 0, seed=7)
        assert stream(s, k) == full[:k]
        t = DistributedSampler(10, 2, 0, seed=7)
        t.load_state_dict(s.state_dict())
        assert stream(t, 8 - k) == full[k:], k
    other = stream(DistributedSampler(10, 2, 1, seed=7), 8)
    flat, flat1 = sum(full, []), sum(other, [])
    for e in range(3):  # disjoint shares that together cover each epoch
        assert sorted(flat[5 * e:5 * e + 5] + flat1[5 * e:5 * e + 5]) == list(range(10))


def test_held_out_windows_share_no_token_with_training():
    cfg = TrainConfig(block_size=16)
    tr, val = runtime.train_val_datasets(cfg)
    assert tr.lo == 0 and val.lo - tr.hi >= cfg.block_size  # last train target index < first val input index
    n = tr.hi + len(val) + cfg.block_size
    assert len(val) == int(n * train_cli.VAL_FRACTION) - cfg.block_size
    x, y = val.get_batch([0])
    assert (x[0, 1:] == y[0, :-1]).all() and (tr.dataset.tokens[val.lo:val.lo + 16] == x[0]).all()


def test_metrics_of_the_lost_run_are_dropped_on_resume(tmp_path):
    p = tmp_path / "m.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0 / s}) for s in range(1, 8)] + [json.dumps({"step": 4, "val_loss": 2})]
    p.write_text("\n".join(lines) + '\n{"step": 8, "lo')  # the last line was cut by the kill
    runtime.trim_metrics(str(p), 4)
    kept = records(p)
    assert [r["step"] for r in kept] == [1, 2, 3, 4, 4] and kept[-1] == {"step": 4, "val_loss": 2}


def test_world_smaller_than_the_srun_step_refuses_to_train(tmp_path):
    # Two srun tasks that each started a one-rank MPI (srun --mpi plugin not matching the MPI): refuse.
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "HPCFSDP_RANK_ENV_PID")}
    env.update(SLURM_PROCID="0", SLURM_STEP_NUM_TASKS="2", SLURM_LOCALID="0")
    res = subprocess.run([sys.executable, "-m", "mpi4py", "-m", "hpcfsdp.cli.main", "train", "--steps", "1",
                          "--out-dir", str(tmp_path / "o")], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "srun started 2 tasks" in res.stderr and "srun --mpi=pmi2" in res.stderr
    assert not (tmp_path / "o").exists()
    assert train_cli.check_slurm_world(2, {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}) is None
    assert train_cli.check_slurm_world(4, {"SLURM_STEP_NUM_TASKS": "8"}) is None  # not in an srun task


def test_checkpoint_inspect_into_a_closed_pipe_ends_quietly(runs):
    d, _ = runs("fsdp2", 2, [])
    for flags in (["--json"], []):
        proc = subprocess.Popen(HPC + ["checkpoint", "inspect", *flags, str(d / "ckpt" / "latest")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc.stdout.close()  # the reader is gone before anything is written, as `| head` once it has its lines
        err = proc.stderr.read()
        proc.wait(timeout=60)
        assert proc.returncode == 0 and "BrokenPipe" not in err and "Traceback" not in err, err


def test_bad_argument_prints_usage_once_per_job(tmp_path):
    res = subprocess.run(HPC + ["launch", "-n", "2", "--", "hpcfsdp", "train", "--bogus"], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.count("usage:") == 1 and res.stderr.count("unrecognized arguments: --bogus") == 1, res.stderr


def test_keep_last_keeps_k_step_checkpoints_and_removes_stale_temporaries(runs, tmp_path):
    from hpcfsdp.distributed.checkpoint import read_metadata

    ref_dir, _ = runs("fsdp2", 2, [])
    d = tmp_path / "run"
    ckpt = d / "ckpt"
    stale = ckpt / ("latest.tmp-" + "ab" * 16)  # left by a writer killed mid-save in an earlier job
    stale.mkdir(parents=True)
    (stale / "shard-00000.safetensors").write_bytes(b"partial")
    os.utime(stale / "shard-00000.safetensors", (1e9, 1e9))
    os.utime(stale, (1e9, 1e9))
    args = TINY + ["--out-dir", str(d), "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "2", "--keep-last", "2"]
    res = ok(job(tmp_path, 2, args))
    assert "removed 1 temporary file(s)" in res.stdout and not stale.exists()
    steps = sorted(n for n in os.listdir(ckpt) if n.startswith("step-") and ".ckpt-" not in n)
    assert steps == ["step-00000010", "step-00000012"]
    assert os.readlink(ckpt / "latest") == "step-00000012"
    assert read_metadata(str(ckpt / "latest")).extras["skeleton"]["step"] == 12
    kept = {os.path.basename(os.path.realpath(ckpt / s)) for s in steps}
    leftovers = {n for n in os.listdir(ckpt) if ".ckpt-" in n} - kept
    assert not leftovers, leftovers  # pruned checkpoints are gone, not just unlinked
    assert losses(d / "metrics.jsonl") == losses(ref_dir / "metrics.jsonl")
    again = ok(job(tmp_path, 2, args + ["--resume", "--steps", "14"]))
    assert "at step 12" in again.stdout
    assert sorted(n for n in os.listdir(ckpt) if n.startswith("step-") and ".ckpt-" not in n) == \
        ["step-00000012", "step-00000014"]


def test_stale_temporaries_spare_a_live_writers_and_recent_ones(tmp_path):
    import time

    from hpcfsdp.cli import _keep

    started = time.time()
    old = time.time() - 3600
    dead = tmp_path / ("latest.tmp-" + "aa" * 16)  # nothing touched it for an hour: its writer is gone
    live = tmp_path / ("latest.tmp-" + "bb" * 16)  # an old directory, but a file in it is being written
    link = tmp_path / ("latest.link-" + "cc" * 16)
    for d in (dead, live):
        d.mkdir()
        (d / "shard-00000.safetensors").write_bytes(b"partial")
        os.utime(d / "shard-00000.safetensors", (old, old))
        os.utime(d, (old, old))
    os.utime(live / "shard-00000.safetensors")  # written just now
    os.symlink("step-00000001", link)
    os.utime(link, (old, old), follow_symlinks=False)
    (tmp_path / "step-00000001").mkdir()  # not a temporary: never touched
    gone = _keep.remove_stale_temporaries(str(tmp_path), started)
    assert sorted(gone) == sorted([dead.name, link.name])
    assert live.exists() and not dead.exists() and not os.path.lexists(link) and (tmp_path / "step-00000001").exists()
    # one touched within QUIET seconds before the job started is left to the next start
    recent = tmp_path / ("latest.tmp-" + "dd" * 16)
    recent.mkdir()
    then = started - _keep.QUIET / 2
    os.utime(recent, (then, then))
    assert _keep.remove_stale_temporaries(str(tmp_path), started) == [] and recent.exists()


def test_resume_without_a_checkpoint_is_an_error_naming_the_path(tmp_path):
    """--resume on a directory that never held a checkpoint (a mistyped --checkpoint-dir) is one error line
    naming it; --resume-if-exists starts from step 0 there (what a requeued Slurm job's first run needs)."""
    base = TINY + ["--steps", "2", "--out-dir", str(tmp_path / "o")]
    res = job(tmp_path, 2, base + ["--checkpoint-dir", str(tmp_path / "chekpoints"), "--resume"])
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    errors = [line for line in res.stderr.splitlines() if "resume: no checkpoint at" in line]
    assert len(errors) == 1 and str(tmp_path / "chekpoints" / "latest") in errors[0], res.stderr
    assert "does not exist (a mistyped --checkpoint-dir?)" in errors[0] and "--resume-if-exists" in errors[0]
    fresh = ok(job(tmp_path, 2, base + ["--checkpoint-dir", str(tmp_path / "ck"), "--resume-if-exists"]))
    assert "no checkpoint at" in fresh.stdout and "starting from step 0" in fresh.stdout


def test_resume_from_a_kept_step(tmp_path):
    """--resume-from step-N continues from that kept checkpoint, not the latest."""
    d, ckpt = tmp_path / "o", tmp_path / "ck"
    args = TINY + ["--out-dir", str(d), "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "2", "--keep-last",
                   "3", "--steps", "6"]
    ok(job(tmp_path, 2, args))
    again = ok(job(tmp_path, 2, args + ["--resume-from", "step-4"]))
    assert f"resumed from {ckpt / 'step-00000004'} at step 4" in again.stdout
    missing = job(tmp_path, 2, args + ["--resume-from", "3"])
    assert missing.returncode != 0 and "no checkpoint at" in missing.stderr
    assert "it holds step-00000002, step-00000004, step-00000006" in missing.stderr, missing.stderr
