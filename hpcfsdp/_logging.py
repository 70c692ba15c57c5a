"""The ``hpcfsdp`` logger: rank-prefixed lines, one write each, level from HPCFSDP_LOG_LEVEL or --log-level."""

import logging
import os
import socket
import sys

import hpcfsdp._settings as _settings  # a leaf
from hpcfsdp._launcher_env import launcher_rank  # a leaf (_settings only)

__all__ = ["LOGGER_NAME", "LEVELS", "get_logger", "set_level", "rank_and_size", "rank_prefix", "write_line"]

# [Note: Logging]
# Library diagnostics go to Python `logging` under the "hpcfsdp" logger (children "hpcfsdp.<module>"),
# so applications filter and route them as they do any library's. On first use the logger gets one
# handler of its own (unless the application configured one) that writes each record to stderr as a
# single os.write ending in a newline, prefixed `[rank R/N host]`: lines of different ranks never run
# together and grep finds a rank's. A record logged with extra={"job": True} is job-wide (every rank
# would say the same thing): only rank 0 writes it, so the job prints it once. The level comes from
# HPCFSDP_LOG_LEVEL (default warning), read when the logger is first configured, or set_level()
# (`hpcfsdp train --log-level`). The rank is MPI's when MPI is initialised, else the launcher's
# environment (no MPI call: logging must work before init and after finalize). User-facing output
# of the CLI (progress, results) stays plain prints on rank 0; abort reports stay single raw writes
# (they must get out even when logging is misconfigured).

LOGGER_NAME = "hpcfsdp"
LEVELS = ("debug", "info", "warning", "error", "critical")
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")
_configured = False


def rank_and_size() -> tuple[int, int]:
    """(rank, size) of this process: MPI's when initialised, else the launcher's environment, else (0, 1)."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()

    rank = launcher_rank()
    size = next((int(v) for v in (os.environ.get(var, "").strip() for var in _SIZE_VARS) if v.isdigit()), 1)
    return (0 if rank is None else rank), size


def rank_prefix() -> str:
    """``[rank 3/8 host]``."""
    r, n = rank_and_size()
    return f"[rank {r}/{n} {socket.gethostname()}]"


def write_line(text: str, fd: int = 2) -> None:
    """``text`` as one os.write ending in a newline (lines of several processes never run together)."""
    data = (text if text.endswith("\n") else text + "\n").encode("utf-8", "replace")
    while data:
        try:
            n = os.write(fd, data)
        except InterruptedError:
            continue
        except OSError:
            return  # stderr closed: nothing left to tell
        data = data[n:]


class _OneWrite(logging.Handler):
    """Each record as one rank-prefixed os.write to stderr; job-wide records on rank 0 only."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if getattr(record, "job", False) and rank_and_size()[0] != 0:
                return
            write_line(self.format(record))
        except Exception:
            self.handleError(record)


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return f"{rank_prefix()} {record.levelname.lower()} {record.name}: {text}"


def _parse_level(level) -> int:
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    if isinstance(level, str) and level.strip().lower() in LEVELS:
        return getattr(logging, level.strip().upper())
    raise ValueError(f"log level {level!r}: expected one of {LEVELS}")


def set_level(level) -> None:
    """Set the ``hpcfsdp`` logger's level (a name of LEVELS, any case, or a logging level number)."""
    get_logger().setLevel(_parse_level(level))


def get_logger(name: str | None = None) -> logging.Logger:
    """The ``hpcfsdp`` logger (or its child ``hpcfsdp.<name>``), configured on first use. See [Note: Logging]."""
    global _configured
    root = logging.getLogger(LOGGER_NAME)
    if not _configured:
        _configured = True
        if not root.handlers:
            h = _OneWrite()
            h.setFormatter(_Formatter())
            root.addHandler(h)
            root.propagate = False
        if root.level == logging.NOTSET:
            root.setLevel(_parse_level(_settings.get("HPCFSDP_LOG_LEVEL")))
    return root if not name else root.getChild(name)
