"""The tokenizer a token data set was written with, as a JSON value that travels with checkpoints, and loading it.

[Note: Tokenizer with the checkpoint]
`hpcfsdp data prepare` writes OUT/tokenizer.json (Hugging Face `tokenizers`' own JSON; no pickle) and names
it in every shard's sidecar ({"type": "bpe", "file": "tokenizer.json", "eot_id": N}). `hpcfsdp train`
reads that file once and saves its text, with the type, vocabulary size and end-of-text id, in every
checkpoint's metadata (the state dict's "tokenizer" value: {"type": "byte"} for the byte corpus), so a
checkpoint decodes its own samples wherever it is copied, and the tokenizer cannot go out of step with
the weights. `hpcfsdp generate` and `hpcfsdp checkpoint export --hf` read it back from there.
"""
from __future__ import annotations

import glob
import json
import os

import numpy as np

from .tokenizer import VOCAB_SIZE

__all__ = ["tokenizer_spec", "load_tokenizer", "tokenizer_from_file", "LoadedTokenizer"]


def _sidecar_of(data_path):
    from .tokenfile import read_sidecar

    path = os.fspath(data_path)
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.bin")))
        path = files[0] if files else None
    return (path, read_sidecar(path)) if path else (None, None)


def tokenizer_spec(data_path) -> dict | None:
    """The tokenizer of token data ``data_path`` (None: the shipped byte corpus) as a JSON-safe dict.

    {"type": "byte", "vocab_size": 256}, or {"type": "bpe", "file": NAME, "vocab_size": V, "eot_id": N,
    "json": the tokenizer file's text}; None when the data does not say (a token file without sidecar).
    See [Note: Tokenizer with the checkpoint]."""
    if data_path is None:
        return {"type": "byte", "vocab_size": VOCAB_SIZE}
    path, meta = _sidecar_of(data_path)
    info = (meta or {}).get("tokenizer") or {}
    kind = info.get("type")
    if kind == "byte":
        return {"type": "byte", "vocab_size": VOCAB_SIZE}
    if kind != "bpe" or not info.get("file"):
        return None
    fn = os.path.join(os.path.dirname(os.path.abspath(path)), info["file"])
    try:
        with open(fn, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"{fn}: the tokenizer the sidecar of {path} names cannot be read ({e.strerror or e})") \
            from None
    try:
        vocab = _vocab_size(json.loads(text))
    except ValueError as e:
        raise ValueError(f"{fn}: not a tokenizer.json ({e})") from None
    return {"type": "bpe", "file": os.path.basename(fn), "vocab_size": vocab, "eot_id": info.get("eot_id"),
            "json": text}


def _vocab_size(doc) -> int:
    """Hugging Face's get_vocab_size(with_added_tokens=True), from the JSON alone: the model's vocabulary and the
    added tokens, counted once."""
    vocab = (doc.get("model") or {}).get("vocab") if isinstance(doc, dict) else None
    if not isinstance(vocab, dict):
        raise ValueError("no model.vocab table")
    ids = set(vocab.values()) | {t.get("id") for t in doc.get("added_tokens") or [] if isinstance(t, dict)}
    return len(ids)


class LoadedTokenizer:
    """encode(text) -> int64 ids, decode(ids) -> text, vocab_size, and ``name`` (what it is, in words)."""

    def __init__(self, name, vocab_size, encode, decode):
        self.name, self.vocab_size = name, int(vocab_size)
        self._encode, self._decode = encode, decode

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._encode(text), dtype=np.int64)

    def decode(self, ids) -> str:
        """Text of ``ids``; a ValueError naming the first id outside the vocabulary and the vocabulary's size."""
        a = np.asarray(ids, dtype=np.int64).reshape(-1)
        bad = a[(a < 0) | (a >= self.vocab_size)]
        if bad.size:
            raise ValueError(f"token id {int(bad[0])} is outside the tokenizer ({self.name}, vocabulary "
                             f"{self.vocab_size}: ids 0..{self.vocab_size - 1})")
        return self._decode(a.tolist())


def _hf_tokenizer(tok, name):
    return LoadedTokenizer(name, tok.get_vocab_size(), lambda s: tok.encode(s).ids, lambda ids: tok.decode(ids))


def _need_tokenizers(what):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError(f"{what} needs Hugging Face `tokenizers` (pip install 'hpcfsdp[data]' or pip install "
                         "tokenizers)") from None
    return Tokenizer


def load_tokenizer(spec) -> LoadedTokenizer:
    """The tokenizer a ``tokenizer_spec`` dict describes (as saved in a checkpoint)."""
    from .tokenizer import decode, encode

    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind == "byte":
        return LoadedTokenizer("byte-level", VOCAB_SIZE, encode, decode)
    if kind == "bpe" and isinstance(spec.get("json"), str):
        Tokenizer = _need_tokenizers("the checkpoint's BPE tokenizer")
        return _hf_tokenizer(Tokenizer.from_str(spec["json"]), f"BPE {spec.get('file', 'tokenizer.json')}")
    raise ValueError(f"unknown tokenizer description {str(spec)[:80]!r}: expected type 'byte' or 'bpe' with its json")


def tokenizer_from_file(path) -> LoadedTokenizer:
    """A Hugging Face tokenizer.json file."""
    Tokenizer = _need_tokenizers(os.fspath(path))
    try:
        tok = Tokenizer.from_file(os.fspath(path))
    except Exception as e:  # noqa: BLE001 - tokenizers raises its own Exception type
        raise ValueError(f"{path}: not a tokenizer.json ({e})") from None
    return _hf_tokenizer(tok, os.fspath(path))
