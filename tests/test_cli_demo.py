"""`hpcfsdp demo`: a short run on 4 ranks trains, reports the loss drop and leaves metrics and a checkpoint."""
import json
import math
import os
import re
import subprocess
import sys

from hpcfsdp.cli.demo import DEMO_MODEL, demo_train_args
from hpcfsdp.cli.main import main as hpcfsdp_main


def test_short_demo_trains_and_says_where_everything_is(tmp_path):
    out = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if k not in ("HPCFSDP_PROGRESS", "HPCFSDP_TRAIN_CRASH_AFTER_STEP")}
    res = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "demo", "--steps", "30", "--out-dir", str(out)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    metrics, ckpt = out / "metrics.jsonl", out / "checkpoints" / "latest"
    m = re.search(rf"^loss ([\d.]+) -> ([\d.]+) over steps 1..30; metrics: {re.escape(str(metrics))}; "
                  rf"checkpoint: {re.escape(str(ckpt))} \(step 30\)$", res.stdout, re.M)
    assert m, res.stdout
    first, last = float(m.group(1)), float(m.group(2))
    assert abs(first - math.log(256)) < 0.1 and last < first - 1.0  # byte-level: from uniform to well below
    assert res.stdout.count(" -> ") == 1 and res.stdout.count(str(metrics)) == 1  # the summary once, not twice
    said = res.stdout.splitlines()[-1]
    assert said.startswith("hpcfsdp demo: 30 steps in ") and f"`hpcfsdp checkpoint inspect {ckpt}`" in said, said
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in recs] == [1] + list(range(3, 31, 3))
    assert all(len(r["peak_mem_bytes"]) == 4 for r in recs)
    assert hpcfsdp_main(["checkpoint", "verify", str(ckpt)]) == 0


def test_demo_arguments_describe_a_full_shard_run(tmp_path):
    args = demo_train_args(300, str(tmp_path))
    flags = dict(zip(args[::2], args[1::2]))
    assert flags["--strategy"] == "FULL_SHARD" and flags["--steps"] == "300"
    assert int(flags["--n-embd"]) % int(flags["--n-head"]) == 0
    assert {k: int(flags["--" + k.replace("_", "-")]) for k in DEMO_MODEL} == DEMO_MODEL
    assert flags["--checkpoint-dir"] == os.path.join(str(tmp_path), "checkpoints")


def test_bad_demo_arguments_exit_2(capsys):
    assert hpcfsdp_main(["demo", "--steps", "0"]) == 2
    assert "--steps 0: expected a positive integer" in capsys.readouterr().err
