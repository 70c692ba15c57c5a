"""Run pytest on one MPI rank; ranks other than 0 write their output to a per-rank log file."""
import os
import sys

import pytest

# the repository root on sys.path, as `python -m pytest` has it (tests import `tests._gradcheck`)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# as conftest.py sets them, before hpcfsdp (NumPy) loads below
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from hpcfsdp._launcher_env import launcher_rank  # noqa: E402


def _rank() -> int:
    rank = launcher_rank()  # see [Note: Launcher rank] in hpcfsdp/_launcher_env.py
    return 0 if rank is None else rank


def main() -> int:
    rank = _rank()
    logdir = os.environ.get("HPCFSDP_TEST_LOGDIR")
    args = sys.argv[1:]
    if rank != 0 and logdir:
        log = open(os.path.join(logdir, f"rank{rank}.log"), "w")
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        args = [a for a in args if not a.startswith("--junitxml")]
    code = pytest.main(args)
    sys.stdout.flush()
    sys.stderr.flush()
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
