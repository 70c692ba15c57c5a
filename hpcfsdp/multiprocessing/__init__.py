"""torch.multiprocessing for MPI jobs: ``spawn`` runs the function on this rank (the launcher started the processes).

The standard library's start-method functions are re-exported, as ``torch.multiprocessing`` re-exports
``multiprocessing``, so scripts that call ``mp.set_start_method("spawn")`` keep working.
"""
from multiprocessing import cpu_count, get_all_start_methods, get_context, get_start_method, set_start_method

from hpcfsdp.multiprocessing.spawn import (
    ProcessContext,
    ProcessException,
    ProcessExitedException,
    ProcessRaisedException,
    spawn,
    start_processes,
)

__all__ = [
    "spawn", "start_processes", "ProcessContext", "ProcessException", "ProcessRaisedException",
    "ProcessExitedException", "set_start_method", "get_start_method", "get_all_start_methods", "get_context",
    "cpu_count",
]
