"""`hpcfsdp plan --config FILE`: the run's own config file (as `hpcfsdp train --config` reads it), flags win."""

import json
import os
import subprocess
import sys

import pytest

from hpcfsdp.cli import _stepmodel as sm

HP = [sys.executable, "-m", "hpcfsdp.cli.main"]


def _plan(*args):
    res = subprocess.run(HP + ["plan", "--ranks", "8,16", "--json", *map(str, args)], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    return res


def _rows(res):
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["plan"]


@pytest.mark.timeout(120)
def test_config_file_gives_the_model_batch_precision_and_strategy(tmp_path):
    conf = tmp_path / "run.toml"
    conf.write_text('n_layer = 12\nn_embd = 768\nn_head = 12\nvocab_size = 50304\nblock_size = 1024\n'
                    'batch_size = 4\nmixed_precision = "bf16"\nstrategy = "HYBRID_SHARD"\nmesh = "2x4"\nlr = 6e-4\n')
    got = _rows(_plan("--config", conf))
    same = _rows(_plan("--n-layer", 12, "--n-embd", 768, "--vocab-size", 50304, "--block-size", 1024,
                       "--batch-size", 4, "--precision", "bf16", "--strategies", "HYBRID_SHARD"))
    assert got == same
    assert got["params"] == sm.gpt_shape(50304, 1024, 12, 768, 4).params  # GPT-2 small's 124M shape
    assert {r["strategy"] for r in got["rows"]} == {"HYBRID_SHARD"}


@pytest.mark.timeout(120)
def test_flags_override_the_file_and_the_trainers_defaults_fill_the_rest(tmp_path):
    conf = tmp_path / "run.json"
    conf.write_text(json.dumps({"n_layer": 6, "tie_weights": False, "strategy": "FULL_SHARD"}))
    got = _rows(_plan("--config", conf, "--n-layer", 3, "--strategies", "FULL_SHARD,HYBRID_SHARD"))
    # train's defaults for what the file leaves out: vocab 256, block 64, n_embd 128, batch 8, fp32 (no mixed precision)
    same = _rows(_plan("--n-layer", 3, "--no-tie", "--vocab-size", 256, "--block-size", 64, "--n-embd", 128,
                       "--batch-size", 8, "--precision", "fp32"))
    assert got == same
    assert got["params"] == sm.gpt_shape(256, 64, 3, 128, 8, tie=False).params
    assert _rows(_plan("--config", conf, "--tie"))["params"] == sm.gpt_shape(256, 64, 6, 128, 8).params
    # without --config, plan's own defaults (GPT-3 6.7B) as before
    assert _rows(_plan())["params"] == sm.gpt_shape(50304, 2048, 32, 4096, 2).params


@pytest.mark.timeout(120)
def test_bad_config_files_exit_2_naming_the_key(tmp_path):
    conf = tmp_path / "run.toml"
    conf.write_text("learning_rate = 3e-4\n")
    res = _plan("--config", conf)
    assert res.returncode == 2 and "unknown key 'learning_rate' (did you mean 'lr'?)" in res.stderr, res.stderr
    conf.write_text('strategy = "NO_SHARD"\n')
    res = _plan("--config", conf)
    assert res.returncode == 2 and "strategy='NO_SHARD'" in res.stderr and "--strategies" in res.stderr
    conf.write_text("grad_accum = 4\n")
    res = _plan("--config", conf)
    assert res.returncode == 0 and res.stderr.count("note:") == 1 and "grad_accum=4" in res.stderr, res.stderr
    res = _plan("--config", tmp_path / "missing.toml")
    assert res.returncode == 2 and "cannot read it" in res.stderr
