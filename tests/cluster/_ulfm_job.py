"""ULFM across simulated hosts, plain mpi4py: `python _ulfm_job.py VICTIMS KILL_AT DIR` under `mpirun --with-ft ulfm`.

Every rank all-reduces a 1 on a duplicate of COMM_WORLD (errors returned, not fatal) every 10 ms, and prints
`READY <rank>` after its first (a rank killed from outside must be killed after that: one that dies in MPI_Init
can leave the others there until the job's timeout); at iteration
KILL_AT each rank in VICTIMS (comma-separated world ranks) writes DIR/killed<rank> (the time) and SIGKILLs
itself. The survivors catch the error of their all-reduce, revoke the communicator, shrink it, agree on a flag
and all-reduce their world ranks over the shrunk communicator; each prints one line
`SURVIVOR <json>`: rank, host, error class, when it saw the error, the shrunk size and rank, the agreed flag,
the sum, whether the all-reduces before iteration KILL_AT summed to the world size, and the iterations from
KILL_AT on that completed without an error and what they summed to. (ULFM lets an all-reduce that a dead rank never
joined return success at some survivors: on simulated hosts 2-3 of 5 survivors did in every run, with a wrong
sum or the last one left in the buffer; only an agreement afterwards tells them that step failed.)
"""
import json
import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI


def main():
    victims = {int(v) for v in sys.argv[1].split(",")}
    kill_at, d = int(sys.argv[2]), sys.argv[3]
    comm = MPI.COMM_WORLD.Dup()
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    rank, size = comm.Get_rank(), comm.Get_size()
    out, it, sums_ok, after = np.zeros(1), 0, True, []
    while True:
        if rank in victims and it == kill_at:
            with open(os.path.join(d, f"killed{rank}"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), 9)
        try:
            comm.Allreduce(np.ones(1), out, op=MPI.SUM)
        except MPI.Exception as err:
            seen, error_class = time.time(), err.Get_error_class()
            break
        if it == 0:
            print(f"READY {rank}", flush=True)
        if it < kill_at:
            sums_ok &= bool(out[0] == size)
        else:
            after.append([it, float(out[0])])
        it += 1
        time.sleep(0.01)
    comm.Revoke()
    shrunk = comm.Shrink()
    flag = shrunk.Agree(1)
    total = np.zeros(1)
    shrunk.Allreduce(np.array([float(rank)]), total, op=MPI.SUM)
    print("SURVIVOR " + json.dumps({
        "rank": rank, "host": socket.gethostname(), "error_class": error_class,
        "error": MPI.Get_error_string(error_class), "iteration": it, "seen": seen, "size": shrunk.Get_size(),
        "new_rank": shrunk.Get_rank(), "agreed": flag, "sum": float(total[0]), "sums_before_ok": sums_ok,
        "completed_after": after}),
        flush=True)
    shrunk.Free()
    comm.Free()


if __name__ == "__main__":
    main()
