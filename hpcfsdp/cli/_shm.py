"""Shared-memory segments a failed MPI job leaves in /dev/shm, removed by `hpcfsdp launch` when it ends.

[Note: Stale shared-memory segments]
MPICH keeps a node's shared memory in ``/dev/shm/mpich_shm_<job>_<node>`` (Open MPI: ``vader_segment.*``,
``sm_segment.*``) and unlinks it in MPI_Finalize. A job whose ranks are killed or abort never gets there,
and its segments stay, in RAM, until the machine reboots: on the development machine 1120 of them (3.4 GB)
had piled up after a few days of tests. The launcher notes the segments that exist before it starts the
job and, when the job has ended, removes each new one that belongs to this user and that no process maps
(a job of the same user started meanwhile has its segment mapped, and keeps it).

[Note: Every host's segments]
A job across hosts leaves segments in each host's /dev/shm, which the launcher does not see, and the rank
wrappers cannot clean them: Hydra SIGKILLs them as it tears the job down. So after a failed job that ran on
other hosts (--hosts/--hostfile, or a rank wrapper reported a rank lost on another host and mpiexec then
ended the job itself: one that hung may hang again), the launcher runs one more short step through the same
mpiexec, on the same hosts, for at most CLEAN_TIMEOUT seconds: `python _shm.py --since T` (this file run
by path, so the hpcfsdp package is not imported: a fraction of a second), which removes on its host the
segments of this user that were created or changed since T (the job's start, less a second) and that no
process maps, and says how many it removed. A segment of another job of this user keeps being mapped while
that job runs, as on the launcher's host.
"""

import os
import socket
import subprocess
import sys
import time

__all__ = ["segments", "remove_stale", "remove_since", "clean_hosts", "CLEAN_TIMEOUT"]

CLEAN_TIMEOUT = 10.0  # seconds the per-host cleaning step may take

SHM = "/dev/shm"
_PREFIXES = ("mpich_shm_", "vader_segment.", "sm_segment.")


def segments(directory: str = SHM) -> set:
    """The MPI segment files in ``directory`` owned by this user."""
    try:
        names = os.listdir(directory)
    except OSError:
        return set()
    uid = os.getuid()
    out = set()
    for name in names:
        if name.startswith(_PREFIXES):
            try:
                if os.stat(os.path.join(directory, name)).st_uid == uid:
                    out.add(name)
            except OSError:
                continue
    return out


def _mapped(directory: str) -> set:
    """Paths under ``directory`` that some readable process maps."""
    prefix = directory.rstrip("/") + "/"
    out = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    i = line.find(prefix)
                    if i >= 0:
                        out.add(line[i:].rstrip("\n").removesuffix(" (deleted)"))
        except OSError:  # gone, or another user's
            continue
    return out


def remove_stale(before: set, directory: str = SHM) -> list:
    """Unlink the segments not in ``before`` that no process maps; returns their names."""
    new = segments(directory) - before
    if not new:
        return []
    mapped = _mapped(directory)
    removed = []
    for name in sorted(new):
        path = os.path.join(directory, name)
        if path in mapped:
            continue
        try:
            os.unlink(path)
            removed.append(name)
        except OSError:
            continue
    return removed


def remove_since(since: float, directory: str = SHM) -> list:
    """Unlink the segments created or changed at or after time ``since`` (ctime) that no process maps."""
    recent = set()
    for name in segments(directory):
        try:
            if os.stat(os.path.join(directory, name)).st_ctime >= since:
                recent.add(name)
        except OSError:
            continue
    return remove_stale(segments(directory) - recent, directory)


def clean_hosts(mpiexec: str, vendor: str, nprocs: int, hosts, since: float, env=None) -> int:
    """Run `python _shm.py --since SINCE` through ``mpiexec`` on ``hosts`` ((host, slots) pairs: one process each),
    or on ``nprocs`` ranks placed as mpiexec places them when there is no host list (see [Note: Every host's
    segments]); its lines go to stderr. Returns mpiexec's status (124 after CLEAN_TIMEOUT)."""
    argv = [mpiexec, "-n", str(len(hosts) if hosts else nprocs)]
    if hosts:
        argv += ["--host" if vendor == "openmpi" else "-hosts", ",".join(f"{h}:1" for h, _ in hosts)]
    if vendor == "openmpi":
        argv.append("--oversubscribe")
    env = dict(os.environ if env is None else env)
    if vendor == "openmpi" and hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    argv += [sys.executable, "-S", os.path.abspath(__file__), "--since", repr(since)]
    try:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError:
        return 127
    try:
        text = proc.communicate(timeout=CLEAN_TIMEOUT)[0]
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, 9)  # mpiexec's session: its children too
        except (ProcessLookupError, PermissionError):
            pass
        proc.communicate()
        return 124
    out = subprocess.CompletedProcess(argv, proc.returncode, text)
    said = [ln for ln in out.stdout.decode(errors="replace").splitlines() if ln.startswith("hpcfsdp launch: ")]
    if said:
        sys.stderr.write("".join(f"{ln}\n" for ln in dict.fromkeys(said)))
        sys.stderr.flush()
    return out.returncode


def _main(argv) -> int:
    since = float(argv[argv.index("--since") + 1]) if "--since" in argv else time.time()
    gone = remove_since(since)
    if gone:
        print(f"hpcfsdp launch: removed {len(gone)} shared-memory segment(s) the job left on {socket.gethostname()}: "
              f"{', '.join(gone)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
