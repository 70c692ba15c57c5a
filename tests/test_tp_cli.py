"""`hpcfsdp train --tp 2` at 4 ranks (dp=2 x tp=2) trains as `hpcfsdp train` at 2 ranks (dp=2): same data per
data-parallel rank, same losses and gradient norms; bad --tp values are refused."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hpcfsdp.cli.config import ConfigError, TrainConfig

HPC = [sys.executable, "-m", "hpcfsdp.cli.main"]
TINY = ["--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--block-size", "16", "--batch-size", "4",
        "--steps", "6", "--log-interval", "1", "--lr", "3e-3", "--warmup-steps", "2"]


def _train(tmp, n, extra):
    d = os.path.join(tmp, f"run{n}")
    cmd = HPC + ["launch", "-n", str(n), "--timeout", "150", "--", sys.executable, "-m", "hpcfsdp.cli.main",
                 "train", *TINY, "--out-dir", d, *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, timeout=200)
    assert out.returncode == 0, f"{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    with open(os.path.join(d, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return [(r["step"], r["loss"], r["grad_norm"]) for r in recs if "loss" in r]


@pytest.mark.timeout(500)
def test_train_tp2_at_4_ranks_matches_dp2(tmp_path):
    want = _train(str(tmp_path), 2, [])
    got = _train(str(tmp_path), 4, ["--tp", "2"])
    assert [s for s, _, _ in got] == [s for s, _, _ in want] and len(got) == 6
    np.testing.assert_allclose([g[1:] for g in got], [w[1:] for w in want], rtol=2e-4)


@pytest.mark.timeout(500)
def test_train_tp2_sequence_parallel_matches_dp2(tmp_path):
    want = _train(str(tmp_path), 2, [])
    got = _train(str(tmp_path), 4, ["--tp", "2", "--sequence-parallel"])
    assert [s for s, _, _ in got] == [s for s, _, _ in want] and len(got) == 6
    np.testing.assert_allclose([g[1:] for g in got], [w[1:] for w in want], rtol=2e-4)


def test_tp_config_errors():
    with pytest.raises(ConfigError, match="tp=3: must divide the world size 4"):
        TrainConfig(tp=3).validate(4)
    with pytest.raises(ConfigError, match="tp=0: expected a positive integer"):
        TrainConfig(tp=0).validate(4)
    with pytest.raises(ConfigError, match=r"tp=2: must divide n_head=3 \(attention is split by heads\)"):
        TrainConfig(tp=2, n_head=3, n_embd=24).validate(4)
    with pytest.raises(ConfigError, match="sequence_parallel=True: needs tensor parallelism"):
        TrainConfig(sequence_parallel=True).validate(4)
    with pytest.raises(ConfigError, match="tp must divide block_size=9"):
        TrainConfig(tp=2, sequence_parallel=True, block_size=9).validate(4)
    with pytest.raises(ConfigError, match="NO_SHARD"):
        TrainConfig(tp=2, strategy="NO_SHARD").validate(4)
