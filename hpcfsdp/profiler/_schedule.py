"""ProfilerAction and schedule(): which steps torch.profiler's schedule records."""
import enum
import warnings

__all__ = ["ProfilerAction", "schedule"]


class ProfilerAction(enum.Enum):
    """What the profiler does during one step (PyTorch's members and order)."""

    NONE = 0  # not profiling
    WARMUP = 1  # tracing warms up; nothing is kept
    RECORD = 2  # events are recorded
    RECORD_AND_SAVE = 3  # the last recorded step of a cycle: at its end the trace is ready (on_trace_ready)


def schedule(*, wait: int, warmup: int, active: int, repeat: int = 0, skip_first: int = 0,
             skip_first_wait: int = 0):
    """The schedule callable of ``profile(schedule=...)``: skip ``skip_first`` steps, then cycles of ``wait``
    idle, ``warmup`` warm-up and ``active`` recorded steps (the last one RECORD_AND_SAVE), ``repeat`` cycles
    (0 = until the profiler stops). ``skip_first_wait`` != 0 leaves out the first cycle's wait."""
    for name, value in (("wait", wait), ("warmup", warmup), ("active", active), ("repeat", repeat),
                        ("skip_first", skip_first), ("skip_first_wait", skip_first_wait)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"schedule({name}={value!r}): expected an int")
    if wait < 0 or warmup < 0 or active <= 0 or repeat < 0 or skip_first < 0:
        raise AssertionError(  # PyTorch raises AssertionError here
            f"Invalid profiler schedule arguments. Got wait={wait} (need >= 0), warmup={warmup} (need >= 0), "
            f"active={active} (need > 0), repeat={repeat} (need >= 0), skip_first={skip_first} (need >= 0).")
    if warmup == 0:
        warnings.warn("Profiler won't be using warmup, this can skew profiler results", stacklevel=2)
    cycle = wait + warmup + active

    def action(step: int) -> ProfilerAction:
        if step < 0:
            raise AssertionError(f"Step must be non-negative. Got {step}.")
        if step < skip_first:
            return ProfilerAction.NONE
        k = step - skip_first + (wait if skip_first_wait else 0)  # steps since the (shifted) first cycle began
        if repeat and k >= repeat * cycle:
            return ProfilerAction.NONE
        pos = k % cycle
        if pos < wait:
            return ProfilerAction.NONE
        if pos < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD_AND_SAVE if pos == cycle - 1 else ProfilerAction.RECORD

    return action
