"""record_function and what key_averages() returns (PyTorch's FunctionEvent, FunctionEventAvg, EventList)."""
import contextlib
import threading

from hpcfsdp import _trace

__all__ = ["record_function", "FunctionEvent", "FunctionEventAvg", "EventList"]


class record_function(contextlib.ContextDecorator):
    """Label a block (``with record_function("name"):``) or a function (as a decorator) in the timeline: a
    "user_annotation" event while a profiler, HPCFSDP_TRACE or ``train --trace`` records; nothing otherwise."""

    def __init__(self, name: str, args: str | None = None):
        if not isinstance(name, str) or not name:
            raise TypeError(f"record_function(name={name!r}): expected a non-empty str")
        self.name, self.args = name, args
        self._tls = threading.local()  # (recorder, start) per entry and thread: a decorated function may recurse

    def _stack(self) -> list:
        s = getattr(self._tls, "stack", None)
        if s is None:
            s = self._tls.stack = []
        return s

    def __enter__(self):
        rec = _trace.RECORDER
        self._stack().append((rec, rec.now() if rec is not None else 0.0))
        return self

    def __exit__(self, *exc):
        rec, t0 = self._stack().pop()
        if rec is not None and rec is _trace.RECORDER:  # a recording that stopped inside the block keeps nothing
            rec.complete(self.name, "user_annotation", t0, rec.now(), {"args": self.args} if self.args else None)
        return False


def _format_time(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


class FunctionEvent:
    """One recorded span: name, thread, start and end (microseconds), total and self CPU time."""

    def __init__(self, name, thread, start_us, end_us, category="", args=None):
        self.name, self.thread, self.category, self.args = name, thread, category, args or {}
        self.start_us, self.end_us = start_us, end_us
        self.cpu_time_total = end_us - start_us
        self.self_cpu_time_total = self.cpu_time_total  # less the children's time (set by EventList.of)
        self.cpu_children = []
        self.cpu_parent = None
        self.device_time_total = self.self_device_time_total = 0.0
        self.count = 1

    @property
    def key(self) -> str:
        return self.name

    def __repr__(self):
        return (f"<FunctionEvent name={self.name!r} thread={self.thread} cpu_time_total={self.cpu_time_total:.3f}us "
                f"self_cpu_time_total={self.self_cpu_time_total:.3f}us>")


class FunctionEventAvg:
    """The events of one key together: count, total and self CPU time (``cpu_time`` is the mean)."""

    def __init__(self, key):
        self.key = key
        self.count = 0
        self.cpu_time_total = self.self_cpu_time_total = 0.0
        self.device_time_total = self.self_device_time_total = 0.0

    def add(self, ev):
        self.count += ev.count
        self.cpu_time_total += ev.cpu_time_total
        self.self_cpu_time_total += ev.self_cpu_time_total
        return self

    @property
    def cpu_time(self) -> float:
        return self.cpu_time_total / self.count if self.count else 0.0

    @property
    def device_time(self) -> float:
        return 0.0

    cuda_time_total = property(lambda self: self.device_time_total)  # PyTorch's older names
    self_cuda_time_total = property(lambda self: self.self_device_time_total)
    cuda_time = property(lambda self: 0.0)

    def __repr__(self):
        return (f"<FunctionEventAvg key={self.key!r} count={self.count} cpu_time_total={self.cpu_time_total:.3f}us "
                f"self_cpu_time_total={self.self_cpu_time_total:.3f}us>")


_SORT_KEYS = ("cpu_time", "cpu_time_total", "self_cpu_time_total", "count", "device_time", "device_time_total",
              "self_device_time_total", "cuda_time", "cuda_time_total", "self_cuda_time_total")


class EventList(list):
    """A list of FunctionEvent (prof.events()) or FunctionEventAvg (key_averages()), with table()."""

    @classmethod
    def of(cls, raw_events) -> "EventList":
        """FunctionEvents of Chrome trace complete events, each with its children on the same thread (the spans
        it encloses directly) and its self time (its time less theirs)."""
        evs = [FunctionEvent(e["name"], e.get("tid", 0), e["ts"], e["ts"] + e["dur"], e.get("cat", ""), e.get("args"))
               for e in raw_events if e.get("ph") == "X"]
        by_thread = {}
        for ev in sorted(evs, key=lambda e: (e.start_us, -e.end_us)):
            stack = by_thread.setdefault(ev.thread, [])
            while stack and stack[-1].end_us <= ev.start_us:
                stack.pop()
            if stack and ev.end_us <= stack[-1].end_us:
                parent = stack[-1]
                parent.cpu_children.append(ev)
                parent.self_cpu_time_total -= ev.cpu_time_total
                ev.cpu_parent = parent
            stack.append(ev)
        return cls(sorted(evs, key=lambda e: e.start_us))

    def key_averages(self, group_by_input_shape=False, group_by_stack_n=0) -> "EventList":
        """One FunctionEventAvg per event name, in order of first appearance (shapes and stacks are not
        recorded, so the grouping arguments change nothing)."""
        groups = {}
        for ev in self:
            groups.setdefault(ev.key, FunctionEventAvg(ev.key)).add(ev)
        return EventList(groups.values())

    def total_average(self) -> FunctionEventAvg:
        total = FunctionEventAvg("Total")
        for ev in self:
            total.add(ev)
        return total

    @property
    def self_cpu_time_total(self) -> float:
        return sum(ev.self_cpu_time_total for ev in self)

    def table(self, sort_by=None, row_limit=100, max_name_column_width=55, header=None, **kwargs) -> str:
        """PyTorch's summary table: name, self CPU %, self CPU, CPU total %, CPU total, CPU time avg, # of Calls;
        rows sorted by ``sort_by`` (largest first), at most ``row_limit`` of them (< 0: all)."""
        rows = list(self)
        if sort_by is not None:
            if sort_by not in _SORT_KEYS:
                raise ValueError(f"table(sort_by={sort_by!r}): expected one of {', '.join(_SORT_KEYS)}")
            rows.sort(key=lambda ev: getattr(ev, sort_by), reverse=True)
        if row_limit is not None and row_limit >= 0:
            rows = rows[:row_limit]
        self_total = self.self_cpu_time_total
        # the CPU-total percentage is of the summed self time as well, as PyTorch's
        pct = (lambda t: f"{100.0 * t / self_total:.2f}%") if self_total > 0 else (lambda t: "0.00%")
        name_w = max([len("Name")] + [min(len(ev.key), max_name_column_width) for ev in rows]) + 2
        cols = ("Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "# of Calls")
        line = "-" * name_w + ("  " + "-" * 12) * len(cols)
        out = [header] if header else []
        out += [line, "Name".rjust(name_w) + "".join("  " + c.rjust(12) for c in cols), line]
        for ev in rows:
            name = ev.key if len(ev.key) <= max_name_column_width else ev.key[:max_name_column_width - 3] + "..."
            vals = (pct(ev.self_cpu_time_total), _format_time(ev.self_cpu_time_total), pct(ev.cpu_time_total),
                    _format_time(ev.cpu_time_total), _format_time(ev.cpu_time_total / max(ev.count, 1)), str(ev.count))
            out.append(name.rjust(name_w) + "".join("  " + v.rjust(12) for v in vals))
        out += [line, f"Self CPU time total: {_format_time(self_total)}", ""]
        return "\n".join(out)

    def __str__(self):
        return self.table()
