"""Run pytest on one MPI rank; ranks other than 0 write their output to a per-rank log file."""
import os
import sys

import pytest

# the repository root on sys.path, as `python -m pytest` has it (tests import `tests._gradcheck`)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rank() -> int:
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "MPI_LOCALRANKID"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


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
