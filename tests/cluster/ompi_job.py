"""An Open MPI job across the simulated hosts, whose ranks a test can kill: ``OmpiJob``.

[Note: Open MPI jobs that lose ranks]
``OmpiJob(cluster, nhosts, ppn, cmd, ft=True)`` runs ``cmd`` under the cluster's Open MPI mpirun stand-in
(``--with-ft ulfm`` with ``ft``), directly, not under ``hpcfsdp launch``: the launcher ends a job whose rank was
killed (see [Note: A rank lost across hosts] in hpcfsdp/cli/launch.py), a ULFM job goes on without it. The ranks
are found from /proc (the namespaces share the PID space): each is the topmost process below mpirun with
OMPI_COMM_WORLD_RANK in its environment, on the host whose network namespace it is in. ``kill_rank`` and
``kill_host`` send a signal now or ``after`` seconds (a timer); the times are kept in ``kills``. Kill a rank
only once every rank is past MPI_Init (``wait_for`` a line the job prints then): a rank lost inside MPI_Init
left the others there until the timeout, or mpirun ended at once with status 0 and no output.

PRRTE 5.0.x's mpirun sometimes does not end after its job has (1 run in 10 of jobs that end at once, even
with --leave-session-attached, see [Note: Open MPI on simulated hosts]; the daemons and mpirun wait in their
event loops). ``wait`` therefore watches the ranks: once every rank has exited and mpirun still runs
``linger`` seconds later it kills mpirun's whole process tree and says so (``hung``); the same at its
``timeout``. Two known limits of that Open MPI: when every rank of one host is gone (its prted alive), the
survivors' MPI_Finalize never returns (the PMIx fence waits for that host); and a lost prted (a whole host
lost) ends the job ("PRTE has lost communication with a remote daemon") instead of leaving it to ULFM.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from .harness import ROOT, ompi_python

__all__ = ["OmpiJob", "OmpiResult", "RankProc"]

LINGER = 10.0  # seconds mpirun may run on after every rank has exited before it counts as hung


@dataclass
class RankProc:
    rank: int
    pid: int
    host: int  # index of the simulated host


@dataclass
class OmpiResult:
    returncode: int | None  # None: mpirun was killed (hung or past the timeout)
    stdout: str
    stderr: str
    seconds: float
    hung: bool  # mpirun still ran `linger` s after every rank had exited, and was killed
    timed_out: bool
    kills: list = field(default_factory=list)  # (time.time(), rank, pid, signal) of every kill sent


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    found, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def _rank_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return None
    for kv in env:
        if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
            return int(kv.split(b"=", 1)[1])
    return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class OmpiJob:
    """``cmd`` on ``ppn`` ranks on each of the first ``nhosts`` hosts of ``cluster`` under Open MPI's mpirun
    (``--with-ft ulfm`` when ``ft``); a leading ``hpcfsdp``/``python`` of ``cmd`` runs in the Open MPI
    environment. ``env`` adds variables; ``timeout`` bounds ``wait``. See [Note: Open MPI jobs that lose ranks]."""

    def __init__(self, cluster, nhosts: int, ppn: int, cmd, *, ft: bool = True, env=None, timeout: float = 300.0,
                 linger: float = LINGER, cwd=None):
        if not 1 <= nhosts <= cluster.nhosts:
            raise ValueError(f"nhosts must be 1..{cluster.nhosts}, got {nhosts}")
        self.cluster, self.nhosts, self.ppn, self.size = cluster, nhosts, ppn, nhosts * ppn
        self.python = ompi_python()
        cmd = list(cmd)
        if cmd[0] == "hpcfsdp":
            cmd = [self.python, "-m", "hpcfsdp.cli.main", *cmd[1:]]
        elif cmd[0] in ("python", "python3", sys.executable):
            cmd[0] = self.python
        self.argv = [cluster.openmpi_mpirun(), "-n", str(self.size), "--oversubscribe", *cmd]
        e = dict(os.environ)
        e.update(env or {})
        e.update(HPCFSDP_CLUSTER_HOSTS=str(nhosts), HPCFSDP_CLUSTER_PPN=str(ppn), HPCFSDP_CLUSTER_FT="ulfm" if ft else "")
        e["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, e.get("PYTHONPATH")) if p)
        e.pop("HPCFSDP_RANKS_PER_NODE", None)
        self.env, self.timeout, self.linger, self.cwd = e, timeout, linger, cwd or ROOT
        self.kills: list = []
        self.proc = None
        self._ranks: dict[int, RankProc] = {}
        self._timers: list[threading.Timer] = []
        self._logs = tempfile.mkdtemp(prefix="ompi-job-")
        self._net = {os.stat(f"/run/netns/{h}").st_ino: i for i, h in enumerate(cluster.hosts)}

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self):
        self._out = open(os.path.join(self._logs, "stdout"), "wb")
        self._err = open(os.path.join(self._logs, "stderr"), "wb")
        self.started = time.time()
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=self._out,
                                     stderr=self._err, start_new_session=True)
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def stop(self):
        """Cancel pending kills and SIGKILL mpirun's process tree (idempotent)."""
        for t in self._timers:
            t.cancel()
        if self.proc is None or self.proc.poll() is not None:
            return
        pids = _descendants(self.proc.pid)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)

    # ---- output --------------------------------------------------------------------------------------
    def stdout(self) -> str:
        with open(os.path.join(self._logs, "stdout"), errors="replace") as f:
            return f.read()

    def stderr(self) -> str:
        with open(os.path.join(self._logs, "stderr"), errors="replace") as f:
            return f.read()

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 60.0) -> list[str]:
        """Wait until ``count`` lines of stdout match ``pattern`` (a regex); those lines."""
        deadline = time.time() + timeout
        while True:
            lines = [ln for ln in self.stdout().splitlines() if re.search(pattern, ln)]
            if len(lines) >= count:
                return lines
            if self.proc.poll() is not None or time.time() > deadline:
                raise AssertionError(f"{count} line(s) matching {pattern!r} not seen (mpirun "
                                     f"{'exited ' + str(self.proc.returncode) if self.proc.poll() is not None else 'runs'}):"
                                     f"\n{self.stdout()[-3000:]}\n{self.stderr()[-3000:]}")
            time.sleep(0.1)

    # ---- ranks ---------------------------------------------------------------------------------------
    def ranks(self, timeout: float = 60.0) -> dict[int, RankProc]:
        """Every rank's process, once all ``size`` have started (waits up to ``timeout`` s)."""
        deadline = time.time() + timeout
        while len(self._ranks) < self.size:
            for pid in _descendants(self.proc.pid):
                r = _rank_of(pid)
                if r is None or r in self._ranks:
                    continue
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                    host = self._net[os.stat(f"/proc/{pid}/ns/net").st_ino]
                except (OSError, KeyError, ValueError):
                    continue
                if _rank_of(ppid) is None:  # topmost: not a child process of a rank
                    self._ranks[r] = RankProc(r, pid, host)
            if len(self._ranks) >= self.size:
                break
            if self.proc.poll() is not None or time.time() > deadline:
                raise AssertionError(f"only ranks {sorted(self._ranks)} of {self.size} started:\n{self.stderr()[-3000:]}")
            time.sleep(0.1)
        return dict(self._ranks)

    def host_ranks(self, host: int) -> list[int]:
        return sorted(r for r, p in self.ranks().items() if p.host == host)

    def kill_rank(self, rank: int, sig: int = signal.SIGKILL, after: float | None = None):
        """Send ``sig`` to rank ``rank``'s process, now or ``after`` seconds from now (a timer)."""
        pid = self.ranks()[rank].pid
        if after:
            t = threading.Timer(after, self._kill, (rank, pid, sig))
            t.daemon = True
            self._timers.append(t)
            t.start()
        else:
            self._kill(rank, pid, sig)

    def kill_host(self, host: int, sig: int = signal.SIGKILL, after: float | None = None) -> list[int]:
        """Send ``sig`` to every rank on host ``host`` (index); the ranks. Its prted is left alone (see the Note)."""
        ranks = self.host_ranks(host)
        for r in ranks:
            self.kill_rank(r, sig, after)
        return ranks

    def _kill(self, rank, pid, sig):
        self.kills.append((time.time(), rank, pid, sig))
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    # ---- the end -------------------------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> OmpiResult:
        """Wait for mpirun; kill its tree when it lingers after every rank has exited (``hung``) or at the timeout."""
        deadline = self.started + (self.timeout if timeout is None else timeout)
        all_gone = None
        hung = timed_out = False
        while self.proc.poll() is None:
            now = time.time()
            if now > deadline:
                timed_out = True
                break
            if len(self._ranks) == self.size and not any(_alive(p.pid) for p in self._ranks.values()):
                all_gone = all_gone or now
                if now - all_gone > self.linger:
                    hung = True
                    break
            elif len(self._ranks) < self.size:
                try:
                    self.ranks(timeout=0)
                except AssertionError:
                    pass
            time.sleep(0.2)
        self.stop()
        self._out.close()
        self._err.close()
        rc = None if hung or timed_out else self.proc.returncode
        return OmpiResult(rc, self.stdout(), self.stderr(), time.time() - self.started, hung, timed_out, list(self.kills))
