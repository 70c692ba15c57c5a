"""Checkpoint storage primitives: boxes, safetensors shard files, exact preads, CRCs, the commit lock."""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import shutil
import stat
import struct
import zlib
from typing import Any, Sequence

import numpy as np

from hpcfsdp._logging import get_logger

__all__ = [
    "SAFETENSORS_CODES",
    "intersect",
    "check_disjoint_cover",
    "loads_strict",
    "shard_file_header",
    "write_shard_file",
    "read_header",
    "pread_exact",
    "block_crcs",
    "verify_blocks",
    "fsync_dir",
    "commit_lock",
    "remove_stale_copies",
    "IncompleteCheckpointError",
    "Reader",
]

# metadata dtype name -> safetensors dtype code
SAFETENSORS_CODES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL",
}
_ITEMSIZE = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the limit the safetensors library itself enforces
WRITE_CHUNK = 64 << 20
READ_CHUNK = 32 << 20



class IncompleteCheckpointError(ValueError):
    """A checkpoint directory whose save never committed (a rank died, or the job stopped mid-save)."""


Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, lengths)


# ----------------------------------------------------------------------------------------------- boxes


def intersect(o1: Sequence[int], l1: Sequence[int], o2: Sequence[int], l2: Sequence[int]) -> Box | None:
    """The intersection of two boxes as (offsets, lengths), or None when it is empty."""
    lo = tuple(max(a, b) for a, b in zip(o1, o2))
    hi = tuple(min(a + m, b + n) for a, m, b, n in zip(o1, l1, o2, l2))
    if any(h <= l for l, h in zip(lo, hi)):
        return None
    return lo, tuple(h - l for l, h in zip(lo, hi))


def check_disjoint_cover(name: str, shape: Sequence[int], boxes: Sequence[Box]) -> None:
    """ValueError unless the non-empty, in-bounds `boxes` are pairwise disjoint and tile `shape` exactly.

    [Note: Tiling check] Disjoint boxes inside the shape cover it exactly iff their volumes sum to its volume.
    Disjointness: sort along the dim with the most distinct offsets and compare each box only with the boxes
    that start before it ends on that dim: O(P log P) for the usual one-dim shardings, O(P^2) at worst.
    """
    total = math.prod(shape)
    vol = sum(math.prod(lengths) for _, lengths in boxes)
    overlap = vol > total
    if boxes and not overlap:
        nd = len(shape)
        if nd == 0:
            overlap = len(boxes) > 1
        else:
            d = max(range(nd), key=lambda k: len({o[k] for o, _ in boxes}))
            order = sorted(boxes, key=lambda b: b[0][d])
            for i, (oi, li) in enumerate(order):
                end = oi[d] + li[d]
                for oj, lj in order[i + 1:]:
                    if oj[d] >= end:
                        break
                    if intersect(oi, li, oj, lj) is not None:
                        overlap = True
                        break
                if overlap:
                    break
    if overlap:
        raise ValueError(f"entry {name!r}: saved pieces overlap")
    if vol != total:
        raise ValueError(f"entry {name!r}: saved pieces cover {vol} of its {total} elements (shape {tuple(shape)})")


# ------------------------------------------------------------------------------------------------ json


def _no_dupes(pairs: list) -> dict:
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"duplicate JSON key {k!r:.80}")
        d[k] = v
    return d


def _bad_constant(name: str):
    raise ValueError(f"JSON constant {name} is not allowed")


def loads_strict(data: bytes, source: str) -> Any:
    """json.loads that rejects NaN/Infinity and duplicate keys; every failure is a ValueError naming `source`."""
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_no_dupes, parse_constant=_bad_constant)
    except RecursionError:
        raise ValueError(f"{source}: JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{source}: not valid JSON: {e}") from None


# ------------------------------------------------------------------------------------------------- I/O


def block_crcs(u8: np.ndarray, block_size: int) -> list[int]:
    return [zlib.crc32(u8[i:i + block_size]) for i in range(0, len(u8), block_size)]


def verify_blocks(u8: np.ndarray, first_block: int, crcs: Sequence[int], block_size: int, where: str) -> None:
    """Check the CRC of every block in `u8`, which holds blocks first_block, first_block+1, ... of a piece."""
    for k, i in enumerate(range(0, len(u8), block_size)):
        b = first_block + k
        if zlib.crc32(u8[i:i + block_size]) != crcs[b]:
            lo = b * block_size
            hi = lo + min(block_size, len(u8) - i)
            raise ValueError(f"checksum mismatch in {where}, bytes [{lo}, {hi}) of the piece: "
                             "the checkpoint is corrupted")


def pread_exact(fd: int, u8: np.ndarray | memoryview, offset: int, source: str) -> None:
    """Fill the writable byte buffer `u8` from `fd` at `offset`; ValueError if the file ends first."""
    mv = memoryview(u8).cast("B")
    got, n = 0, len(mv)
    while got < n:
        if hasattr(os, "preadv"):
            r = os.preadv(fd, [mv[got:]], offset + got)
        else:
            r = _pread_into(fd, mv[got:], offset + got)
        if r == 0:
            raise ValueError(
                f"{source} is truncated: wanted bytes [{offset}, {offset + n}), file ends at {offset + got}")
        got += r


def _pread_into(fd: int, mv: memoryview, offset: int) -> int:
    data = os.pread(fd, len(mv), offset)
    mv[: len(data)] = data
    return len(data)


def _write_all(f, mv: memoryview) -> None:
    while len(mv):
        n = f.write(mv)
        mv = mv[n:]


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def shard_file_header(specs: Sequence[tuple[str, Sequence[int], Any]]) -> tuple[bytes, list[int]]:
    """The first bytes of a shard file holding tensors (name, shape, dtype) in this order, and the absolute
    byte offset of each tensor's data. Layout (safetensors): 8-byte little-endian header length N, N bytes
    of JSON header padded with spaces to a multiple of 8, then the tensors' bytes back to back in order."""
    header: dict[str, Any] = {}
    pos, starts = 0, []
    for name, shape, dtype in specs:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        header[name] = {"dtype": SAFETENSORS_CODES[np.dtype(dtype).name], "shape": [int(n) for n in shape],
                        "data_offsets": [pos, pos + nbytes]}
        starts.append(pos)
        pos += nbytes
    header["__metadata__"] = {"format": "hpcfsdp"}
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb, [8 + len(hb) + p for p in starts]


def write_shard_file(path: str, tensors: Sequence[tuple[str, np.ndarray]], block_size: int,
                     fsync: bool = True) -> tuple[int, list[tuple[int, int, list[int]]]]:
    """Write C-contiguous host arrays as one safetensors file (see shard_file_header); return (file size,
    [(byte_offset, byte_length, crcs)]), byte_offset absolute in the file."""
    prefix, starts = shard_file_header([(name, arr.shape, arr.dtype) for name, arr in tensors])
    out = []
    with open(path, "wb", buffering=0) as f:
        _write_all(f, memoryview(prefix))
        for (_, arr), start in zip(tensors, starts):
            u8 = arr.reshape(-1).view(np.uint8)
            crcs = []
            step = max(block_size, WRITE_CHUNK // block_size * block_size)
            for i in range(0, len(u8), step):
                chunk = u8[i:i + step]
                crcs += block_crcs(chunk, block_size)
                _write_all(f, memoryview(chunk))
            out.append((start, arr.nbytes, crcs))
        if fsync:
            os.fsync(f.fileno())
    return (starts[-1] + tensors[-1][1].nbytes) if tensors else len(prefix), out


def read_header(fd: int, file_size: int, source: str) -> tuple[int, dict[str, tuple[str, tuple[int, ...], int, int]]]:
    """Parse and validate a safetensors header: (data start, {tensor: (code, shape, begin, end)}), absolute bytes."""
    if file_size < 8:
        raise ValueError(f"{source} is truncated: {file_size} bytes, a safetensors file has at least 8")
    nb = np.empty(8, np.uint8)
    pread_exact(fd, nb, 0, source)
    n = int(nb.view("<u8")[0])
    if n > min(MAX_HEADER_BYTES, file_size - 8):
        raise ValueError(f"{source}: safetensors header length {n} exceeds the file ({file_size} bytes) or the limit")
    hb = np.empty(n, np.uint8)
    pread_exact(fd, hb, 8, source)
    hdr = loads_strict(hb.tobytes(), f"{source} (safetensors header)")
    if not isinstance(hdr, dict):
        raise ValueError(f"{source}: safetensors header is not a JSON object")
    start = 8 + n
    out = {}
    for name, v in hdr.items():
        if name == "__metadata__":
            if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
                raise ValueError(f"{source}: safetensors __metadata__ must map strings to strings")
            continue
        ok = isinstance(v, dict) and set(v) == {"dtype", "shape", "data_offsets"}
        ok = ok and isinstance(v["dtype"], str) and v["dtype"] in _ITEMSIZE
        ok = ok and isinstance(v["shape"], list) and len(v["shape"]) <= 64
        ok = ok and all(type(s) is int and 0 <= s < 1 << 62 for s in v["shape"])
        ok = ok and isinstance(v["data_offsets"], list) and len(v["data_offsets"]) == 2
        ok = ok and all(type(s) is int for s in v["data_offsets"])
        if not ok:
            raise ValueError(f"{source}: malformed safetensors header entry {name!r:.80}")
        b, e = v["data_offsets"]
        nbytes = math.prod(v["shape"]) * _ITEMSIZE[v["dtype"]]
        if not 0 <= b <= e <= file_size - start or e - b != nbytes:
            raise ValueError(f"{source}: tensor {name!r:.80} has data_offsets [{b}, {e}) that do not fit the file "
                             f"or its shape {v['shape']}")
        out[name] = (v["dtype"], tuple(v["shape"]), start + b, start + e)
    return start, out


# ------------------------------------------------------------------------------------------- reading


class Reader:
    """Opens shard files lazily, checks their size and header against the metadata, reads verified boxes."""

    def __init__(self, md):
        self.md = md
        self.fds: dict[str, tuple[int, dict]] = {}

    def close(self) -> None:
        for fd, _ in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def _open(self, fname: str) -> tuple[int, dict]:
        if fname not in self.fds:
            fpath = os.path.join(self.md.path, fname)
            try:
                fd = os.open(fpath, os.O_RDONLY)
            except FileNotFoundError:
                raise IncompleteCheckpointError(f"incomplete checkpoint {self.md.path!r}: {fname} is missing") from None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
                    raise ValueError(f"{fpath} is {what}, not a shard file: the checkpoint is damaged")
                size = st.st_size
                want = self.md.files[fname].size
                if size != want:
                    raise ValueError(f"{fpath} has {size} bytes, the metadata says {want}: truncated or damaged")
                _, hdr = read_header(fd, size, fpath)
            except BaseException:
                os.close(fd)
                raise
            self.fds[fname] = (fd, hdr)
        return self.fds[fname]

    def check_piece(self, p, dtype: np.dtype) -> int:
        fd, hdr = self._open(p.file)
        h = hdr.get(p.tensor)
        want = (SAFETENSORS_CODES[dtype.name], p.lengths, p.byte_offset, p.byte_offset + p.byte_length)
        if h != want:
            raise ValueError(f"{os.path.join(self.md.path, p.file)}: tensor {p.tensor!r} is {h} in the file header "
                             f"but {want} in the metadata")
        return fd

    def read_box(self, p, dtype: np.dtype, a: tuple, s: tuple, dest: np.ndarray) -> None:
        """dest[...] = piece[a : a + s] (local coordinates), verifying the CRC of every block read."""
        fd = self.check_piece(p, dtype)
        where = f"{os.path.join(self.md.path, p.file)} tensor {p.tensor!r}"
        B = self.md.block_size
        L = p.lengths if p.lengths else (1,)
        a, s = (a, s) if p.lengths else ((0,), (1,))
        dest = dest if p.lengths else dest.reshape(1)
        row = math.prod(L[1:]) * dtype.itemsize
        start, stop = a[0] * row, (a[0] + s[0]) * row
        if (s[1:] == L[1:] and dest.flags.c_contiguous and start % B == 0
                and (stop % B == 0 or stop == p.byte_length)):
            u8 = dest.reshape(-1).view(np.uint8)
            pread_exact(fd, u8, p.byte_offset + start, where)
            verify_blocks(u8, start // B, p.crc32, B, where)
            return
        inner = tuple(slice(ak, ak + sk) for ak, sk in zip(a[1:], s[1:]))
        step = max(1, READ_CHUNK // row)
        for r0 in range(0, s[0], step):
            r1 = min(s[0], r0 + step)
            cs, ce = (a[0] + r0) * row, (a[0] + r1) * row
            bs, be = cs // B * B, min(-(-ce // B) * B, p.byte_length)
            buf = np.empty(be - bs, np.uint8)
            pread_exact(fd, buf, p.byte_offset + bs, where)
            verify_blocks(buf, bs // B, p.crc32, B, where)
            slab = buf[cs - bs:ce - bs].view(dtype).reshape((r1 - r0,) + L[1:])
            dest[r0:r1] = slab[(slice(None),) + inner]


# ------------------------------------------------------------------------------------------- racing saves


# [Note: Racing saves]
# Two jobs (or a job and a resubmitted copy of it) may save to one PATH at once. Their commits (rename
# the temporary directory, swap the link, delete the previous target) run under an exclusive flock(2)
# on PATH's parent directory, so no commit sees another half done. Holding it, the committer also
# removes every other ``PATH.ckpt-<id>`` and ``PATH.link-<id>`` sibling: no commit is between its
# rename and its swap (they hold the lock for that), so such a sibling is a copy that nothing links
# to (left by a race before this lock existed, or by a commit killed between its steps). Temporaries
# (``PATH.tmp-<id>``) may belong to a save still writing and are left alone. Where the file system
# refuses the lock, the commit goes on without it and removes only the target it replaced.

_COPY_RE = r"\.(?:ckpt|link)-[0-9a-f]{32}\Z"


@contextlib.contextmanager
def commit_lock(parent: str):
    """Hold an exclusive flock on ``parent``; yields whether it is held. See [Note: Racing saves]."""
    try:
        fd = os.open(parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = True
        except OSError:
            held = False
        yield held
    finally:
        os.close(fd)  # releases the lock


def remove_stale_copies(parent: str, base: str, keep: str) -> None:
    """Remove ``base.ckpt-*`` / ``base.link-*`` siblings other than ``keep`` (under the commit lock)."""
    pattern = re.compile(re.escape(base) + _COPY_RE)
    for name in os.listdir(parent):
        if name == keep or not pattern.match(name):
            continue
        p = os.path.join(parent, name)
        if os.path.islink(p) or not os.path.isdir(p):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
        else:
            shutil.rmtree(p, ignore_errors=True)
        get_logger("checkpoint").info("removed %s: a copy no checkpoint link points to (a racing or "
                                      "interrupted save)", p)
