"""async_save: a sharded checkpoint staged in reused host memory at once and written in the background."""
from __future__ import annotations

import concurrent.futures
import errno
import mmap
import os
import threading
import time
import zlib

import numpy as np

from . import _format as F
from . import _storage as S

__all__ = ["async_save", "wait_pending"]

# [Note: Asynchronous save]
# ``async_save`` runs the save of _format.save_pieces in two halves. On the caller's thread: wait for the
# previous async save, phase 1 of the format (check and plan: rank 0 creates the temporary directory; the
# plan needs only shapes and dtypes), then stage: copy the boxes this rank owns into its shard file's image
# in host memory (a private copy, so training may change its parameters at once). It returns a Future. On
# a background thread: phase 2 (each rank computes the block CRCs of its image, writes and fsyncs it) and
# phase 3 (the commit: every rank finished -> rank 0 writes metadata.json and swaps the link), so the commit
# stays atomic and a crash mid-write leaves the previous checkpoint in place (see [Note: Atomic commit]).
#
# Communicator: the async saves of a process group use a Dup of its communicator of their own, made at the
# first async_save in the communication thread's order (every rank makes it at the same point), so their
# collectives can never match training's collectives or a synchronous save's. Only one async save is in
# flight per process: a second one, and save()/load(), first wait for it.
#
# Thread level: the background thread calls MPI while the communication thread runs training's
# collectives, which needs MPI_THREAD_MULTIPLE (what hpcfsdp requests and MPICH and Open MPI provide). It
# first waits for every rank's write with a nonblocking Ibarrier polled with sleeps, so that it does not
# spin inside MPI while the others are still writing, then runs the short gather/commit/broadcast. Under a
# lower thread level the whole save runs on the caller's thread before async_save returns (a completed
# Future): correct, but without the overlap.
#
# Errors: a failure on any rank in the background is reported through the commit's gather and raised at
# ``.result()`` on every rank (RuntimeError naming the rank), with nothing committed.

# [Note: Staging and direct writes]
# What an async save costs training is the time its call takes plus the CPU, memory traffic and GIL it
# takes from the training threads while it writes, so the save does as little of each as it can. Measured
# on the 2-vCPU VM (a Firecracker guest), 264 MiB per rank, 2 ranks:
# - Fresh memory is expensive: the first touch of newly allocated (or newly page-cached) memory costs
#   ~1 s/GiB here (page faults, and the host backing the guest's pages), 10-20x the copy itself. A host
#   copy into new arrays at every save took 0.25-0.5 s; a buffered write() into the page cache, whose
#   pages the previous checkpoint's deletion had just freed, 0.65 s of the writer's CPU, against 0.06 s
#   once the pages were warm. So the shards are staged in one page-aligned buffer per process, allocated
#   at the first async save (which pays that first touch) and reused by every later one (it grows if the
#   state grows). The buffer is the shard file's exact image (safetensors header, then the tensors at
#   their file offsets), so staging is one copy per piece and nothing is serialized or concatenated
#   afterwards. It stays allocated for the life of the process (the state's size per rank, as PyTorch's
#   cached pinned staging does). On a GPU the buffer is registered as pinned memory and the
#   device-to-host copy lands in it directly.
# - The block CRCs are computed while staging, block by block right after each block is copied (it is
#   still in cache): ~40 ms per 264 MiB on the caller's thread. On the writer thread they would cost a
#   GIL hand-off per 1 MiB block (zlib releases the GIL per call); CPython's forced switching makes the
#   thread that drops the GIL wait until the other has taken it, so every hand-off to a low-priority
#   writer on a busy machine stalls the training thread until the scheduler runs the writer.
# - The image is written with O_DIRECT in 64 MiB os.pwrite calls (page-aligned buffer and offsets, the
#   file truncated to its size at the end): the disk's DMA reads the staging buffer, no page cache is
#   filled, and the writer thread spends ~10 ms of CPU on 264 MiB instead of ~0.6 s, in a handful of
#   GIL hand-offs; the final fsync has only metadata left to flush. A file system that refuses O_DIRECT
#   (tmpfs; EINVAL at open or at a write) gets ordinary writes of the same bytes. The file is byte for
#   byte what a synchronous save writes (same header from _storage.shard_file_header, same order).
# - The writer thread runs at nice +10 (Linux applies nice per thread): where ranks have no spare core it
#   takes CPU from training only when training leaves some; nobody waits for it until the next save.

_COMMS: dict = {}
_PENDING: list = []  # the Future of the async save in flight, if any
_POLL_MAX = 0.01  # longest sleep between Ibarrier tests (seconds)
_NICE = 10  # the writer thread's nice increment
_ALIGN = 4096  # O_DIRECT alignment of buffer, offsets and lengths (the page size covers every block size)
_CHUNK = 64 << 20  # bytes per write call (each one a GIL hand-off: few and large)
_STAGING: dict = {}  # "buf": the mmap, "arr": a uint8 array over it, "pinned": registered with CUDA


def wait_pending() -> None:
    """Wait for the async save in flight (if any) to finish; its error, if any, is left to its Future."""
    while _PENDING:
        fut = _PENDING.pop()
        concurrent.futures.wait([fut])


def _async_comm(process_group):
    """The Dup of the group's communicator that async saves use. See [Note: Asynchronous save]."""
    from .._c10d_groups import resolve_group
    from .._comm_thread import call_sync

    pg = resolve_group(process_group)
    if id(pg) not in _COMMS:
        _COMMS[id(pg)] = (pg, call_sync("Comm.Dup (async checkpoints)", pg.comm.Dup))
    return _COMMS[id(pg)][1]


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _unpin() -> None:
    if _STAGING.get("pinned"):
        import cupy

        try:
            cupy.cuda.runtime.hostUnregister(_STAGING["arr"].ctypes.data)
        except Exception:  # noqa: BLE001 (the buffer is being dropped anyway)
            pass


def _staging(nbytes: int) -> np.ndarray:
    """The page-aligned staging buffer (uint8, at least ``nbytes`` rounded up to _ALIGN), reused across
    saves. Only one async save is in flight, so the previous one no longer reads it. See the Note."""
    need = _round_up(max(nbytes, 1), _ALIGN)
    if "arr" not in _STAGING or len(_STAGING["arr"]) < need:
        _unpin()
        _STAGING.clear()
        size = _round_up(need, 2 << 20)
        buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(buf, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                buf.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        _STAGING.update(buf=buf, arr=np.frombuffer(buf, np.uint8), pinned=False)
    return _STAGING["arr"]


def _pin_for_device() -> None:
    """Register the staging buffer with CUDA once, so device-to-host copies into it run at full speed."""
    if _STAGING.get("pinned") is not False:
        return
    arr = _STAGING["arr"]
    try:
        import cupy

        cupy.cuda.runtime.hostRegister(arr.ctypes.data, arr.nbytes, 0)
        _STAGING["pinned"] = True
    except Exception:  # noqa: BLE001 (pinning is an optimization; copies work unpinned)
        _STAGING["pinned"] = None


def _copy_and_crc(dst: np.ndarray, src, block_size: int) -> list[int]:
    """Copy ``src`` into ``dst`` (same shape and dtype) and return the CRC32 of each block of its bytes,
    block by block while the block is in cache where ``src`` is a C-contiguous NumPy array."""
    u8 = dst.reshape(-1).view(np.uint8)
    if isinstance(src, np.ndarray) and src.flags.c_contiguous and src.dtype == dst.dtype:
        s8 = src.reshape(-1).view(np.uint8)
        crcs = []
        for i in range(0, len(u8), block_size):
            blk = u8[i:i + block_size]
            np.copyto(blk, s8[i:i + block_size])
            crcs.append(zlib.crc32(blk))
        return crcs
    if isinstance(src, np.ndarray):
        np.copyto(dst, src, casting="no")
    elif hasattr(src, "get"):  # CuPy: one device-to-host copy into the (pinned) buffer
        _pin_for_device()
        src.get(out=dst)
    else:
        np.copyto(dst, np.asarray(src), casting="no")
    return S.block_crcs(u8, block_size)


def _stage(plan, arrays, mine, block_size: int):
    """Copy the boxes this rank writes into the staging buffer as its shard file's image, with their block
    CRCs. Returns (image or None, file size, [(tensor name, byte offset, byte length, crcs)])."""
    if not mine:
        return None, 0, []
    specs = [(F._tensor_name(plan[i][0], plan[i][3]), tuple(arrays[i].shape), np.dtype(arrays[i].dtype))
             for i in mine]
    prefix, starts = S.shard_file_header(specs)
    lens = [int(np.prod(shape, dtype=np.int64)) * dt.itemsize for _, shape, dt in specs]
    size = starts[-1] + lens[-1]
    img = _staging(size)
    img[:len(prefix)] = np.frombuffer(prefix, np.uint8)
    placed = []
    for i, (name, shape, dt), start, n in zip(mine, specs, starts, lens):
        crcs = _copy_and_crc(img[start:start + n].view(dt).reshape(shape), arrays[i], block_size)
        placed.append((name, start, n, crcs))
    return img, size, placed


def _write_image(path: str, img: np.ndarray, size: int, fsync: bool, direct: bool = True) -> bool:
    """Write ``img[:size]`` as file ``path``: O_DIRECT where the file system takes it, ordinary writes
    otherwise (same bytes). Returns whether every byte went through O_DIRECT. See the Note."""
    o_direct = getattr(os, "O_DIRECT", 0) if direct else 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | o_direct, 0o644)
    except OSError as e:
        if not o_direct or e.errno != errno.EINVAL:
            raise
        o_direct = 0
        fd = os.open(path, flags, 0o644)
    try:
        end = _round_up(size, _ALIGN) if o_direct else size
        mv, off = memoryview(img), 0
        while off < end:
            try:
                n = os.pwrite(fd, mv[off:min(off + _CHUNK, end)], off)
            except OSError as e:
                if not o_direct or e.errno != errno.EINVAL:
                    raise
                import fcntl  # refused at this offset or alignment: the rest as ordinary writes

                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~o_direct)
                o_direct, end = 0, size
                continue
            if n <= 0:
                raise OSError(errno.EIO, f"write returned {n} at byte {off} of {path}")
            off += n
        if off != size:
            os.ftruncate(fd, size)  # the O_DIRECT tail padding
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return bool(o_direct)


def _write_staged(tmp: str, rank: int, plan, mine, staged, fsync: bool):
    """Phase 2 from the staged image; returns what _format._write_own_file returns (error or None, file
    info, piece records), so the commit is the same code as a synchronous save's."""
    err, records, finfo = None, [], None
    try:
        if isinstance(staged, BaseException):  # staging failed on the caller's thread
            raise staged
        img, size, placed = staged
        if mine:
            fname = F.shard_file_name(rank)
            _write_image(os.path.join(tmp, fname), img, size, fsync)
            finfo = (fname, size)
            for i, (tname, start, n, c) in zip(mine, placed):
                records.append((plan[i][0], fname, tname, plan[i][3], plan[i][4], start, n, c))
        F._hook("write")
    except Exception as e:
        err = f"rank {rank}: {F._describe(e)}"
    return err, finfo, records


def _wait_all(comm) -> None:
    """Return once every rank of ``comm`` got here, sleeping between tests (no busy MPI wait)."""
    if comm.Get_size() == 1:
        return
    req = comm.Ibarrier()
    pause = 0.0005
    while not req.Test():
        time.sleep(pause)
        pause = min(pause * 2, _POLL_MAX)


def _lower_priority() -> None:
    """Give the calling thread a lower CPU priority (Linux: nice applies per thread). See the Note."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + _NICE))
    except (AttributeError, OSError):  # not Linux, or not allowed: run at the same priority
        pass


def _finish(fut, comm, path, tmp, plan, mine, staged, entries, extras, mesh_info, fsync: bool,
            background: bool = True) -> None:
    """Phases 2 and 3 (write, commit); the outcome goes to ``fut``."""
    if background:
        _lower_priority()
    try:
        rank, world = comm.Get_rank(), comm.Get_size()
        res = _write_staged(tmp, rank, plan, mine, staged, fsync)
        _wait_all(comm)
        results = F._gather(comm, res)
        status = F._commit_on_root(path, tmp, results, entries, world, F.DEFAULT_BLOCK_SIZE, mesh_info, extras,
                                   fsync) if rank == 0 else None
        status = F._bcast(comm, status)
        if status is not None:
            fut.set_exception(status[0](status[1]))
        else:
            fut.set_result(None)
    except BaseException as e:  # noqa: BLE001 (surfaces at .result())
        fut.set_exception(e)


def async_save(state_dict, *, checkpoint_id=None, storage_writer=None, planner=None, process_group=None,
               async_checkpointer_type=None, async_stager=None, no_dist: bool = False,
               use_collectives: bool = True, _walk=None, _boxes=None, fsync: bool = True):
    """Save ``state_dict`` like ``save`` but return a ``concurrent.futures.Future`` as soon as this rank's
    pieces are staged in host memory; the files are written and committed in the background. Collective.
    ``.result()`` returns None once the checkpoint is committed, or raises the error of any rank.
    See [Note: Asynchronous save] and [Note: Staging and direct writes]."""
    if checkpoint_id is None:
        raise ValueError("async_save needs checkpoint_id (the checkpoint directory)")
    for name, val in (("storage_writer", storage_writer), ("planner", planner), ("async_stager", async_stager)):
        if val is not None:
            raise ValueError(f"async_save: {name}={val!r} is not supported; expected None (the built-in "
                             "sharded format and a host-memory copy)")
    kind = getattr(async_checkpointer_type, "name", async_checkpointer_type)
    if kind is not None and str(kind).lower() != "thread":
        raise ValueError(f"async_checkpointer_type={async_checkpointer_type!r}: only the thread checkpointer "
                         "exists here; expected None or THREAD")
    if no_dist or not use_collectives:
        raise ValueError("async_save: no_dist=True / use_collectives=False are not supported; the commit is "
                         "collective")
    if not isinstance(state_dict, dict):
        raise TypeError(f"async_save expects a dict state_dict, got {type(state_dict).__name__}")
    wait_pending()  # the previous save no longer reads the staging buffer after this
    tensors: dict = {}
    skeleton = _walk(state_dict, "", tensors, None)
    pieces = {}
    for name, t in tensors.items():
        # the live arrays (NumPy or CuPy; several boxes for an interleaved DTensor piece), staged below
        pieces[name] = [F.Piece(shape, arr.dtype, offsets, arr) for shape, offsets, arr in _boxes(t, host=False)]
    comm = _async_comm(process_group)
    rank, world = comm.Get_rank(), comm.Get_size()
    path = str(checkpoint_id)
    # phase 1 on the caller's thread: check and plan (rank 0 creates the temporary directory)
    err, plan, arrays = F._check_pieces(pieces, rank, world)
    del pieces
    gathered = F._gather(comm, (err, plan))
    decisions, entries = F._plan_on_root(path, gathered, world) if rank == 0 else (None, None)
    err, tmp, mine = F._scatter(comm, decisions)
    if err is not None:
        raise err[0](err[1])
    try:
        staged = _stage(plan, arrays, mine, F.DEFAULT_BLOCK_SIZE)  # the private copy: training may change its arrays from here on
    except Exception as e:  # noqa: BLE001 (reported through the commit's gather: every rank fails together)
        staged = e
    del arrays
    fut: concurrent.futures.Future = concurrent.futures.Future()
    fut.set_running_or_notify_cancel()
    args = (fut, comm, path, tmp, plan, mine, staged, entries, {"skeleton": skeleton}, {"world_size": world}, fsync)
    from .._mpi import get_mpi, thread_level

    if world > 1 and thread_level() < get_mpi().THREAD_MULTIPLE:
        _finish(*args, background=False)  # no MPI from a second thread: finish here (see the Note)
        return fut
    t = threading.Thread(target=_finish, args=args, name="hpcfsdp-async-save", daemon=False)
    _PENDING.append(fut)
    t.start()
    return fut
