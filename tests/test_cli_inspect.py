"""`hpcfsdp checkpoint inspect` on a checkpoint `hpcfsdp train` wrote at 2 ranks: a header first, entries on request."""

import datetime
import json
import os
import subprocess
import sys
import time

import pytest

from hpcfsdp.distributed.checkpoint import read_metadata

HP = [sys.executable, "-m", "hpcfsdp.cli.main"]
MODEL = {"vocab_size": 256, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32, "dropout": 0.0,
         "bias": False, "tie_weights": True}


def _env():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "HPCFSDP_RANK_ENV_PID")}
    return dict(env, PYTHONPATH=os.pathsep.join(sys.path))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("inspect")
    before = time.time()
    res = subprocess.run(HP + ["launch", "-n", "2", "--", sys.executable, "-m", "hpcfsdp.cli.main", "train",
                               "--vocab-size", "256", "--block-size", "16", "--n-layer", "2", "--n-head", "2",
                               "--n-embd", "32", "--no-bias", "--batch-size", "2", "--steps", "3",
                               "--checkpoint-dir", str(d / "ckpt"), "--out-dir", str(d / "out")],
                         capture_output=True, text=True, timeout=300, env=_env())
    assert res.returncode == 0, res.stderr
    return d / "ckpt" / "latest", before, time.time()


def _inspect(*args):
    res = subprocess.run(HP + ["checkpoint", "inspect", *map(str, args)], capture_output=True, text=True,
                         timeout=60, env=_env())
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.timeout(300)
def test_header_first_entries_only_on_request(trained):
    path, before, after = trained
    md = read_metadata(str(path))
    out = _inspect(path)
    lines = out.splitlines()
    assert len(lines) <= 12, out  # a header, not ~160 entry lines and a 20 KB line
    assert max(map(len, lines)) < 300, out
    fields = dict(ln.split(": ", 1) for ln in lines)
    assert fields["step"] == "3"
    assert fields["world size"].startswith("2 rank(s)")
    assert fields["model"].startswith("model=gpt " + " ".join(f"{k}={v}" for k, v in MODEL.items()))
    saved = datetime.datetime.strptime(fields["saved"].rsplit(" ", 1)[0], "%Y-%m-%d %H:%M:%S")
    assert before - 1 <= saved.timestamp() <= after + 1  # local time, as printed
    on_disk = sum(os.path.getsize(os.path.join(md.path, f)) for f in os.listdir(md.path))
    assert fields["size on disk"].startswith(f"{on_disk} bytes (")
    assert f") in {len(os.listdir(md.path))} file(s)" in fields["size on disk"]
    assert f"entries: {len(md.entries)} " in out and "--entries lists them" in out
    assert not any(name in out for name in md.entries)
    full = _inspect(path, "--entries")
    assert full.startswith(out)  # the same header, then one line per entry
    rows = full[len(out):].splitlines()
    assert [r.split()[0] for r in rows] == list(md.entries)
    shape = list(md.entries["model.transformer.wte.weight"].shape)
    assert str(shape) in next(r for r in rows if r.split()[0] == "model.transformer.wte.weight")


@pytest.mark.timeout(300)
def test_json_keeps_the_metadata_and_adds_the_header(trained):
    path, before, after = trained
    md = read_metadata(str(path))
    doc = json.loads(_inspect(path, "--json"))
    assert doc["entries"].keys() == md.entries.keys() and doc["world_size"] == 2  # the metadata, as before
    s = doc["summary"]
    assert s["step"] == 3 and s["world_size"] == 2 and s["model"]["model"] == "gpt"
    assert {k: s["model"][k] for k in MODEL} == MODEL  # the built model's config, every field resolved
    assert before - 1 <= datetime.datetime.fromisoformat(s["saved"]).timestamp() <= after + 1
    assert s["size_on_disk_bytes"] == sum(os.path.getsize(os.path.join(md.path, f)) for f in os.listdir(md.path))
    n = sum(int(__import__("math").prod(e.shape)) for k, e in md.entries.items() if k.startswith("model."))
    assert s["parameters"] == n and s["entries"] == len(md.entries)
