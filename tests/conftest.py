"""Shared pytest fixtures: array backends, MPI helpers."""
import os

import pytest

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _have_gpu():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


HAVE_GPU = _have_gpu()

# ---- system tier: the simulated multi-host cluster (fixture `cluster`, tests/cluster/) ----
from cluster.fixtures import cluster  # noqa: E402,F401
# ---- end system tier ----


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU / CuPy")
    for item in items:
        if "gpu" in item.keywords and not HAVE_GPU:
            item.add_marker(skip_gpu)


def pytest_generate_tests(metafunc):
    # Tests that take a `device` argument run on every available array backend.
    if "device" in metafunc.fixturenames:
        devs = ["cpu"] + (["cuda"] if HAVE_GPU else [])
        metafunc.parametrize("device", devs)
