"""Byte-level tokenizer (UTF-8 bytes are the token ids, vocabulary 256) and the check of a token dtype on disk; token
files are written and read by tokenfile.py."""
from __future__ import annotations

import numpy as np

__all__ = ["VOCAB_SIZE", "ByteTokenizer", "encode", "decode", "check_token_dtype"]

VOCAB_SIZE = 256
TOKEN_DTYPES = (np.dtype(np.uint16), np.dtype(np.uint32))


def check_token_dtype(dtype) -> np.dtype:
    """The on-disk token dtype: uint16 (vocabularies up to 65536) or uint32; TypeError otherwise."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"token dtype must be numpy.uint16 or numpy.uint32, got {dtype!r}") from None
    if dt not in TOKEN_DTYPES:
        raise TypeError(f"token dtype must be numpy.uint16 or numpy.uint32, got {dt.name}")
    return dt


class ByteTokenizer:
    """Token id = UTF-8 byte value. Lossless on any text; decode() replaces invalid byte sequences with U+FFFD
    (a model's sample may cut a multi-byte character)."""

    vocab_size = VOCAB_SIZE

    def encode(self, text: str, dtype=np.uint16) -> np.ndarray:
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(check_token_dtype(dtype))

    def decode(self, ids) -> str:
        a = np.asarray(ids)
        if a.size and (a.dtype.kind not in "iu" or a.min() < 0 or a.max() >= VOCAB_SIZE):
            bad = a.dtype if a.dtype.kind not in "iu" else (a.min() if a.min() < 0 else a.max())
            raise ValueError(f"decode() takes integer token ids in [0, {VOCAB_SIZE}), got {bad}")
        return a.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


_TOKENIZER = ByteTokenizer()


def encode(text: str, dtype=np.uint16) -> np.ndarray:
    """UTF-8 bytes of `text` as token ids (uint16 by default)."""
    return _TOKENIZER.encode(text, dtype)


def decode(ids) -> str:
    """Text from byte token ids."""
    return _TOKENIZER.decode(ids)
