"""spawn/start_processes under an MPI launcher: one call of ``fn(rank, *args)`` per MPI rank, in this process."""
from __future__ import annotations

import os
import traceback
from typing import Any, Callable

__all__ = ["spawn", "start_processes", "ProcessContext", "ProcessException", "ProcessRaisedException",
           "ProcessExitedException"]

_START_METHODS = ("spawn", "fork", "forkserver")

# [Note: spawn under MPI]
# PyTorch's `mp.spawn(fn, args, nprocs)` starts nprocs processes and calls fn(i, *args) in process i; the
# script is started once. An MPI job is started nprocs times by the launcher (`hpcfsdp launch -n N`,
# mpiexec, srun), so spawn starts nothing: it checks that the MPI world has nprocs ranks and calls
# fn(mpi_rank, *args) here, synchronously. What fn raises propagates wrapped in ProcessRaisedException (the
# original as __cause__), as PyTorch's parent re-raises a child's error; with join=False the error waits in
# the returned ProcessContext until join(). fn(rank, world_size, ...) then calls init_process_group(backend,
# rank=rank, world_size=world_size), which checks both against MPI.


class ProcessException(Exception):
    """An error of one spawned process (PyTorch's base class): ``error_index`` is its rank, ``pid`` its pid."""

    __slots__ = ["error_index", "error_pid"]

    def __init__(self, msg: str, error_index: int, pid: int):
        super().__init__(msg)
        self.msg = msg
        self.error_index = error_index
        self.pid = pid

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.pid)


class ProcessRaisedException(ProcessException):
    """``fn`` raised on rank ``error_index``; the original exception is ``__cause__``."""

    def __init__(self, msg: str, error_index: int, error_pid: int):
        super().__init__(msg, error_index, error_pid)


class ProcessExitedException(ProcessException):
    """PyTorch's error for a child that exited abnormally; never raised here (MPI aborts such a job)."""

    __slots__ = ["exit_code"]

    def __init__(self, msg: str, error_index: int, error_pid: int, exit_code: int, signal_name: str | None = None):
        super().__init__(msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.pid, self.exit_code, self.signal_name)


class ProcessContext:
    """What ``spawn(..., join=False)`` returns: ``fn`` has already run on this rank; ``join()`` raises its error."""

    def __init__(self, rank: int, error: ProcessRaisedException | None = None):
        self.processes: list = []  # no child processes: the MPI launcher started the ranks
        self.error_files: list = []
        self._rank = rank
        self._error = error

    def pids(self) -> list[int]:
        """This rank's process id (the other ranks' processes belong to the launcher)."""
        return [os.getpid()]

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        """True: ``fn`` finished; raises ProcessRaisedException if it raised."""
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        return True


def _world() -> tuple[int, int]:
    from hpcfsdp.distributed._mpi import get_mpi

    comm = get_mpi().COMM_WORLD
    return comm.Get_rank(), comm.Get_size()


def start_processes(fn: Callable[..., Any], args: tuple = (), nprocs: int = 1, join: bool = True,
                    daemon: bool = False, start_method: str = "spawn"):
    """Call ``fn(rank, *args)`` with this process's MPI rank, after checking the MPI world has ``nprocs`` ranks.

    Returns None (``join=True``) or a finished ProcessContext (``join=False``). See [Note: spawn under MPI].
    """
    if not callable(fn):
        raise TypeError(f"fn={fn!r}: expected a callable taking the process index first")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs={nprocs!r}: expected a positive int")
    if start_method not in _START_METHODS:
        raise ValueError(f"start_method={start_method!r}: expected one of {list(_START_METHODS)}")
    rank, size = _world()
    if size != nprocs:
        raise RuntimeError(
            f"spawn(nprocs={nprocs}) under MPI runs one process per MPI rank, but this job has {size} "
            f"rank{'s' if size != 1 else ''}: launch the script with `hpcfsdp launch -n {nprocs} -- python ...` "
            f"(or mpiexec -n {nprocs} / srun -n {nprocs})")
    error = None
    try:
        fn(rank, *args)
    except Exception as e:
        msg = f"\n\n-- Process {rank} terminated with the following error:\n{traceback.format_exc()}"
        error = ProcessRaisedException(msg, rank, os.getpid())
        error.__cause__ = e
        if join:
            raise error from e
    return None if join else ProcessContext(rank, error)


def spawn(fn: Callable[..., Any], args: tuple = (), nprocs: int = 1, join: bool = True, daemon: bool = False,
          start_method: str = "spawn"):
    """torch.multiprocessing.spawn for MPI jobs: ``fn(mpi_rank, *args)`` on this rank; ``nprocs`` must equal
    the MPI world size (launch with ``hpcfsdp launch -n nprocs``). See [Note: spawn under MPI]."""
    return start_processes(fn, args=args, nprocs=nprocs, join=join, daemon=daemon, start_method=start_method)
