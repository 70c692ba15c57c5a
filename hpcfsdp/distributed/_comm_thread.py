"""Work, the per-process communication thread and the hand-off of MPI calls to it (execute, submit, call_sync)."""

from __future__ import annotations

import atexit
import collections
import datetime
import threading
import time
import traceback
from typing import Any, Callable

from hpcfsdp import _backend, _trace
from hpcfsdp.distributed import _failure as F
from hpcfsdp.distributed._mpi import comm_timeout, get_mpi, inline_enabled, thread_level

__all__ = ["Work", "CommThread", "COMM_THREAD", "comm_thread", "execute", "submit", "call_sync"]

# [Note: Communication thread]
# One thread per process runs every MPI call of the comm layer, in the order the main thread
# issued them (a FIFO), for all process groups together. This is the analogue of the one NCCL
# stream FSDP2 uses per kind: because all ranks issue collectives in the same order, they reach
# MPI in the same order, on every communicator, and no two collectives of this process are ever
# inside MPI at once. The main thread only enqueues and waits on a threading.Event, so it keeps
# computing (NumPy and CuPy release the GIL in their kernels, mpi4py releases it inside MPI).
# Communicator management (Dup, Split, Free) goes through the same queue, so it is ordered
# with the collectives and MPI_THREAD_SERIALIZED would suffice. With less than SERIALIZED the
# thread is not started and every call runs inline on the calling thread (no overlap).
#
# [Note: Progress and busy polling]
# MPICH progresses a collective only while a thread is inside MPI, and its blocking calls
# busy-poll (sched_yield every MPIR_CVAR_POLLS_BEFORE_YIELD=1000 polls). Mode "blocking"
# (default, HPCFSDP_COMM_PROGRESS) calls the blocking collective on the comm thread; mode "test"
# starts the nonblocking one and polls MPI_Test with a sleeping back-off, so the comm thread
# gives its core away while it waits. Measured on the 2-vCPU dev VM, 2 ranks (one core each),
# a 64 MiB all-gather (~16 ms alone) against an equally long float32 256x256 matmul loop,
# wall(overlapped) / (wall(comm) + wall(compute)), best runs of 25 repetitions:
#     blocking 0.85-0.90   test 0.85-0.95   either + MPIR_CVAR_CH4_PROGRESS_THROTTLE=1 0.84-0.96
#     either + MPIR_CVAR_POLLS_BEFORE_YIELD=1 MPIR_CVAR_ENABLE_HEAVY_YIELD=1 0.85-0.91
#     comm thread at nice +5 / +19: 1.2-1.6 (the peer's copy stalls: never do this)
# No knob beats the run-to-run noise (+-0.05, other jobs share the VM). The limit is physical:
# on shared memory the all-gather is memcpy work (32 MiB copy: 5.5 ms alone, 8.4 ms when both
# cores copy), so with one core per rank overlap can only win back the memory-bandwidth
# contention and the waiting, not the copies. The busy polling costs little because MPICH is
# copying most of the time it polls. With a spare core per rank (or a GPU doing the compute)
# the comm thread runs beside the compute and overlap approaches min(comm, compute).
# Launcher knobs if a machine shows polling contention: MPIR_CVAR_CH4_PROGRESS_THROTTLE=1,
# MPIR_CVAR_POLLS_BEFORE_YIELD=<small>, MPIR_CVAR_ENABLE_HEAVY_YIELD=1 (MPICH);
# OMPI_MCA_mpi_yield_when_idle=1 (Open MPI); or HPCFSDP_COMM_PROGRESS=test.
#
# [Note: Inline calls]
# Handing a blocking call to the communication thread costs two thread wake-ups (about 150 us
# per collective on this VM, measured with `hpcfsdp bench comm`), which dominates small
# messages. So a *blocking* call whose turn it already is (nothing queued or running) runs on
# the calling thread instead; the order is unchanged because everything issued before it has
# completed. Async calls always go through the thread. While an inline call runs, the idle
# communication thread watches its deadline (see [Note: Watchdog]). HPCFSDP_COMM_INLINE=0
# sends every call through the thread.


class Work:
    """Handle of an issued collective: wait(), is_completed(), exception(), result()."""

    __slots__ = ("_desc", "_fn", "_done", "_exc", "_result", "_issued", "_tb", "_meta", "_device", "_kept")

    def __init__(self, desc: str | Callable[[], str], fn: Callable[[], Any] | None = None):
        self._desc = desc  # a str or a callable making it (formatted only when needed)
        self._fn = fn
        self._meta = None  # the history entry of a ProcessGroup collective (watchdog report)
        self._done = threading.Event()
        self._exc: BaseException | None = None
        self._result: Any = None
        self._issued = time.monotonic()
        self._tb = ""
        self._device = None  # the issuing thread's CUDA device; see [Note: Device arrays] in _buffers.py
        self._kept = True  # False: a blocking call's Work, dropped on completion (see _run)

    @property
    def desc(self) -> str:
        """What this Work is: collective, buffers and group."""
        if callable(self._desc):
            self._desc = self._desc()
        return self._desc

    @classmethod
    def _completed(cls, desc, result: Any = None) -> "Work":
        w = cls(desc)
        w._result = result
        w._done.set()
        return w

    def _run(self) -> None:
        rec = _trace.RECORDER  # see [Note: Timeline] in hpcfsdp/_trace.py
        t0 = rec.now() if rec is not None else 0.0
        try:
            self._result = self._fn()
        except BaseException as e:  # re-raised at wait(); see [Note: Failure handling]
            self._exc = e
            self._tb = traceback.format_exc()
            F.UNREPORTED[id(self)] = (self, time.monotonic())
        finally:
            self._fn = None
            # the lazy description captures the buffers: format it and free them where the Work outlives
            # the call (async) or failed; a blocking call's Work is dropped, so it skips the formatting
            if callable(self._desc) and (self._kept or self._exc is not None):
                self._desc = self._desc()
            if rec is not None:
                rec.comm_event(self, t0)
            self._done.set()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._exc is None

    def exception(self) -> BaseException | None:
        if self._exc is not None:
            F.UNREPORTED.pop(id(self), None)
        return self._exc

    def result(self) -> Any:
        self.wait()
        return self._result

    def wait(self, timeout: float | datetime.timedelta | None = None) -> bool:
        """Block until done; re-raise the comm thread's exception. See [Note: Watchdog]."""
        if not self._done.is_set():
            if isinstance(timeout, datetime.timedelta):
                timeout = timeout.total_seconds()
            rec = _trace.RECORDER
            t0 = rec.now() if rec is not None else 0.0
            self._wait_loop(timeout)
            if rec is not None:
                rec.wait_event(self, t0)
        if self._exc is not None:
            F.UNREPORTED.pop(id(self), None)
            raise self._exc
        return True

    def _wait_loop(self, timeout: float | None) -> None:
        limit = comm_timeout()
        start = time.monotonic()
        step = 0.001
        while not self._done.wait(step):
            step = min(step * 2, 0.1)
            waited = time.monotonic() - start
            if timeout is not None and waited >= timeout:
                raise TimeoutError(f"{self.desc} did not complete within timeout={timeout} s")
            if 0 < limit <= waited:
                _watchdog_abort(self, limit)

    def __repr__(self) -> str:
        state = "completed" if self.is_completed() else "pending"
        return f"Work({self.desc}, {state})"


class CommThread:
    """The per-process FIFO executor of MPI calls. See [Note: Communication thread]."""

    def __init__(self):
        self._q: collections.deque[Work] = collections.deque()
        self._cv = threading.Condition()
        self.current: Work | None = None
        self._inline_since: float | None = None
        self._thread = threading.Thread(target=self._loop, name="hpcfsdp-comm", daemon=True)
        self._thread.start()
        atexit.register(self.drain)  # runs before MPI_Finalize and _report_unreported_at_exit

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until everything queued has run (at exit: no MPI call may outlive MPI_Finalize)."""
        end = time.monotonic() + timeout
        with self._cv:
            while self._q or (self.current is not None and self._inline_since is None):
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.1))
        return True

    def submit(self, work: Work) -> Work:
        with self._cv:
            self._q.append(work)
            self._cv.notify()
        return work

    def idle(self) -> bool:
        with self._cv:
            return not self._q and self.current is None

    def begin_inline(self, work: Work) -> bool:
        """Claim MPI for the calling thread if nothing is queued or running. See [Note: Inline calls]."""
        with self._cv:
            if self._q or self.current is not None:
                return False
            self.current = work
            self._inline_since = time.monotonic()  # watched by the thread's periodic check
            return True

    def end_inline(self) -> None:
        with self._cv:
            self.current = None
            self._inline_since = None
            if self._q:  # another thread queued work meanwhile
                self._cv.notify()

    def _loop(self) -> None:
        while True:
            fire = None
            with self._cv:
                while not self._q or self.current is not None:
                    # no wake-up per inline call (each costs ~100 us on a busy VM): poll instead
                    limit = comm_timeout()
                    if self._inline_since is not None and 0 < limit <= time.monotonic() - self._inline_since:
                        fire = (_watchdog_abort, self.current, limit)
                        break
                    stale = F.stale_failure(limit) if F.UNREPORTED else None
                    if stale is not None:
                        fire = (F.abort_unretrieved, stale, limit)
                        break
                    self._cv.wait(min(0.25, limit / 4) if limit > 0 else None)
                else:
                    work = self._q.popleft()
                    self.current = work
            if fire is not None:  # outside the lock: the report takes a grace period
                abort, stuck, limit = fire
                abort(stuck, limit)
                continue
            if work._device is not None:  # CUDA's current device is per host thread
                _backend.use_cuda_device(work._device)
            work._run()
            with self._cv:
                self.current = None
                self._cv.notify_all()  # drain() waiters


COMM_THREAD: CommThread | None = None
_THREAD_LOCK = threading.Lock()


def comm_thread() -> CommThread | None:
    """The communication thread, started on first use; None when MPI forbids threads."""
    global COMM_THREAD
    if COMM_THREAD is None:
        with _THREAD_LOCK:
            if COMM_THREAD is None:
                if thread_level() < get_mpi().THREAD_SERIALIZED:
                    return None
                COMM_THREAD = CommThread()
    return COMM_THREAD


def _watchdog_abort(work: Work, limit: float) -> None:
    """``work`` timed out: report it with what the comm thread is running, and abort. See [Note: Watchdog]."""
    t = COMM_THREAD
    F.watchdog_abort(work, limit, t.current if t is not None else None)


def _issuer_device() -> int | None:
    """The calling thread's CUDA device (None without CuPy): the comm thread runs the Work there."""
    return _backend.current_cuda_device()


def execute(desc, fn: Callable[[], Any], async_op: bool, meta: list | None = None) -> Work:
    """Run ``fn`` as the next MPI operation of this process; return its Work (completed unless async)."""
    work = Work(desc, fn)
    work._kept = async_op
    work._device = _issuer_device()
    if meta is not None:
        work._meta = meta
        meta.done = work._done
    if _trace.RECORDER is not None:
        _trace.RECORDER.issued(work)
    t = comm_thread()
    if t is None:
        work._run()
    elif not async_op and inline_enabled() and t.begin_inline(work):
        try:
            work._run()
        finally:
            t.end_inline()
    else:
        t.submit(work)
    return work


def submit(desc, fn: Callable[[], Any], async_op: bool, meta: list | None = None) -> Work | None:
    work = execute(desc, fn, async_op, meta)
    if async_op:
        return work
    work.wait()
    return None


def call_sync(desc, fn: Callable[[], Any], meta: list | None = None) -> Any:
    """Run fn as the next MPI operation (after everything issued before) and return its result."""
    return execute(desc, fn, False, meta).result()
