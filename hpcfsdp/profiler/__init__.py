"""hpcfsdp.profiler: PyTorch's ``torch.profiler`` (profile, schedule, record_function, ...) on hpcfsdp's timeline.

See [Note: Profiler on the timeline] in profiler.py: a profile's trace is the Chrome trace HPCFSDP_TRACE writes.
"""
from ._events import EventList, FunctionEvent, FunctionEventAvg, record_function
from ._schedule import ProfilerAction, schedule
from .profiler import ProfilerActivity, profile, supported_activities, tensorboard_trace_handler

__all__ = [
    "profile", "record_function", "schedule", "ProfilerAction", "ProfilerActivity", "supported_activities",
    "tensorboard_trace_handler", "EventList", "FunctionEvent", "FunctionEventAvg",
]
