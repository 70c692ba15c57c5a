"""MPI initialisation and the capability probe (hpcfsdp.distributed._mpi) and buffer specs (_buffers)."""
import importlib.util
import json

import ml_dtypes
import numpy as np
import pytest

from hpcfsdp.distributed import _buffers as B
from hpcfsdp.distributed import _mpi


@pytest.fixture
def fresh_cuda_probe(monkeypatch):
    monkeypatch.setattr(_mpi, "_CUDA_AWARE", None)
    for var in ("HPCFSDP_CUDA_AWARE", "MPICH_GPU_SUPPORT_ENABLED", "OMPI_MCA_opal_cuda_support"):
        monkeypatch.delenv(var, raising=False)
    yield monkeypatch
    _mpi._CUDA_AWARE = None


def test_probe_is_json_and_describes_this_mpi():
    from mpi4py import MPI

    p = _mpi.probe()
    json.dumps(p)
    assert p["vendor"] == "MPICH" and p["version"].startswith("5.")  # the mpich wheel of this venv
    assert p["thread_level"] == "multiple" and p["thread_multiple"] is True
    assert p["world_size"] == MPI.COMM_WORLD.Get_size() and p["world_rank"] == MPI.COMM_WORLD.Get_rank()
    assert p["num_nodes"] >= 1 and p["local_size"] >= 1
    assert p["float16_type"] is True
    assert p["bfloat16_type"] is (MPI.BFLOAT16_T != MPI.DATATYPE_NULL)
    assert isinstance(p["cuda_aware"], bool) and p["cuda_aware_source"]
    assert p["gpu_count"] == 0  # no GPU on this machine; CuPy itself imports (the cuda extra installs it)
    assert p["cupy"] is (importlib.util.find_spec("cupy") is not None)
    assert "cupy_version" in p if p["cupy"] else "cupy_error" in p
    assert _mpi.init_mpi() is MPI  # idempotent


def test_half_types_reject_datatype_null():
    from mpi4py import MPI

    h = _mpi.half_types()
    assert h["float16"] is MPI.FLOAT16_T or h["float16"] == MPI.FLOAT16_T
    if MPI.BFLOAT16_T == MPI.DATATYPE_NULL:
        assert h["bfloat16"] is None
    t, work = B.reduce_plan(ml_dtypes.bfloat16)
    assert (work is None) == (h["bfloat16"] is not None)
    t, work = B.reduce_plan(np.float16, force_fallback=True)
    assert t == MPI.FLOAT and work == np.float32
    with pytest.raises(TypeError, match="cannot reduce arrays of dtype str"):
        B.reduce_plan(np.dtype("U3"))


def test_byte_spec_sends_half_types_as_bytes():
    from mpi4py import MPI

    a = np.arange(6, dtype=ml_dtypes.bfloat16).reshape(2, 3)
    buf, t = B.byte_spec(a)
    assert t == MPI.BYTE and buf.dtype == np.uint8 and buf.size == 12
    assert np.shares_memory(buf, a)


def test_cuda_awareness_decision_order(fresh_cuda_probe):
    mp = fresh_cuda_probe
    mp.setenv("HPCFSDP_CUDA_AWARE", "1")
    assert _mpi.cuda_aware(refresh=True) == (True, "env HPCFSDP_CUDA_AWARE")
    mp.setenv("HPCFSDP_CUDA_AWARE", "off")
    assert _mpi.cuda_aware(refresh=True) == (False, "env HPCFSDP_CUDA_AWARE")
    mp.setenv("HPCFSDP_CUDA_AWARE", "maybe")
    with pytest.raises(ValueError, match="HPCFSDP_CUDA_AWARE='maybe': expected 1/true/yes/on, 0/false/no/off or auto"):
        _mpi.cuda_aware(refresh=True)
    mp.delenv("HPCFSDP_CUDA_AWARE")
    mp.setattr(_mpi, "_mpix_query_cuda_support", lambda: None)
    mp.setenv("MPICH_GPU_SUPPORT_ENABLED", "1")
    assert _mpi.cuda_aware(refresh=True) == (True, "env MPICH_GPU_SUPPORT_ENABLED=1")
    mp.delenv("MPICH_GPU_SUPPORT_ENABLED")
    assert _mpi.cuda_aware(refresh=True) == (False, "default (no evidence of CUDA support)")
    mp.setattr(_mpi, "_mpix_query_cuda_support", lambda: False)
    mp.setenv("OMPI_MCA_opal_cuda_support", "true")  # the library's own answer wins over vendor variables
    assert _mpi.cuda_aware(refresh=True) == (False, "MPIX_Query_cuda_support()=0")


def test_mpix_query_on_the_loaded_library():
    # MPICH 5 exports MPIX_Query_cuda_support; this wheel is built without CUDA.
    assert _mpi._loaded_libmpi() is not None
    assert _mpi._mpix_query_cuda_support() in (False, None)


def test_ranks_per_node_override_validation(monkeypatch):
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", "0")
    with pytest.raises(ValueError, match="HPCFSDP_RANKS_PER_NODE='0': expected a positive integer"):
        _mpi.node_comm()
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", "two")
    with pytest.raises(ValueError, match="expected a positive integer"):
        _mpi.node_comm()


@pytest.mark.mpi(min_size=2)
def test_node_layout_real_and_simulated(monkeypatch):
    from mpi4py import MPI

    n, me = MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()
    real = _mpi.node_layout()
    assert real["num_nodes"] == 1 and real["local_rank"] == me and real["local_size"] == n  # one machine
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", "1")
    sim = _mpi.node_layout()
    assert sim["num_nodes"] == n and sim["local_rank"] == 0 and sim["node_index"] == me
    monkeypatch.setenv("HPCFSDP_RANKS_PER_NODE", "2")
    sim2 = _mpi.probe()
    assert sim2["num_nodes"] == (n + 1) // 2 and sim2["local_rank"] == me % 2
    assert sim2["node_of_rank"] == [r // 2 for r in range(n)] and sim2["node_major"] is True


_ENV_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "HPCFSDP_RANK_ENV_PID", "HPCFSDP_RANKS_PER_NODE",
              "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
              "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
              "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID")


@pytest.fixture
def rank_env(monkeypatch):
    """No torchrun or launcher variable set; whatever the test sets is undone afterwards."""
    for name in _ENV_NAMES:
        monkeypatch.setenv(name, "x")  # recorded, so teardown restores the original (or removes it)
        monkeypatch.delenv(name)
    return monkeypatch


def _rank_vars():
    import os

    return tuple(os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))


def test_rank_env_from_each_launcher(rank_env):
    rank_env.setenv("OMPI_COMM_WORLD_RANK", "3")
    rank_env.setenv("OMPI_COMM_WORLD_SIZE", "8")
    rank_env.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    rank_env.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    rank_env.setenv("SLURM_PROCID", "0")  # an enclosing batch step's: the first launcher found wins
    assert _mpi.export_rank_env() == {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    for name in _ENV_NAMES:
        rank_env.delenv(name, raising=False)
    rank_env.setenv("SLURM_PROCID", "5")
    assert _mpi.export_rank_env() == {}  # Slurm's variables count only inside an srun step
    rank_env.setenv("SLURM_STEP_NUM_TASKS", "6")
    rank_env.setenv("SLURM_LOCALID", "1")
    assert _rank_vars() == (None, None, None, None)
    _mpi.export_rank_env()
    assert _rank_vars() == ("5", "6", "1", None)
    rank_env.setenv("HPCFSDP_RANKS_PER_NODE", "4")  # simulated nodes: local values from the rank
    _mpi.export_rank_env()
    assert _rank_vars() == ("5", "6", "1", "4")


def test_rank_env_checks_against_mpi_and_the_user(rank_env):
    import os

    rank_env.setenv("PMI_RANK", "1")
    rank_env.setenv("PMI_SIZE", "2")
    with pytest.raises(RuntimeError, match=r"PMI_RANK=1 \(set by MPICH/Hydra\) disagrees with MPI: RANK is 0"):
        _mpi.export_rank_env(0, 2)
    rank_env.setenv("RANK", "0")  # set by the user
    with pytest.raises(RuntimeError, match="RANK=0 in the environment disagrees with PMI_RANK of MPICH/Hydra: "
                                           "this process has RANK=1"):
        _mpi.export_rank_env()
    rank_env.delenv("PMI_RANK")
    rank_env.delenv("PMI_SIZE")
    rank_env.setenv("LOCAL_RANK", "2")
    with pytest.raises(RuntimeError, match="LOCAL_RANK=2 in the environment disagrees with MPI: this process has "
                                           "LOCAL_RANK=0"):
        _mpi.export_rank_env(0, 4, 0, 4)
    rank_env.setenv("HPCFSDP_RANK_ENV_PID", str(os.getpid() + 1))  # exported by a parent process: replaced
    assert _mpi.export_rank_env(0, 4, 0, 4) == {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0",
                                                "LOCAL_WORLD_SIZE": "4"}
    assert os.environ["HPCFSDP_RANK_ENV_PID"] == str(os.getpid())


@pytest.mark.mpi(min_size=2)
def test_rank_env_of_a_launched_job_matches_mpi():
    import os

    import hpcfsdp.distributed as dist

    dist.barrier()  # the default group exists: every variable is set and checked
    lay = _mpi.node_layout()
    assert _rank_vars() == (str(dist.get_rank()), str(dist.get_world_size()), str(lay["local_rank"]),
                            str(lay["local_size"]))
    assert os.environ["HPCFSDP_RANK_ENV_PID"] == str(os.getpid())
