"""`hpcfsdp train ARGS...` in which the rank launched as VICTIM SIGKILLs itself right after committing step
STEP: the survivors committed it too, and nothing else of the step (its memory image, its record) has
happened yet. Used by tests/test_elastic_train.py:

    mpirun --with-ft ulfm -n 4 python tests/_elastic_commit_job.py VICTIM STEP train --elastic ...
"""
import os
import signal
import sys

from mpi4py import MPI

from hpcfsdp.cli import _elastic
from hpcfsdp.cli.main import main

VICTIM, STEP = int(sys.argv[1]), int(sys.argv[2])
_step = _elastic.ElasticSession.train_step


def _train_step(self):
    rec = _step(self)
    if rec["step"] == STEP and MPI.COMM_WORLD.Get_rank() == VICTIM:
        os.kill(os.getpid(), signal.SIGKILL)
    return rec


_elastic.ElasticSession.train_step = _train_step
sys.exit(main(sys.argv[3:]))
