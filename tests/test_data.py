"""Data pipeline: byte tokenizer, memory-mapped TokenDataset, DistributedSampler and resumable batches."""
import os

import numpy as np
import pytest

from hpcfsdp.data import (VOCAB_SIZE, ByteTokenizer, DistributedSampler, TokenDataset, batches, decode, default_corpus,
                          encode)
from hpcfsdp.data.tokenfile import build_token_file


# ------------------------------------------------------------------------------------------------ tokenizer


def test_tokenizer_is_utf8_bytes():
    text = "Hello, wörld — ∑ 😀\n"
    ids = encode(text)
    assert ids.dtype == np.uint16 and list(ids) == list(text.encode("utf-8"))
    assert decode(ids) == text and ByteTokenizer().vocab_size == VOCAB_SIZE == 256
    assert encode(text, np.uint32).dtype == np.uint32
    assert decode(ids[:-2]).endswith("\ufffd")  # a cut multi-byte character decodes to U+FFFD, not an error


def test_tokenizer_errors():
    with pytest.raises(ValueError, match=r"\[0, 256\), got 256"):
        decode([1, 256])
    with pytest.raises(ValueError, match="got -1"):
        decode(np.array([-1, 3]))
    with pytest.raises(TypeError, match="takes a str"):
        encode(b"bytes")
    with pytest.raises(TypeError, match="uint16 or numpy.uint32, got int64"):
        encode("x", np.int64)


def test_build_token_file_and_memmap_dataset(tmp_path):
    text = "abcdefghij" * 5
    src = tmp_path / "t.txt"
    src.write_text(text, encoding="utf-8")
    for dt in (np.uint16, np.uint32):
        out = tmp_path / f"t.{np.dtype(dt).name}.bin"
        assert build_token_file(src, out, dtype=dt) == 50
        raw = np.fromfile(out, dtype=np.dtype(dt).newbyteorder("<"))
        np.testing.assert_array_equal(raw, np.frombuffer(text.encode(), np.uint8))
        ds = TokenDataset(out, block_size=8, dtype=dt)
        assert isinstance(ds.tokens, np.memmap) and not ds.tokens.flags.writeable
        assert len(ds) == 42
        for i in (0, 5, 41, -1):
            x, y = ds[i]
            j = i % 42
            assert x.dtype == y.dtype == np.int64 and x.shape == y.shape == (8,)
            np.testing.assert_array_equal(x, raw[j:j + 8])
            np.testing.assert_array_equal(y, raw[j + 1:j + 9])
        xb, yb = ds.get_batch([3, 0, 41])
        assert xb.shape == yb.shape == (3, 8) and xb.dtype == np.int64
        np.testing.assert_array_equal(xb[0], ds[3][0])
        np.testing.assert_array_equal(yb[2], ds[41][1])


def test_dataset_errors(tmp_path):
    with pytest.raises(ValueError, match="holds 5 tokens; block_size=8 needs at least 9"):
        TokenDataset(np.arange(5), 8)
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        TokenDataset(np.arange(5), 0)
    with pytest.raises(TypeError, match="uint16 or numpy.uint32, got float32"):
        TokenDataset(np.arange(50), 4, dtype=np.float32)
    with pytest.raises(ValueError, match="70000 does not fit in uint16.*uint32"):
        TokenDataset(np.array([1, 2, 70000, 4, 5, 6]), 2)
    assert len(TokenDataset(np.array([1, 2, 70000, 4, 5, 6]), 2, dtype=np.uint32)) == 4
    with pytest.raises(ValueError, match="negative"):
        TokenDataset(np.array([1, -2, 3, 4]), 2)
    with pytest.raises(TypeError, match="1-D integer"):
        TokenDataset(np.zeros((4, 4)), 2)
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x02\x03")
    with pytest.raises(ValueError, match="not a multiple of 2.*wrong dtype"):
        TokenDataset(odd, 1)
    short = tmp_path / "short.bin"
    np.arange(4, dtype=np.uint16).tofile(short)
    with pytest.raises(ValueError, match="holds 4 tokens; block_size=4"):
        TokenDataset(short, 4)
    ds = TokenDataset(np.arange(10), 4)
    with pytest.raises(IndexError, match="out of range"):
        ds[6]
    with pytest.raises(TypeError, match="integers"):
        ds[1.0]


def test_from_text_and_default_corpus(tmp_path):
    path = default_corpus()
    size = os.path.getsize(path)
    assert 30_000 <= size <= 60_000
    text = open(path, encoding="utf-8").read()
    ds = TokenDataset.from_text(path, 64)
    assert len(ds) == len(text.encode()) - 64
    assert decode(ds[100][0]) == text[100:164]  # the corpus is ASCII: bytes == characters
    mem = TokenDataset.from_text("to be or not to be", 4)
    assert len(mem) == 14 and decode(mem[0][1]) == "o be"


# -------------------------------------------------------------------------------------------------- sampler


@pytest.mark.parametrize("n,world", [(100, 4), (103, 4), (7, 3), (5, 8)])
def test_sampler_disjoint_and_covering(n, world):
    for drop_last in (True, False):
        shares = [list(DistributedSampler(n, world, r, shuffle=True, seed=3, drop_last=drop_last))
                  for r in range(world)]
        lens = {len(s) for s in shares}
        assert len(lens) == 1  # every rank gets the same number of samples
        assert lens == {len(DistributedSampler(n, world, 0, drop_last=drop_last))}
        allidx = [i for s in shares for i in s]
        if drop_last:
            assert len(allidx) == len(set(allidx)) == n // world * world  # disjoint
        else:
            assert set(allidx) == set(range(n)) and len(allidx) == -(-n // world) * world  # covering, padded
        assert all(0 <= i < n for i in allidx)


def test_sampler_matches_reference_permutation_and_epochs():
    n, world = 20, 2
    s = DistributedSampler(n, world, 1, seed=7)
    perm0 = np.random.Generator(np.random.PCG64(7)).permutation(n)
    assert list(s) == list(perm0[1::2])
    s.set_epoch(3)
    assert list(s) == list(np.random.Generator(np.random.PCG64(10)).permutation(n)[1::2])
    assert list(DistributedSampler(n, world, 0, shuffle=False)) == list(range(0, 20, 2))
    # deterministic: a fresh sampler with the same seed and epoch gives the same order
    t = DistributedSampler(n, world, 1, seed=7)
    t.set_epoch(3)
    assert list(t) == list(np.random.Generator(np.random.PCG64(10)).permutation(n)[1::2])


def _run(ds, world, batch_size, stop_after=None, states=None, loop_batches=None, seed=0):
    """Batches of every rank for one epoch; optionally stop after k batches and return the states."""
    out = []
    for r in range(world):
        s = DistributedSampler(len(ds), world, r, seed=seed)
        if states is not None:
            s.load_state_dict(states[r])
        got = []
        for k, (x, y) in enumerate(batches(ds, s, batch_size)):
            got.append((x, y))
            if stop_after is not None and k + 1 == stop_after:
                break
        out.append((got, s.state_dict()))
    return out


def test_batches_shapes_and_content():
    tokens = np.random.default_rng(0).integers(0, 256, 500)
    ds = TokenDataset(tokens, 16)
    s = DistributedSampler(len(ds), 2, 0, seed=1)
    order = list(DistributedSampler(len(ds), 2, 0, seed=1))
    xs = list(batches(ds, s, 8))
    assert len(xs) == len(order) // 8
    for b, (x, y) in enumerate(xs):
        assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == np.int64
        for k in range(8):
            i = order[b * 8 + k]
            np.testing.assert_array_equal(x[k], tokens[i:i + 16])
            np.testing.assert_array_equal(y[k], tokens[i + 1:i + 17])


@pytest.mark.parametrize("world_before,world_after", [(2, 2), (4, 2), (2, 3)])
def test_resume_continues_with_the_next_unseen_samples(world_before, world_after):
    ds = TokenDataset(np.arange(300), 4, dtype=np.uint32)  # window i starts with token i
    B = 5
    full = _run(ds, world_before, B)
    part = _run(ds, world_before, B, stop_after=3)
    states = [st for _, st in part]
    assert all(st == states[0] for st in states) and states[0]["position"] == 3 * B * world_before
    if world_before == world_after:  # bit-identical continuation of every rank's stream
        rest = _run(ds, world_after, B, states=states)
        for r in range(world_before):
            resumed = part[r][0] + rest[r][0]
            assert len(resumed) == len(full[r][0])
            for (x1, y1), (x2, y2) in zip(resumed, full[r][0]):
                np.testing.assert_array_equal(x1, x2)
                np.testing.assert_array_equal(y1, y2)
    # at any world size: the resumed windows are exactly the next unseen ones of the epoch's order
    rest = _run(ds, world_after, B, states=[states[0]] * world_after)
    order = np.random.Generator(np.random.PCG64(0)).permutation(len(ds))
    first = 3 * B * world_before
    seen = sorted(int(v) for got, _ in part for xb, _ in got for v in xb[:, 0])
    assert seen == sorted(order[:first])
    per_rank = (len(ds) - first) // world_after // B * B
    resumed = sorted(int(v) for got, _ in rest for xb, _ in got for v in xb[:, 0])
    assert resumed == sorted(order[first:first + per_rank * world_after])


def test_resume_by_window_index_exactly():
    n = 57
    full = list(DistributedSampler(n, 3, 1, seed=9))
    s = DistributedSampler(n, 3, 1, seed=9)
    it = iter(s)
    head = [next(it) for _ in range(6)]
    st = s.state_dict()
    s2 = DistributedSampler(n, 3, 1, seed=9)
    s2.load_state_dict(st)
    s2.set_epoch(0)  # a resumed loop calls set_epoch(epoch) again: the position survives
    assert head + list(s2) == full
    assert s2.remaining() == 0 and s2.state_dict()["position"] == n // 3 * 3
    s2.set_epoch(1)
    assert s2.state_dict()["position"] == 0 and len(list(s2)) == n // 3
    with pytest.raises(ValueError, match="seed=9 but this sampler has seed=1"):
        DistributedSampler(n, 3, 1, seed=1).load_state_dict(st)
    with pytest.raises(ValueError, match="lacks"):
        s2.load_state_dict({"epoch": 0})


def test_loop_moves_to_next_epoch():
    ds = TokenDataset(np.arange(40), 4)  # 36 windows
    s = DistributedSampler(len(ds), 2, 0, seed=0)
    it = batches(ds, s, 6, loop=True)
    for _ in range(3):  # 18 samples per rank and epoch -> 3 batches
        next(it)
    assert s.epoch == 0
    x, _ = next(it)
    assert s.epoch == 1
    e1 = DistributedSampler(len(ds), 2, 0, seed=0)
    e1.set_epoch(1)
    np.testing.assert_array_equal(x[:, 0], [ds[i][0][0] for i in list(e1)[:6]])


def test_sampler_errors():
    with pytest.raises(ValueError, match=r"Invalid rank 4, rank should be in the interval \[0, 3\]"):
        DistributedSampler(10, 4, 4)
    with pytest.raises(ValueError, match="num_replicas must be an int >= 1"):
        DistributedSampler(10, 0, 0)
    with pytest.raises(ValueError, match="num_samples must be an int >= 0"):
        DistributedSampler(-1, 1, 0)
    ds = TokenDataset(np.arange(40), 4)
    with pytest.raises(ValueError, match="covers 10 samples but the dataset has 36"):
        next(batches(ds, DistributedSampler(10, 1, 0), 2))
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        next(batches(ds, DistributedSampler(ds, 1, 0), 0))
    assert DistributedSampler(ds, 1, 0).num_samples == 36  # a dataset works in place of its length
