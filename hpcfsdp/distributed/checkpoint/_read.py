"""Sharded checkpoint reading: metadata.json and the boxes a rank asks for, at any world size (resharding load).

``load_pieces``/``read_metadata`` are described in ``_format``'s docstring (which re-exports them); the piece
and request checks here are shared with the writer."""
from __future__ import annotations

import dataclasses
import glob
import os
import re
from typing import Any, Mapping, NamedTuple

import numpy as np

from ._metadata import (
    DTYPES, MAX_METADATA_BYTES, METADATA_FILE, CheckpointMetadata, IncompleteCheckpointError, dtype_name,
    parse_metadata,
)
from ._storage import Reader as _Reader
from ._storage import intersect

__all__ = ["LoadResult", "load_pieces", "read_metadata"]

_TMP_RE = re.compile(r"\.tmp-[0-9a-f]{32}\Z")


class LoadResult(NamedTuple):
    metadata: CheckpointMetadata
    missing_keys: list  # requested entries the checkpoint lacks (only with strict=False)
    unexpected_keys: list  # checkpoint entries nobody requested


def _as_list(spec) -> list:
    if isinstance(spec, (tuple, list)) and len(spec) == 4 and hasattr(spec[3], "shape") and hasattr(spec[3], "dtype"):
        return [spec]
    if isinstance(spec, (tuple, list)):
        return list(spec)
    raise TypeError(
        f"expected a Piece (global_shape, dtype, offsets, array) or a list of them, got {type(spec).__name__}")


def _shape(x, what: str) -> tuple[int, ...]:
    try:
        t = tuple(x)
    except TypeError:
        raise TypeError(f"{what} must be a sequence of ints, got {x!r}") from None
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0 for v in t):
        raise ValueError(f"{what} must be non-negative ints, got {x!r}")
    return tuple(int(v) for v in t)


def _normalise(name: str, piece, what: str, array_key: str = "array") -> tuple:
    """-> (shape, dtype name, offsets, lengths, array) after checking the piece against itself."""
    if not isinstance(piece, (tuple, list)) or len(piece) != 4:
        raise TypeError(
            f"{what} of entry {name!r}: expected (global_shape, dtype, offsets, {array_key}), got {piece!r:.100}")
    shape = _shape(piece[0], f"global_shape of entry {name!r}")
    dt = dtype_name(piece[1])
    offsets = _shape(piece[2], f"offsets of entry {name!r}")
    arr = piece[3]
    if not hasattr(arr, "shape") or not hasattr(arr, "dtype"):
        raise TypeError(f"{what} of entry {name!r}: {array_key} must be an ndarray, got {type(arr).__name__}")
    lengths = tuple(int(n) for n in arr.shape)
    if np.dtype(arr.dtype) != DTYPES[dt]:
        raise TypeError(
            f"{what} of entry {name!r}: {array_key} dtype {np.dtype(arr.dtype).name} != declared dtype {dt}")
    if not len(shape) == len(offsets) == len(lengths):
        raise ValueError(f"{what} of entry {name!r}: global shape {shape}, offsets {offsets} and {array_key} shape "
                         f"{lengths} must have the same number of dims")
    for d, (o, n, s) in enumerate(zip(offsets, lengths, shape)):
        if o + n > s:
            raise ValueError(f"{what} of entry {name!r}: box offsets {offsets} + shape {lengths} exceeds global shape "
                             f"{shape} on dim {d}")
    return shape, dt, offsets, lengths, arr

def _resolve(path) -> str:
    p = os.path.abspath(os.fspath(path))
    if not os.path.lexists(p):
        hint = sorted(glob.glob(glob.escape(p) + ".ckpt-*"))
        extra = f" (an interrupted commit left {hint[-1]!r}, which holds a complete checkpoint)" if hint else ""
        raise ValueError(f"checkpoint {p!r} does not exist{extra}")
    real = os.path.realpath(p)
    if not os.path.isdir(real):
        raise ValueError(f"{p!r} is not a checkpoint directory")
    if _TMP_RE.search(os.path.basename(real)):
        raise IncompleteCheckpointError(
            f"incomplete checkpoint {p!r}: an uncommitted temporary directory of an interrupted save")
    if not os.path.isfile(os.path.join(real, METADATA_FILE)):
        if glob.glob(os.path.join(glob.escape(real), "rank_*.safetensors")):
            raise IncompleteCheckpointError(f"incomplete checkpoint {p!r}: shard files but no {METADATA_FILE}")
        raise ValueError(f"{p!r} is not a checkpoint directory (no {METADATA_FILE})")
    return real


def _read_metadata_bytes(real: str) -> bytes:
    mpath = os.path.join(real, METADATA_FILE)
    with open(mpath, "rb") as f:
        data = f.read(MAX_METADATA_BYTES + 1)
    return data


def read_metadata(path) -> CheckpointMetadata:
    """Read and validate a checkpoint's metadata.json (no shard file is opened)."""
    real = _resolve(path)
    md = parse_metadata(_read_metadata_bytes(real), os.path.join(real, METADATA_FILE))
    return dataclasses.replace(md, path=real)


def _load_local(md: CheckpointMetadata, requests: Mapping[str, Any], strict: bool) -> LoadResult:
    if not isinstance(requests, Mapping):
        raise TypeError(f"requests must be a mapping of entry name -> requests, got {type(requests).__name__}")
    missing = sorted(n for n in requests if n not in md.entries)
    if missing and strict:
        raise ValueError(f"entries missing from checkpoint {md.path!r}: {missing}")
    reader = _Reader(md)
    try:
        for name, spec in requests.items():
            if name not in md.entries:
                continue
            e = md.entries[name]
            for k, req in enumerate(_as_list(spec)):
                shape, dt, offsets, lengths, out = _normalise(name, req, f"request {k}", "out")
                if shape != e.shape or DTYPES[dt] != e.dtype:
                    raise ValueError(f"entry {name!r}: requested global shape {shape} dtype {dt}, but the checkpoint "
                                     f"has shape {e.shape} dtype {e.dtype.name}")
                host = out if isinstance(out, np.ndarray) else np.empty(lengths, e.dtype)
                if not host.flags.writeable:
                    raise ValueError(f"request {k} of entry {name!r}: the output array is read-only")
                for p in e.pieces:
                    box = intersect(p.offsets, p.lengths, offsets, lengths)
                    if box is None:
                        continue
                    io, il = box
                    a = tuple(x - y for x, y in zip(io, p.offsets))
                    idx = tuple(slice(x - y, x - y + n) for x, y, n in zip(io, offsets, il))
                    dest = host[idx] if idx else host  # a 0-d index would return a scalar, not a view
                    reader.read_box(p, e.dtype, a, il, dest)
                if host is not out:
                    out.set(host) if hasattr(out, "set") else out.__setitem__(Ellipsis, host)
    finally:
        reader.close()
    unexpected = sorted(n for n in md.entries if n not in requests)
    return LoadResult(md, missing, unexpected)


def load_pieces(path, requests: Mapping[str, Any], *, comm=None, strict: bool = True) -> LoadResult:
    """Fill the requested boxes from a checkpoint saved at any world size. See the module docstring."""
    if comm is None or comm.Get_size() == 1:
        return _load_local(read_metadata(path), requests, strict)
    rank = comm.Get_rank()
    shared = None
    if rank == 0:
        try:
            real = _resolve(path)
            shared = (None, real, _read_metadata_bytes(real))
        except Exception as e:
            shared = ((type(e) if isinstance(e, ValueError) else ValueError, str(e)), None, None)
    err, real, data = comm.bcast(shared, root=0)
    if err is not None:
        raise err[0](err[1])
    result, err = None, None
    try:
        md = dataclasses.replace(parse_metadata(data, os.path.join(real, METADATA_FILE)), path=real)
        result = _load_local(md, requests, strict)
    except Exception as e:  # reported, not raised: every rank must reach the allgather
        err = e
    errs = comm.allgather(None if err is None else f"rank {rank}: {err}")
    if err is not None:
        raise err
    bad = [m for m in errs if m is not None]
    if bad:
        err = ValueError("checkpoint load failed on another rank: " + "; ".join(bad))
        err.on_other_rank = True  # an echo: the failing rank raises its own error (cli.runtime.agree)
        raise err
    return result
