"""How long a checkpoint stalls FSDP training: dcp.save against dcp.async_save (run under 2+ ranks).

    hpcfsdp launch -n 2 -- python scripts/bench_async_save.py [--mib 256] [--steps 10] [--dir DIR] [--repeat 3]

Each rank holds --mib MiB of checkpoint state: parameters (a stack of bias-free 2048x2048 Linear layers,
fully_shard per layer) and their two AdamW moments. Three loops of --steps training steps each: none saves; one calls dcp.save at
step 2; one calls dcp.async_save at step 2 and waits for its Future at the end of the loop (inside the
timing). Two measures of the stall, medians over --repeat runs, max over ranks: `stall_vs_none_s`, the
loop's time above the no-save loop of the same repeat (the honest one; needs a quiet machine), and `stall_s`,
the loop's time above --steps times its own median step (robust to load changing between loops, but blind to
a slowdown spread evenly over the steps). `step_times_s`: each step of the last repeat, then the wait for the
Future. fsync on; DIR should be on the disk checkpoints go to, not a tmpfs. Prints one JSON line on rank 0.
"""
import argparse
import json
import os
import shutil
import statistics
import time

from mpi4py import MPI

import hpcfsdp as hp
import hpcfsdp.distributed.checkpoint as dcp
from hpcfsdp import nn
from hpcfsdp.distributed.fsdp import fully_shard


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join(os.getcwd(), "bench_async_ckpt"))
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    world, rank = comm.Get_size(), comm.Get_rank()
    d = 2048
    n_layers = max(1, round(a.mib * 2**20 * world / (3 * d * d * 4)))
    hp.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(d, d, bias=False) for _ in range(n_layers)])
    for m in model:
        fully_shard(m)
    fully_shard(model)
    opt = hp.optim.AdamW(model.parameters(), lr=1e-6)
    x = hp.randn(4, d)
    state_bytes = 3 * sum(p.to_local().numel() * 4 for p in model.parameters())

    def step():
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    def loop(kind):
        path = os.path.join(a.dir, f"ck_{kind}")
        comm.Barrier()
        fut, call, times = None, 0.0, []
        for i in range(a.steps):
            t = time.perf_counter()
            if i == 2 and kind != "none":
                state = {"model": dcp.get_model_state_dict(model), "optim": dcp.get_optimizer_state_dict(model, opt)}
                if kind == "sync":
                    dcp.save(state, checkpoint_id=path)
                else:
                    fut = dcp.async_save(state, checkpoint_id=path)
                del state
                call = time.perf_counter() - t
            step()
            times.append(time.perf_counter() - t)
        t = time.perf_counter()
        if fut is not None:
            fut.result()
        tail = time.perf_counter() - t
        total = sum(times) + tail
        # the stall: this loop's time above steps x its own median step (robust to load changing between loops)
        stall = total - a.steps * statistics.median(times)
        return [comm.allreduce(v, op=MPI.MAX) for v in (total, call, stall, tail)] + [times + [tail]]

    if rank == 0:
        os.makedirs(a.dir, exist_ok=True)
    step()  # warm-up
    runs = {k: [] for k in ("none", "sync", "async")}
    for _ in range(a.repeat):
        for kind in ("none", "sync", "async"):
            runs[kind].append(loop(kind))
    if rank == 0:
        med = {k: [statistics.median(r[j] for r in v) for j in range(4)] for k, v in runs.items()}
        out = {"world_size": world, "state_MiB_per_rank": round(state_bytes / 2**20, 1), "steps": a.steps,
               "repeat": a.repeat, "loop_s": {k: round(v[0], 3) for k, v in med.items()},
               "save_call_s": {k: round(med[k][1], 3) for k in ("sync", "async")},
               "result_wait_s": round(med["async"][3], 3),
               "stall_s": {k: round(v[2], 3) for k, v in med.items()}}
        out["async_over_sync"] = round(out["stall_s"]["async"] / out["stall_s"]["sync"], 3)
        # the same, against the no-save loop of the same repeat (paired), median over repeats
        paired = {k: statistics.median(r[0] - n[0] for r, n in zip(runs[k], runs["none"])) for k in ("sync", "async")}
        out["stall_vs_none_s"] = {k: round(v, 3) for k, v in paired.items()}
        out["per_repeat_loop_s"] = {k: [round(r[0], 2) for r in v] for k, v in runs.items()}
        out["step_times_s"] = {k: [round(t, 3) for t in v[-1][4]] for k, v in runs.items()}
        print(json.dumps(out))
        shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
