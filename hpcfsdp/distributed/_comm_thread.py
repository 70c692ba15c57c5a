"""Work, the per-process communication thread and the hand-off of MPI calls to it (execute, submit, call_sync)."""

from __future__ import annotations

import atexit
import collections
import datetime
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable

from hpcfsdp import _backend, _settings, _trace
from hpcfsdp.distributed import _failure as F
from hpcfsdp.distributed._mpi import comm_timeout, get_mpi, inline_enabled, thread_level

__all__ = ["Work", "Staged", "CommThread", "COMM_THREAD", "comm_thread", "execute", "submit", "call_sync",
           "independent"]

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

#
# [Note: Collectives left in flight]
# A Work's function may return ``Staged(resources, generator)`` instead of a result: a collective made of
# stages, each one nonblocking MPI call on one resource ("intra": the node's shared memory, "inter": the
# node's network link), listed up front. The generator yields each stage's request; it is resumed to start
# the next stage once the previous request completed (MPI_Test), and its code after the last yield finishes
# the collective. The thread keeps such Works in flight, oldest first, and moves on to the next queued
# Work. A stage starts only when no older Work in flight runs a stage on that resource or has one still to
# start there. So each resource serves the Works in issue order, which keeps every communicator's
# collectives started in the same order on every rank (a communicator's stages all use one resource), and
# the awaited all-gather is never slowed down by the next one; while the two resources work at once: the
# intra-host stage of one collective runs beside the cross-host stage of the next, and HSDP's cross-host
# all-reduce of one unit beside the next unit's reduce-scatter. Idle with Works in flight, the thread tests
# them with a sleeping back-off from 50 us to 1 ms (the MPI library progresses requests only inside MPI
# calls), and it tests them between the Works it runs.
# FSDP uses it only with HPCFSDP_COMM_STAGED=1 (off by default): on the 2-core simulated cluster the
# timelines show the overlap as designed, but step times were no better (HYBRID_SHARD at 1 Gbit/s slightly
# worse: the all-reduces progress only at the polls, where a blocking call keeps MPI driving the socket);
# see BENCHMARKS.md, "After overlap tuning".
# Memory safety: a Work starts while others are in flight only when it was issued inside
# ``independent()`` (its buffers are none of theirs, as FSDP's freshly allocated buffers), and after the
# Work given as ``after`` (whose output it reads) completed; any other Work first completes everything in
# flight, so user code that issues two collectives on one buffer sees them in order. Inline calls are
# refused while anything is in flight, so one thread at a time is inside MPI (MPI_THREAD_SERIALIZED).
# Two additions serve point-to-point Works (_p2p.py): ``Staged(..., detached=True)`` marks a Work that no
# later Work waits for (it is only tested; see [Note: Point-to-point] in _p2p.py), and the value the
# generator returns becomes the Work's result (a receive's source rank).
#
# [Note: Communication thread priority]
# Where a host's ranks outnumber its cores (the simulated cluster: 4 ranks on 2 cores), the kernel shares
# the CPUs evenly among every rank's compute (main) thread and communication thread, so a collective that
# needs a few CPU-milliseconds (shared-memory copies, the sums of a reduce-scatter, the socket work of a
# cross-host stage) waits behind other ranks' compute and takes 1.5-2x its wire time. HPCFSDP_COMM_NICE=-k
# makes the communication thread k nicer-levels more important than the thread that started it (Linux
# per-thread niceness): it lowers its own niceness where permitted (CAP_SYS_NICE), and otherwise raises
# the starting thread's by k (always permitted, and irreversible without the capability). Opt-in: it
# changes how the process competes for the CPU. Measured on the simulated 2 x 2 cluster (BENCHMARKS.md):
# faster at 1 Gbit/s, neutral at 200 Mbit/s.
#
# [Note: Thread switch interval]
# The communication thread needs the GIL for the few Python lines between two MPI calls. When it is
# woken (a collective queued) while the main thread runs Python (autograd bookkeeping between NumPy
# kernels), CPython hands the GIL over only after the switch interval, 5 ms by default: timelines on the
# simulated cluster showed prefetched all-gathers starting 5-8 ms after their issue. With the prefetch
# issued before the wait (see _fsdp_state.py) the thread is mostly busy when the next all-gather arrives,
# and lowering the interval to 0.5 ms changed no step time measurably (1 Gbit/s FULL_SHARD, 5 interleaved
# rounds), so it is left alone unless HPCFSDP_COMM_SWITCH_INTERVAL > 0 asks (a process-wide setting).


class Staged:
    """What a Work's function returns to run staged: the resource of each stage, and the generator yielding
    each stage's MPI request. See [Note: Collectives left in flight]."""

    __slots__ = ("resources", "gen", "detached")

    def __init__(self, resources, gen, detached: bool = False):
        self.resources = list(resources)
        self.gen = gen
        self.detached = detached  # later Works never wait for it (point-to-point)


_INDEPENDENT = threading.local()
_POLL_MIN, _POLL_MAX = 5e-5, 1e-3  # seconds between two tests of the Works in flight, when idle


class independent:
    """Context: the Works issued inside may start while earlier Works are in flight (their buffers are
    disjoint from those), once ``after`` (a Work whose output they read) completed.
    See [Note: Collectives left in flight]."""

    def __init__(self, after: "Work | None" = None):
        self.after = after

    def __enter__(self):
        stack = getattr(_INDEPENDENT, "stack", None)
        if stack is None:
            stack = _INDEPENDENT.stack = []
        stack.append(self)
        return self

    def __exit__(self, *exc):
        _INDEPENDENT.stack.pop()
        return False


def _is_independent() -> bool:
    return bool(getattr(_INDEPENDENT, "stack", None))


def _independent_after() -> "Work | None":
    stack = getattr(_INDEPENDENT, "stack", None)
    return stack[-1].after if stack else None


class Work:
    """Handle of an issued collective: wait(), is_completed(), exception(), result()."""

    __slots__ = ("_desc", "_fn", "_done", "_exc", "_result", "_issued", "_tb", "_meta", "_device", "_kept",
                 "_independent", "_after", "_gen", "_req", "_todo", "_running", "_t0", "_ts", "_t_first",
                 "_detached", "_hb")

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
        self._independent = False  # may start while others are in flight; see [Note: Collectives left in flight]
        self._after = None  # the Work that must complete before this one starts (independent only)
        self._detached = False  # staged, and never waited for by later Works (Staged.detached)
        self._gen = None  # a staged collective in flight: its generator, the running request and its
        self._req = None  # resource, and the resources of the stages still to start
        self._running = None
        self._todo: list = []
        self._ts = 0.0  # trace: start of the running stage, and of the first
        self._t_first = None
        self._t0 = 0.0
        self._hb = None  # the simulated device's hand-off of host knowledge (see [Note: Simulated CUDA] in _backend)

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
        """Run the function; a staged one stays in flight, advanced by ``_step``."""
        rec = _trace.RECORDER  # see [Note: Timeline] in hpcfsdp/_trace.py
        self._t0 = rec.now() if rec is not None else 0.0
        if self._hb is not None:  # what the issuing thread knew (the simulated device)
            _backend.THREAD_HANDOFF.acquire(self._hb)
        try:
            res = self._fn()
            self._fn = None
            if isinstance(res, Staged):
                if not res.resources:
                    raise RuntimeError(f"staged collective {self.desc}: no stages")
                self._gen, self._todo, self._detached = res.gen, res.resources, res.detached
                return
            self._result = res
        except BaseException as e:  # re-raised at wait(); see [Note: Failure handling]
            self._fail(e)
        self._finish()

    def _fail(self, e: BaseException) -> None:
        self._exc = e
        self._tb = traceback.format_exc()
        F.UNREPORTED[id(self)] = (self, time.monotonic())
        self._gen = self._req = self._running = None
        self._todo = []

    def _step(self, busy: set, block: bool = False) -> bool:
        """Advance a staged Work: test its running stage; start the next when its resource is not in ``busy``
        (used by older Works); with ``block``, run it to the end. Adds the resources it still uses to
        ``busy``; returns whether anything changed (when it is done, the Work is completed)."""
        changed = False
        try:
            while self._gen is not None:
                if self._req is not None:
                    if block:
                        self._req.Wait()
                    elif not self._req.Test():
                        break
                    rec = _trace.RECORDER
                    if rec is not None:  # each stage as a "stage" event of its resource; see [Note: Timeline]
                        rec.complete(f"{rec._kind(self)} [{self._running}]", "stage", self._ts, rec.now(),
                                     {"resource": self._running, "seq": getattr(self._meta, "seq", None)})
                    self._req = self._running = None
                    changed = True
                    if not self._todo:  # the code after the last stage; what it returns is the result
                        try:
                            next(self._gen)
                        except StopIteration as stop:
                            self._result = stop.value
                        else:
                            raise RuntimeError(f"staged collective {self.desc}: more requests than stages")
                        self._gen = None
                    continue
                after = self._after
                if after is not None and not after._done.is_set():
                    if not block:
                        break
                    after._done.wait()
                self._after = None
                if not block and self._todo[0] in busy:
                    break
                rec = _trace.RECORDER
                if rec is not None:
                    self._ts = rec.now()
                    if self._t_first is None:  # the comm event spans the stages, not the queueing before
                        self._t_first = self._t0 = self._ts
                self._running = self._todo.pop(0)
                self._req = next(self._gen, None)
                changed = True
                if self._req is None:
                    raise RuntimeError(f"staged collective {self.desc}: fewer requests than stages")
        except BaseException as e:
            self._fail(e)
            changed = True
        if self._gen is None:
            if changed:
                self._finish()
            return changed
        if self._running is not None:
            busy.add(self._running)
        busy.update(self._todo)
        return changed

    def _finish(self) -> None:
        self._fn = None
        # the lazy description captures the buffers: format it and free them where the Work outlives
        # the call (async) or failed; a blocking call's Work is dropped, so it skips the formatting
        if callable(self._desc) and (self._kept or self._exc is not None):
            self._desc = self._desc()
        rec = _trace.RECORDER
        if rec is not None:
            rec.comm_event(self, self._t0)
        handoff = _backend.THREAD_HANDOFF
        if handoff is not None:  # the simulated device: what this thread knows, for the waiter
            self._hb = handoff.publish()
        self._done.set()

    def is_completed(self) -> bool:
        if not self._done.is_set():
            return False
        if self._hb is not None:
            _backend.THREAD_HANDOFF.acquire(self._hb)
        return True

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
        if self._hb is not None:  # the simulated device: the waiter learns what the finishing thread knew
            _backend.THREAD_HANDOFF.acquire(self._hb)
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
        self._inflight: list[Work] = []  # Works left in flight (only this thread touches it)
        self._n_inflight = 0  # len(self._inflight), read by other threads under the lock
        self._inline_since: float | None = None
        interval = _settings.get("HPCFSDP_COMM_SWITCH_INTERVAL")
        if interval < 0:
            raise ValueError(f"HPCFSDP_COMM_SWITCH_INTERVAL={interval}: expected seconds >= 0 (0 leaves it alone)")
        if 0 < interval < sys.getswitchinterval():  # see [Note: Thread switch interval]
            sys.setswitchinterval(interval)
        self._nice = (_settings.get("HPCFSDP_COMM_NICE"), threading.get_native_id())
        self._thread = threading.Thread(target=self._loop, name="hpcfsdp-comm", daemon=True)
        self._thread.start()
        atexit.register(self.drain)  # runs before MPI_Finalize and _report_unreported_at_exit

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until everything queued has run (at exit: no MPI call may outlive MPI_Finalize)."""
        end = time.monotonic() + timeout
        with self._cv:
            while self._q or self._n_inflight or (self.current is not None and self._inline_since is None):
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
            return not self._q and self.current is None and not self._n_inflight

    def begin_inline(self, work: Work) -> bool:
        """Claim MPI for the calling thread if nothing is queued, running or in flight. See [Note: Inline calls]."""
        with self._cv:
            if self._q or self.current is not None or self._n_inflight:
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
        _prioritise(*self._nice)
        delay = 0.0  # back-off between two tests of the Works in flight
        while True:
            fire = None
            work = None
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
                    if self._inflight and self.current is None:
                        break  # test them (outside the lock), then wait a little
                    self._cv.wait(min(0.25, limit / 4) if limit > 0 else None)
                else:
                    work = self._q.popleft()
                    self.current = work
            if fire is not None:  # outside the lock: the report takes a grace period
                abort, stuck, limit = fire
                abort(stuck, limit)
                continue
            if work is None:  # idle with Works in flight: see [Note: Collectives left in flight]
                if self._test_inflight():
                    delay = 0.0
                    continue
                delay = min(max(delay * 2, _POLL_MIN), _POLL_MAX)
                with self._cv:
                    if not self._q:
                        self._cv.wait(delay)
                continue
            if self._inflight:
                after = work._after
                if work._independent and (after is None or after._done.is_set()):
                    self._test_inflight()
                else:  # its buffers (or its input) may be theirs: complete them first
                    self._test_inflight(block=True)
            if work._device is not None:  # CUDA's current device is per host thread
                _backend.use_cuda_device(work._device)
            work._run()
            with self._cv:
                if work._gen is not None:
                    self._inflight.append(work)
                    self._n_inflight = len(self._inflight)
                self.current = None
                self._cv.notify_all()  # drain() waiters
            if work._gen is not None:
                self._test_inflight()  # its first stage starts now if its resource is free

    def _test_inflight(self, block: bool = False) -> bool:
        """Advance the Works in flight, oldest first (to completion with ``block``); whether any changed."""
        busy: set = set()
        changed = False
        for w in self._inflight:
            changed |= w._step(busy, block and not w._detached)
        if changed:
            with self._cv:
                self._inflight = [w for w in self._inflight if w._gen is not None]
                self._n_inflight = len(self._inflight)
                self._cv.notify_all()
        return changed


def _prioritise(delta: int, starter_tid: int) -> None:
    """Make the calling (communication) thread ``delta`` nicer than the thread that started it.
    See [Note: Communication thread priority]."""
    if delta == 0 or not hasattr(os, "setpriority"):
        return
    base = os.getpriority(os.PRIO_PROCESS, starter_tid)
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), base + delta)
    except PermissionError:  # lowering one's niceness needs CAP_SYS_NICE: raise the starter's instead
        os.setpriority(os.PRIO_PROCESS, starter_tid, base - delta)


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
    if _is_independent():
        work._independent = True
        work._after = _independent_after()
    work._device = _issuer_device()
    handoff = _backend.THREAD_HANDOFF
    if handoff is not None:  # the simulated device: the thread running it learns what the issuer knew
        work._hb = handoff.publish()
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
