"""Shared-memory segments a failed MPI job leaves in /dev/shm, removed by `hpcfsdp launch` when it ends.

[Note: Stale shared-memory segments]
MPICH keeps a node's shared memory in ``/dev/shm/mpich_shm_<job>_<node>`` (Open MPI: ``vader_segment.*``,
``sm_segment.*``) and unlinks it in MPI_Finalize. A job whose ranks are killed or abort never gets there,
and its segments stay, in RAM, until the machine reboots: on the development machine 1120 of them (3.4 GB)
had piled up after a few days of tests. The launcher notes the segments that exist before it starts the
job and, when the job has ended, removes each new one that belongs to this user and that no process maps
(a job of the same user started meanwhile has its segment mapped, and keeps it). Only this machine's
/dev/shm is seen: segments on other hosts are their site's business (Slurm's epilog, a reboot).
"""

import os

__all__ = ["segments", "remove_stale"]

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
