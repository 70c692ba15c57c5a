"""async_save: a sharded checkpoint copied to host memory at once and written in the background."""
from __future__ import annotations

import concurrent.futures
import os
import threading
import time

import numpy as np

from . import _format as F

__all__ = ["async_save", "wait_pending"]

# [Note: Asynchronous save]
# ``async_save`` runs the save of _format.save_pieces in two halves. On the caller's thread: wait for the
# previous async save, copy every local shard to host memory (a private copy, so training may change its
# parameters at once), then phase 1 of the format (check and plan: rank 0 creates the temporary directory).
# It returns a Future. On a background thread: phase 2 (each rank writes and fsyncs its shard file) and
# phase 3 (the commit: every rank finished -> rank 0 writes metadata.json and swaps the link), so the commit
# stays atomic and a crash mid-write leaves the previous checkpoint in place (see [Note: Atomic commit]).
#
# Communicator: the async saves of a process group use a Dup of its communicator of their own, made at the
# first async_save in the communication thread's order (every rank makes it at the same point), so their
# collectives can never match training's collectives or a synchronous save's. Only one async save is in
# flight per process: a second one, and save()/load(), first wait for it.
#
# CPU: the writer thread runs at nice +10 (Linux applies nice per thread): copying into the page cache and
# computing the CRCs takes CPU, and where ranks have no spare core it would otherwise slow the training
# threads, which are on the critical path, while nobody waits for the writer until the next save.
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

_COMMS: dict = {}
_PENDING: list = []  # the Future of the async save in flight, if any
_POLL_MAX = 0.01  # longest sleep between Ibarrier tests (seconds)
_NICE = 10  # the writer thread's nice increment


def wait_pending() -> None:
    """Wait for the async save in flight (if any) to finish; its error, if any, is left to its Future."""
    while _PENDING:
        fut = _PENDING.pop()
        concurrent.futures.wait([fut])


def _async_comm(process_group):
    """The Dup of the group's communicator that async saves use. See [Note: Asynchronous save]."""
    from ..distributed_c10d import _resolve
    from ..process_group import _call_sync

    pg = _resolve(process_group)
    if id(pg) not in _COMMS:
        _COMMS[id(pg)] = (pg, _call_sync("Comm.Dup (async checkpoints)", pg.comm.Dup))
    return _COMMS[id(pg)][1]


def _host_pieces(state_dict, walk, box) -> tuple:
    """(JSON skeleton, {entry: Piece}) with every local array copied to host memory."""
    tensors: dict = {}
    skeleton = walk(state_dict, "", tensors, None)
    pieces = {}
    for name, t in tensors.items():
        shape, offsets, arr = box(t)
        if isinstance(t._data, np.ndarray) or arr.base is not None:  # may alias the live array: copy it
            arr = np.array(arr, copy=True, order="C")
        pieces[name] = F.Piece(shape, arr.dtype, offsets, arr)
    return skeleton, pieces


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


def _finish(fut, comm, path, tmp, plan, arrays, mine, entries, extras, mesh_info, fsync: bool,
            background: bool = True) -> None:
    """Phases 2 and 3 (write, commit); the outcome goes to ``fut``."""
    if background:
        _lower_priority()
    try:
        rank, world = comm.Get_rank(), comm.Get_size()
        res = F._write_own_file(tmp, rank, plan, arrays, mine, F.DEFAULT_BLOCK_SIZE, fsync)
        arrays.clear()  # the host copies are written: free them before the commit's wait
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
               use_collectives: bool = True, _walk=None, _box=None, fsync: bool = True):
    """Save ``state_dict`` like ``save`` but return a ``concurrent.futures.Future`` as soon as this rank's
    pieces are copied to host memory; the files are written and committed in the background. Collective.
    ``.result()`` returns None once the checkpoint is committed, or raises the error of any rank.
    See [Note: Asynchronous save]."""
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
    wait_pending()
    skeleton, pieces = _host_pieces(state_dict, _walk, _box)
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
    fut: concurrent.futures.Future = concurrent.futures.Future()
    fut.set_running_or_notify_cancel()
    args = (fut, comm, path, tmp, plan, arrays, mine, entries, {"skeleton": skeleton}, {"world_size": world}, fsync)
    from .._mpi import get_mpi, thread_level

    if world > 1 and thread_level() < get_mpi().THREAD_MULTIPLE:
        _finish(*args, background=False)  # no MPI from a second thread: finish here (see the Note)
        return fut
    t = threading.Thread(target=_finish, args=args, name="hpcfsdp-async-save", daemon=False)
    _PENDING.append(fut)
    t.start()
    return fut
