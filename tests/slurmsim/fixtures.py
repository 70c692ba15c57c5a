"""The `slurm` fixture's body: a private one-node Slurm (tests/slurmsim/harness.py), always torn down.

A test module declares ``@pytest.fixture(scope="module") def slurm(): yield from private_slurm()``.

Where it cannot start (not root, packages not installable, a daemon failing) a test using it is skipped
with the reason, except in CI (the CI variable set) or in the system tier (HPCFSDP_SYSTEM_TIER=1, set
by `tests/run_all.py --system`): there it fails, so a Slurm that does not start never passes as skipped.
"""
import os

import pytest

from .harness import Slurm, SlurmError, preflight

__all__ = ["private_slurm", "must_run"]


def must_run() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("HPCFSDP_SYSTEM_TIER") == "1"


def _unavailable(why):
    if must_run():
        pytest.fail(f"system tier: the private Slurm cannot start: {why}", pytrace=False)
    pytest.skip(f"a real Slurm is unavailable: {why} (the system tier runs it: "
                "`python tests/run_all.py --system` as root)")


def private_slurm():
    why = preflight()
    if why:
        _unavailable(why)
    s = Slurm()
    try:
        s.up()
    except (SlurmError, OSError) as err:
        s.down()
        _unavailable(str(err))
    try:
        yield s
    finally:
        s.down()
