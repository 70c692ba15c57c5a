"""Sharded checkpoint storage: collective save and resharding load of N-D array pieces, on NumPy and mpi4py.

API (raw arrays; the state-dict layer in ``checkpoint/__init__.py`` builds on it)::

    Piece(global_shape, dtype, offsets, array)            # a namedtuple; plain 4-tuples work too
    save_pieces(path, pieces, *, comm=None, extras=None, mesh_info=None, block_size=1 MiB, fsync=True) -> None
        pieces: {entry name: Piece | [Piece, ...]}. Collective over `comm` (default MPI.COMM_WORLD).
        Every rank passes the pieces it holds: sharded entries as their local boxes (empty boxes are fine),
        replicated entries on every rank holding them. Identical boxes are written once, by the lowest rank.
        The pieces of every entry must tile its global shape (disjoint + complete) or every rank raises
        ValueError before anything is written. `extras` and `mesh_info` (JSON values) are taken from rank 0.
    load_pieces(path, requests, *, comm=None, strict=True) -> LoadResult(metadata, missing_keys, unexpected_keys)
        requests: {entry name: Request | [Request, ...]}, Request = (global_shape, dtype, offsets, out):
        fills `out` (numpy, or cupy via a host buffer) with entry[offsets : offsets + out.shape]. Any world
        size; any box: reads only the byte ranges of the saved pieces that intersect it, verifying their CRCs.
        comm=None: this rank alone. With a comm: rank 0 reads metadata.json and broadcasts it, and an error on
        any rank is raised on every rank. strict=False: entries missing from the checkpoint are skipped and
        reported in `missing_keys` instead of raising.
    read_metadata(path) -> CheckpointMetadata (.entries[name].shape/.dtype/.pieces, .extras, .mesh, .world_size,
        .files, .total_bytes)
    verify_checkpoint(path) -> CheckpointMetadata   # reads every byte, checks every CRC and header
    consolidate(path, out_file) -> None            # one safetensors file with the full entries, names unchanged
    benchmark_io(path, total_bytes, comm=None) -> dict   # save/load throughput vs raw tofile/fromfile

The reading half (``load_pieces``, ``read_metadata``, the request checks) lives in ``_read.py`` and is
re-exported here; this module writes, commits and holds the tools.

Errors: ValueError for anything wrong on disk or in the request (IncompleteCheckpointError, a ValueError,
for an interrupted save), TypeError for a dtype a checkpoint cannot hold, RuntimeError on every rank when a
rank failed to write during a save.

Layout on disk (see [Note: Atomic commit])::

    PATH -> PATH.ckpt-<id>/            PATH is a symlink to the committed directory
              metadata.json            format, version, world_size, mesh, extras, checksum block size,
                                       files {name: {rank, size}}, entries {name: {shape, dtype, pieces:
                                       [{rank, file, tensor, offsets, lengths, byte_offset, byte_length, crc32}]}}
              rank_00000.safetensors   one per rank that owns a piece; tensor "<entry>|<offsets>" = local box
              rank_00001.safetensors

[Note: Atomic commit]
A save writes into ``PATH.tmp-<id>/``: every rank writes and fsyncs its shard file, a gather to rank 0 proves
all of them finished (and carries their piece index), rank 0 writes metadata.json last and fsyncs it and the
directory, renames the directory to ``PATH.ckpt-<id>`` and atomically swaps the symlink ``PATH`` onto it
(symlink to a temporary name + rename(2), which replaces the old link in one step), then deletes the previous
``PATH.ckpt-*`` target. A crash at any point leaves PATH pointing to a complete checkpoint (the previous one
until the swap, the new one after): at worst an orphan ``.tmp-`` or ``.ckpt-`` sibling stays behind, and the
next successful commit removes orphan ``.ckpt-`` siblings (see [Note: Racing saves]). Loading
a ``.tmp-`` directory, or a directory without metadata.json that holds shard files, raises
IncompleteCheckpointError ("incomplete checkpoint ..."). If PATH is a plain directory holding a checkpoint
(copied by hand), it is first renamed aside to ``PATH.ckpt-<id>``: only in that case there is a short window
without PATH, and the error for a missing PATH names the sibling that holds the data. PATH may not be a
non-checkpoint file or non-empty directory (ValueError, nothing is touched).

[Note: Partial reads and checksums]
Each piece carries a CRC32 per `block_size` block of its bytes. A load reads, for every saved piece that
intersects the requested box, the dim-0 slab of rows it needs, widened to whole blocks, checks those blocks'
CRCs and copies the box out: in bounded chunks (~32 MiB) through a scratch buffer, or straight into the
output when the slab is block-aligned and the output contiguous (the same-world-size reload). Resharding to
another dim reads whole rows, so at most the full piece.
"""
from __future__ import annotations

import math
import os
import shutil
import time
import uuid
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from hpcfsdp._files import honour_umask

from ._metadata import (
    DTYPES, FORMAT_VERSION, METADATA_FILE, CheckpointMetadata, EntryInfo, FileInfo,
    IncompleteCheckpointError, PieceInfo, dump_metadata, parse_metadata, shard_file_name,
)
from ._read import LoadResult, _as_list, _load_local, _normalise, load_pieces, read_metadata
from ._storage import Reader as _Reader
from ._storage import (
    READ_CHUNK, check_disjoint_cover, commit_lock, fsync_dir, pread_exact, remove_stale_copies,
    verify_blocks, write_shard_file,
)

__all__ = [
    "Piece",
    "LoadResult",
    "CheckpointMetadata",
    "EntryInfo",
    "PieceInfo",
    "IncompleteCheckpointError",
    "save_pieces",
    "load_pieces",
    "read_metadata",
    "verify_checkpoint",
    "consolidate",
    "benchmark_io",
]

DEFAULT_BLOCK_SIZE = 1 << 20


class Piece(NamedTuple):
    global_shape: tuple
    dtype: Any
    offsets: tuple
    array: Any


class _SimulatedCrash(BaseException):
    """Test-only: raised by a fault hook to stop a save dead at a stage, with no cleanup (like a killed job)."""


# Test hook: called as _fault_hook(stage) at "write" (every rank, after writing its file), and on rank 0 at
# "metadata" (metadata.json written), "rename" (directory renamed, link not yet swapped), "swap" (link
# swapped, old checkpoint not yet deleted).
_fault_hook: Callable[[str], None] | None = None


def _hook(stage: str) -> None:
    if _fault_hook is not None:
        _fault_hook(stage)


# --------------------------------------------------------------------------------------------- comm helpers


def _world(comm):
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    return comm


def _gather(comm, obj) -> list | None:
    if comm is None or comm.Get_size() == 1:
        return [obj]
    return comm.gather(obj, root=0)


def _scatter(comm, objs):
    if comm is None or comm.Get_size() == 1:
        return objs[0]
    return comm.scatter(objs, root=0)


def _bcast(comm, obj):
    if comm is None or comm.Get_size() == 1:
        return obj
    return comm.bcast(obj, root=0)


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


# ------------------------------------------------------------------------------------------------------ save


def _to_host(arr) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        arr = arr.get() if hasattr(arr, "get") else np.asarray(arr)  # cupy -> host
    return arr if arr.flags.c_contiguous else arr.copy(order="C")  # np.ascontiguousarray would make 0-d 1-d


def _tensor_name(entry: str, offsets: Sequence[int]) -> str:
    return f"{entry}|{','.join(map(str, offsets))}"


def _plan(plans: list, world: int):
    """Rank 0: check every rank's pieces agree and tile their entries; pick the owner of each distinct box.

    Returns ({entry: (shape, dtype)}, owned) where owned[r] lists indices into rank r's plan it must write.
    """
    entries: dict[str, tuple] = {}
    boxes: dict[str, dict[tuple, int]] = {}  # entry -> {(offsets, lengths): owner rank}
    owned: list[list[int]] = [[] for _ in range(world)]
    for r, plan in enumerate(plans):
        for i, (name, shape, dt, offsets, lengths) in enumerate(plan):
            if name not in entries:
                entries[name] = (shape, dt)
                boxes[name] = {}
            elif entries[name] != (shape, dt):
                raise ValueError(f"entry {name!r}: ranks disagree on its global shape/dtype: {entries[name]} on an "
                                 f"earlier rank, {(shape, dt)} on rank {r}")
            if math.prod(lengths) == 0 or (offsets, lengths) in boxes[name]:
                continue  # empty box, or a replica of a box a lower rank writes
            boxes[name][(offsets, lengths)] = r
            owned[r].append(i)
    for name, (shape, _) in entries.items():
        check_disjoint_cover(name, shape, list(boxes[name]))
    return entries, owned


def _prepare_target(path: str) -> None:
    """Rank 0: refuse to clobber something that is not a checkpoint."""
    if os.path.islink(path):
        return
    if os.path.isdir(path):
        content = os.listdir(path)
        if content and METADATA_FILE not in content:
            raise ValueError(f"{path!r} exists and is not a checkpoint directory; refusing to replace it")
        if not content:
            os.rmdir(path)
    elif os.path.exists(path):
        raise ValueError(f"{path!r} exists and is not a checkpoint directory; refusing to replace it")


def save_pieces(path, pieces: Mapping[str, Any], *, comm=None, extras: Any = None, mesh_info: Any = None,
                block_size: int = DEFAULT_BLOCK_SIZE, fsync: bool = True) -> None:
    """Collectively save array pieces as a sharded checkpoint directory at `path`. See the module docstring.

    Three phases, each ending in a collective that carries every rank's errors, so that all ranks fail
    together and none hangs: check and plan (rank 0 creates the temporary directory), write (each rank its
    own shard file), commit (rank 0 writes metadata.json and swaps the link). See [Note: Atomic commit].
    """
    comm = _world(comm)
    rank, world = comm.Get_rank(), comm.Get_size()
    if type(block_size) is not int or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    err, plan, arrays = _check_pieces(pieces, rank, world)
    gathered = _gather(comm, (err, plan))
    decisions, entries = _plan_on_root(path, gathered, world) if rank == 0 else (None, None)
    err, tmp, mine = _scatter(comm, decisions)
    if err is not None:
        raise err[0](err[1])
    results = _gather(comm, _write_own_file(tmp, rank, plan, arrays, mine, block_size, fsync))
    status = _commit_on_root(path, tmp, results, entries, world, block_size, mesh_info, extras, fsync) \
        if rank == 0 else None
    status = _bcast(comm, status)
    if status is not None:
        raise status[0](status[1])


def _check_pieces(pieces, rank: int, world: int):
    """Phase 1, every rank: check its own pieces. Returns (error or None, plan, arrays); the error is
    reported, not raised, because every rank must reach the gather."""
    err, plan, arrays = None, [], []
    try:
        if not isinstance(pieces, Mapping):
            raise TypeError(f"pieces must be a mapping of entry name -> pieces, got {type(pieces).__name__}")
        for name, spec in pieces.items():
            if not isinstance(name, str) or not name or name == "__metadata__":
                raise ValueError(f"entry names must be non-empty strings other than '__metadata__', got {name!r}")
            for k, p in enumerate(_as_list(spec)):
                shape, dt, offsets, lengths, arr = _normalise(name, p, f"piece {k}")
                plan.append((name, shape, dt, offsets, lengths))
                arrays.append(arr)
    except Exception as e:
        kind = type(e) if isinstance(e, (TypeError, ValueError)) else RuntimeError
        err = (kind, f"rank {rank}: {e}" if world > 1 else str(e))
    return err, plan, arrays


def _plan_on_root(path, gathered, world: int):
    """Phase 1, rank 0: raise any rank's error, plan the owners of every box and create the temporary
    directory. Returns (one (error, tmp dir, indices to write) per rank, {entry: (shape, dtype)})."""
    try:
        errs = [g[0] for g in gathered if g[0] is not None]
        if errs:
            raise errs[0][0](errs[0][1])
        entries, owned = _plan([g[1] for g in gathered], world)
        target = os.path.abspath(os.fspath(path))
        parent, base = os.path.split(target)
        if not base:
            raise ValueError(f"invalid checkpoint path {path!r}")
        _prepare_target(target)
        tmp = os.path.join(parent, f"{base}.tmp-{uuid.uuid4().hex}")
        os.makedirs(parent, exist_ok=True)
        os.mkdir(tmp)
        return [(None, tmp, owned[r]) for r in range(world)], entries
    except Exception as e:
        kind = type(e) if isinstance(e, (TypeError, ValueError, RuntimeError)) else RuntimeError
        return [((kind, str(e) if kind is type(e) else _describe(e)), None, None)] * world, None


def _write_own_file(tmp: str, rank: int, plan, arrays, mine, block_size: int, fsync: bool):
    """Phase 2, every rank: write the boxes it owns to its shard file. Returns (error or None, file info,
    piece records) for rank 0; an error is reported so that every rank fails together."""
    err, records, finfo = None, [], None
    try:
        if mine:
            fname = shard_file_name(rank)
            tensors = [(_tensor_name(plan[i][0], plan[i][3]), _to_host(arrays[i])) for i in mine]
            size, placed = write_shard_file(os.path.join(tmp, fname), tensors, block_size, fsync)
            finfo = (fname, size)
            for i, (tname, _), (boff, blen, crcs) in zip(mine, tensors, placed):
                records.append((plan[i][0], fname, tname, plan[i][3], plan[i][4], boff, blen, crcs))
        _hook("write")
    except Exception as e:
        err = f"rank {rank}: {_describe(e)}"
    return err, finfo, records


def _commit_on_root(path, tmp: str, results, entries, world: int, block_size: int, mesh_info, extras,
                    fsync: bool):
    """Phase 3, rank 0: write metadata.json last and commit. Returns None or (error type, message)."""
    errs = [r[0] for r in results if r[0] is not None]
    try:
        if errs:
            raise RuntimeError("checkpoint save failed, nothing was committed: " + "; ".join(errs))
        md = _build_metadata(entries, results, world, block_size, mesh_info, extras)
        _write_metadata(tmp, md, fsync)
        _hook("metadata")
        _commit(tmp, os.path.abspath(os.fspath(path)), fsync)
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        return (RuntimeError if not isinstance(e, ValueError) else ValueError, str(e))
    return None


def _build_metadata(entries, results, world, block_size, mesh_info, extras) -> CheckpointMetadata:
    files, pieces = {}, {name: [] for name in entries}
    for r, (_, finfo, records) in enumerate(results):
        if finfo is not None:
            files[finfo[0]] = FileInfo(finfo[0], r, finfo[1])
        for name, fname, tname, offsets, lengths, boff, blen, crcs in records:
            pieces[name].append(PieceInfo(r, fname, tname, offsets, lengths, boff, blen, tuple(crcs)))
    ents = {
        name: EntryInfo(name, shape, DTYPES[dt], tuple(sorted(pieces[name], key=lambda p: p.offsets)))
        for name, (shape, dt) in entries.items()
    }
    md = CheckpointMetadata(FORMAT_VERSION, world, block_size, ents, files, mesh_info, extras)
    parse_metadata(dump_metadata(md), "(being written)")  # the writer obeys its own reader
    return md


def _write_metadata(tmp: str, md: CheckpointMetadata, fsync: bool) -> None:
    with open(os.path.join(tmp, METADATA_FILE), "wb") as f:
        f.write(dump_metadata(md))
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    if fsync:
        fsync_dir(tmp)


def _commit(tmp: str, target: str, fsync: bool) -> None:
    parent, base = os.path.split(target)
    uid = tmp.rsplit("-", 1)[1]
    final = os.path.join(parent, f"{base}.ckpt-{uid}")
    with commit_lock(parent) as locked:
        os.rename(tmp, final)
        if fsync:
            fsync_dir(parent)
        _hook("rename")
        old = None
        if os.path.islink(target):
            dest = os.readlink(target)
            if os.path.dirname(dest) in ("", parent) and os.path.basename(dest).startswith(f"{base}.ckpt-"):
                old = os.path.join(parent, os.path.basename(dest))
        elif os.path.isdir(target):  # a plain checkpoint directory: move it aside first (see the Note)
            old = os.path.join(parent, f"{base}.ckpt-{uuid.uuid4().hex}")
            os.rename(target, old)
        link = os.path.join(parent, f"{base}.link-{uid}")
        os.symlink(os.path.basename(final), link)
        os.replace(link, target)
        if fsync:
            fsync_dir(parent)
        _hook("swap")
        if old is not None and old != final:
            shutil.rmtree(old, ignore_errors=True)
        if locked:
            remove_stale_copies(parent, base, os.path.basename(final))


# ----------------------------------------------------------------------------------------------------- tools


def verify_checkpoint(path) -> CheckpointMetadata:
    """Read every piece of every file and check sizes, headers and all CRCs; ValueError naming the first fault."""
    md = read_metadata(path)
    reader = _Reader(md)
    try:
        for fname in md.files:
            reader._open(fname)
        for e in md.entries.values():
            for p in e.pieces:
                fd = reader.check_piece(p, e.dtype)
                where = f"{os.path.join(md.path, p.file)} tensor {p.tensor!r}"
                step = max(1, READ_CHUNK // md.block_size) * md.block_size
                for off in range(0, p.byte_length, step):
                    buf = np.empty(min(step, p.byte_length - off), np.uint8)
                    pread_exact(fd, buf, p.byte_offset + off, where)
                    verify_blocks(buf, off // md.block_size, p.crc32, md.block_size, where)
    finally:
        reader.close()
    return md


def consolidate(path, out_file, optim_file=None) -> list:
    """Assemble every entry in full, piece by piece, and write safetensors files; returns the files written.

    A training checkpoint (entries under ``model.`` and ``optim.``) is split: the model's weights go to
    ``out_file`` under their parameter names (``model.`` removed, so a model loads them directly) and the
    optimizer state to ``optim_file`` (default: ``out_file`` with ``.optim`` before its suffix), names
    unchanged. Any other checkpoint is written whole to ``out_file`` with its entry names."""
    import json

    from safetensors.numpy import save_file

    md = read_metadata(path)
    for f in md.files.values():  # allocate only what the files really hold
        fpath = os.path.join(md.path, f.name)
        if os.path.isdir(fpath):
            raise ValueError(f"{fpath} is a directory, not a shard file: the checkpoint is damaged")
        size = os.path.getsize(fpath) if os.path.exists(fpath) else None
        if size != f.size:
            raise ValueError(f"{fpath} has {size} bytes, the metadata says {f.size}: truncated, damaged or missing")
    meta = {"format": "np", "hpcfsdp.extras": json.dumps(md.extras), "hpcfsdp.mesh": json.dumps(md.mesh)}
    names = list(md.entries)
    model = [n for n in names if n.startswith("model.")]
    optim = [n for n in names if n.startswith("optim.")]
    if not model or len(model) + len(optim) != len(names):
        groups = [(os.fspath(out_file), names, "")]
    else:
        if optim_file is None:
            stem, ext = os.path.splitext(os.fspath(out_file))
            optim_file = f"{stem}.optim{ext or '.safetensors'}"
        groups = [(os.fspath(out_file), model, "model.")]
        if optim:
            groups.append((os.fspath(optim_file), optim, ""))
    for target, group, prefix in groups:
        full = {name: np.empty(md.entries[name].shape, md.entries[name].dtype) for name in group}
        _load_local(md, {name: (md.entries[name].shape, md.entries[name].dtype, (0,) * len(md.entries[name].shape),
                                full[name]) for name in group}, True)
        save_file({name[len(prefix):]: a for name, a in full.items()}, target, metadata=meta)
        honour_umask(target)
        del full
    return [target for target, _, _ in groups]


def benchmark_io(path, total_bytes: int, comm=None, *, fsync: bool = True) -> dict:
    """Time save_pieces/load_pieces of a float32 vector of `total_bytes`, sharded on dim 0 over `comm`, against
    raw ndarray.tofile/np.fromfile of the same per-rank bytes. Collective. Returns seconds (max over ranks) and
    GB/s. Reads are likely served from the page cache; the comparison is like for like."""
    comm = _world(comm)
    rank, world = comm.Get_rank(), comm.Get_size()
    n = max(1, int(total_bytes) // 4)
    c = -(-n // world)
    lo, hi = min(rank * c, n), min((rank + 1) * c, n)
    local = np.random.default_rng(rank).standard_normal(hi - lo, dtype=np.float32)
    base = os.path.abspath(os.fspath(path))
    if rank == 0:
        os.makedirs(base, exist_ok=True)
    _bcast(comm, None)

    def timed(fn):
        if world > 1:
            comm.Barrier()
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        return comm.allreduce(dt, op=_max_op()) if world > 1 else dt

    ck = os.path.join(base, "bench_ckpt")
    raw = os.path.join(base, f"bench_raw_{rank:05d}.bin")
    out = np.empty_like(local)

    def raw_write():
        with open(raw, "wb") as f:
            local.tofile(f)
            f.flush()
            if fsync:
                os.fsync(f.fileno())

    def raw_read():
        out[...] = np.fromfile(raw, dtype=np.float32)

    t_save = timed(lambda: save_pieces(ck, {"x": Piece((n,), np.float32, (lo,), local)}, comm=comm, fsync=fsync))
    t_load = timed(lambda: load_pieces(ck, {"x": ((n,), np.float32, (lo,), out)}, comm=comm))
    ok = bool(np.array_equal(out, local))
    t_wr = timed(raw_write)
    t_rd = timed(raw_read)
    os.remove(raw)
    if world > 1:
        comm.Barrier()
    if rank == 0:
        real = os.path.realpath(ck)
        os.remove(ck)
        shutil.rmtree(real, ignore_errors=True)
    nbytes = n * 4
    gbps = lambda t: nbytes / t / 1e9 if t > 0 else float("inf")  # noqa: E731
    return {
        "world_size": world, "bytes": nbytes, "roundtrip_ok": ok,
        "save_s": t_save, "load_s": t_load, "raw_write_s": t_wr, "raw_read_s": t_rd,
        "save_GBps": gbps(t_save), "load_GBps": gbps(t_load), "raw_write_GBps": gbps(t_wr), "raw_read_GBps": gbps(t_rd),
    }


def _max_op():
    from mpi4py import MPI

    return MPI.MAX
