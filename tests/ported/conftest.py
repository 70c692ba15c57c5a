"""Fixtures of the ported PyTorch FSDP2 tests: the default process group of the chosen framework."""
import pytest

from _framework import init_world


@pytest.fixture(autouse=True)
def _world(request):
    if request.node.get_closest_marker("mpi") is not None:
        init_world()
    yield
