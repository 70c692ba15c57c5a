"""`hpcfsdp train --metrics jsonl,tensorboard,wandb` at 2 ranks: every sink holds the JSONL log's values."""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hpcfsdp.cli import _metrics
from hpcfsdp.cli import train as train_cli
from hpcfsdp.cli.config import ConfigError, TrainConfig

HPC = [sys.executable, "-m", "hpcfsdp.cli.main"]
TINY = ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "8", "--batch-size", "2",
        "--steps", "8", "--log-interval", "1", "--warmup-steps", "2"]


def job(tmp, args, *, n=2, env=None, timeout=150):
    e = {k: v for k, v in os.environ.items() if k not in (train_cli.CRASH_ENV, train_cli.PROGRESS_ENV)}
    e.update(env or {})
    return subprocess.run(HPC + ["launch", "-n", str(n), "--timeout", str(timeout), "--", sys.executable, "-m",
                                 "hpcfsdp.cli.main", "train", *args],
                          capture_output=True, text=True, env=e, cwd=tmp, timeout=timeout + 30)


def ok(res):
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    return res


def records(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def tensorboard_scalars(logdir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.mark.timeout(400)
def test_tensorboard_at_two_ranks_holds_the_loss_of_every_step(tmp_path):
    out = tmp_path / "run"
    res = ok(job(tmp_path, TINY + ["--out-dir", str(out), "--metrics", "jsonl,tensorboard", "--eval-interval", "4"]))
    recs = records(out / "metrics.jsonl")
    train = [(r["step"], r["loss"]) for r in recs if "loss" in r]
    assert [s for s, _ in train] == list(range(1, 9))
    tb = tensorboard_scalars(out / "tensorboard", "train/loss")
    assert [s for s, _ in tb] == [s for s, _ in train]
    np.testing.assert_array_equal([v for _, v in tb], np.float32([v for _, v in train]))  # simple_value is float32
    lr = tensorboard_scalars(out / "tensorboard", "train/lr")
    np.testing.assert_allclose([v for _, v in lr], [r["lr"] for r in recs if "loss" in r], rtol=1e-6)
    peak = tensorboard_scalars(out / "tensorboard", "train/peak_mem_bytes")
    assert [v for _, v in peak] == [float(np.float32(max(r["peak_mem_bytes"]))) for r in recs if "loss" in r]
    val = tensorboard_scalars(out / "tensorboard", "val/loss")
    assert val == [(r["step"], float(np.float32(r["val_loss"]))) for r in recs if "val_loss" in r]
    assert [s for s, _ in val] == [4, 8]
    assert f"tensorboard --logdir {out / 'tensorboard'}" in res.stdout
    assert len(glob.glob(str(out / "tensorboard" / "events.out.tfevents.*"))) == 1  # rank 0 only


@pytest.mark.timeout(500)
def test_resumed_run_rewrites_tensorboard_steps_after_the_checkpoint(tmp_path):
    out = tmp_path / "run"
    args = TINY + ["--out-dir", str(out), "--metrics", "tensorboard,jsonl", "--checkpoint-dir", str(out / "ckpt"),
                   "--checkpoint-interval", "4"]
    crashed = job(tmp_path, args, env={train_cli.CRASH_ENV: "6"})
    assert crashed.returncode != 0 and "exiting hard after step 6" in crashed.stdout
    assert [s for s, _ in tensorboard_scalars(out / "tensorboard", "train/loss")] == list(range(1, 7))
    ok(job(tmp_path, args + ["--resume"]))
    train = [(r["step"], r["loss"]) for r in records(out / "metrics.jsonl") if "loss" in r]
    tb = tensorboard_scalars(out / "tensorboard", "train/loss")
    assert [s for s, _ in tb] == list(range(1, 9)) == [s for s, _ in train]  # steps 5, 6 once: the resumed run's
    np.testing.assert_array_equal([v for _, v in tb], np.float32([v for _, v in train]))


@pytest.mark.timeout(500)
def test_wandb_offline_writes_its_run_directory(tmp_path):
    out = tmp_path / "run"
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": "", "WANDB_PROJECT": "hpcfsdp-test"}
    env = {k: v for k, v in env.items() if v}
    ok(job(tmp_path, TINY + ["--out-dir", str(out), "--metrics", "jsonl,wandb"], env=env))
    runs = glob.glob(str(out / "wandb" / "offline-run-*"))
    assert len(runs) == 1, os.listdir(out)  # rank 0 only
    (data,) = glob.glob(os.path.join(runs[0], "run-*.wandb"))
    blob = open(data, "rb").read()
    # The history rows hold each value as JSON text: every logged loss is in the run file, under its key.
    assert b"train/loss" in blob and b"train/tokens_per_s" in blob
    for r in records(out / "metrics.jsonl"):
        assert json.dumps(r["loss"]).encode() in blob, r["loss"]
    assert b"hpcfsdp-test" in blob  # the project


def test_unknown_sink_fails_every_rank_with_a_suggestion(tmp_path):
    res = job(tmp_path, TINY + ["--out-dir", str(tmp_path / "r"), "--metrics", "jsonl,tensorbord"], timeout=60)
    assert res.returncode == 2
    assert res.stderr.count("'tensorbord' is not a metrics sink") == 1 and "did you mean 'tensorboard'" in res.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.timeout(30)
def test_parse_and_check_metrics(monkeypatch):
    assert _metrics.parse_metrics("jsonl") == ("jsonl",)
    assert _metrics.parse_metrics(" tensorboard , wandb") == ("tensorboard", "wandb")
    with pytest.raises(ValueError, match="named twice"):
        _metrics.parse_metrics("jsonl,jsonl")
    with pytest.raises(ValueError, match="expected one or more"):
        _metrics.parse_metrics("")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a))
    with pytest.raises(ConfigError, match=r"wandb is not installed here: pip install wandb"):
        TrainConfig(metrics="jsonl,wandb").validate(1)
    TrainConfig(metrics="tensorboard").validate(1)


@pytest.mark.timeout(30)
def test_scalars_of_a_record():
    rec = {"step": 3, "loss": 2.5, "lr": 1e-3, "peak_mem_bytes": [5, 9], "time": 1.0, "flag": True}
    assert _metrics.scalars(rec) == {"train/loss": 2.5, "train/lr": 1e-3, "train/peak_mem_bytes": 9}
    assert _metrics.scalars({"step": 4, "val_loss": 1.5}) == {"val/loss": 1.5}
