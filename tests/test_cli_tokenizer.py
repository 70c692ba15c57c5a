"""The tokenizer travels with every checkpoint: `data prepare` (BPE) -> `train` at 2 ranks -> `generate CKPT`."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from hpcfsdp.cli.generate import load_checkpoint
from hpcfsdp.cli.main import main
from hpcfsdp.data import default_corpus
from hpcfsdp.data.tokenizer_spec import load_tokenizer, tokenizer_spec

tokenizers = pytest.importorskip("tokenizers")

HPC = [sys.executable, "-m", "hpcfsdp.cli.main"]
TINY = ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "16", "--batch-size", "2",
        "--steps", "3", "--log-interval", "1"]
VOCAB = 400


def _train(cwd, args):
    res = subprocess.run(HPC + ["launch", "-n", "2", "--timeout", "200", "--", sys.executable, "-m",
                                "hpcfsdp.cli.main", "train", *TINY, *args],
                         capture_output=True, text=True, cwd=cwd, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return res


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A BPE data set and a 2-rank training run on it, made once."""
    root = tmp_path_factory.mktemp("tok")
    assert main(["data", "prepare", default_corpus(), "--out", str(root / "data"), "--vocab-size", str(VOCAB),
                 "--no-progress"]) == 0
    _train(root, ["--data", "data", "--vocab-size", str(VOCAB), "--out-dir", "run", "--checkpoint-dir", "run/ckpt"])
    return root


@pytest.mark.timeout(300)
def test_generate_decodes_with_the_tokenizer_data_prepare_wrote(prepared, tmp_path, capsys):
    tok_file = prepared / "data" / "tokenizer.json"
    ref = tokenizers.Tokenizer.from_file(str(tok_file))  # the reference: Hugging Face's own reader of the file
    assert ref.get_vocab_size() == VOCAB
    # the checkpoint holds the file's text; copied elsewhere without the data, it still decodes its samples
    ckpt = tmp_path / "moved"
    shutil.copytree(os.path.realpath(prepared / "run" / "ckpt" / "latest"), ckpt)
    meta = json.loads((ckpt / "metadata.json").read_text())
    saved = meta["extras"]["skeleton"]["tokenizer"]
    assert saved["json"] == tok_file.read_text() and saved["type"] == "bpe" and saved["vocab_size"] == VOCAB
    assert saved["eot_id"] == ref.token_to_id("<|endoftext|>")
    assert meta["extras"]["skeleton"]["model_config"]["model"] == "gpt"
    capsys.readouterr()
    prompt = "The quick "
    assert main(["generate", str(ckpt), "--prompt", prompt, "--max-new-tokens", "20", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    # greedy continuation computed independently: the trained weights, the prompt encoded and decoded by `tokenizers`
    model, source, _ = load_checkpoint(str(ckpt))
    assert source == "hpcfsdp" and model.config.vocab_size == VOCAB
    import hpcfsdp as hp

    ids = np.asarray(ref.encode(prompt).ids, dtype=np.int64)[None]
    got = model.eval().generate(hp.tensor(ids), 20, temperature=0)[0].numpy()
    assert got.max() >= 256  # beyond bytes: the byte fallback could not have decoded this
    assert out == ref.decode(got.tolist()) + "\n"
    assert out.startswith(prompt)


@pytest.mark.timeout(300)
def test_an_id_outside_the_tokenizer_is_one_line(prepared, tmp_path, capsys):
    """A token file without sidecar says nothing of its tokenizer: the checkpoint carries none, generate assumes
    bytes and the model (vocabulary 400) samples ids beyond 255: one line naming the id and both vocabularies."""
    shutil.copy(prepared / "data" / "shard_00000.bin", tmp_path / "raw.bin")  # no .json sidecar
    _train(tmp_path, ["--data", "raw.bin", "--data-dtype", "uint16", "--vocab-size", str(VOCAB), "--out-dir", "run",
                      "--checkpoint-dir", "ckpt"])
    capsys.readouterr()
    code = main(["generate", str(tmp_path / "ckpt" / "latest"), "--prompt", "ab", "--max-new-tokens", "60",
                 "--temperature", "2", "--top-k", "0", "--seed", "3"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("hpcfsdp generate: token id ") and "byte-level, vocabulary 256" in err, err
    bad = int(err.split("token id ")[1].split()[0])
    assert 256 <= bad < VOCAB and f"the model's vocabulary is {VOCAB}" in err and "--tokenizer FILE" in err
    # and with the tokenizer given, the same checkpoint decodes
    assert main(["generate", str(tmp_path / "ckpt" / "latest"), "--prompt", "ab", "--max-new-tokens", "5",
                 "--tokenizer", str(prepared / "data" / "tokenizer.json")]) == 0


@pytest.mark.timeout(120)
def test_the_saved_tokenizer_refuses_ids_beyond_its_vocabulary(prepared):
    spec = tokenizer_spec(str(prepared / "data"))
    tok = load_tokenizer(spec)
    ref = tokenizers.Tokenizer.from_file(str(prepared / "data" / "tokenizer.json"))
    ids = ref.encode("Hello, world").ids
    assert tok.vocab_size == VOCAB and tok.encode("Hello, world").tolist() == ids
    assert tok.decode(ids) == ref.decode(ids)
    with pytest.raises(ValueError, match=rf"token id {VOCAB} is outside the tokenizer \(BPE tokenizer.json, "
                                         rf"vocabulary {VOCAB}: ids 0..{VOCAB - 1}\)"):
        tok.decode([1, VOCAB, 2])
    assert tokenizer_spec(None) == {"type": "byte", "vocab_size": 256}
    byte = load_tokenizer(tokenizer_spec(None))
    assert byte.decode(byte.encode("héllo")) == "héllo"
    with pytest.raises(ValueError, match="token id -1 is outside the tokenizer"):
        byte.decode([-1])


@pytest.mark.timeout(300)
def test_resume_refuses_data_of_another_tokenizer(prepared, tmp_path):
    assert main(["data", "prepare", default_corpus(), "--out", str(tmp_path / "bytes"), "--tokenizer", "byte",
                 "--no-progress"]) == 0
    shutil.copytree(os.path.realpath(prepared / "run" / "ckpt" / "latest"), tmp_path / "ckpt" / "latest")
    res = subprocess.run(HPC + ["launch", "-n", "2", "--timeout", "200", "--", sys.executable, "-m",
                                "hpcfsdp.cli.main", "train", *TINY, "--steps", "6", "--data", "bytes", "--vocab-size",
                                str(VOCAB), "--out-dir", "run", "--checkpoint-dir", "ckpt", "--resume"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=240)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-3000:]
    assert res.stderr.count("was written with another tokenizer (byte, vocabulary 256) than the checkpoint") == 1, \
        res.stderr
    assert f"(bpe, vocabulary {VOCAB})" in res.stderr
