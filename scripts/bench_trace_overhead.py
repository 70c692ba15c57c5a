"""Cost of the timeline (HPCFSDP_TRACE): FSDP step time with tracing off and on, and the off-path check alone.

    hpcfsdp launch -n 2 -- python scripts/bench_trace_overhead.py [--steps 20] [--rounds 5]

The demo's GPT (3 blocks, 96 wide, 64-token context, 8 sequences per rank), FULL_SHARD, AdamW. Rounds
alternate off/on (tracing is switched with _trace.start/stop in the same process, so both see the same
machine load); the reported step time is the median over rounds of each round's mean step, max over ranks,
and on_over_off_paired the median over rounds of on/off.
Also times the check every call site makes when tracing is off (`_trace.RECORDER is not None`) and counts
the events recorded per step when on (at most 3 off-path checks each). Prints one JSON line on rank 0.
"""
import argparse
import json
import os
import statistics
import tempfile
import time
import timeit

import numpy as np
from mpi4py import MPI

import hpcfsdp as hp
from hpcfsdp import _trace
from hpcfsdp.cli.demo import DEMO_MODEL
from hpcfsdp.distributed.fsdp import fully_shard
from hpcfsdp.models import GPT, GPTConfig


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    m = DEMO_MODEL
    hp.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=256, block_size=m["block_size"], n_layer=m["n_layer"], n_head=m["n_head"],
                          n_embd=m["n_embd"], dropout=0.0))
    for b in model.transformer.h:
        fully_shard(b)
    fully_shard(model)
    opt = hp.optim.AdamW(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(comm.rank)
    x = hp.tensor(rng.integers(0, 256, (m["batch_size"], m["block_size"])))
    y = hp.tensor(rng.integers(0, 256, (m["batch_size"], m["block_size"])))

    def steps(n):
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(n):
            _, loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        return comm.allreduce((time.perf_counter() - t) / n, op=MPI.MAX)

    steps(3)  # warm-up
    tmp = tempfile.mkdtemp(prefix="hpcfsdp-trace-bench-")
    off, on, events = [], [], 0
    for _ in range(a.rounds):
        off.append(steps(a.steps))
        rec = _trace.start(tmp, comm.rank)
        on.append(steps(a.steps))
        events = len(rec.events) / a.steps
        _trace.stop()
    check = min(timeit.repeat("_trace.RECORDER is not None", globals={"_trace": _trace}, number=100000, repeat=5))
    check_ns = check / 100000 * 1e9
    r = _trace.Recorder(tmp, comm.rank)
    t_ev = min(timeit.repeat(lambda: r.complete("all_gather transformer.h.0", "comm", 1.0, 2.0, {"kind": "all_gather"}),
                             number=20000, repeat=5)) / 20000
    if comm.rank == 0:
        t_off, t_on = statistics.median(off), statistics.median(on)
        print(json.dumps({
            "world_size": comm.size, "model": m, "step_ms_off": round(t_off * 1e3, 3),
            "step_ms_on": round(t_on * 1e3, 3), "on_over_off": round(t_on / t_off, 4),
            "on_over_off_paired": round(statistics.median(b / a_ for a_, b in zip(off, on)), 4),
            "events_per_step": events, "off_check_ns": round(check_ns, 1),
            # at most 3 checks per event when off (issue, run and wait of a collective; begin/end of a unit)
            "off_cost_per_step_us_at_most": round(check_ns * 3 * events / 1e3, 2),
            "on_cost_per_event_us": round(t_ev * 1e6, 2), "on_cost_per_step_us": round(t_ev * 1e6 * events, 1),
            "rounds_ms_off": [round(v * 1e3, 2) for v in off], "rounds_ms_on": [round(v * 1e3, 2) for v in on]}))
    for f in os.listdir(tmp):
        os.remove(os.path.join(tmp, f)) if f.endswith(f"{comm.rank:05d}.json") else None
    comm.Barrier()
    if comm.rank == 0:
        os.rmdir(tmp)


if __name__ == "__main__":
    main()
