"""Point-to-point messages (isend/irecv) and monitored_barrier on raw arrays: a mixin of ProcessGroup."""

from __future__ import annotations

import datetime
import itertools
import sys
import time
from typing import Any

import numpy as np

from hpcfsdp import _backend
from hpcfsdp.distributed import _buffers as B
from hpcfsdp.distributed import _comm_thread as CT
from hpcfsdp.distributed import _failure as F
from hpcfsdp.distributed import _nccl
from hpcfsdp.distributed._mpi import comm_timeout, get_mpi

__all__ = ["PointToPoint", "RESERVED_TAGS", "check_tag", "monitored_timeout"]

# [Note: Point-to-point]
# isend/irecv (and send/recv, which wait on them) go through the communication thread like every MPI
# call ([Note: Communication thread]), but never as a blocking MPI_Send/MPI_Recv there: the thread is one
# FIFO per process, and a blocking call would hold it while the peer's matching call may sit behind work
# of its own. Both ranks doing isend(a) then irecv(b) then wait() would then hang once the message is too
# large for the eager protocol: each comm thread sits in MPI_Send until the peer posts its receive, and
# that receive is queued behind the send on the peer. Likewise rank 0 doing isend(x) then all_reduce()
# while rank 1 does all_reduce() then recv(x): the all_reduce of rank 0 must not wait for the send.
# So each operation is one nonblocking call, run as a detached staged Work ([Note: Collectives left in
# flight]): the thread posts MPI_Isend/MPI_Irecv when the Work's turn comes, leaves the request in flight
# and goes on with its queue; it tests the request between Works and, when idle, with a sleeping back-off
# (50 us to 1 ms). Later Works (collectives included) never wait for a detached Work, so no ordering of
# sends, receives and collectives that MPI itself allows can deadlock here. Posting in issue order keeps
# MPI's non-overtaking rule meaningful: two messages from one rank to another on one group and tag match
# the receives in the order the program issued them. The Work completes when the request does (a send's
# buffer may be reused; a receive's data has arrived, copied to the device when staged) and its result is
# the source's group rank (for irecv from any source). Blocking send/recv are these plus wait() on the
# calling thread: only the caller blocks. As in PyTorch, a buffer must not be touched until its Work is
# waited for. While a Work is in flight, blocking collectives go through the thread instead of running
# inline ([Note: Inline calls]). Without a communication thread (MPI below THREAD_SERIALIZED) the calling
# thread posts the request at once and drives it in wait().
# Device arrays: the sender's stream is synchronised before MPI reads ([Note: Device arrays]); without a
# CUDA-aware MPI the data goes through a pinned host buffer of its own per operation (the stager's shared
# slots could be in use by another operation still in flight).
# Tags: any int 0 <= tag <= MPI_TAG_UB except RESERVED_TAGS, which the watchdog's reports and
# monitored_barrier use on the same communicator. Messages are not counted in collective_counts()
# and not recorded in the collective history (they are not collectives: ranks issue different ones);
# ``pg.stats`` counts "send" and "recv".

_MB_ARRIVE = F.WATCHDOG_TAG + 1  # monitored_barrier: a rank reached it (to group rank 0)
_MB_VERDICT = F.WATCHDOG_TAG + 2  # monitored_barrier: rank 0's answer
RESERVED_TAGS = (F.WATCHDOG_TAG, _MB_ARRIVE, _MB_VERDICT)
_TAG_UB: int | None = None
_RESOURCE = itertools.count()  # a staged resource per operation: none waits for another to start


def check_tag(tag: Any, what: str) -> int:
    """``tag`` as an int usable for user messages; RuntimeError for a negative one (PyTorch's), else ValueError."""
    global _TAG_UB
    if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)):
        raise TypeError(f"{what}: tag={tag!r}: expected an int")
    tag = int(tag)
    if tag < 0:
        raise RuntimeError(f"{what}: Tag must be nonnegative, got tag={tag}")
    if _TAG_UB is None:
        MPI = get_mpi()
        _TAG_UB = int(CT.call_sync("Comm.Get_attr(TAG_UB)", lambda: MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)))
    if tag > _TAG_UB:
        raise ValueError(f"{what}: tag={tag} exceeds this MPI library's MPI_TAG_UB={_TAG_UB}")
    if tag in RESERVED_TAGS:
        raise ValueError(f"{what}: tag={tag} is reserved by hpcfsdp (watchdog reports, monitored_barrier: "
                         f"{list(RESERVED_TAGS)}); use another tag")
    return tag


class _StatusRequest:
    """An MPI request that fills a Status when it completes (what _step tests), explaining truncation."""

    __slots__ = ("req", "status", "what")

    def __init__(self, req, what):
        self.req, self.status, self.what = req, get_mpi().Status(), what  # what: a callable making the text

    def Test(self) -> bool:  # noqa: N802 (mpi4py's name, called by Work._step)
        return self._call(self.req.Test)

    def Wait(self) -> bool:  # noqa: N802
        return self._call(self.req.Wait)

    def _call(self, f) -> bool:
        MPI = get_mpi()
        try:
            return f(self.status)
        except MPI.Exception as e:
            if e.Get_error_class() == MPI.ERR_TRUNCATE:
                raise RuntimeError(f"{self.what()}: the message is larger than the receive buffer (MPI_ERR_TRUNCATE): "
                                   "the sender's tensor has more bytes than this one") from e
            raise


def _mpi_window(reads, writes, op: str):
    """The simulated device's bracket of a nonblocking call on ``reads``/``writes`` (see [Note: Simulated CUDA] in
    _backend): a token to end once the request completed, None with real CuPy."""
    window = _backend.MPI_WINDOW
    return window.begin(reads, writes, op) if window is not None else None


def _mpi_done(token) -> None:
    if token is not None:
        _backend.MPI_WINDOW.end(token)


def _fresh_host(a, copy: bool):
    """A pinned host array of its own shaped like device array ``a`` (holding a's data when ``copy``)."""
    host = _backend.pinned_bytes(a.nbytes)[:a.nbytes].view(a.dtype).reshape(a.shape)
    if copy and a.size:
        cp = sys.modules["cupy"]
        with cp.cuda.Device(a.device.id):
            s = B.stager().stream(a.device.id)
            a.get(stream=s, out=host)
            s.synchronize()
    return host


class _Driven(CT.Work):
    """A point-to-point Work driven by the waiting thread (no communication thread). See [Note: Point-to-point]."""

    __slots__ = ("_inner",)

    def __init__(self, inner: CT.Work):
        super().__init__(inner._desc)
        self._inner = inner

    def is_completed(self) -> bool:
        if not self._inner.is_completed():
            self._inner._step(set())
        return self._inner.is_completed()

    def exception(self):
        return self._inner.exception()

    def result(self) -> Any:
        self.wait()
        return self._inner._result

    def wait(self, timeout=None) -> bool:
        if not self._inner.is_completed():
            self._inner._step(set(), block=True)
        return self._inner.wait(timeout)


def monitored_timeout(timeout: Any) -> float:
    """monitored_barrier's ``timeout`` (timedelta, seconds or None: the group timeout) in seconds."""
    if timeout is None:
        limit = comm_timeout()
        return limit if limit > 0 else 1800.0  # no watchdog: PyTorch's default Gloo timeout, 30 min
    if isinstance(timeout, datetime.timedelta):
        secs = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        secs = float(timeout)
    else:
        raise TypeError(f"monitored_barrier: timeout={timeout!r}: expected a datetime.timedelta, seconds or None")
    if not secs > 0:
        raise ValueError(f"monitored_barrier: timeout={timeout!r}: expected a positive duration")
    return secs


def _poll(reqs: list, deadline: float, want_all: bool = True) -> None:
    """Test ``reqs`` (None entries are done) until all (or, without ``want_all``, any) completed or the deadline.
    Completed requests are set to None in place."""
    spins, delay = 0, 0.0
    while True:
        for i, r in enumerate(reqs):
            if r is not None and r.Test():
                reqs[i] = None
        left = [r for r in reqs if r is not None]
        if not left or (not want_all and len(left) < len(reqs)) or time.monotonic() >= deadline:
            return
        spins += 1
        delay = 0.0 if spins < 32 else min(max(delay * 2, 2e-5), 1e-3)
        time.sleep(delay)


def _cancel(req) -> bool:
    """Cancel a pending receive; whether it was cancelled (False: it completed meanwhile)."""
    MPI = get_mpi()
    req.Cancel()
    st = MPI.Status()
    req.Wait(st)
    return st.Is_cancelled()


_PARKED: list = []  # (request, buffer): monitored_barrier's small sends not yet complete when it returned


def _park(req, buf) -> None:
    """Keep ``buf`` alive until send ``req`` completes (tested at the next monitored_barrier)."""
    if not req.Test():
        _PARKED.append((req, buf))


def _unpark() -> None:
    _PARKED[:] = [(q, b) for q, b in _PARKED if not q.Test()]


_VERDICT_LEN = 11  # rank 0's answer: [seq, failed?, number missing, the first 8 missing group ranks]


def _verdict(seq: int, missing: list[int]) -> np.ndarray:
    v = np.zeros(_VERDICT_LEN, np.int64)
    shown = missing[:_VERDICT_LEN - 3]
    v[:3] = seq, bool(missing), len(missing)
    v[3:3 + len(shown)] = shown
    return v


def _ranks_text(ranks: list[int]) -> str:
    return f"Rank {ranks[0]}" if len(ranks) == 1 else "Ranks " + ", ".join(str(r) for r in ranks)


class PointToPoint:
    """ProcessGroup's point-to-point methods (raw arrays; ranks are group ranks). See [Note: Point-to-point].

    Uses the group's ``comm``, ``_rank``, ``_size``, ``stats``, ``_check_alive``, ``_check_rank``, ``_gdesc``
    and ``_note``.
    """

    _mb_seq = 0  # monitored_barrier calls on this group (per instance once set)

    def isend(self, arr, dst: int, tag: int = 0) -> CT.Work:
        """Send ``arr``'s bytes to group rank ``dst``; the Work completes when ``arr`` may be reused."""
        self._check_alive()
        B.check_buffer(arr, "isend: array")
        dst = self._check_rank(dst, "isend: dst")
        tag = check_tag(tag, "isend")
        comm = self.comm
        ev = B.record_event(arr)

        def gen():
            if ev is not None:
                ev.synchronize()
            buf = _fresh_host(arr, copy=True) if B.needs_staging(arr) else arr
            token = _mpi_window((buf,), (), "MPI Isend")
            yield comm.Isend(B.byte_spec(buf), dst, tag)
            _mpi_done(token)
            return None

        self.stats["send"] += 1
        return self._p2p(lambda: f"isend({B.describe(arr)}, dst={dst}, tag={tag}) on {self._gdesc()}", gen)

    def irecv(self, arr, src: int | None = None, tag: int = 0) -> CT.Work:
        """Receive into ``arr`` from group rank ``src`` (None: any rank); ``work.result()`` is the sender's group
        rank. The message must have exactly ``arr.nbytes`` bytes (RuntimeError otherwise)."""
        self._check_alive()
        B.check_buffer(arr, "irecv: array", writable=True)
        MPI = get_mpi()
        source = MPI.ANY_SOURCE if src is None else self._check_rank(src, "irecv: src")
        tag = check_tag(tag, "irecv")
        comm = self.comm
        ev = B.record_event(arr)  # earlier device work on arr finishes before MPI writes it
        desc = lambda: f"irecv({B.describe(arr)}, src={src}, tag={tag}) on {self._gdesc()}"

        def gen():
            if ev is not None:
                ev.synchronize()
            staged = B.needs_staging(arr)
            buf = _fresh_host(arr, copy=False) if staged else arr
            token = _mpi_window((), (buf,), "MPI Irecv")
            req = _StatusRequest(comm.Irecv(B.byte_spec(buf), source, tag), desc)
            yield req
            _mpi_done(token)
            got, sender = req.status.Get_count(MPI.BYTE), req.status.Get_source()
            if got != arr.nbytes:
                raise RuntimeError(f"{desc()}: received {got} bytes from group rank {sender}, expected "
                                   f"{arr.nbytes} (the size of the receiving tensor)")
            if staged:
                B.stager().to_device(buf, arr)
            return sender

        self.stats["recv"] += 1
        return self._p2p(desc, gen)

    def batch_isend_irecv(self, ops: list) -> list[CT.Work]:
        """Issue ``ops``, each ``(is_send, array, peer group rank, tag)``, and return a Work per op. CUDA arrays
        on a group whose GPU path is nccl go as one NCCL group (tags ignored; the group's first device call
        chooses the path, collectively); host arrays, and CUDA arrays on the other paths, as isend/irecv in list
        order. One batch is all CUDA or all host arrays. See [Note: GPU collectives] in _nccl.py."""
        self._check_alive()
        if not ops:
            raise ValueError("batch_isend_irecv: no operations")
        todo = []
        for i, (is_send, arr, peer, tag) in enumerate(ops):
            what = f"batch_isend_irecv: op {i} ({'isend' if is_send else 'irecv'})"
            B.check_buffer(arr, f"{what}: array", writable=not is_send)
            todo.append((bool(is_send), arr, self._check_rank(peer, f"{what}: peer"), tag))
        on_device = [B.is_cupy_array(a) for _, a, _, _ in todo]
        if all(on_device):
            _check_device_batch(todo, self._rank)
            if self._size == 1:
                return self._self_copies(todo)
            ng = _nccl.gpu_path(self, todo[0][1]).nccl
            if ng is not None:
                self.stats["send"] += sum(s for s, _, _, _ in todo)
                self.stats["recv"] += sum(not s for s, _, _, _ in todo)
                descs = [self._batch_desc(s, a, p) for s, a, p, _ in todo]
                return _nccl.batch_send_recv(ng, [(s, a.reshape(-1), p) for s, a, p, _ in todo], descs)
        elif any(on_device):
            i, j = on_device.index(True), on_device.index(False)
            raise ValueError(
                f"batch_isend_irecv: op {i} is a CUDA array ({B.describe(todo[i][1])}) and op {j} a host array "
                f"({B.describe(todo[j][1])}): one batch moves CUDA tensors (on NCCL where the group uses it) or host "
                "tensors (on MPI), not both; issue them as two batches")
        return [self.isend(a, p, t) if s else self.irecv(a, p, t) for s, a, p, t in todo]

    def _batch_desc(self, is_send: bool, arr, peer: int):
        return lambda: (f"batch_isend_irecv: {'isend' if is_send else 'irecv'}({B.describe(arr)}, "
                        f"{'dst' if is_send else 'src'}={peer}) on {self._gdesc()}")

    def _self_copies(self, todo: list) -> list[CT.Work]:
        """A size-1 group's batch (every op with itself): each send's bytes copied into its receive on the
        caller's stream, completed Works (as the size-1 collectives)."""
        sends = iter([a for s, a, _, _ in todo if s])
        works = []
        for s, a, p, _ in todo:
            if not s:
                B.copy_into(a.reshape(-1).view(np.uint8), next(sends).reshape(-1).view(np.uint8))
            self.stats["send" if s else "recv"] += 1
            works.append(CT.Work._completed(self._batch_desc(s, a, p), None if s else p))
        return works

    def _p2p(self, desc, gen) -> CT.Work:
        resource = f"p2p{next(_RESOURCE)}"
        work = CT.execute(desc, lambda: CT.Staged([resource], gen(), detached=True), True)
        if CT.comm_thread() is None:  # no communication thread: post now, drive in wait()
            work._step(set())
            return _Driven(work)
        return work

    # -- monitored_barrier -------------------------------------------------------------------
    def monitored_barrier(self, timeout: float, wait_all_ranks: bool = False) -> None:
        """A barrier that names the group ranks which did not reach it within ``timeout`` seconds (PyTorch's
        Gloo protocol): every rank reports to group rank 0, which answers once all did. Rank 0 raises
        RuntimeError naming the first missing rank (all of them with ``wait_all_ranks``) and tells the ranks
        that arrived, which raise too; a rank that hears nothing from rank 0 within twice ``timeout`` raises."""
        self._check_alive()
        timeout = float(timeout)
        meta = self._note("monitored_barrier", 0)
        if self._size == 1:
            return
        self._mb_seq += 1
        seq, comm, me, n = self._mb_seq, self.comm, self._rank, self._size
        ms = int(round(timeout * 1000))
        world = self.world_ranks

        def failed_text(missing: list[int]) -> str:
            text = f"{_ranks_text(missing)} failed to pass monitoredBarrier in {ms} ms"
            if list(world) != list(range(n)):
                text += f" (group ranks; world ranks {[world[q] for q in missing]})"
            return text

        def fn():
            MPI = get_mpi()
            _unpark()
            deadline = time.monotonic() + timeout
            if me != 0:  # rank 0 may arrive up to a timeout later, then wait one: answers come within two
                deadline += timeout
                mine = np.array([seq, 0], np.int64)
                sreq = comm.Isend([mine, MPI.INT64_T], 0, _MB_ARRIVE)
                verdict = np.zeros(_VERDICT_LEN, np.int64)
                while True:
                    reqs = [comm.Irecv([verdict, MPI.INT64_T], 0, _MB_VERDICT)]
                    _poll(reqs, deadline)
                    if reqs[0] is not None:  # no answer in time
                        _cancel(reqs[0])
                        break
                    if verdict[0] == seq:
                        break
                    # an answer to an earlier monitored_barrier this rank gave up on: skip it
                _park(sreq, mine)
                if verdict[0] == seq and verdict[1] == 0:
                    return
                msg = (f"Rank {me} successfully reached monitoredBarrier, but received errors while waiting for "
                       f"send/recv from rank 0. Please check rank 0 logs for faulty rank.")
                if verdict[0] == seq:
                    k = int(verdict[2])
                    shown = verdict[3:3 + min(k, _VERDICT_LEN - 3)].tolist()
                    more = f" (and {k - len(shown)} more)" if k > len(shown) else ""
                    msg += f" Rank 0 reports: {failed_text(shown)}{more}."
                else:
                    msg += f" (no answer from rank 0 within {2 * ms} ms)"
                raise RuntimeError(msg)
            bufs = {r: np.zeros(2, np.int64) for r in range(1, n)}
            reqs = {r: comm.Irecv([bufs[r], MPI.INT64_T], r, _MB_ARRIVE) for r in range(1, n)}
            arrived: list[int] = []
            while reqs:
                order = sorted(reqs)
                pending = [reqs[r] for r in order]
                _poll(pending, deadline, want_all=False)
                done = [r for r, q in zip(order, pending) if q is None]
                if not done:
                    break  # deadline
                for r in done:
                    del reqs[r]
                    if bufs[r][0] < seq:  # a late arrival at an earlier barrier: fail it, listen again
                        stale = _verdict(bufs[r][0], [r])
                        _park(comm.Isend([stale, MPI.INT64_T], r, _MB_VERDICT), stale)
                        reqs[r] = comm.Irecv([bufs[r], MPI.INT64_T], r, _MB_ARRIVE)
                    else:
                        arrived.append(r)
            missing = sorted(r for r, q in reqs.items() if _cancel(q))
            arrived += [r for r in reqs if r not in missing]  # completed while being cancelled
            verdict = _verdict(seq, missing)
            for r in arrived:  # (a rank that gave up no longer listens: its answer stays parked)
                _park(comm.Isend([verdict, MPI.INT64_T], r, _MB_VERDICT), verdict)
            if missing:
                raise RuntimeError(f"[Rank 0]: {failed_text(missing if wait_all_ranks else missing[:1])}")

        desc = lambda: f"monitored_barrier(timeout={timeout:g} s) on {self._gdesc()}"
        work = CT.execute(desc, fn, True, meta)  # through the thread: never watched as an inline call
        if CT.comm_thread() is not None:
            _wait_beyond(work, 2 * timeout)
        work.wait()


def _check_device_batch(todo: list, me: int) -> None:
    """What one rank can check of a batch of CUDA arrays: one GPU, and its sends to itself matching its receives
    from itself in number and, in order, in bytes (NCCL checks no sizes; an unmatched one would hang)."""
    devs = sorted({int(a.device.id) for _, a, _, _ in todo})
    if len(devs) > 1:
        raise ValueError(f"batch_isend_irecv: CUDA arrays on devices {devs}: one batch runs on one GPU")
    sends = [(i, a) for i, (s, a, p, _) in enumerate(todo) if s and p == me]
    recvs = [(i, a) for i, (s, a, p, _) in enumerate(todo) if not s and p == me]
    if len(sends) != len(recvs):
        raise ValueError(f"batch_isend_irecv: {len(sends)} isend and {len(recvs)} irecv with this rank itself "
                         f"(group rank {me}) as the peer: a send to oneself needs its receive in the same batch")
    for (i, a), (j, b) in zip(sends, recvs):
        if a.nbytes != b.nbytes:
            raise ValueError(f"batch_isend_irecv: op {i} sends {a.nbytes} bytes ({B.describe(a)}) to this rank "
                             f"itself and op {j}, its receive, takes {b.nbytes} ({B.describe(b)})")


def _wait_beyond(work: CT.Work, budget: float) -> None:
    """Wait for ``work`` (which has its own deadline within ``budget`` seconds): the watchdog fires only after
    ``budget`` plus HPCFSDP_COMM_TIMEOUT (the thread may first finish what was queued before it)."""
    limit = comm_timeout()
    start, step = time.monotonic(), 0.001
    while not work._done.wait(step):
        step = min(step * 2, 0.1)
        if 0 < limit and limit + budget <= time.monotonic() - start:
            CT._watchdog_abort(work, limit + budget)
