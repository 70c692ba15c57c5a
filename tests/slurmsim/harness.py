"""A real one-node Slurm on this machine: munged, slurmctld and slurmd started as root from a private directory.

[Note: A private Slurm]
Debian's `slurm-wlm` and `munge` (installed with apt-get when missing; needs root) run from a fresh
temporary directory: a MUNGE key and socket of their own, a `slurm.conf` naming this machine as the
one node (``NodeAddr=127.0.0.1``) with ``CPUs`` set above the real core count (``SlurmdParameters=
config_overrides``) so a 4-rank job fits on a 2-core machine, free TCP ports, state and spool
directories inside the same directory. No cgroups (``proctrack/linuxproc``, ``task/none``), no
accounting, ``MpiDefault=none`` (a site that does not choose an MPI plugin for its users).
``AuthInfo=cred_expire`` is short (10 s), because it is also how long a requeued job waits before
it may start again, and the scheduler runs every 2 s. munged and slurmctld run at nice -10 (their
sessions too: autogroup) and ``MessageTimeout`` is 30 s: the jobs' ranks keep every core busy, and a
starved controller made `scancel` time out on a 2-core machine. Every command reaches this Slurm through
``SLURM_CONF`` in the environment `Slurm.env` returns; nothing under /etc is read or written.

[Note: MPICH segments and job ids]
MPICH names a job's node-local shared memory ``/dev/shm/mpich_shm_<world id>_<node>``, the world id
being the FNV-1a hash of the PMI KVS name, which under ``srun --mpi=pmi2`` is ``<job id>.<step id>``.
A job killed before MPI_Finalize leaves its segment behind, and a later job with the same id opens
the stale one and spins in MPI_Init forever. A fresh slurmctld numbers jobs from 1 again, so each
private Slurm starts at a random ``FirstJobId`` and its teardown removes the segments of its own jobs.

[Note: Teardown of the private Slurm]
Every process started here (the daemons, and through them every job, since jobs inherit the
submitting environment) carries ``HPCFSDP_SLURMSIM=<its directory>``. `Slurm.down()` kills each
process carrying that mark, then each process descended from one (slurmstepd and what it runs),
by pid, and removes the directory. A reaper started with the daemons, in a session of its own,
holds a pipe from the owner: when the owner ends without `down()` (pytest-timeout's os._exit, a
SIGKILL) the pipe closes and the reaper does the same teardown.
"""
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

__all__ = ["Slurm", "SlurmError", "preflight", "install", "teardown", "MARK"]

MARK = "HPCFSDP_SLURMSIM"
PACKAGES = ("slurm-wlm", "munge")
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue", "scancel", "srun")
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                "BOOT_FAIL", "DEADLINE")


class SlurmError(RuntimeError):
    """The private Slurm cannot be installed, started or used here."""


def _missing():
    return [t for t in TOOLS if shutil.which(t) is None and not os.path.exists(f"/usr/sbin/{t}")]


def install() -> str | None:
    """Install slurm-wlm and munge with apt-get when a tool is missing; returns why not (None: all present)."""
    if not _missing():
        return None
    if shutil.which("apt-get") is None:
        return f"{', '.join(_missing())} not installed and no apt-get to install {' '.join(PACKAGES)}"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:  # a fresh machine may have no package lists yet
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True, timeout=600)
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0 or _missing():
        return f"`{' '.join(cmd)}` failed ({out.returncode}): {(out.stderr or out.stdout)[-1500:]}"
    return None


def preflight() -> str | None:
    """Why a private Slurm cannot run here (None when it can): root, then the packages (installed if missing)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the Slurm daemons run as root (SlurmUser=root); run as root, e.g. in CI"
    return install()


def _renice(nice):
    """Nice this process and, where the kernel groups the CPU by session (autogroup: a task's nice then weighs
    only inside its session), its session too. Runs in the child after setsid."""
    os.nice(nice)
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:  # no autogroup in this kernel: the task's own nice is what counts
        pass


def _tool(name):
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _marked(directory):
    """Pids of the processes carrying MARK=directory, and of every process descended from one."""
    want = f"{MARK}={directory}".encode()
    parent, marked = {}, set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/stat") as f:
                parent[pid] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    marked.add(pid)
        except (OSError, ValueError, IndexError):
            continue
    found = set(marked)
    grew = True
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if ppid in found and pid not in found and pid != os.getpid():
                found.add(pid)
                grew = True
    return found


def _fnv1a(text):
    h = 2166136261
    for b in text.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def _remove_segments(directory):
    """Remove the MPICH shared-memory segments of the jobs this Slurm ran (see [Note: MPICH segments and job ids])."""
    try:
        with open(os.path.join(directory, "jobids")) as f:
            first, last = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return
    names = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    for job in range(first, last + 1):
        for step in range(16):
            world = f"{_fnv1a(f'{job}.{step}'):x}"
            for name in names:
                if name.startswith((f"mpich_shm_{world}_", f"mpich_vci_{world}_")):
                    try:
                        os.unlink(os.path.join("/dev/shm", name))
                    except OSError:
                        pass


def teardown(directory):
    """Kill (SIGKILL, by pid) every process of the private Slurm in `directory`, then remove it."""
    end = time.monotonic() + 15
    while time.monotonic() < end:
        pids = _marked(directory)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.3)
    _remove_segments(directory)
    shutil.rmtree(directory, ignore_errors=True)


_CONF = """\
ClusterName=hpcfsdpsim
FirstJobId={first_job}
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge/munge.socket,cred_expire=10
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={dir}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=30
MessageTimeout=30
MinJobAge=3600
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=2000 State=UNKNOWN
PartitionName=sim Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""

_REAPER = ("import sys; sys.stdin.read(); sys.path.insert(0, sys.argv[1]); "
           "from slurmsim.harness import teardown; teardown(sys.argv[2])")


class Slurm:
    """A private one-node Slurm; `up()` starts it, `down()` removes it and every job it ran."""

    def __init__(self, cpus=8):
        self.cpus = cpus
        self.node = socket.gethostname().split(".")[0]
        self.dir = None
        self._procs = []
        self._reaper = None

    @property
    def env(self):
        """The environment for Slurm commands and jobs: this Slurm's SLURM_CONF and the teardown mark."""
        return dict(os.environ, SLURM_CONF=os.path.join(self.dir, "slurm.conf"), **{MARK: self.dir})

    def up(self, timeout=90):
        self.dir = tempfile.mkdtemp(prefix="hpcfsdp-slurm-")
        os.chmod(self.dir, 0o755)
        tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self._reaper = subprocess.Popen([sys.executable, "-c", _REAPER, tests, self.dir], stdin=subprocess.PIPE,
                                        start_new_session=True,
                                        env={k: v for k, v in os.environ.items() if k != MARK})
        for sub in ("munge", "state", "spool", "log"):
            os.makedirs(os.path.join(self.dir, sub), mode=0o755)
        key = os.path.join(self.dir, "munge", "munge.key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, os.urandom(1024))
        os.close(fd)
        ctld_port, slurmd_port = _free_ports(2)
        self.first_job = random.randrange(1_000_000, 60_000_000)  # see [Note: MPICH segments and job ids]
        self._note_job(self.first_job)
        with open(os.path.join(self.dir, "slurm.conf"), "w") as f:
            f.write(_CONF.format(node=self.node, dir=self.dir, cpus=self.cpus, ctld_port=ctld_port,
                                 slurmd_port=slurmd_port, first_job=self.first_job))
        m = os.path.join(self.dir, "munge")
        self._start("munged", [_tool("munged"), "-F", f"--socket={m}/munge.socket", f"--key-file={key}",
                               f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log",
                               f"--seed-file={m}/munged.seed"], nice=-10)
        self._until(lambda: os.path.exists(f"{m}/munge.socket"), 20, "munged made no socket")
        self._start("slurmctld", [_tool("slurmctld"), "-D", "-i"], nice=-10)
        self._start("slurmd", [_tool("slurmd"), "-D", "-N", self.node])
        self._until(lambda: self.node_state() == "idle", timeout, "the node did not become idle")
        return self

    def _note_job(self, job):
        """Record the range of job ids used, for the teardown (a batch step's srun steps share its id)."""
        with open(os.path.join(self.dir, "jobids"), "w") as f:
            f.write(f"{self.first_job} {max(int(job), self.first_job)}")

    def _start(self, name, argv, nice=0):
        """Start a daemon in a session of its own; ``nice`` < 0 keeps it answering while the jobs' ranks hold
        every core (slurmd stays at 0: the jobs it starts inherit its priority)."""
        log = open(os.path.join(self.dir, "log", f"{name}.out"), "w")
        self._procs.append((name, subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL, start_new_session=True,
                                                   preexec_fn=(lambda: _renice(nice)) if nice else None)))
        log.close()

    def _until(self, cond, timeout, what):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for name, p in self._procs:
                if p.poll() is not None:
                    raise SlurmError(f"{name} exited with {p.returncode}\n{self.logs()}")
            if cond():
                return
            time.sleep(0.5)
        raise SlurmError(f"{what} within {timeout} s\n{self.logs()}")

    def down(self):
        if self.dir:
            teardown(self.dir)
        for _, p in self._procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._procs = []
        if self._reaper is not None:
            self._reaper.stdin.close()  # its teardown finds nothing left
            try:
                self._reaper.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._reaper.kill()
            self._reaper = None

    # -------------------------------------------------------------------- using it

    def run(self, *argv, timeout=60, check=True, **kw):
        out = subprocess.run(list(argv), env=kw.pop("env", self.env), capture_output=True, text=True,
                             timeout=timeout, **kw)
        if check and out.returncode != 0:
            raise SlurmError(f"`{' '.join(argv)}` failed ({out.returncode}): {out.stderr.strip() or out.stdout}")
        return out

    def node_state(self):
        out = self.run("sinfo", "-h", "-N", "-o", "%T", check=False, timeout=20)
        return out.stdout.strip() if out.returncode == 0 else None

    def sbatch(self, script, *, cwd, env=None, args=()):
        """Submit `script` from `cwd` (exporting the whole environment `env`); returns the job id."""
        out = self.run("sbatch", "--parsable", "--export=ALL", *args, str(script), cwd=cwd,
                       env=dict(self.env, **(env or {})))
        job = out.stdout.strip().split(";")[0]
        self._note_job(job)
        return job

    def job(self, job_id) -> dict:
        """`scontrol show job -o` as a dict (JobState, Restarts, ExitCode, Reason, ...)."""
        for name, p in self._procs:
            if p.poll() is not None:
                raise SlurmError(f"{name} (pid {p.pid}) ended with {p.returncode} while job {job_id} was "
                                 f"watched\n{self.logs()}")
        for attempt in range(3):  # a query can die mid-answer while slurmctld requeues (SIGPIPE: -13, seen once)
            out = self.run("scontrol", "show", "job", "-o", str(job_id), timeout=20, check=False)
            if out.returncode >= 0 or attempt == 2:
                break
            time.sleep(0.5)
        if out.returncode != 0:
            raise SlurmError(f"`scontrol show job -o {job_id}` failed ({out.returncode}): "
                             f"{out.stderr.strip() or out.stdout}\n{self.logs()}")
        return dict(re.findall(r"(?:^|\s)([A-Za-z:/]+)=(\S*)", out.stdout))

    def wait(self, job_id, cond=None, timeout=120, what=None):
        """Poll the job until `cond(info)` (default: a final state); returns its info, else SlurmError."""
        cond = cond or (lambda info: info.get("JobState") in FINAL_STATES)
        end = time.monotonic() + timeout
        info = {}
        while time.monotonic() < end:
            info = self.job(job_id)
            if cond(info):
                return info
            time.sleep(0.5)
        raise SlurmError(f"job {job_id}: {what or 'no final state'} within {timeout} s; last: "
                         f"{ {k: info.get(k) for k in ('JobState', 'Reason', 'Restarts', 'ExitCode')} }\n"
                         f"{self.logs()}")

    def logs(self, tail=3000):
        if not self.dir:
            return ""
        parts = []
        for name in ("munged.out", "slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"):
            path = os.path.join(self.dir, "log", name)
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    parts.append(f"--- {name}\n{f.read()[-tail:]}")
        return "\n".join(parts)
