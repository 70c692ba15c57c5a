"""`hpcfsdp train --model gpt|llama [--init-from HF_DIR]` and `hpcfsdp checkpoint export --hf`, against the
transformers fixtures of tests/fixtures/hf (written by transformers itself; see make_fixtures.py)."""
import argparse
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp.cli.config import ConfigError, TrainConfig, add_config_arguments, config_from_args
from hpcfsdp.data import TokenFileWriter
from hpcfsdp.models import GPT, Llama
from hpcfsdp.models import _hf

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf")
HPC = [sys.executable, "-m", "hpcfsdp.cli.main"]
# (class, fixture, logits, vocabulary): the committed transformers models
CASES = {"llama": (Llama, "llama", "llama_logits.npy", 101), "gpt": (GPT, "gpt2", "gpt2_logits.npy", 97)}


def _cfg(argv):
    p = argparse.ArgumentParser(prog="hpcfsdp train")
    add_config_arguments(p)
    return config_from_args(p.parse_args(argv))


def _tokens(path, vocab, n=4000, seed=0):
    with TokenFileWriter(str(path), vocab_size=vocab) as w:
        w.write(np.random.default_rng(seed).integers(0, vocab, n))
    return str(path)


def _file_tensors(path):
    ck = _hf.HFCheckpoint(str(path))
    return {k: ck.read(k) for k in ck.keys()}


def _inputs():
    return hp.tensor(np.load(os.path.join(FIX, "inputs.npy")))


# ------------------------------------------------------------------------------------------- configuration


@pytest.mark.timeout(60)
def test_init_from_fills_the_model_keys_from_config_json():
    cfg = _cfg(["--model", "llama", "--init-from", os.path.join(FIX, "llama")])
    with pytest.raises(ConfigError, match="vocab_size=101: the shipped byte-level corpus needs vocab_size >= 256"):
        cfg.validate(2)  # the model's vocabulary, from config.json, is checked against the data
    cfg = _cfg(["--model", "llama", "--init-from", os.path.join(FIX, "llama"), "--data", "tokens.bin"])
    cfg.validate(2)
    assert (cfg.model, cfg.vocab_size, cfg.n_layer, cfg.n_head, cfg.n_kv_head, cfg.n_embd, cfg.intermediate_size,
            cfg.head_dim, cfg.rms_norm_eps, cfg.rope_theta, cfg.bias, cfg.tie_weights) == \
        ("llama", 101, 2, 4, 2, 16, 40, 4, 1e-6, 500.0, False, False)
    assert cfg.block_size == 64  # the training window: the default, within the model's 64 positions
    gpt = _cfg(["--init-from", os.path.join(FIX, "gpt2"), "--data", "tokens.bin"])  # --model from model_type
    gpt.validate(1)
    assert (gpt.model, gpt.vocab_size, gpt.block_size, gpt.gelu_approximate, gpt.tie_weights) == \
        ("gpt", 97, 32, "tanh", True)  # block_size: at most GPT-2's n_positions (32)
    again = TrainConfig.from_dict(cfg.to_dict())  # what config.toml and the checkpoint hold
    assert again == cfg


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv,fragment", [
    (["--model", "gpt", "--init-from", "llama"], "model='gpt', but init_from="),
    (["--init-from", "llama", "--n-layer", "3"], "n_layer=3, but init_from="),
    (["--init-from", "llama", "--n-kv-head", "4"], "has n_kv_head=2 (its config.json)"),
    (["--init-from", "gpt2", "--block-size", "64"], "block_size=64: longer than the 32 positions"),
    (["--init-from", "nowhere"], "no config.json"),
])
def test_init_from_conflicts_are_one_line(argv, fragment):
    argv = [os.path.join(FIX, a) if i and argv[i - 1] == "--init-from" else a for i, a in enumerate(argv)]
    with pytest.raises(ConfigError, match="init_from|positions") as info:
        _cfg(argv)
    assert fragment in str(info.value) and "\n" not in str(info.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kw,fragment", [
    (dict(n_kv_head=2), "n_kv_head=2: a setting of model 'llama', but model='gpt' (--model llama"),
    (dict(model="llama", gelu_approximate="tanh"), "gelu_approximate='tanh': a setting of model 'gpt'"),
    (dict(model="lama"), "model='lama': expected one of gpt, llama (did you mean 'llama'?)"),
    (dict(model="llama", n_kv_head=3), "n_head (4) must be a multiple of n_kv_head (3)"),
    (dict(model="llama", rope_theta=-1.0), "rope_theta=-1.0: expected a finite number > 0"),
    (dict(model="llama", n_kv_head=1, tp=2), "tp=2: must divide n_kv_head=1"),
])
def test_model_keys_are_validated(kw, fragment):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**kw).validate(2)
    assert fragment in str(info.value)


@pytest.mark.timeout(60)
def test_model_keys_of_other_trainers_get_a_hint(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('model = "llama"\nnum_key_value_heads = 2\ninitial_load_path = "x"\n')
    with pytest.raises(ConfigError) as info:
        _cfg(["--config", str(f)])
    assert "'num_key_value_heads' (did you mean 'n_kv_head'?)" in str(info.value)
    assert "'initial_load_path' (did you mean 'init_from'?)" in str(info.value)
    f.write_text('model = "llama"\nn_kv_head = 2\n')
    cfg = _cfg(["--config", str(f)])
    cfg.validate(1)
    assert (cfg.model, cfg.n_kv_head, cfg.bias) == ("llama", 2, None)  # bias: Llama's own default (none)


# ------------------------------------------------------------------------------------------- step 0


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["llama", "gpt"])
def test_trainers_model_at_step_0_reproduces_transformers_logits(kind, tmp_path, monkeypatch):
    """The model `hpcfsdp train --model K --init-from FIXTURE` builds (sharded over the ranks, each rank reading
    only its slices) computes transformers' logits."""
    from hpcfsdp.cli.runtime import Context, Session
    from hpcfsdp.distributed.tensor import DTensor

    cls, name, ref, vocab = CASES[kind]
    cfg = _cfg(["--model", kind, "--init-from", os.path.join(FIX, name), "--data", _tokens(tmp_path / "t.bin", vocab),
                "--batch-size", "2"])
    import hpcfsdp.distributed as dist

    if dist.is_initialized():  # Context starts the default group, as the trainer does
        dist.destroy_process_group()
    reads, orig = [], _hf.HFCheckpoint.read

    def spy(self, tname, bounds=None):
        arr = orig(self, tname, bounds)
        reads.append((self.shape(tname), arr.shape))
        return arr

    monkeypatch.setattr(_hf.HFCheckpoint, "read", spy)
    try:
        ctx = Context(cfg)
        session = Session(cfg, ctx)
        monkeypatch.undo()
        # streamed into the shards: about 1/world of the weights read here, no tensor whole
        total, got = sum(int(np.prod(full)) for full, _ in reads), sum(int(np.prod(piece)) for _, piece in reads)
        assert got <= -(-total // ctx.world) + 64 * len(reads), (got, total)
        assert all(np.prod(piece) < np.prod(full) for full, piece in reads if max(full) >= ctx.world), reads
        model = session.model.eval()
        assert isinstance(model, cls) and all(isinstance(p, DTensor) for p in model.parameters())
        with hp.no_grad():
            logits, _ = model(_inputs())
    finally:
        dist.destroy_process_group()
    want = np.load(os.path.join(FIX, ref))
    assert logits.shape == want.shape
    np.testing.assert_allclose(logits.numpy(), want, rtol=0, atol=1e-5)
    assert session.model_config["model"] == kind and session.hf_config == _hf.read_config(os.path.join(FIX, name))


# ------------------------------------------------------------------------------------------- end to end


def _train(cwd, args, timeout=200):
    res = subprocess.run(HPC + ["launch", "-n", "2", "--timeout", str(timeout), "--", sys.executable, "-m",
                                "hpcfsdp.cli.main", "train", "--batch-size", "2", "--log-interval", "1",
                                "--out-dir", "run", "--checkpoint-dir", "run/ckpt", *args],
                         capture_output=True, text=True, cwd=cwd, timeout=timeout + 40)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return res


def _export(cwd, out="hf"):
    res = subprocess.run(HPC + ["checkpoint", "export", "--hf", out, "run/ckpt/latest"], capture_output=True,
                         text=True, cwd=cwd, timeout=120)
    assert res.returncode == 0 and res.stdout.startswith("wrote "), res.stdout + res.stderr
    return cwd / out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["llama", "gpt"])
def test_train_from_hf_then_export_writes_the_transformers_layout(kind, tmp_path):
    """--init-from FIXTURE, one step at lr 0 (the weights stay those of step 0), export --hf: the key names, shapes,
    dtypes, bytes and config.json fields of the transformers fixture; from_pretrained reads it back bit for bit and
    reproduces transformers' logits."""
    cls, name, ref, vocab = CASES[kind]
    src = os.path.join(FIX, name)
    _tokens(tmp_path / "t.bin", vocab)
    _train(tmp_path, ["--model", kind, "--init-from", src, "--data", "t.bin", "--steps", "1", "--lr", "0",
                      "--min-lr", "0", "--weight-decay", "0", "--grad-clip", "0"])
    out = _export(tmp_path)
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]  # no tokenizer: a raw token file
    want, got = _file_tensors(src), _file_tensors(out)
    assert sorted(got) == sorted(want)  # transformers' names (GPT-2: the tied head not stored)
    for k in want:
        assert (got[k].dtype, got[k].shape) == (want[k].dtype, want[k].shape), k
        assert got[k].tobytes() == want[k].tobytes(), k
    fixture_cfg, exported_cfg = _hf.read_config(src), _hf.read_config(str(out))
    assert {k: exported_cfg.get(k) for k in fixture_cfg} == fixture_cfg
    again = cls.from_pretrained(str(out)).eval()
    orig = cls.from_pretrained(src)
    assert again.config == orig.config
    for (n, p), (_, q) in zip(orig.named_parameters(), again.named_parameters()):
        assert p.detach().numpy().tobytes() == q.detach().numpy().tobytes(), n
    with hp.no_grad():
        logits, _ = again(_inputs())
    np.testing.assert_allclose(logits.numpy(), np.load(os.path.join(FIX, ref)), rtol=0, atol=1e-5)


@pytest.mark.timeout(300)
def test_fresh_llama_trains_and_exports_with_its_tokenizer(tmp_path):
    """--model llama with Llama's own keys on BPE data: the loss falls; the export carries the tokenizer and
    transformers' config.json fields, and loads back as the checkpoint's weights, bit for bit."""
    from hpcfsdp.cli.generate import load_checkpoint
    from hpcfsdp.cli.main import main
    from hpcfsdp.data import default_corpus

    pytest.importorskip("tokenizers")
    assert main(["data", "prepare", default_corpus(), "--out", str(tmp_path / "data"), "--vocab-size", "300",
                 "--no-progress"]) == 0
    _train(tmp_path, ["--model", "llama", "--data", "data", "--vocab-size", "300", "--n-layer", "2", "--n-head", "4",
                      "--n-kv-head", "2", "--n-embd", "32", "--intermediate-size", "48", "--rope-theta", "500",
                      "--block-size", "16", "--steps", "8", "--lr", "3e-3", "--warmup-steps", "1"])
    recs = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl") if '"loss"' in line]
    assert recs[-1]["loss"] < recs[0]["loss"] - 0.2
    out = _export(tmp_path)
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (out / "tokenizer.json").read_text() == (tmp_path / "data" / "tokenizer.json").read_text()
    exported = _hf.read_config(str(out))
    transformers_keys = set(_hf.read_config(os.path.join(FIX, "llama"))) - {"transformers_version", "pad_token_id"}
    assert transformers_keys <= set(exported), sorted(transformers_keys - set(exported))
    assert (exported["num_key_value_heads"], exported["intermediate_size"], exported["rope_parameters"]["rope_theta"],
            exported["vocab_size"]) == (2, 48, 500.0, 300)
    eot = json.loads((tmp_path / "data" / "tokenizer.json").read_text())["added_tokens"][0]["id"]
    assert exported["bos_token_id"] == exported["eos_token_id"] == eot
    trained, _, tok = load_checkpoint(str(tmp_path / "run" / "ckpt" / "latest"))
    again = Llama.from_pretrained(str(out))
    assert dataclasses.asdict(again.config) == dataclasses.asdict(trained.config)
    for (n, p), (_, q) in zip(trained.named_parameters(), again.named_parameters()):
        assert p.detach().numpy().tobytes() == q.detach().numpy().tobytes(), n
    assert tok.vocab_size == 300


@pytest.mark.timeout(60)
def test_checkpoints_from_before_model_config_rebuild_a_gpt_and_others_are_refused(tmp_path, capsys):
    from mpi4py import MPI

    from hpcfsdp.cli._model import model_from_saved
    from hpcfsdp.cli.main import main
    from hpcfsdp.distributed.checkpoint import _format as F

    old = {"vocab_size": 256, "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, "dropout": 0.1,
           "bias": True, "tie_weights": False, "seed": 1}  # a config saved before `model` and `model_config`
    m = model_from_saved({"config": old})
    assert isinstance(m, GPT) and (m.config.n_embd, m.config.tie_weights, m.config.dropout) == (16, False, 0.0)
    w = np.ones((2, 2), np.float32)
    F.save_pieces(str(tmp_path / "ck"), {"w": F.Piece(w.shape, w.dtype, (0, 0), w)}, comm=MPI.COMM_SELF)
    assert main(["checkpoint", "export", "--hf", str(tmp_path / "hf"), str(tmp_path / "ck")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no training configuration" in err and not (tmp_path / "hf").exists()
