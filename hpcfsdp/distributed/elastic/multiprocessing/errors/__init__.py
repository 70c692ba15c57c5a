"""Error files for launchers: ``@record`` writes an uncaught exception to ``$TORCHELASTIC_ERROR_FILE``.

As torchelastic's: a function decorated with ``record`` that raises writes a JSON error file (the exception,
its traceback and a timestamp) to the path in the environment variable ``TORCHELASTIC_ERROR_FILE`` when it
is set, then re-raises; without the variable, or when nothing is raised, it is transparent. ``SystemExit(0)``
returns None. hpcfsdp jobs start under mpiexec/srun, which do not set the variable; launchers that do
(torchrun-style agents, schedulers) read the file of the first failing rank.
"""

import faulthandler
import functools
import json
import logging
import os
import signal
import socket
import time
import traceback
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = ["ProcessFailure", "ChildFailedError", "record", "ErrorHandler", "get_error_handler"]

logger = logging.getLogger(__name__)

_NOT_AVAILABLE = "<N/A>"


class ErrorHandler:
    """Writes an exception as JSON to the file named by ``TORCHELASTIC_ERROR_FILE`` (nothing when unset).
    Subclass and override ``initialize``/``record_exception`` to handle errors otherwise."""

    def _get_error_file_path(self) -> str | None:
        return os.environ.get("TORCHELASTIC_ERROR_FILE", None)

    def initialize(self) -> None:
        """Called before the decorated function runs: enables ``faulthandler`` (as torchelastic)."""
        try:
            faulthandler.enable(all_threads=True)
        except Exception as e:  # noqa: BLE001 (e.g. a stderr without a file descriptor)
            warnings.warn(f"Unable to enable fault handler. {type(e).__name__}: {e}", stacklevel=2)

    def record_exception(self, e: BaseException) -> None:
        """Write ``{"message": {"message": "Type: text", "extraInfo": {"py_callstack", "timestamp"}}}``."""
        file = self._get_error_file_path()
        if file:
            data = {"message": {"message": f"{type(e).__name__}: {e}",
                                "extraInfo": {"py_callstack": traceback.format_exc(),
                                              "timestamp": str(int(time.time()))}}}
            with open(file, "w") as fp:
                json.dump(data, fp)

    def dump_error_file(self, rootcause_error_file: str, error_code: int = 0) -> None:
        """Copy a child's error file to this process's, with ``errorCode`` set to ``error_code`` if nonzero."""
        with open(rootcause_error_file) as fp:
            rootcause = json.load(fp)
        if error_code and isinstance(rootcause.get("message"), dict):
            rootcause["message"]["errorCode"] = error_code
        mine = self._get_error_file_path()
        if not mine:
            logger.error("no error file defined for parent, to copy child error file (%s)", rootcause_error_file)
            return
        if os.path.isfile(mine):
            logger.warning("%s already exists and will be overwritten", mine)
            os.remove(mine)
        try:
            with open(mine, "w") as fp:
                fp.write(json.dumps(rootcause))
        except Exception as e:  # noqa: BLE001 (as torchelastic: a warning, the original error propagates)
            warnings.warn(f"Unable to write error to file. {type(e).__name__}: {e}", stacklevel=2)


def get_error_handler() -> ErrorHandler:
    return ErrorHandler()


@dataclass
class ProcessFailure:
    """A failed child process: its exit code and, when it wrote one, its error file's message and timestamp."""

    local_rank: int
    pid: int
    exitcode: int
    error_file: str
    error_file_data: dict = field(init=False)
    message: Any = field(init=False)
    timestamp: int = field(init=False)

    def __post_init__(self):
        self.error_file_data, self.message, self.timestamp = {"message": "<NONE>"}, "", int(time.time())
        if os.path.isfile(self.error_file):
            with open(self.error_file) as fp:
                self.error_file_data = json.load(fp)
            msg = self.error_file_data["message"]
            self.message = msg
            self.timestamp = int(self.error_file_data.get("timestamp", 0) if isinstance(msg, str)
                                 else msg["extraInfo"]["timestamp"])
        else:
            self.error_file = _NOT_AVAILABLE
        if not self.message:
            self.message = (f"Signal {-self.exitcode} ({self.signal_name()}) received by PID {self.pid}"
                            if self.exitcode < 0 else
                            "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")

    def timestamp_isoformat(self) -> str:
        """The failure's timestamp as YYYY-MM-DD_HH:MM:SS."""
        return datetime.fromtimestamp(self.timestamp).isoformat(sep="_")

    def signal_name(self) -> str:
        if self.exitcode < 0:
            try:
                return signal.Signals(-self.exitcode).name
            except ValueError:
                return _NOT_AVAILABLE
        return _NOT_AVAILABLE


class ChildFailedError(Exception):
    """Raised by a parent (``name``) whose children failed: ``failures`` maps global rank to ProcessFailure.
    ``record`` copies the first failure's error file to the parent's."""

    def __init__(self, name: str, failures: dict):
        if not failures:
            raise ValueError("ChildFailedError needs at least one failure; got an empty dict")
        self.name, self.failures = name, failures
        super().__init__(self.format_msg())

    def get_first_failure(self) -> tuple:
        rank = min(self.failures, key=lambda r: self.failures[r].timestamp)
        return rank, self.failures[rank]

    def format_msg(self, boarder_delim: str = "=", section_delim: str = "-") -> str:
        root, _ = self.get_first_failure()
        blocks = {}
        for idx, (rank, f) in enumerate(self.failures.items()):
            msg = f.message
            if isinstance(msg, dict):
                msg = msg.get("extraInfo", {}).get("py_callstack", msg.get("message", _NOT_AVAILABLE))
            sig = f.signal_name()
            sig = f" ({sig})" if sig != _NOT_AVAILABLE else ""
            blocks[rank] = (f"[{idx}]:\n  time      : {f.timestamp_isoformat()}\n  host      : {socket.getfqdn()}\n"
                            f"  rank      : {rank} (local_rank: {f.local_rank})\n"
                            f"  exitcode  : {f.exitcode} (pid: {f.pid}) {sig}\n  error_file: {f.error_file}\n"
                            "  traceback : " + str(msg).replace("\n", "\n  "))
        title = f"{self.name} FAILED"
        width = min(max([len(title)] + [len(line) for b in blocks.values() for line in b.split("\n")]), 60)
        others = "\n".join(b for r, b in blocks.items() if r != root) or "  <NO_OTHER_FAILURES>"
        return (f"\n{boarder_delim * width}\n{title}\n{section_delim * width}\nFailures:\n{others}\n"
                f"{section_delim * width}\nRoot Cause (first observed failure):\n{blocks[root]}\n"
                f"{boarder_delim * width}")


def record(fn, error_handler: ErrorHandler | None = None):
    """Decorate the entry point (``@record def main(): ...``): an uncaught exception is written to
    ``$TORCHELASTIC_ERROR_FILE`` (when set) and re-raised; ``SystemExit(0)`` returns None."""
    handler = error_handler or get_error_handler()

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        handler.initialize()
        try:
            return fn(*args, **kwargs)
        except SystemExit as se:
            if se.code == 0:
                return None
            raise
        except ChildFailedError as e:
            rank, failure = e.get_first_failure()
            if failure.error_file != _NOT_AVAILABLE:
                handler.dump_error_file(failure.error_file, failure.exitcode)
            else:
                logger.info("local_rank %s FAILED with no error file. Decorate your entrypoint fn with @record "
                            "for traceback info.", rank)
            raise
        except Exception as e:
            handler.record_exception(e)
            raise

    return wrapper
