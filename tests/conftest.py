"""Shared pytest fixtures: array backends, MPI helpers."""
import os

import numpy as np
import pytest

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


from hpcfsdp import _backend  # noqa: E402  (HPCFSDP_CUDA_SIM=1 installs the simulated cupy here)


@pytest.fixture
def rng():
    """A seeded NumPy generator for test data (a test module may define its own)."""
    return np.random.default_rng(1234)


def _have_gpu():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


HAVE_GPU = _have_gpu()  # real or simulated (HPCFSDP_CUDA_SIM=1): runs the `gpu` tests
REAL_GPU = HAVE_GPU and not _backend.cuda_simulated()  # runs the `gpu_hw` tests too

# ---- system tier: the simulated multi-host cluster (fixture `cluster`, tests/cluster/) ----
from cluster.fixtures import cluster, ompi_python  # noqa: E402,F401

# ---- end system tier ----


def _gpus_short_of_ranks() -> bool:
    """On real GPUs: fewer visible GPUs than MPI ranks (ranks share a GPU, so NCCL cannot span them)."""
    if not REAL_GPU:
        return False
    import cupy
    from mpi4py import MPI

    return MPI.Is_initialized() and cupy.cuda.runtime.getDeviceCount() < MPI.COMM_WORLD.Get_size()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU / CuPy (HPCFSDP_CUDA_SIM=1 runs these on the simulated device)")
    skip_hw = pytest.mark.skip(reason="needs a real CUDA GPU and CuPy (timings, real kernels)")
    skip_sim = pytest.mark.skip(reason="checks the simulated device's own rules (HPCFSDP_CUDA_SIM=1)")
    skip_share = pytest.mark.skip(reason="NCCL across ranks needs a GPU per rank; these ranks share GPUs")
    short = _gpus_short_of_ranks()
    for item in items:
        if item.get_closest_marker("gpu_hw") and not REAL_GPU:
            item.add_marker(skip_hw)
        elif item.get_closest_marker("gpu") and not HAVE_GPU:
            item.add_marker(skip_gpu)
        elif item.get_closest_marker("gpu_sim") and REAL_GPU:
            item.add_marker(skip_sim)
        elif item.get_closest_marker("gpu_per_rank") and short:
            item.add_marker(skip_share)


def pytest_generate_tests(metafunc):
    # Tests that take a `device` argument run on every available array backend.
    if "device" in metafunc.fixturenames:
        devs = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.gpu)] if HAVE_GPU else [])
        metafunc.parametrize("device", devs)
