"""A small parent process per rank: exports the torchrun variables, forwards signals, names a rank that dies.

[Note: Rank wrapper]
A rank killed by SIGKILL (the OOM killer, a node failing, `kill -9`) or dying of a segfault writes no
Python traceback, and mpiexec's own report names processes by exit code, not by rank, host and pid.
`python -m hpcfsdp.cli.rankwrap [--ranks-per-node K] -- CMD ...` runs CMD as its child and, when the
child ends by a signal, writes one line naming the rank, host, pid and signal (not for a signal it passed
on: the user pressed Ctrl-C, or the launcher asked the job to stop while this rank was still starting), then exits with the shell's status for it (128 + signal), so the launcher
ends the rest of the job. It forwards SIGTERM,
SIGINT, SIGUSR1 and SIGUSR2 to the child (mpiexec and srun signal the process they started: this
one), and asks the kernel to SIGKILL the child if the wrapper itself dies, so no rank outlives its
wrapper. The child runs in a process group of its own: Hydra signals the wrapper's process group, so a
child in it would get every signal twice (directly and forwarded), and a second SIGINT means "stop at
once" (see [Note: Ctrl-C] in runtime.py). Not when its stdin is a terminal (the wrapper run by hand): a
process outside the terminal's foreground group may not read it. Before starting the child it exports
RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE from
the launcher's variables (values the user set are kept; see [Note: torchrun variables] in
distributed/_mpi.py), marked with the child's pid. `hpcfsdp launch` puts it in front of every rank, and
`hpcfsdp train` (demo, bench) under a plain mpiexec execs into it (see [Note: A rank under plain
mpiexec] in main.py); for other programs, put it in front of the command yourself:
    mpiexec -n 4 python -m hpcfsdp.cli.rankwrap -- python -m mpi4py train.py
    srun --mpi=pmi2 python -m hpcfsdp.cli.rankwrap -- python -m mpi4py train.py
The child inherits every file descriptor (Hydra's PMI_FD is one).
"""

import argparse
import os
import signal
import socket
import subprocess
import sys

from hpcfsdp._launcher_env import RANK_ENV_PID, find_launcher, forget_inherited, launcher_rank

__all__ = ["main", "rank_env", "describe_status", "restore_sigint", "is_rank_wrapper", "FORWARDED", "HOLD_SIGINT_FOR"]

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def rank_env(environ, ranks_per_node=None) -> dict:
    """The torchrun variables this rank gets from its launcher's variables in `environ` (values set there
    already win); {} when no launcher's variables are found."""
    hit = find_launcher(environ)
    if hit is None:
        return {}
    values = {}
    for key, var in hit[1].items():
        if environ.get(var, "").strip().isdigit():
            values[key] = environ[var].strip()
    if ranks_per_node:
        values["LOCAL_RANK"] = str(int(values["RANK"]) % ranks_per_node)
        values["LOCAL_WORLD_SIZE"] = str(ranks_per_node)
    return {k: environ.get(k, v) for k, v in values.items()}


def describe_status(returncode) -> str:
    """A subprocess return code in words: 'exited with status 3', 'killed by SIGKILL (signal 9)'."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name} (signal {-returncode})"
    return f"exited with status {returncode}"


def _this_rank():
    rank = launcher_rank()
    return "?" if rank is None else str(rank)


def _die_with_parent(hold_sigint=False):
    """In the child before exec: SIGKILL me when my parent (the wrapper) dies; mark the rank variables mine.
    With ``hold_sigint``, start with SIGINT ignored (see [Note: Ctrl-C while a rank starts])."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass
    if "RANK" in os.environ:
        os.environ[RANK_ENV_PID] = str(os.getpid())
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    if hold_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not os.isatty(0):  # a process group of its own: each signal once, from the wrapper (see [Note: Rank wrapper])
        os.setpgid(0, 0)


# [Note: Ctrl-C while a rank starts]
# An `hpcfsdp` command answers Ctrl-C in one line (see [Note: Ctrl-C] in runtime.py), but only once it
# runs: a SIGINT while Python still imports hpcfsdp (a second or two) would end every rank in a
# KeyboardInterrupt traceback. So the wrapper starts an `hpcfsdp.cli.main` child with SIGINT ignored
# (Python then installs no handler of its own), and hpcfsdp.cli.main, once imported, takes SIGINT again
# (restore_sigint); a SIGINT that comes before is held by the wrapper, which watches the child's ignored
# signals (/proc/PID/status, SigIgn) and passes it on as soon as SIGINT is no longer ignored there.
HOLD_SIGINT_FOR = "hpcfsdp.cli.main"  # the module whose runs start with SIGINT held


def _ignores_sigint(pid) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigIgn:"):
                    return bool(int(line.split()[1], 16) >> (signal.SIGINT - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def is_rank_wrapper(pid) -> bool:
    """Whether process ``pid`` runs this module (a rank wrapper), by its command line."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"hpcfsdp.cli.rankwrap" in f.read().split(b"\0")
    except OSError:
        return False


def restore_sigint() -> None:
    """In an `hpcfsdp` command that a rank wrapper started with SIGINT ignored: take SIGINT again (Python's
    KeyboardInterrupt), so that the SIGINT the wrapper holds is passed on. A no-op elsewhere (a SIGINT ignored
    on purpose, `nohup`, stays ignored)."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        return
    if is_rank_wrapper(os.getppid()):
        signal.signal(signal.SIGINT, signal.default_int_handler)


STATUS_DIR_ENV = "HPCFSDP_LAUNCH_STATUS_DIR"  # set by `hpcfsdp launch --elastic`: See [Note: Elastic jobs] in launch.py


def report_status(code: int) -> int:
    """Write this rank's exit status where `hpcfsdp launch --elastic` reads it (when it set the directory, on
    its host); return it."""
    from hpcfsdp import _settings

    where = _settings.get(STATUS_DIR_ENV)
    if where:
        try:
            with open(os.path.join(where, str(os.getpid())), "w") as f:
                f.write(str(code))
        except OSError:  # the launcher's host only; elsewhere the directory does not exist
            pass
    return code


def main(argv=None) -> int:
    return report_status(_main(argv))


def _main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpcfsdp.cli.rankwrap",
                                description="Run CMD as this rank's child; name the rank if it dies by a signal.")
    p.add_argument("--ranks-per-node", type=int, default=None)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        p.error("no command given: python -m hpcfsdp.cli.rankwrap -- CMD ...")
    forget_inherited(os.environ)  # set by an hpcfsdp process for itself: not this rank's values
    os.environ.update(rank_env(os.environ, args.ranks_per_node))
    child = None
    pending = []
    forwarded = set()
    starting = [HOLD_SIGINT_FOR in cmd]  # the child still ignores SIGINT; see [Note: Ctrl-C while a rank starts]
    held = []

    def forward(sig, frame):
        forwarded.add(sig)
        if child is None:
            pending.append(sig)
        elif sig == signal.SIGINT and starting[0]:
            held.append(sig)
        else:
            try:
                child.send_signal(sig)
            except ProcessLookupError:
                pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    try:
        child = subprocess.Popen(cmd, close_fds=False, preexec_fn=lambda: _die_with_parent(starting[0]))
    except OSError as e:
        sys.stderr.write(f"hpcfsdp: rank {_this_rank()}: cannot start {cmd[0]!r}: {e}\n")
        return 127
    for sig in pending:
        forward(sig, None)
    while True:
        try:
            code = child.wait(timeout=0.05 if starting[0] else None)
            break
        except subprocess.TimeoutExpired:
            if not _ignores_sigint(child.pid):  # it takes SIGINT now: pass on what came meanwhile
                if held:
                    child.send_signal(held.pop(0))  # one at a time: a second Ctrl-C is a signal of its own
                else:
                    starting[0] = False
        except InterruptedError:
            continue
    if code < 0:
        sig = -code
        if sig in forwarded:  # passed on by this wrapper: a stop the launcher asked for (a rank still starting
            return 128 + sig  # dies of it), or Ctrl-C, whose KeyboardInterrupt ends by SIGINT after its own report
        sys.stderr.write(f"hpcfsdp: rank {_this_rank()} (host {socket.gethostname()}, pid {child.pid}) "
                         f"{describe_status(code)} without a Python traceback\n")
        sys.stderr.flush()
        return 128 + sig
    return code


if __name__ == "__main__":
    sys.exit(main())
