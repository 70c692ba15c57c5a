"""How long a checkpoint stalls FSDP training: dcp.save against dcp.async_save (run under 2+ ranks).

    hpcfsdp launch -n 2 -- python scripts/bench_async_save.py [--mib 256] [--steps 12] [--save-at 2]
        [--rounds 7] [--dir DIR]

Each rank holds --mib MiB of checkpoint state: parameters (a stack of bias-free 2048x2048 Linear layers,
fully_shard per layer) and their two AdamW moments. A training step is a real hpcfsdp step: forward and
backward through the FSDP stack (all-gathers, reduce-scatters) and AdamW.

The stall of a save (what this script measures): the extra wall time a training loop of --steps steps
loses because a save is issued before step --save-at, against the same loop with no save, run in the same
process and round. A loop's time runs from a barrier to the end of its last step, and for async_save until
its Future's ``.result()`` returned (so a write that does not finish behind the remaining steps counts in
full); max over ranks. Each round runs every kind of loop once, in an order rotated round by round, so that
load drifting during the run falls on every kind alike; the stall of a kind is its loop time minus the
no-save loop of the same round; reported as the median over rounds with min and max (`stall_s`).
Where other jobs load the machine, loops minutes apart run at different speeds; `stall_within_loop_s` is
then the steadier estimate: a loop's time minus --steps times its own median step, which compares each
loop with itself over seconds, and counts a save's slowdown in full as long as it slows fewer than half
of the steps (`step_s_median_over_rounds` shows which steps it slowed); and `stall_stepwise_s`, the same
extra time summed step by step from per-step medians over rounds (robust to a burst of load in one loop).
Kinds:
  none        no save
  sync        dcp.save at step --save-at
  async       dcp.async_save at step --save-at, .result() awaited after the last step
  async_wait  dcp.async_save(...).result() at step --save-at (the async writer used synchronously)
Before the rounds every kind runs once untimed (the first async save allocates its staging buffer; that
first call is reported as first_async_call_s). fsync on. DIR must be on the disk checkpoints go to, not a
tmpfs (its file system is reported). Prints one JSON line on rank 0.
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

KINDS = ("none", "sync", "async", "async_wait")


def _filesystem(path: str) -> str:
    """'<fstype> on <device>' of the mount holding ``path`` (Linux /proc/mounts)."""
    best = ("", "?", "?")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
                    best = (mnt, dev, fstype)
    except OSError:
        pass
    return f"{best[2]} on {best[1]} (mounted at {best[0]})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--save-at", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--writer-nice", type=int, default=None,
                    help="nice increment of async_save's writer thread (default: the library's)")
    ap.add_argument("--dir", default=os.path.join(os.getcwd(), "bench_async_ckpt"))
    a = ap.parse_args()
    kinds = a.kinds.split(",")
    if kinds[0] != "none" or any(k not in KINDS for k in kinds):
        raise SystemExit(f"--kinds: a comma list from {KINDS} starting with none, got {a.kinds!r}")
    if not 0 <= a.save_at < a.steps:
        raise SystemExit(f"--save-at {a.save_at} must be in [0, --steps {a.steps})")
    if a.writer_nice is not None:
        from hpcfsdp.distributed.checkpoint import _async

        _async._NICE = a.writer_nice
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
    x = hp.randn(a.batch, d)
    state_bytes = 3 * sum(p.to_local().numel() * 4 for p in model.parameters())
    ckdir = os.path.abspath(a.dir)

    def step():
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    def save(kind):
        path = os.path.join(ckdir, f"ck_{kind}")
        state = {"model": dcp.get_model_state_dict(model), "optim": dcp.get_optimizer_state_dict(model, opt)}
        if kind == "sync":
            dcp.save(state, checkpoint_id=path)
            return None
        fut = dcp.async_save(state, checkpoint_id=path)
        if kind == "async_wait":
            fut.result()
            return None
        return fut

    def loop(kind):
        """(loop s, save call s, .result() wait s, [step s]), each the max over ranks."""
        comm.Barrier()
        fut, call, times = None, 0.0, []
        t0 = time.perf_counter()
        for i in range(a.steps):
            t = time.perf_counter()
            if i == a.save_at and kind != "none":
                fut = save(kind)
                call = time.perf_counter() - t
            step()
            times.append(time.perf_counter() - t)
        t = time.perf_counter()
        if fut is not None:
            fut.result()
        wait = time.perf_counter() - t
        total = time.perf_counter() - t0
        vals = [max(col) for col in zip(*comm.allgather([total, call, wait] + times))]
        return vals[0], vals[1], vals[2], vals[3:]

    if rank == 0:
        os.makedirs(ckdir, exist_ok=True)
    comm.Barrier()
    load_before = os.getloadavg()
    step()  # warm-up: buffers, the communicators of both save paths, the async staging buffer
    first = {}
    for kind in kinds[1:]:
        comm.Barrier()
        t = time.perf_counter()
        fut = save(kind)
        first[kind] = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
        if fut is not None:
            fut.result()
    rounds = []
    for r in range(a.rounds):
        order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
        rounds.append({k: loop(k) for k in order})
    load_after = os.getloadavg()
    if rank == 0:
        def med(v):
            return round(statistics.median(v), 3)

        stall = {k: [rd[k][0] - rd["none"][0] for rd in rounds] for k in kinds[1:]}
        within = {k: [rd[k][0] - a.steps * statistics.median(rd[k][3]) for rd in rounds] for k in kinds}
        out = {"world_size": world, "state_MiB_per_rank": round(state_bytes / 2**20, 1), "steps": a.steps,
               "save_at": a.save_at, "batch": a.batch,
               "writer_nice": __import__("hpcfsdp.distributed.checkpoint._async", fromlist=["_NICE"])._NICE, "rounds": a.rounds, "dir": ckdir,
               "filesystem": _filesystem(ckdir),
               "loadavg_1_5_15": {"before": [round(v, 2) for v in load_before],
                                  "after": [round(v, 2) for v in load_after]},
               "first_save_call_s": {k: round(v, 3) for k, v in first.items()},
               "loop_s_median": {k: med([rd[k][0] for rd in rounds]) for k in kinds},
               "stall_s": {k: {"median": med(v), "min": round(min(v), 3), "max": round(max(v), 3)}
                           for k, v in stall.items()},
               "stall_within_loop_s": {k: {"median": med(v), "min": round(min(v), 3), "max": round(max(v), 3)}
                                       for k, v in within.items()},
               "save_call_s_median": {k: med([rd[k][1] for rd in rounds]) for k in kinds[1:]}}
        if "async" in kinds:
            out["result_wait_s_median"] = med([rd["async"][2] for rd in rounds])
        if "async" in kinds and "sync" in kinds:
            s, y = out["stall_s"]["sync"]["median"], out["stall_s"]["async"]["median"]
            out["async_over_sync"] = round(y / s, 3) if s > 0 else None
            out["async_over_sync_per_round"] = [round(u / v, 3) if v > 0 else None
                                                for u, v in zip(stall["async"], stall["sync"])]
            s, y = out["stall_within_loop_s"]["sync"]["median"], out["stall_within_loop_s"]["async"]["median"]
            out["async_over_sync_within_loop"] = round(y / s, 3) if s > 0 else None
        # the same extra time, located per step: sum over steps of (median over rounds of this kind's step
        # minus that of the no-save loop's same step), plus the median .result() wait
        out["stall_stepwise_s"] = {k: round(sum(
            statistics.median(rd[k][3][i] for rd in rounds) - statistics.median(rd["none"][3][i] for rd in rounds)
            for i in range(a.steps)) + statistics.median(rd[k][2] for rd in rounds), 3) for k in kinds[1:]}
        if "async" in kinds and "sync" in kinds and out["stall_stepwise_s"]["sync"] > 0:
            out["async_over_sync_stepwise"] = round(out["stall_stepwise_s"]["async"] / out["stall_stepwise_s"]["sync"], 3)
        out["per_round_loop_s"] = [{k: round(rd[k][0], 3) for k in kinds} for rd in rounds]
        out["step_s_median_over_rounds"] = {
            k: [med([rd[k][3][i] for rd in rounds]) for i in range(a.steps)] for k in kinds}
        print(json.dumps(out))
        shutil.rmtree(ckdir, ignore_errors=True)


if __name__ == "__main__":
    main()
