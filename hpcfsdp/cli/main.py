"""The `hpcfsdp` command: a registry of subcommands, each a module with `add_parser(subparsers)`."""

import argparse
import importlib
import os
import sys

from hpcfsdp._launcher_env import LauncherEnvError, MPILibraryError
from hpcfsdp._version import __version__

__all__ = ["main", "build_parser", "COMMANDS"]

# Subcommand modules, in the order `hpcfsdp --help` lists them. Each exposes
# `add_parser(subparsers)`, which registers its parser and sets `func(args) -> int`.
COMMANDS = (
    "hpcfsdp.cli.info",
    "hpcfsdp.cli.launch",
    "hpcfsdp.cli.demo",
    "hpcfsdp.cli.train",
    "hpcfsdp.cli.data",
    "hpcfsdp.cli.bench",
    "hpcfsdp.cli.plan",
    "hpcfsdp.cli.slurm",
    "hpcfsdp.cli.checkpoint",
    "hpcfsdp.cli.generate",
    "hpcfsdp.cli.plot",
    "hpcfsdp.cli.trace",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpcfsdp",
        description="Fully sharded data-parallel training on MPI, NumPy and CuPy.",
    )
    parser.add_argument("--version", action="version", version=f"hpcfsdp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).add_parser(sub)
    return parser


def _error_once(parser, message):
    """argparse's error(), printed by rank 0 only: every rank of a job parses the same arguments."""
    from .runtime import launch_rank

    if launch_rank() == 0:
        parser.print_usage(sys.stderr)
        sys.stderr.write(f"{parser.prog}: error: {message}\n")
    sys.exit(2)


def _subparser(parser, command):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(command)
    return None


def _unrecognized(parser, args, extras):
    """argparse's "unrecognized arguments" from the subcommand's own parser (its usage, not the top level's),
    with the option each unknown one most likely means."""
    sub = _subparser(parser, getattr(args, "command", None)) or parser
    sub.error = _error_once.__get__(sub)
    options = {o for a in sub._actions for o in a.option_strings if o.startswith("--")}
    hints = []
    for e in extras:
        if e.startswith("--"):
            from .config import closest_field

            field = closest_field(e.split("=", 1)[0], [o[2:].replace("-", "_") for o in options])
            if field is not None:
                flag = next(o for o in options if o[2:].replace("-", "_") == field)
                hints.append(f"{e.split('=', 1)[0]} (did you mean {flag}?)")
    sub.error(f"unrecognized arguments: {' '.join(extras)}" + (f"; {', '.join(hints)}" if hints else ""))


# [Note: A rank under plain mpiexec]
# `mpiexec -n 4 hpcfsdp train` starts no rank wrapper (see [Note: Rank wrapper] in rankwrap.py): a rank killed by
# kill -9 or the OOM killer then ends the job in a tenth of a second with Hydra's banner only, whose PID is
# not even the killed rank's (it names the first process Hydra saw end, often one it killed itself). So a
# command that runs as a rank (RANKED), started by an MPI launcher (a launcher rank, see [Note: Launcher
# rank] in _launcher_env.py) and not by a rank wrapper nor directly by srun's slurmstepd (srun says
# "srun: error: NODE: task R: Killed" itself), replaces itself by one (exec: the pid, the
# file descriptors such as Hydra's PMI_FD and the environment the launcher knows stay), which runs the
# same command (under `python -m mpi4py` if it ran so) as its child and names the rank, host, pid and signal
# of a child that dies by a signal. Before MPI starts, and never from main(argv) called in a program, nor
# for `train --elastic`, whose ranks outlive a lost one.
RANKED = ("train", "demo", "bench")


def _parent_is(name) -> bool:
    try:
        with open(f"/proc/{os.getppid()}/comm") as f:
            return f.read().strip() == name
    except OSError:
        return False


def _wrap_rank(argv) -> None:
    """Exec this process into a rank wrapper running the same command, if [Note: A rank under plain mpiexec]
    says so; returns where it does not."""
    from hpcfsdp._launcher_env import launcher_rank

    from .rankwrap import is_rank_wrapper

    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in RANKED or launcher_rank() is None or "mpi4py.MPI" in sys.modules or "--elastic" in argv:
        return  # `train --elastic` (ULFM) survives a lost rank in the job and reports it itself
    if is_rank_wrapper(os.getppid()) or _parent_is("slurmstepd"):
        return  # srun names the node and task of a killed rank itself, and signals every process of a task
    inner = [sys.executable, *(["-m", "mpi4py"] if "mpi4py.run" in sys.modules else []), "-m", "hpcfsdp.cli.main"]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(sys.executable, [sys.executable, "-m", "hpcfsdp.cli.rankwrap", "--", *inner, *argv])
    except OSError:
        return  # run unwrapped: the rank is then not named when it is killed


def main(argv=None) -> int:
    from .runtime import release_early_stop_request

    if argv is None:
        _wrap_rank(sys.argv[1:])
    name = ["hpcfsdp"]
    try:
        return _main(argv, name)
    except KeyboardInterrupt:  # Ctrl-C outside a handler of the command's own (see [Note: Ctrl-C] in runtime.py)
        from .runtime import INTERRUPTED_EXIT

        _say_once(f"{name[0]}: interrupted (SIGINT); exit {INTERRUPTED_EXIT}\n")
        MPI = sys.modules.get("mpi4py.MPI")
        if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
            # another rank may be inside a collective, so MPI cannot be finalized; `python -m mpi4py` would call
            # MPI_Abort, one more line per rank
            sys.stdout.flush()
            os._exit(INTERRUPTED_EXIT)
        return INTERRUPTED_EXIT
    finally:
        release_early_stop_request()


def _main(argv, name) -> int:
    parser = build_parser()
    parser.error = _error_once.__get__(parser)
    args, extras = parser.parse_known_args(argv)
    if getattr(args, "command", None):
        name[0] = f"hpcfsdp {args.command}"
    _take_sigint(getattr(args, "command", None))
    if extras:
        _unrecognized(parser, args, extras)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (LauncherEnvError, MPILibraryError) as e:
        # a stale RANK in the shell, no MPI library (see [Note: No MPI library] in distributed/_mpi.py):
        # one line for the job, not a traceback per rank
        _say_once(f"hpcfsdp {args.command}: error: {e}\n")
        return 2


def _take_sigint(command):
    """SIGINT from here on: `train` keeps it for its first step boundary (see [Note: Ctrl-C] in runtime.py), any
    other command gets Python's KeyboardInterrupt. Started by a rank wrapper with SIGINT ignored, the command takes
    it only now (see [Note: Ctrl-C while a rank starts] in rankwrap.py)."""
    import signal

    from .rankwrap import restore_sigint

    if command == "train":
        from .runtime import early_stop_request

        held = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        restore_sigint()
        if not held or signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            early_stop_request()
    else:
        restore_sigint()


def _say_once(line):
    from .runtime import launch_rank

    if launch_rank() == 0:
        sys.stderr.write(line)
        sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
