"""Token files with a JSON sidecar (dtype, vocabulary, count): writers (streaming, and build_token_file from a text
file), readers and sharded datasets."""
from __future__ import annotations

import glob
import json
import os

import numpy as np

from .dataset import TokenDataset
from .tokenizer import VOCAB_SIZE, check_token_dtype, encode

__all__ = ["SIDECAR_SUFFIX", "sidecar_path", "read_sidecar", "write_sidecar", "TokenFileWriter", "build_token_file",
           "ShardedTokenDataset", "open_token_data", "dtype_for_vocab"]

# [Note: Token file sidecar]
# A token file stays a flat little-endian array of ids (nanoGPT's train.bin layout, memory-mappable
# as is); next to it, FILE.json says what it holds: {"format": "hpcfsdp.tokens", "version": 1,
# "dtype": "uint16", "vocab_size": 50304, "num_tokens": N, "max_id": M, "tokenizer": {...}}. Readers
# take the dtype from the sidecar and refuse a different one asked for explicitly, check the file size
# against num_tokens (a truncated file is an error, not fewer tokens), and compare max_id with the
# model's vocabulary before the first step. Files without a sidecar are still read when the dtype is
# given; their ids are then checked batch by batch.

SIDECAR_SUFFIX = ".json"
FORMAT = "hpcfsdp.tokens"
READ_DTYPES = ("uint8", "uint16", "uint32")


def sidecar_path(path) -> str:
    return os.fspath(path) + SIDECAR_SUFFIX


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The smallest on-disk dtype for ids below ``vocab_size``: uint16 up to 65536, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 2 ** 16 else np.dtype(np.uint32)


def write_sidecar(path, *, dtype, vocab_size: int, num_tokens: int, max_id: int, tokenizer=None) -> str:
    meta = {"format": FORMAT, "version": 1, "dtype": np.dtype(dtype).name, "byteorder": "little",
            "vocab_size": int(vocab_size), "num_tokens": int(num_tokens), "max_id": int(max_id),
            "tokenizer": tokenizer or {}}
    out = sidecar_path(path)
    tmp = f"{out}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, out)
    return out


def read_sidecar(path):
    """The sidecar of token file ``path`` as a dict, checked against the file; None if it has none."""
    sc = sidecar_path(path)
    if not os.path.exists(sc):
        return None
    try:
        with open(sc) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{sc}: unreadable token-file sidecar: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{sc}: not an hpcfsdp token-file sidecar (format {meta.get('format')!r})")
    if meta.get("dtype") not in READ_DTYPES:
        raise ValueError(f"{sc}: dtype {meta.get('dtype')!r} is not one of {READ_DTYPES}")
    size = os.path.getsize(path)
    want = int(meta["num_tokens"]) * np.dtype(meta["dtype"]).itemsize
    if size != want:
        raise ValueError(f"{os.fspath(path)} has {size} bytes but its sidecar says {meta['num_tokens']} "
                         f"{meta['dtype']} tokens ({want} bytes): truncated or overwritten")
    return meta


class TokenFileWriter:
    """Append id arrays to a token file; ``close()`` renames it into place and writes its sidecar."""

    def __init__(self, path, *, vocab_size: int, dtype=None, tokenizer=None):
        self.path = os.fspath(path)
        self.vocab_size = int(vocab_size)
        self.dtype = check_token_dtype(dtype if dtype is not None else dtype_for_vocab(self.vocab_size))
        if self.vocab_size - 1 > np.iinfo(self.dtype).max:
            raise ValueError(f"vocab_size={self.vocab_size} does not fit in {self.dtype.name}; use uint32")
        self.tokenizer = tokenizer
        self.num_tokens = 0
        self.max_id = -1
        self._tmp = f"{self.path}.tmp-{os.getpid()}"
        self._f = open(self._tmp, "wb")

    def write(self, ids) -> None:
        a = np.asarray(ids)
        if a.size == 0:
            return
        if a.dtype.kind not in "iu":
            raise TypeError(f"token ids must be integers, got {a.dtype}")
        lo, hi = int(a.min()), int(a.max())
        if lo < 0 or hi >= self.vocab_size:
            raise ValueError(f"token id {lo if lo < 0 else hi} is outside the vocabulary [0, {self.vocab_size})")
        self._f.write(a.astype(self.dtype.newbyteorder("<"), copy=False).tobytes())
        self.num_tokens += int(a.size)
        self.max_id = max(self.max_id, hi)

    def close(self) -> None:
        if self._f is None:
            return
        self._f.close()
        self._f = None
        os.replace(self._tmp, self.path)
        write_sidecar(self.path, dtype=self.dtype, vocab_size=self.vocab_size, num_tokens=self.num_tokens,
                      max_id=self.max_id, tokenizer=self.tokenizer)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is not None and self._f is not None:
            self._f.close()
            self._f = None
            os.remove(self._tmp)
            return False
        self.close()
        return False


def build_token_file(text_path, out_path, dtype=np.uint16) -> int:
    """Tokenise a UTF-8 text file into a flat little-endian binary of token ids (nanoGPT's train.bin layout),
    written to a temporary name and renamed into place, with its sidecar OUT.json (dtype, vocabulary).
    Returns the number of tokens."""
    dt = check_token_dtype(dtype).newbyteorder("<")
    try:
        with open(text_path, "rb") as f:
            text = f.read().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{os.fspath(text_path)!r} is not UTF-8 text: {e}") from None
    ids = encode(text, np.uint32)
    if ids.size and int(ids.max()) > np.iinfo(dt).max:
        raise ValueError(f"token id {int(ids.max())} does not fit in {dt.name}; use dtype=numpy.uint32")
    tmp = f"{os.fspath(out_path)}.tmp-{os.getpid()}"
    ids.astype(dt).tofile(tmp)
    os.replace(tmp, out_path)
    write_sidecar(out_path, dtype=dt, vocab_size=VOCAB_SIZE, num_tokens=ids.size,
                  max_id=int(ids.max()) if ids.size else -1, tokenizer={"type": "byte"})
    return int(ids.size)


class ShardedTokenDataset:
    """Windows over several token files (shards); a window never crosses a shard boundary.

    Each shard is memory-mapped; ``get_batch`` reads only the windows asked for.
    """

    def __init__(self, shards):
        if not shards:
            raise ValueError("ShardedTokenDataset needs at least one shard")
        self.shards = list(shards)
        self.block_size = self.shards[0].block_size
        self.vocab_size = self.shards[0].vocab_size
        self._starts = np.cumsum([0] + [len(s) for s in self.shards])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def get_batch(self, indices):
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"window indices must lie in [0, {len(self)}), got {idx.min()}..{idx.max()}")
        which = np.searchsorted(self._starts, idx, side="right") - 1
        x = np.empty((idx.size, self.block_size), np.int64)
        y = np.empty_like(x)
        for s in np.unique(which):
            sel = which == s
            x[sel], y[sel] = self.shards[s].get_batch(idx[sel] - self._starts[s])
        return x, y

    def __repr__(self) -> str:
        return f"ShardedTokenDataset({len(self.shards)} shards, block_size={self.block_size}, windows={len(self)})"


def _open_file(path, block_size, dtype, vocab_size):
    meta = read_sidecar(path)
    if meta is not None:
        if dtype not in (None, "auto") and np.dtype(dtype) != np.dtype(meta["dtype"]):
            raise ValueError(f"{path} holds {meta['dtype']} tokens (see {sidecar_path(path)}), but "
                             f"--data-dtype {np.dtype(dtype).name} was asked for; drop --data-dtype or pass "
                             f"{meta['dtype']}")
        if vocab_size is not None and int(meta["max_id"]) >= vocab_size:
            raise ValueError(f"{path} holds token id {meta['max_id']} (tokenizer vocabulary {meta['vocab_size']}), "
                             f"outside the model's vocabulary: vocab_size={vocab_size}; train with "
                             f"--vocab-size {meta['vocab_size']} or more")
        dtype = meta["dtype"]
    elif dtype in (None, "auto"):
        raise ValueError(f"{path} has no sidecar {sidecar_path(path)} saying its token dtype; pass --data-dtype "
                         f"(uint8, uint16 or uint32), or write it with `hpcfsdp data prepare`")
    return TokenDataset(path, block_size, dtype=np.dtype(dtype), vocab_size=vocab_size)


def open_token_data(path, block_size: int, *, dtype="auto", vocab_size=None):
    """A memory-mapped dataset of ``path``: one token file, or a directory of shards (``*.bin``, in name order).

    ``dtype`` "auto" takes it from each file's sidecar (see [Note: Token file sidecar]); an explicit
    dtype must agree with the sidecar. With ``vocab_size`` every id must be below it.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.bin")))
        if not files:
            raise FileNotFoundError(f"{path}: a directory without *.bin token files")
        shards = [_open_file(f, block_size, dtype, vocab_size) for f in files]
        return shards[0] if len(shards) == 1 else ShardedTokenDataset(shards)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such token file or directory")
    return _open_file(path, block_size, dtype, vocab_size)
