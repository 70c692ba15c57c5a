"""torch.profiler.profile on hpcfsdp's timeline recorder: the same Chrome trace as HPCFSDP_TRACE."""
import enum
import os
import socket
import time
import warnings

from hpcfsdp import _trace

from ._events import EventList, record_function
from ._schedule import ProfilerAction

__all__ = ["profile", "ProfilerActivity", "supported_activities", "tensorboard_trace_handler"]

# [Note: Profiler on the timeline]
# hpcfsdp has one recorder of what a process does over time, hpcfsdp._trace (see [Note: Timeline]): FSDP's
# forward/backward per unit, every collective and every wait on one, plus record_function's labels. A profile
# records with it: while the schedule says RECORD (or RECORD_AND_SAVE) it uses the recorder that
# HPCFSDP_TRACE / `train --trace` started, or starts one of its own for the window (written nowhere, and
# removed when the window ends); the window's events are then the profile's trace, exported in the
# recorder's own Chrome trace format (pid = rank). Actions follow PyTorch's transitions between steps:
# recording starts on entering RECORD/RECORD_AND_SAVE, and after a RECORD_AND_SAVE step the trace is
# complete and on_trace_ready(prof) is called; leaving the context ends a window that is still open the same
# way. With a schedule, every step is labelled ProfilerStep#N, as in PyTorch. The spans are host-side: the
# CUDA activity is accepted, but device kernels are not timed here (Nsight Systems shows them, next to
# hpcfsdp.cuda.nvtx ranges). record_shapes, profile_memory, with_stack, with_flops and with_modules are
# accepted and record nothing more.


class ProfilerActivity(enum.Enum):
    """The activity groups a profile records (PyTorch's names)."""

    CPU = 0  # host-side spans: FSDP units, collectives, waits, record_function
    CUDA = 2  # accepted; the host-side spans of GPU work (see [Note: Profiler on the timeline])


def supported_activities() -> set:
    """CPU, and CUDA where a GPU is usable."""
    from hpcfsdp import _backend

    acts = {ProfilerActivity.CPU}
    if _backend.cupy_available():
        acts.add(ProfilerActivity.CUDA)
    return acts


def tensorboard_trace_handler(dir_name, worker_name=None, use_gzip=False, use_python_export=False):
    """An on_trace_ready that writes ``dir_name/<worker>.<ns>.pt.trace.json[.gz]`` (worker: host_pid), the files
    TensorBoard's profiler plugin and Perfetto read."""
    dir_name = os.fspath(dir_name)

    def handler(prof):
        try:
            os.makedirs(dir_name, exist_ok=True)
        except OSError as e:
            raise RuntimeError(f"Can't create directory: {dir_name} ({e.strerror or e})") from None
        worker = worker_name or f"{socket.gethostname()}_{os.getpid()}"
        name = f"{worker}.{time.time_ns()}.pt.trace.json" + (".gz" if use_gzip else "")
        prof.export_chrome_trace(os.path.join(dir_name, name))

    return handler


def _default_schedule(step):
    return ProfilerAction.RECORD


class profile:
    """``with profile(activities=[ProfilerActivity.CPU], schedule=schedule(...), on_trace_ready=...) as prof:``
    ... ``prof.step()`` per training step; then ``prof.export_chrome_trace(path)``,
    ``prof.key_averages().table(sort_by="cpu_time_total")``. See [Note: Profiler on the timeline]."""

    def __init__(self, *, activities=None, schedule=None, on_trace_ready=None, record_shapes=False,
                 profile_memory=False, with_stack=False, with_flops=False, with_modules=False,
                 experimental_config=None, execution_trace_observer=None, acc_events=False, **kwargs):
        unknown = set(kwargs) - {"use_cuda", "custom_trace_id_callback", "post_processing_timeout_s"}
        if unknown:
            raise TypeError(f"profile() got unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        acts = supported_activities() if activities is None else set(activities)
        bad = [a for a in acts if not isinstance(a, ProfilerActivity)]
        if bad:
            raise TypeError(f"profile(activities=...): expected ProfilerActivity members, got {bad[0]!r}")
        if not acts:
            raise AssertionError("No valid profiler activities found")
        if schedule is not None and not callable(schedule):
            raise TypeError(f"profile(schedule={schedule!r}): expected a callable step -> ProfilerAction")
        if on_trace_ready is not None and not callable(on_trace_ready):
            raise TypeError(f"profile(on_trace_ready={on_trace_ready!r}): expected a callable taking the profile")
        self.activities = acts
        self.record_shapes, self.profile_memory, self.with_stack = record_shapes, profile_memory, with_stack
        self.with_flops, self.with_modules = with_flops, with_modules
        self.schedule = schedule if schedule is not None else _default_schedule
        self.record_steps = schedule is not None
        self.on_trace_ready = on_trace_ready
        self.acc_events = acc_events
        self.step_num = 0
        self.current_action = self._action(0)
        self._recorder = None  # the recorder of the open window
        self._own = False  # whether this profile started it
        self._first = 0  # index of the window's first event in the recorder's list
        self._window = None  # the events of the open window (None: no window open)
        self._trace_events = None  # the last finished window's raw events
        self._trace_recorder = None
        self._accumulated = []
        self._step_label = None

    def _action(self, step):
        a = self.schedule(step)
        if not isinstance(a, ProfilerAction):
            raise TypeError(f"profile: schedule({step}) returned {a!r}; expected a ProfilerAction")
        return a

    # -- the recording window --------------------------------------------------------------------------
    def _start_trace(self):
        rec = _trace.RECORDER
        if rec is None:
            rec = _trace.Recorder(os.getcwd())  # the window's own recorder: See [Note: Profiler on the timeline]
            _trace.RECORDER = rec
            self._own = True
        else:
            self._own = False
        self._recorder, self._first = rec, len(rec.events)

    def _stop_trace(self):
        rec = self._recorder
        if rec is None:
            return
        self._trace_events = rec.events[self._first:]
        self._trace_recorder = rec
        if self.acc_events:
            self._accumulated.extend(self._trace_events)
        if self._own and _trace.RECORDER is rec:
            _trace.RECORDER = None
        self._recorder = None

    def _trace_ready(self):
        if self.on_trace_ready is not None:
            self.on_trace_ready(self)

    def _transit(self, prev, cur):
        """PyTorch's actions between two steps' ProfilerActions (cur None: the profile stops)."""
        A = ProfilerAction
        recording = (A.RECORD, A.RECORD_AND_SAVE)
        if prev in recording and (cur is None or prev == A.RECORD_AND_SAVE or cur in (A.NONE, A.WARMUP)):
            if prev == A.RECORD and cur is not None:
                warnings.warn(f"Incorrect schedule: RECORD followed by {cur.name}", stacklevel=3)
            self._stop_trace()
            if prev == A.RECORD_AND_SAVE or cur is None:
                self._trace_ready()
            prev = A.NONE
        elif prev == A.WARMUP and cur in (A.NONE, None):  # a window that never recorded: an empty trace
            if cur is not None:
                warnings.warn("Incorrect schedule: WARMUP followed by NONE", stacklevel=3)
            self._start_trace()
            self._stop_trace()
            return
        if cur in recording and prev not in recording:
            self._start_trace()

    # -- the public surface ----------------------------------------------------------------------------
    def start(self):
        self._transit(ProfilerAction.NONE, self.current_action)
        if self.record_steps:
            self._enter_step()

    def stop(self):
        self._exit_step()
        self._transit(self.current_action, None)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.stop()
        return False

    def _enter_step(self):
        self._step_label = record_function(f"ProfilerStep#{self.step_num}")
        self._step_label.__enter__()

    def _exit_step(self):
        if self._step_label is not None:
            label, self._step_label = self._step_label, None
            label.__exit__(None, None, None)

    def step(self):
        """The next step begins: the schedule's action for it takes effect."""
        self._exit_step()
        prev = self.current_action
        self.step_num += 1
        self.current_action = self._action(self.step_num)
        self._transit(prev, self.current_action)
        if self.record_steps:
            self._enter_step()

    def _finished(self):
        if self._trace_events is None:
            raise RuntimeError("profile: no trace has been recorded yet (the schedule's recording steps have not "
                               "ended); call this in on_trace_ready or after the profile stops")
        return self._trace_events

    def export_chrome_trace(self, path):
        """Write the last recorded trace as Chrome trace JSON (gzip-compressed for a path ending in .gz): the
        format of HPCFSDP_TRACE's files, which chrome://tracing, Perfetto and `hpcfsdp trace plot` read."""
        events = self._finished()
        _trace.write_trace(os.fspath(path), self._trace_recorder.chrome_trace(events))
        return path

    def events(self) -> EventList:
        """The spans of the last recorded trace (all traces so far with acc_events=True)."""
        return EventList.of(self._accumulated if self.acc_events and self._accumulated else self._finished())

    def key_averages(self, group_by_input_shape=False, group_by_stack_n=0, group_by_overload_name=False):
        """One row per span name (count, total and self CPU time), for ``.table(sort_by=..., row_limit=...)``."""
        return self.events().key_averages(group_by_input_shape, group_by_stack_n)
