"""TokenDataset: next-token windows over a flat array of token ids, memory-mapped from disk or in memory."""
from __future__ import annotations

import importlib.resources
import os

import numpy as np

from .tokenizer import check_token_dtype, encode

__all__ = ["TokenDataset", "default_corpus"]


def default_corpus() -> str:
    """Path of the small English corpus shipped with hpcfsdp (public-domain texts, about 42 KB)."""
    res = importlib.resources.files("hpcfsdp.data").joinpath("corpus.txt")
    path = os.fspath(res)  # a real file for regular (and editable) installs
    if not os.path.isfile(path):
        raise RuntimeError(f"hpcfsdp's corpus.txt is missing from the installation (looked at {path!r})")
    return path


def _looks_like_path(x) -> bool:
    if isinstance(x, os.PathLike):
        return True
    return isinstance(x, str) and "\n" not in x and len(x) < 4096 and os.path.isfile(x)


class TokenDataset:
    """Windows of `block_size` tokens: item i is (x, y) = (tokens[i : i+T], tokens[i+1 : i+T+1]) as int64.

    `path_or_array` is a binary token file (flat `dtype` ids, e.g. from build_token_file; uint8 byte files
    too), opened read-only with np.memmap so that only the pages a batch touches are read, or an integer
    array of ids. With `vocab_size`, every batch is checked to hold ids below it (a clear error instead of a
    failure deep inside the embedding). len() = number of windows = len(tokens) - block_size.
    """

    def __init__(self, path_or_array, block_size: int, dtype=np.uint16, vocab_size=None):
        if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        self.block_size = int(block_size)
        self.vocab_size = None if vocab_size is None else int(vocab_size)
        is_file = isinstance(path_or_array, (str, os.PathLike))
        self.dtype = np.dtype(np.uint8) if is_file and np.dtype(dtype) == np.uint8 else check_token_dtype(dtype)
        if isinstance(path_or_array, (str, os.PathLike)):
            self.path = os.fspath(path_or_array)
            size = os.path.getsize(self.path)
            if size % self.dtype.itemsize:
                raise ValueError(f"{self.path!r} has {size} bytes, not a multiple of {self.dtype.itemsize}: "
                                 f"not a {self.dtype.name} token file (wrong dtype?)")
            n = size // self.dtype.itemsize
            self._check_length(n, self.path)
            self.tokens = np.memmap(self.path, dtype=self.dtype.newbyteorder("<"), mode="r")
        else:
            self.path = None
            a = np.asarray(path_or_array)
            if a.ndim != 1 or a.dtype.kind not in "iu":
                raise TypeError(f"tokens must be a 1-D integer array, got {a.ndim}-D {a.dtype}")
            self._check_length(a.size, "the token array")
            lo, hi = int(a.min()), int(a.max())
            if lo < 0 or hi > np.iinfo(self.dtype).max:
                bad = lo if lo < 0 else hi
                raise ValueError(f"token id {bad} does not fit in {self.dtype.name} (vocabulary overflow); "
                                 f"use dtype=numpy.uint32" if bad > 0 else f"token id {bad} is negative")
            self.tokens = a.astype(self.dtype, copy=False)

    def _check_length(self, n: int, what: str) -> None:
        if n < self.block_size + 1:
            raise ValueError(f"{what} holds {n} tokens; block_size={self.block_size} needs at least "
                             f"{self.block_size + 1}")

    @classmethod
    def from_text(cls, text_or_path, block_size: int, dtype=np.uint16) -> "TokenDataset":
        """Byte-tokenise text in memory. A path-like, or a str naming an existing file (single line, < 4096
        chars), is read as UTF-8; any other str is the text itself."""
        if _looks_like_path(text_or_path):
            with open(text_or_path, "rb") as f:
                try:
                    text = f.read().decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ValueError(f"{os.fspath(text_or_path)!r} is not UTF-8 text: {e}") from None
        elif isinstance(text_or_path, str):
            text = text_or_path
        else:
            raise TypeError(f"from_text() takes a str or a path, got {type(text_or_path).__name__}")
        return cls(encode(text, dtype), block_size, dtype)

    def __len__(self) -> int:
        return len(self.tokens) - self.block_size

    def _index(self, i) -> int:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"TokenDataset indices must be integers, got {type(i).__name__}")
        n = len(self)
        j = int(i) + n if i < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"window index {i} out of range for a dataset of {n} windows")
        return j

    def __getitem__(self, i) -> tuple[np.ndarray, np.ndarray]:
        j = self._index(i)
        chunk = np.asarray(self.tokens[j:j + self.block_size + 1], dtype=np.int64)
        return chunk[:-1], chunk[1:]

    def get_batch(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """Stack the windows at `indices`: x, y of shape (B, T), int64."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"window indices must lie in [0, {len(self)}), got {idx.min()}..{idx.max()}")
        rows = np.asarray(self.tokens[idx[:, None] + np.arange(self.block_size + 1)], dtype=np.int64)  # (B, T+1)
        if self.vocab_size is not None and rows.size and int(rows.max()) >= self.vocab_size:
            bad = int(rows.max())
            where = int(idx[np.nonzero((rows >= self.vocab_size).any(1))[0][0]])
            raise ValueError(f"token id {bad} in window {where} of {self.path or 'the token array'} is outside "
                             f"the model's vocabulary (vocab_size={self.vocab_size}); wrong --data-dtype or "
                             f"--vocab-size?")
        return rows[:, :-1], rows[:, 1:]

    def __repr__(self) -> str:
        src = repr(self.path) if self.path else "array"
        return f"TokenDataset({src}, block_size={self.block_size}, dtype={self.dtype.name}, windows={len(self)})"
