"""System tier: FSDP x tensor parallelism at 8 ranks, (replicate=2, shard=2, tp=2), as a real MPI job."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.system


@pytest.mark.timeout(600)
def test_gpt_hsdp_x_tp_at_8_ranks():
    cmd = [sys.executable, "-m", "hpcfsdp.cli.main", "launch", "-n", "8", "--timeout", "500", "--",
           sys.executable, os.path.join(HERE, "_mpi_pytest.py"), "--with-mpi", "-m", "mpi", "-q",
           "-p", "no:cacheprovider", os.path.join(HERE, "test_tp.py"), "-k", "8_ranks"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=580, cwd=os.path.dirname(HERE))
    assert out.returncode == 0, f"{out.stdout[-4000:]}\n{out.stderr[-3000:]}"
    assert out.stdout.count("1 passed") == 8, out.stdout[-3000:]
