"""This process's rank from the launcher's environment: the one order of [Note: Launcher rank]
(hpcfsdp/_launcher_env.py), each variable alone and the conflicting combinations; the launcher table the
torchrun variables come from; the inherited-variables marker."""
import os

import pytest

from hpcfsdp import _launcher_env as L

ALL = (*L.RANK_VARIABLES, *L.TORCHRUN_VARIABLES, L.RANK_ENV_PID, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
       "SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALRANKID",
       "MPI_LOCALNRANKS", "SLURM_LOCALID")


@pytest.fixture
def env(monkeypatch):
    for name in ALL:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_order_is_documented_once():
    assert L.RANK_VARIABLES == ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
    # the launchers the torchrun variables come from are the same ones in the same order (PMIx gives no size)
    assert [row[1] for row in L.LAUNCHERS] == [v for v in L.RANK_VARIABLES if v != "PMIX_RANK"]
    for var in (*L.RANK_VARIABLES, "RANK", L.RANK_ENV_PID):
        assert var in L.__doc__


def test_nothing_set_is_none(env):
    assert L.launcher_rank() is None


@pytest.mark.parametrize("var", L.RANK_VARIABLES)
def test_each_launcher_variable_alone(env, var):
    env.setenv(var, "5")
    assert L.launcher_rank() == 5
    env.setenv(var, " 7\n")  # surrounding blanks are not part of the value
    assert L.launcher_rank() == 7
    for bad in ("", "x", "-1", "2.0"):  # not a rank: as if unset
        env.setenv(var, bad)
        assert L.launcher_rank() is None, bad


def test_rank_counts_only_where_hpcfsdp_exported_it_for_this_process(env):
    env.setenv("RANK", "3")
    assert L.launcher_rank() is None  # set by hand (a stale one in the shell): not taken
    env.setenv(L.RANK_ENV_PID, str(os.getpid() + 1))
    assert L.launcher_rank() is None  # inherited from another hpcfsdp process
    env.setenv(L.RANK_ENV_PID, "not a pid")
    assert L.launcher_rank() is None
    env.setenv(L.RANK_ENV_PID, str(os.getpid()))
    assert L.launcher_rank() == 3  # exported here (from MPI, say, under a launcher hpcfsdp does not know)


@pytest.mark.parametrize("first", range(len(L.RANK_VARIABLES)))
def test_conflicts_go_to_the_earlier_variable(env, first):
    """Every later variable of the order (RANK exported here included) set to another value loses."""
    env.setenv("RANK", "99")
    env.setenv(L.RANK_ENV_PID, str(os.getpid()))
    for i, var in enumerate(L.RANK_VARIABLES[first:]):
        env.setenv(var, str(10 + first + i))
    assert L.launcher_rank() == 10 + first


def test_conflicts_named(env):
    env.setenv("PMI_RANK", "1")
    env.setenv("OMPI_COMM_WORLD_RANK", "2")
    assert L.launcher_rank() == 2  # Open MPI before MPICH (as the torchrun variables choose)
    env.delenv("OMPI_COMM_WORLD_RANK")
    env.setenv("SLURM_PROCID", "0")  # an mpiexec inside a batch job: the batch step's SLURM_PROCID
    assert L.launcher_rank() == 1
    env.delenv("PMI_RANK")
    env.setenv("PMIX_RANK", "4")
    assert L.launcher_rank() == 4  # srun --mpi=pmix sets both (equal); PMIx first
    env.setenv("PMIX_RANK", "junk")  # not a rank: the next variable decides
    assert L.launcher_rank() == 0


def test_find_launcher_needs_rank_and_size(env):
    assert L.find_launcher(os.environ) is None
    env.setenv("PMIX_RANK", "1")
    assert L.find_launcher(os.environ) is None  # PMIx puts no world size in the environment
    env.setenv("SLURM_PROCID", "1")
    assert L.find_launcher(os.environ) is None
    env.setenv("SLURM_STEP_NUM_TASKS", "4")
    assert L.find_launcher(os.environ) == ("Slurm", {"RANK": "SLURM_PROCID", "WORLD_SIZE": "SLURM_STEP_NUM_TASKS",
                                                     "LOCAL_RANK": "SLURM_LOCALID"})
    env.setenv("PMI_RANK", "1")
    env.setenv("PMI_SIZE", "4")
    assert L.find_launcher(os.environ)[0] == "MPICH/Hydra"
    env.setenv("OMPI_COMM_WORLD_RANK", "1")
    assert L.find_launcher(os.environ)[0] == "MPICH/Hydra"  # Open MPI's rank without its size: not a launcher
    env.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert L.find_launcher({k: os.environ[k] for k in os.environ})[0] == "Open MPI"


def test_forget_inherited_drops_only_marked_values():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "PMI_RANK": "1"}
    L.forget_inherited(env)
    assert env["RANK"] == "1"  # no marker: the user's, kept (and checked where they are used)
    env[L.RANK_ENV_PID] = "123"
    L.forget_inherited(env)
    assert env == {"PMI_RANK": "1"}
