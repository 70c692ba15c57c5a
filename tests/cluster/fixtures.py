"""pytest fixtures `cluster`: 4 simulated hosts for the system tier, always torn down; `ompi_python`: the python of
the Open MPI environment (see [Note: Open MPI on simulated hosts] in harness.py).

Where the harness cannot start (not root, no network namespaces) a test using it is skipped with the
reason, except in CI (the CI variable set) or in the system tier (HPCFSDP_SYSTEM_TIER=1, set by
`tests/run_all.py --system`): there it fails, so a broken harness can never pass as skipped tests. A test
asking for `ompi_python` fails wherever there is no Open MPI environment ($HPCFSDP_OMPI_PYTHON, default
.venv-ompi at the repository root): only system tests use it.
"""
import os

import pytest

from .harness import Cluster, ClusterError, ompi_python as _ompi_python, preflight

__all__ = ["cluster", "must_run", "ompi_python"]

HOSTS = 4


def must_run() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("HPCFSDP_SYSTEM_TIER") == "1"


def _unavailable(why):
    if must_run():
        pytest.fail(f"system tier: the simulated cluster cannot start: {why}", pytrace=False)
    pytest.skip(f"simulated hosts unavailable: {why} (the system tier runs them: "
                "`python tests/run_all.py --system` as root)")


@pytest.fixture(scope="session")
def cluster():
    why = preflight()
    if why:
        _unavailable(why)
    c = Cluster(HOSTS)
    try:
        c.up()
    except ClusterError as err:
        _unavailable(str(err))
    try:
        yield c
    finally:
        c.down()


@pytest.fixture(scope="session")
def ompi_python():
    try:
        return _ompi_python()
    except ClusterError as err:
        pytest.fail(f"system tier: no Open MPI environment: {err}", pytrace=False)
