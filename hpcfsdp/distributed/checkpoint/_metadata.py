"""Checkpoint metadata: the ``metadata.json`` schema, its strict parser and its writer."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from ._storage import IncompleteCheckpointError, check_disjoint_cover, loads_strict

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "METADATA_FILE",
    "DTYPES",
    "IncompleteCheckpointError",
    "PieceInfo",
    "EntryInfo",
    "FileInfo",
    "CheckpointMetadata",
    "dtype_name",
    "parse_metadata",
    "dump_metadata",
    "shard_file_name",
]

FORMAT_NAME = "hpcfsdp.checkpoint"
FORMAT_VERSION = 1
METADATA_FILE = "metadata.json"
MAX_METADATA_BYTES = 1 << 30
MAX_NDIM = 64
MAX_DIM = 1 << 62
_FILE_RE = re.compile(r"rank_[0-9]{5,9}\.safetensors\Z")

# Whitelisted element types: name in metadata.json -> NumPy dtype. Never `np.dtype(<string from disk>)`:
# that would accept "O" (object arrays) and friends.
DTYPES: dict[str, np.dtype] = {
    np.dtype(t).name: np.dtype(t)
    for t in (
        np.float64, np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
        np.int64, np.int32, np.int16, np.int8, np.uint64, np.uint32, np.uint16, np.uint8, np.bool_,
    )
}


def dtype_name(dtype: Any) -> str:
    """Normalise a dtype-like to its metadata name; TypeError for types a checkpoint cannot hold."""
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"not a dtype: {dtype!r}") from e
    if dt.name not in DTYPES or DTYPES[dt.name] != dt:
        raise TypeError(f"dtype {dt!r} cannot be stored in a checkpoint; expected one of {sorted(DTYPES)}")
    return dt.name


def shard_file_name(rank: int) -> str:
    return f"rank_{rank:05d}.safetensors"


@dataclass(frozen=True)
class PieceInfo:
    """One saved box of an entry: ``entry[offsets : offsets + lengths]`` stored as one safetensors tensor."""

    rank: int  # the rank that wrote it
    file: str  # shard file name inside the checkpoint directory
    tensor: str  # tensor name inside that file, "<entry>|<offsets>"
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    byte_offset: int  # absolute offset of the first byte in `file`
    byte_length: int
    crc32: tuple[int, ...]  # zlib.crc32 of every `block_size` block of the piece's bytes


@dataclass(frozen=True)
class EntryInfo:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    pieces: tuple[PieceInfo, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class FileInfo:
    name: str
    rank: int
    size: int


@dataclass(frozen=True)
class CheckpointMetadata:
    """The parsed, validated content of ``metadata.json``."""

    version: int
    world_size: int
    block_size: int
    entries: dict[str, EntryInfo]
    files: dict[str, FileInfo]
    mesh: Any = None
    extras: Any = None
    path: str = field(default="", compare=False)  # the resolved checkpoint directory it was read from

    @property
    def total_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    def to_json(self) -> dict:
        entries = {}
        for name, e in self.entries.items():
            entries[name] = {
                "shape": list(e.shape),
                "dtype": e.dtype.name,
                "pieces": [
                    {
                        "rank": p.rank, "file": p.file, "tensor": p.tensor, "offsets": list(p.offsets),
                        "lengths": list(p.lengths), "byte_offset": p.byte_offset, "byte_length": p.byte_length,
                        "crc32": list(p.crc32),
                    }
                    for p in e.pieces
                ],
            }
        return {
            "format": FORMAT_NAME,
            "version": self.version,
            "world_size": self.world_size,
            "checksum": {"algorithm": "crc32", "block_size": self.block_size},
            "files": {f.name: {"rank": f.rank, "size": f.size} for f in self.files.values()},
            "entries": entries,
            "mesh": self.mesh,
            "extras": self.extras,
        }


def dump_metadata(md: CheckpointMetadata) -> bytes:
    try:
        text = json.dumps(md.to_json(), separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"checkpoint extras/mesh_info must be JSON-serialisable (no NaN/inf): {e}") from e
    return text.encode("utf-8")


# ---------------------------------------------------------------------------------------------------------
# Strict parsing. [Note: Untrusted metadata]
# Everything read from disk is validated before use: types (bool is not an int), ranges, names (shard file
# names match rank_NNNNN.safetensors so no path leaves the directory), byte ranges inside the declared file
# sizes, checksum list lengths, and that the pieces of every entry tile its shape exactly (disjoint, complete).
# Any violation is a ValueError naming the field, so a fuzzed or hostile file never reaches NumPy with an
# absurd shape, never allocates more than the files hold, and never raises another exception type.


def _err(source: str, where: str, msg: str) -> ValueError:
    return ValueError(f"invalid checkpoint metadata {source}: {where}: {msg}")


def _obj(x: Any, source: str, where: str, keys: set[str], optional: set[str] = frozenset()) -> dict:
    if not isinstance(x, dict):
        raise _err(source, where, f"expected a JSON object, got {type(x).__name__}")
    missing = keys - x.keys()
    extra = x.keys() - keys - optional
    if missing or extra:
        raise _err(source, where,
                   f"expected keys {sorted(keys)}, missing {sorted(missing)}, unexpected {sorted(extra)}")
    return x


def _int(x: Any, source: str, where: str, lo: int = 0, hi: int = MAX_DIM) -> int:
    if type(x) is not int or not lo <= x <= hi:
        raise _err(source, where, f"expected an integer in [{lo}, {hi}], got {x!r:.80}")
    return x


def _ints(x: Any, source: str, where: str, n: int | None = None, lo: int = 0, hi: int = MAX_DIM) -> tuple[int, ...]:
    if not isinstance(x, list) or (n is not None and len(x) != n) or (n is None and len(x) > MAX_NDIM):
        want = f"a list of {n} integers" if n is not None else f"a list of at most {MAX_NDIM} integers"
        raise _err(source, where, f"expected {want}, got {x!r:.80}")
    return tuple(_int(v, source, f"{where}[{i}]", lo, hi) for i, v in enumerate(x))


def _str(x: Any, source: str, where: str) -> str:
    if not isinstance(x, str):
        raise _err(source, where, f"expected a string, got {type(x).__name__}")
    return x


def parse_metadata(data: bytes, source: str) -> CheckpointMetadata:
    """Parse and validate the bytes of a metadata.json; ValueError (naming `source`) on anything unexpected."""
    if len(data) > MAX_METADATA_BYTES:
        raise _err(source, "file", f"{len(data)} bytes is larger than the limit {MAX_METADATA_BYTES}")
    top = loads_strict(data, source)
    if not isinstance(top, dict) or top.get("format") != FORMAT_NAME:
        raise ValueError(f"{source} is not an hpcfsdp checkpoint metadata file (format is not {FORMAT_NAME!r})")
    version = _int(top.get("version"), source, "version", 1, 1 << 31)
    if version > FORMAT_VERSION:
        raise ValueError(
            f"{source}: checkpoint format version {version} is newer than this hpcfsdp supports "
            f"({FORMAT_VERSION}); upgrade hpcfsdp to load it"
        )
    _obj(top, source, "top level",
         {"format", "version", "world_size", "checksum", "files", "entries", "mesh", "extras"})
    world = _int(top["world_size"], source, "world_size", 1, 1 << 24)
    ck = _obj(top["checksum"], source, "checksum", {"algorithm", "block_size"})
    if ck["algorithm"] != "crc32":
        raise _err(source, "checksum.algorithm", f"expected 'crc32', got {ck['algorithm']!r:.40}")
    block = _int(ck["block_size"], source, "checksum.block_size", 1, 1 << 40)

    if not isinstance(top["files"], dict):
        raise _err(source, "files", "expected a JSON object")
    files: dict[str, FileInfo] = {}
    for fname, f in top["files"].items():
        where = f"files[{fname!r:.60}]"
        if not _FILE_RE.match(fname):
            raise _err(source, where, "expected a name like rank_00000.safetensors")
        f = _obj(f, source, where, {"rank", "size"})
        rank = _int(f["rank"], source, where + ".rank", 0, world - 1)
        if fname != shard_file_name(rank):
            raise _err(source, where, f"name does not match its rank {rank}")
        files[fname] = FileInfo(fname, rank, _int(f["size"], source, where + ".size", 8, 1 << 60))

    if not isinstance(top["entries"], dict):
        raise _err(source, "entries", "expected a JSON object")
    entries: dict[str, EntryInfo] = {}
    seen_tensors: set[tuple[str, str]] = set()
    for name, e in top["entries"].items():
        entries[name] = _parse_entry(name, e, files, block, seen_tensors, source)
    return CheckpointMetadata(version, world, block, entries, files, top["mesh"], top["extras"])


def _parse_entry(name, e, files, block, seen_tensors, source) -> EntryInfo:
    where = f"entries[{name!r:.80}]"
    e = _obj(e, source, where, {"shape", "dtype", "pieces"})
    shape = _ints(e["shape"], source, where + ".shape")
    dt = e["dtype"]
    if not isinstance(dt, str) or dt not in DTYPES:
        raise _err(source, where + ".dtype", f"expected one of {sorted(DTYPES)}, got {dt!r:.40}")
    dtype = DTYPES[dt]
    if not isinstance(e["pieces"], list):
        raise _err(source, where + ".pieces", "expected a list")
    pieces = []
    for i, p in enumerate(e["pieces"]):
        pw = f"{where}.pieces[{i}]"
        p = _obj(p, source, pw, {"rank", "file", "tensor", "offsets", "lengths", "byte_offset", "byte_length", "crc32"})
        fname = _str(p["file"], source, pw + ".file")
        if fname not in files:
            raise _err(source, pw + ".file", f"{fname!r:.60} is not listed in 'files'")
        finfo = files[fname]
        rank = _int(p["rank"], source, pw + ".rank")
        if rank != finfo.rank:
            raise _err(source, pw + ".rank", f"{rank} but file {fname} belongs to rank {finfo.rank}")
        tensor = _str(p["tensor"], source, pw + ".tensor")
        if (fname, tensor) in seen_tensors:
            raise _err(source, pw + ".tensor", f"tensor {tensor!r:.80} of {fname} is used twice")
        seen_tensors.add((fname, tensor))
        offsets = _ints(p["offsets"], source, pw + ".offsets", len(shape))
        lengths = _ints(p["lengths"], source, pw + ".lengths", len(shape), lo=1)
        for d, (o, n, s) in enumerate(zip(offsets, lengths, shape)):
            if o + n > s:
                raise _err(source, pw, f"box offsets {offsets} lengths {lengths} exceed shape {shape} on dim {d}")
        nbytes = math.prod(lengths) * dtype.itemsize
        boff = _int(p["byte_offset"], source, pw + ".byte_offset", 8, finfo.size)
        blen = _int(p["byte_length"], source, pw + ".byte_length", 0, finfo.size)
        if blen != nbytes:
            raise _err(source, pw + ".byte_length", f"{blen} but {lengths} x {dtype.name} is {nbytes} bytes")
        if boff + blen > finfo.size:
            raise _err(source, pw, f"bytes [{boff}, {boff + blen}) lie outside {fname} ({finfo.size} bytes)")
        nblocks = -(-blen // block)
        crc = _ints(p["crc32"], source, pw + ".crc32", nblocks, 0, 0xFFFFFFFF)
        pieces.append(PieceInfo(rank, fname, tensor, offsets, lengths, boff, blen, crc))
    try:
        check_disjoint_cover(name, shape, [(p.offsets, p.lengths) for p in pieces])
    except ValueError as err:
        raise _err(source, where, str(err)) from None
    return EntryInfo(name, shape, dtype, tuple(pieces))
