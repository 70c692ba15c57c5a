"""Token files with sidecars, sharded memory-mapped datasets, vocabulary checks, and `hpcfsdp data prepare`."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hpcfsdp.cli.data import prepare, stdlib_dir
import hpcfsdp.data
from hpcfsdp.data import ShardedTokenDataset, TokenFileWriter, open_token_data
from hpcfsdp.data.tokenfile import build_token_file, read_sidecar, sidecar_path


def test_build_token_file_lives_with_the_token_files():
    import hpcfsdp.data.tokenizer as tokenizer

    assert hpcfsdp.data.build_token_file is build_token_file  # the package's name is the same function
    assert build_token_file.__module__ == "hpcfsdp.data.tokenfile" and not hasattr(tokenizer, "build_token_file")


def test_build_token_file_writes_a_sidecar(tmp_path):
    (tmp_path / "t.txt").write_text("héllo world\n" * 10, encoding="utf-8")
    n = build_token_file(tmp_path / "t.txt", tmp_path / "t.bin")
    meta = read_sidecar(tmp_path / "t.bin")
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 256 and meta["num_tokens"] == n
    assert meta["max_id"] == max("héllo world\n".encode())
    ds = open_token_data(tmp_path / "t.bin", 8)  # dtype from the sidecar
    assert isinstance(ds.tokens, np.memmap) and ds.dtype == np.uint16
    x, y = ds.get_batch([0])
    assert bytes(x[0].astype(np.uint8)) == "héllo world\n".encode()[:8]


def test_dtype_mismatch_and_missing_sidecar_are_refused(tmp_path):
    (tmp_path / "t.txt").write_text("abcdefghij" * 10)
    build_token_file(tmp_path / "t.txt", tmp_path / "t.bin")
    with pytest.raises(ValueError, match="holds uint16 tokens .* but --data-dtype uint8 was asked for"):
        open_token_data(tmp_path / "t.bin", 4, dtype="uint8")
    assert open_token_data(tmp_path / "t.bin", 4, dtype="uint16").dtype == np.uint16
    os.remove(sidecar_path(tmp_path / "t.bin"))
    with pytest.raises(ValueError, match="has no sidecar .* pass --data-dtype"):
        open_token_data(tmp_path / "t.bin", 4)
    assert len(open_token_data(tmp_path / "t.bin", 4, dtype="uint16")) == 100 - 4


def test_truncated_file_is_an_error(tmp_path):
    with TokenFileWriter(tmp_path / "a.bin", vocab_size=1000) as w:
        w.write(np.arange(100))
    with open(tmp_path / "a.bin", "r+b") as f:
        f.truncate(150)
    with pytest.raises(ValueError, match="has 150 bytes but its sidecar says 100 uint16 tokens"):
        open_token_data(tmp_path / "a.bin", 4)


def test_vocabulary_checks(tmp_path):
    with TokenFileWriter(tmp_path / "a.bin", vocab_size=1000) as w:
        w.write(np.arange(300))
    with pytest.raises(ValueError, match="token id 299 .* outside the model's vocabulary: vocab_size=256"):
        open_token_data(tmp_path / "a.bin", 4, vocab_size=256)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        with TokenFileWriter(tmp_path / "b.bin", vocab_size=10) as w:
            w.write(np.array([3, 10]))
    assert not os.path.exists(tmp_path / "b.bin")  # nothing half-written is left
    # a raw file without a sidecar: checked batch by batch
    np.arange(300, dtype=np.uint16).tofile(tmp_path / "raw.bin")
    ds = open_token_data(tmp_path / "raw.bin", 4, dtype="uint16", vocab_size=256)
    ds.get_batch([0, 10])
    with pytest.raises(ValueError, match=r"token id 257 in window 253 .*\(vocab_size=256\)"):
        ds.get_batch([0, 253])


def test_uint8_files_are_memory_mapped(tmp_path):
    (np.arange(200) % 256).astype(np.uint8).tofile(tmp_path / "b.bin")
    ds = open_token_data(tmp_path / "b.bin", 16, dtype="uint8")
    assert isinstance(ds.tokens, np.memmap) and ds.tokens.dtype == np.uint8
    x, y = ds.get_batch([5])
    np.testing.assert_array_equal(x[0], np.arange(5, 21))
    np.testing.assert_array_equal(y[0], np.arange(6, 22))


def test_sharded_dataset_windows_stay_inside_shards(tmp_path):
    sizes = [50, 37, 64]
    start = 0
    for i, n in enumerate(sizes):
        with TokenFileWriter(tmp_path / f"s{i}.bin", vocab_size=1000) as w:
            w.write(np.arange(start, start + n))
        start += n
    ds = open_token_data(tmp_path, 8)
    assert isinstance(ds, ShardedTokenDataset) and len(ds) == sum(n - 8 for n in sizes)
    x, y = ds.get_batch(np.arange(len(ds)))
    assert np.all(np.diff(x, axis=1) == 1) and np.all(y == x + 1)  # consecutive ids: no window crosses shards
    firsts = sorted(set(x[:, 0]))
    assert 0 in firsts and 50 in firsts and 87 in firsts and 49 - 8 + 1 not in firsts
    with pytest.raises(IndexError):
        ds.get_batch([len(ds)])


def test_prepare_bytes_is_lossless(tmp_path):
    (tmp_path / "in").mkdir()
    texts = {"a.txt": "first file ü\n", "b.txt": "second\nfile\n" * 3}
    for k, v in texts.items():
        (tmp_path / "in" / k).write_text(v, encoding="utf-8")
    (tmp_path / "in" / "bad.txt").write_bytes(b"\xff\xfe not utf-8")
    s = prepare([str(tmp_path / "in")], str(tmp_path / "out"), tokenizer="byte", shard_tokens=10, progress=False)
    assert s["vocab_size"] == 256 and s["skipped_not_utf8"] == [str(tmp_path / "in" / "bad.txt")]
    ids = np.concatenate([open_token_data(tmp_path / "out" / f, 1).tokens for f in s["shards"]])
    assert bytes(ids.astype(np.uint8)) == "".join(texts[k] for k in sorted(texts)).encode()
    assert len(s["shards"]) == -(-len(ids) // 10)


@pytest.mark.timeout(300)
def test_prepare_bpe_round_trips_the_text(tmp_path):
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer

    src = os.path.join(stdlib_dir(), "json")
    s = prepare([src], str(tmp_path / "out"), vocab_size=400, pattern="*.py", progress=False)
    assert s["tokenizer"]["type"] == "bpe" and s["vocab_size"] == 400
    tok = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    ids = np.concatenate([open_token_data(tmp_path / "out" / f, 1, vocab_size=400).tokens for f in s["shards"]])
    eot = s["tokenizer"]["eot_id"]
    docs = np.split(ids, np.nonzero(ids == eot)[0] + 1)
    files = sorted(os.path.join(d, n) for d, _, ns in os.walk(src) for n in ns if n.endswith(".py"))
    assert len(docs) - 1 == len(files) == s["files"]
    for f, d in zip(files, docs):
        with open(f, encoding="utf-8") as fh:
            assert tok.decode(d[:-1].tolist()) == fh.read(), f  # byte-level BPE is lossless
    assert s["tokens"] < 0.6 * s["bytes"]  # and compresses Python code


@pytest.mark.timeout(600)
def test_prepare_then_train_end_to_end(tmp_path):
    """`hpcfsdp data prepare` (BPE on stdlib sources) then `hpcfsdp train` at 2 ranks; a dtype mismatch is refused."""
    pytest.importorskip("tokenizers")
    hpc = [sys.executable, "-m", "hpcfsdp.cli.main"]
    res = subprocess.run(hpc + ["data", "prepare", "--python-stdlib", "--max-bytes", "400000", "--vocab-size", "512",
                                "--out", "data", "--pattern", "*.py"], capture_output=True, text=True, cwd=tmp_path,
                         timeout=280)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "tokenizing" in res.stderr and "100%" in res.stderr  # the progress bar
    meta = json.loads((tmp_path / "data" / "prepare.json").read_text())
    train = ["launch", "-n", "2", "--", sys.executable, "-m", "hpcfsdp.cli.main", "train", "--data", "data",
             "--vocab-size", "512", "--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--block-size", "32",
             "--batch-size", "4", "--steps", "12", "--lr", "1e-2", "--warmup-steps", "2", "--log-interval", "1",
             "--out-dir", "run"]
    res = subprocess.run(hpc + train, capture_output=True, text=True, cwd=tmp_path, timeout=280)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    recs = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if line]
    losses = [r["loss"] for r in recs if "loss" in r]
    assert len(losses) == 12 and abs(losses[0] - np.log(meta["vocab_size"])) < 0.2
    assert np.mean(losses[-3:]) < losses[0] - 0.3
    res = subprocess.run(hpc + train[:-2] + ["--data-dtype", "uint8", "--steps", "1", "--out-dir", "run2"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=280)
    assert res.returncode != 0 and "holds uint16 tokens" in res.stderr and "--data-dtype uint8" in res.stderr
    res = subprocess.run(hpc + [a if a != "512" else "256" for a in train[:-2]] + ["--steps", "1", "--out-dir", "r3"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=280)
    assert res.returncode != 0 and "outside the model's vocabulary: vocab_size=256" in res.stderr
