"""The timeline recorder: Chrome trace events (JSON) per rank, off unless HPCFSDP_TRACE=DIR or start(DIR)."""
from __future__ import annotations

import atexit
import json
import os
import threading
import time

import hpcfsdp._settings as _settings  # a leaf
from hpcfsdp._launcher_env import launcher_rank  # a leaf (_settings only)

__all__ = ["RECORDER", "Recorder", "start", "stop", "trace_file", "write_trace"]

# [Note: Timeline]
# Call sites test one module attribute, ``_trace.RECORDER is not None``, and do nothing else when tracing
# is off: no events, no files, no clock reads. When on, every event is a complete event ("ph": "X":
# name, category, start and duration in microseconds, pid = rank, tid = a small per-thread number) appended
# to a list (list.append is atomic under the GIL, so the main, communication and checkpoint threads record
# without a lock). Timestamps are time.perf_counter() shifted by one wall-clock offset taken at start, so
# durations are monotonic and ranks on different hosts line up as well as their clocks agree.
# Categories: "compute" (forward/backward of an FSDP unit, main thread), "comm" (a collective running:
# on the communication thread, or on the main thread for an inline call), "wait" (the main thread blocked in
# Work.wait on an unfinished collective: exposed communication), "iteration" (instant: the root's forward
# began, one per training step without gradient accumulation). The file, DIR/trace_rank<R>.json, is
# written at exit (or stop()); `hpcfsdp trace merge` and `hpcfsdp trace plot` read it.

RECORDER: "Recorder | None" = None


def trace_file(directory: str, rank: int) -> str:
    return os.path.join(directory, f"trace_rank{rank:05d}.json")


class Recorder:
    """Events of this process; see [Note: Timeline]."""

    def __init__(self, directory: str, rank: int | None = None):
        self.directory = os.path.abspath(directory)
        self.rank = rank
        self.events: list = []
        self._tids: dict = {}
        self._names: dict = {}
        self._offset = time.time() - time.perf_counter()
        self.open: dict = {}  # key -> start (s) of spans begun in one hook and ended in another
        self.iterations = 0
        self.label: str | None = None  # the FSDP unit issuing collectives now (main thread)
        self.units: dict = {}  # id(FSDP state or param group) -> unit name (named by FSDP)
        self._labels: dict = {}  # id(Work) -> unit, from issue to run
        self._recent: dict = {}  # id(Work) -> unit of recently run Works, for their waits (bounded)
        self._lock = threading.Lock()  # for the bookkeeping dicts several threads update (not for events)
        self._written = False

    def now(self) -> float:
        return time.perf_counter()

    def tid(self) -> int:
        ident = threading.get_ident()
        t = self._tids.get(ident)
        if t is None:
            cur = threading.current_thread()
            with self._lock:
                t = 0 if cur is threading.main_thread() else len(self._tids) + 1
                self._tids[ident] = t
                self._names[t] = "main" if t == 0 else cur.name
        return t

    def complete(self, name: str, cat: str, t0: float, t1: float, args: dict | None = None) -> None:
        ev = {"name": name, "cat": cat, "ph": "X", "ts": (t0 + self._offset) * 1e6, "dur": (t1 - t0) * 1e6,
              "tid": self.tid()}
        if args:
            ev["args"] = args
        self.events.append(ev)

    def instant(self, name: str, cat: str, args: dict | None = None) -> None:
        ev = {"name": name, "cat": cat, "ph": "i", "s": "p", "ts": (self.now() + self._offset) * 1e6,
              "tid": self.tid()}
        if args:
            ev["args"] = args
        self.events.append(ev)

    def begin(self, key) -> None:
        self.open[key] = self.now()

    def end(self, key, name: str, cat: str, args: dict | None = None) -> None:
        t0 = self.open.pop(key, None)
        if t0 is not None:
            self.complete(name, cat, t0, self.now(), args)

    # -- the comm layer's call sites (duck-typed on Work: ._meta.kind/.seq/.count, .desc) --------------------
    def issued(self, work) -> None:
        """A Work was issued: remember the FSDP unit it belongs to (``self.label``, set by FSDP)."""
        if self.label is not None:
            with self._lock:
                self._labels[id(work)] = self.label

    @staticmethod
    def _kind(work) -> str:
        m = work._meta
        if m is not None:
            return m.kind
        return work.desc.split(" ")[0].split("(")[0]

    def comm_event(self, work, t0: float) -> None:
        """A Work's MPI call ran from ``t0`` to now (on this thread)."""
        t1 = self.now()
        kind, m = self._kind(work), work._meta
        with self._lock:
            unit = self._labels.pop(id(work), None)
            if unit is not None:
                self._recent[id(work)] = unit
                if len(self._recent) > 256:
                    self._recent.pop(next(iter(self._recent)))
        args = {"kind": kind}
        if m is not None:
            args.update(seq=m.seq, count=m.count)
        if unit is not None:
            args["unit"] = unit
        self.complete(f"{kind} {unit}" if unit else kind, "comm", t0, t1, args)

    def wait_event(self, work, t0: float) -> None:
        """This thread was blocked in ``work.wait()`` from ``t0`` to now."""
        kind = self._kind(work)
        with self._lock:
            unit = self._recent.pop(id(work), None)
        args = {"kind": kind, "unit": unit} if unit else {"kind": kind}
        self.complete(f"wait {kind} {unit}" if unit else f"wait {kind}", "wait", t0, self.now(), args)

    def _resolve_rank(self) -> int:
        if self.rank is None:
            try:
                import sys

                MPI = sys.modules.get("mpi4py.MPI")
                if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
                    self.rank = MPI.COMM_WORLD.Get_rank()
            except Exception:  # noqa: BLE001 (fall back to the launcher's variables)
                pass
        if self.rank is None:
            self.rank = launcher_rank() or 0  # See [Note: Launcher rank]
        return self.rank

    def chrome_trace(self, events=None) -> dict:
        """The Chrome trace object of ``events`` (default: all recorded so far): what write() and
        hpcfsdp.profiler's export_chrome_trace write."""
        rank = self._resolve_rank()
        meta = [{"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}}]
        meta += [{"name": "thread_name", "ph": "M", "pid": rank, "tid": t, "args": {"name": n}}
                 for t, n in sorted(self._names.items())]
        events = [{**ev, "pid": rank} for ev in (self.events if events is None else events)]
        return {"traceEvents": meta + events, "displayTimeUnit": "ms",
                "otherData": {"rank": rank, "producer": "hpcfsdp"}}

    def write(self) -> str | None:
        """Write DIR/trace_rank<R>.json (once, if anything was recorded); returns its path."""
        if self._written or not self.events:  # a process that traced nothing (a launcher, a tool) writes nothing
            return None
        self._written = True
        trace = self.chrome_trace()
        os.makedirs(self.directory, exist_ok=True)
        path = trace_file(self.directory, trace["otherData"]["rank"])
        write_trace(path, trace)
        return path


def write_trace(path: str, trace: dict) -> None:
    """Write a Chrome trace object to ``path`` atomically (gzip-compressed when it ends in .gz)."""
    tmp = f"{path}.tmp"
    if path.endswith(".gz"):
        import gzip

        with gzip.open(tmp, "wt") as f:
            json.dump(trace, f)
    else:
        with open(tmp, "w") as f:
            json.dump(trace, f)
    os.replace(tmp, path)


def start(directory: str, rank: int | None = None) -> Recorder:
    """Start recording into ``directory`` (the file is written at exit or by stop())."""
    global RECORDER
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
        raise ValueError(f"trace directory {directory!r}: expected a non-empty path")
    if RECORDER is not None and RECORDER.directory == os.path.abspath(directory):
        return RECORDER
    if RECORDER is not None:
        stop()
    RECORDER = Recorder(os.fspath(directory), rank if rank is not None else None)
    atexit.register(_at_exit)
    return RECORDER


def stop() -> str | None:
    """Stop recording and write the file; returns its path (None when tracing was off)."""
    global RECORDER
    rec, RECORDER = RECORDER, None
    return rec.write() if rec is not None else None


def _at_exit() -> None:
    try:
        stop()
    except Exception as e:  # noqa: BLE001 (an exit hook must not raise)
        import sys

        print(f"hpcfsdp: could not write the trace: {type(e).__name__}: {e}", file=sys.stderr)


_env_dir = _settings.get("HPCFSDP_TRACE")
if _env_dir:
    start(_env_dir)
