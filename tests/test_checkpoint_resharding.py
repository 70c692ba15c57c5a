"""Sharded checkpoints across world sizes, through real MPI jobs: save at 4 ranks (FULL_SHARD), load at 4, 2, 1
ranks and into a 2x2 HSDP mesh; parameters and AdamW state equal exactly; training continues identically."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "_ckpt_job.py")


def _launch(n, *args, env=None):
    cmd = [sys.executable, "-m", "hpcfsdp.cli.main", "launch", "-n", str(n), "--timeout", "120", "--",
           sys.executable, JOB, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, f"{' '.join(args)} at {n} ranks failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("ckpt"))
    _launch(4, "save", d)
    return d


def test_save_at_4_load_at_4_continues_bit_for_bit(saved):
    _launch(4, "load", saved)
    cont = json.load(open(os.path.join(saved, "cont.json")))
    loaded = json.load(open(os.path.join(saved, "cont_loaded_4.json")))
    assert loaded == cont


@pytest.mark.parametrize("n", [2, 1])
def test_save_at_4_load_at_fewer_ranks(saved, n):
    _launch(n, "load", saved)
    cont = json.load(open(os.path.join(saved, "cont.json")))
    loaded = json.load(open(os.path.join(saved, f"cont_loaded_{n}.json")))
    np.testing.assert_allclose(loaded, cont, rtol=1e-5)


def test_save_at_4_load_into_2x2_hsdp(saved):
    _launch(4, "load", saved, "hsdp")
    cont = json.load(open(os.path.join(saved, "cont.json")))
    loaded = json.load(open(os.path.join(saved, "cont_loaded_4_hsdp.json")))
    np.testing.assert_allclose(loaded, cont, rtol=1e-5)


def test_checkpoint_cli_reads_it(saved):
    ck = os.path.join(saved, "ckpt")
    out = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "checkpoint", "verify", ck],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "checkpoint", "inspect", "--entries", ck],
                         capture_output=True, text=True, timeout=60)
    assert "model.transformer.wte.weight" in out.stdout and out.returncode == 0
    dst = os.path.join(saved, "full.safetensors")
    out = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "checkpoint", "consolidate", ck, dst],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    from safetensors.numpy import load_file

    full = load_file(dst)  # the model's weights, by parameter name; the optimizer state beside them
    ref = np.load(os.path.join(saved, "ref.npz"))
    np.testing.assert_array_equal(full["transformer.wte.weight"], ref["model/transformer.wte.weight"])
    assert not any(k.startswith(("model.", "optim.")) for k in full)
    optim = load_file(os.path.join(saved, "full.optim.safetensors"))
    assert optim and all(k.startswith("optim.") for k in optim)
