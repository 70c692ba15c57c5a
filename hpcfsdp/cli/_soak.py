"""`hpcfsdp train --soak`: checkpoint/reload cycles checked against an uninterrupted run.

[Note: Soak test]
`--soak` checks that checkpoint/resume cycles lose nothing, in one job. It first trains
`--steps` steps without interruption and keeps every step's loss and grad norm. Then it trains
again from scratch in cycles of `--checkpoint-interval` steps (a quarter of the steps when 0):
after each cycle it saves a checkpoint, drops the model, optimizer and sampler, builds fresh ones
and loads the checkpoint into them. Every step after a reload must give exactly the loss and grad
norm of the uninterrupted run, the parameters after the last reload must equal the uninterrupted
run's, and the resident memory must not grow by more than SOAK_RSS_LIMIT_MIB from the first cycle
to the last. It prints one line per cycle and a PASSED/FAILED summary, writes
OUT_DIR/soak.json, and exits 0 or 1.
"""

import gc
import json
import math
import os
import time

from .runtime import Context, Session, Output, gather_peaks, guarded, say_error

__all__ = ["soak", "compare_to_reference", "SOAK_RSS_LIMIT_MIB"]

SOAK_RSS_LIMIT_MIB = 256  # resident-memory growth a soak tolerates from its first cycle to its last


def _same(a, b):
    return a == b or (math.isnan(a) and math.isnan(b))


def _first(problems, with_rank=False):
    """The first rank's problem of an allgather (every rank gets the same answer), or None."""
    for r, p in enumerate(problems):
        if p:
            return f"rank {r}: {p}" if with_rank else p
    return None


def compare_to_reference(recs, reference):
    """The first step whose loss or grad norm differs from the reference records, as a message, or None."""
    for rec in recs:
        ref = reference[rec["step"] - 1]
        for key in ("loss", "grad_norm"):
            if not _same(rec[key], ref[key]):
                return (f"step {rec['step']}: {key} {rec[key]!r} after reload, {ref[key]!r} in the uninterrupted "
                        f"run")
        if not math.isfinite(rec["loss"]):
            return f"step {rec['step']}: loss {rec['loss']!r} is not finite"
    return None


def soak(cfg) -> int:
    """See [Note: Soak test]."""
    from ._common import current_rss_bytes

    ctx = Context(cfg)
    interval = cfg.checkpoint_interval or max(1, cfg.steps // 4)
    ckpt = os.path.join(cfg.checkpoint_dir or os.path.join(cfg.out_dir, "soak-checkpoint"), "latest")
    ncycles = -(-cfg.steps // interval)
    if ctx.rank == 0:
        print(f"soak: {cfg.steps} steps uninterrupted, then {ncycles} cycles of {interval} steps with a "
              f"checkpoint and a reload into a fresh model after each ({ckpt})", flush=True)
    ref = Session(cfg, ctx)
    reference = [ref.train_step() for _ in range(cfg.steps)]
    ref_params = ref.local_params()
    del ref
    gc.collect()
    if ctx.rank == 0:
        print(f"soak: uninterrupted run done, loss {reference[0]['loss']:.4f} -> {reference[-1]['loss']:.4f}",
              flush=True)

    out = guarded(ctx.comm, f"out_dir={cfg.out_dir!r}", lambda: Output(cfg, ctx, 0))
    session = Session(cfg, ctx)
    failure, rss, t0 = None, [], time.perf_counter()
    try:
        for cycle in range(1, ncycles + 1):
            lo = session.step
            recs = []
            for _ in range(min(interval, cfg.steps - lo)):
                rec = session.train_step()
                recs.append(rec)
                if rec["step"] % cfg.log_interval == 0 or rec["step"] == cfg.steps:
                    peaks = gather_peaks(ctx)
                    out.log_step({**rec, "peak_mem_bytes": peaks}, peaks)
            failure = _first(ctx.comm.allgather(compare_to_reference(recs, reference)))
            if failure:
                break
            session.save(ckpt)
            del session
            gc.collect()
            session = Session(cfg, ctx)
            session.load(ckpt)
            if session.step != recs[-1]["step"]:
                failure = f"cycle {cycle}: the reloaded checkpoint is at step {session.step}, not {recs[-1]['step']}"
                break
            rss.append(max(ctx.comm.allgather(current_rss_bytes())))
            out.say(f"soak cycle {cycle}/{ncycles}: steps {lo + 1}..{session.step} equal the uninterrupted run; "
                    f"saved and reloaded; rss {rss[-1] / 2**20:.0f} MiB (max over ranks)")
        if failure is None:
            final = session.local_params()
            diff = [n for n in ref_params if not (final[n].shape == ref_params[n].shape
                                                  and (final[n] == ref_params[n]).all())]
            failure = _first(ctx.comm.allgather(
                f"parameters {diff[:3]} differ from the uninterrupted run" if diff else None), with_rank=True)
        if failure is None and len(rss) > 1 and rss[-1] - rss[0] > SOAK_RSS_LIMIT_MIB * 2**20:
            failure = (f"resident memory grew from {rss[0] / 2**20:.0f} to {rss[-1] / 2**20:.0f} MiB over "
                       f"{len(rss)} cycles (limit {SOAK_RSS_LIMIT_MIB} MiB): a leak")
    finally:
        out.close()
    summary = {"passed": failure is None, "failure": failure, "steps": cfg.steps, "interval": interval,
               "cycles": len(rss), "world_size": ctx.world, "rss_bytes": rss,
               "seconds": time.perf_counter() - t0}
    if ctx.rank == 0:
        with open(os.path.join(cfg.out_dir, "soak.json"), "w") as f:
            json.dump(summary, f, indent=1)
        if failure is None:
            print(f"soak PASSED: {len(rss)} checkpoint/reload cycles over {cfg.steps} steps on {ctx.world} ranks; "
                  f"every loss and grad norm after a reload equals the uninterrupted run's, final parameters "
                  f"equal; rss {rss[0] / 2**20:.0f} -> {rss[-1] / 2**20:.0f} MiB", flush=True)
        else:
            print(f"soak FAILED: {failure}", flush=True)
            say_error(f"soak failed: {failure}")
    return 0 if failure is None else 1
