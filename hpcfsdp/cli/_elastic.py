"""`hpcfsdp train --elastic`: training that goes on when ranks or hosts are lost.

[Note: Elastic training]
The loop of `hpcfsdp train` with hpcfsdp.distributed.elastic around it (see [Note: In-job recovery] there):
each step ends in a uniform commit before the optimizer step, FULL_SHARD/SHARD_GRAD_OP copy each rank's
state to a partner on another host every --memory-checkpoint-interval steps ([Note: Partner copies]), and a
lost rank, wherever the survivors were, has them shrink the world, rebuild the model, optimizer and meshes
on it, refill them from the memory images of the newest complete step (HYBRID_SHARD: the live state, held
by every shard's replicas, so no step is lost; FULL_SHARD: the partner copies, at most the interval back)
and go on. Fewer than --min-ranks survivors stop the job (exit 1; the disk checkpoint remains).

The global batch stays what it was at the start (batch_size x grad_accum x the first world): step s trains
on positions [s G, (s+1) G) of one endless sequence of epoch permutations, whatever the world (GlobalSampler);
rank r of W takes every W-th position from r and runs it as ceil(ceil(G / W) / batch_size) micro-batches of
at most batch_size; each micro-batch's loss is weighted by its share of the global batch, so the gradient
and the logged loss are those of the whole batch and the curve goes on as if nothing happened (only the
reduction order, and with dropout the masks, change). HYBRID_SHARD's mesh after a loss: shard groups of
the largest size that divides every host's rank count (a host with one rank left makes it 1: replicas).

[Note: No committed step lost]
HYBRID_SHARD takes each rank's image of a step right after the step, before anything else can communicate
(the image is local: ElasticSession.image_state), so a loss after the commit never costs the step: every
survivor committed it and imaged it. Its record may then be missing from the log (the loss struck the
record's gather, which may even return on some survivors, or the rank 0 that wrote it): whenever the restore
lands on the step a survivor last committed, the new rank 0 writes that step's record, in place of any the old
one wrote. FULL_SHARD's partner copy is collective, so it comes after the record.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections import Counter

import numpy as np

from .rankwrap import report_status
from .runtime import Context, Output, Session, StopRequest, gather_peaks, stop_job

__all__ = ["GlobalSampler", "train_elastic"]

_REPLICATED = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2", "NO_SHARD")  # every shard has replicas: nothing to copy


class GlobalSampler:
    """Step s's samples, the same set whatever the world: See [Note: Elastic training]."""

    def __init__(self, n: int, global_batch: int, seed: int):
        self.n, self.global_batch, self.seed = int(n), int(global_batch), int(seed)
        self._perms: dict[int, np.ndarray] = {}

    def state_dict(self) -> dict:
        return {"kind": "global", "n": self.n, "global_batch": self.global_batch, "seed": self.seed}

    def load_state_dict(self, sd: dict) -> None:
        if sd.get("kind") != "global":
            raise ValueError("this checkpoint was written without --elastic (its data order is per rank); resume "
                             "it without --elastic, or start the elastic run afresh")
        if int(sd["n"]) != self.n or int(sd["seed"]) != self.seed:
            raise ValueError(f"the checkpoint's data has {sd['n']} windows (seed {sd['seed']}), this run's "
                             f"{self.n} (seed {self.seed}): resume with the same data and seed")
        self.global_batch = int(sd["global_batch"])

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms = {epoch: np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(self.n)}
        return self._perms[epoch]

    def indices(self, step: int, world: int, rank: int) -> np.ndarray:
        pos = step * self.global_batch + np.arange(rank, self.global_batch, world, dtype=np.int64)
        out = np.empty(pos.size, np.int64)
        for epoch in np.unique(pos // self.n):
            sel = pos // self.n == epoch
            out[sel] = self._perm(int(epoch))[pos[sel] % self.n]
        return out

    def micro_batches(self, world: int, batch_size: int) -> int:
        """Micro-batches per step on ``world`` ranks of at most ``batch_size`` (the same on every rank)."""
        return -(-(-(-self.global_batch // world)) // batch_size)


class ElasticSession(Session):
    """A Session whose step trains the fixed global batch on whatever world it has."""

    def __init__(self, cfg, ctx, global_batch: int):
        super().__init__(cfg, ctx)
        self.sampler = GlobalSampler(len(ctx.train_set), global_batch, cfg.seed)
        least = global_batch // ctx.data_world
        if least < self.sampler.micro_batches(ctx.data_world, cfg.batch_size) or least < 1:
            raise ValueError(f"the global batch of {global_batch} cannot be spread over {ctx.data_world} ranks in "
                             f"micro-batches of {cfg.batch_size}")

    def train_step(self) -> dict:
        import hpcfsdp as hp
        import hpcfsdp.distributed as dist
        from hpcfsdp.distributed import elastic
        from hpcfsdp.distributed.fsdp import exposed_comm_seconds

        cfg, ctx = self.cfg, self.ctx
        world, g = ctx.data_world, self.sampler.global_batch
        chunks = np.array_split(self.sampler.indices(self.step, world, ctx.data_rank),
                                self.sampler.micro_batches(world, cfg.batch_size))
        t0, lr = self._begin_step()
        batches = (ctx.train_set.get_batch(idx) for idx in chunks)
        # each loss weighted so that the gradients' AVG is the global batch's mean
        losses = self._forward_backward(batches, len(chunks), lambda loss, i: loss * (len(chunks[i]) * world / g))
        loss_sum = sum(v * len(idx) for v, idx in zip(losses, chunks))
        norm = self._clip()
        loss_t = hp.tensor([loss_sum], dtype=hp.float64)
        dist.all_reduce(loss_t, op=dist.ReduceOp.SUM)
        elastic.commit()  # every survivor applies this step, or none: See [Note: Committing a step]
        self.optim.step()
        self.optim.zero_grad()
        self.step += 1
        dt = time.perf_counter() - t0
        return {"step": self.step, "loss": float(loss_t.item()) / g, "lr": lr, "grad_norm": float(norm.item()),
                "tokens_per_s": g * cfg.block_size / dt, "step_time_s": dt, "comm_time_s": exposed_comm_seconds()}

    def image_state(self) -> dict:
        """What a memory image holds: the checkpoint's state (model and optimizer shards as DTensors, step,
        sampler), taken from this rank alone (no communication, so a loss cannot stop it halfway)."""
        from hpcfsdp.distributed import checkpoint as dcp
        from hpcfsdp.distributed.checkpoint.state_dict import local_optimizer_state_dict

        return {"model": dcp.get_model_state_dict(self.model), "optim": local_optimizer_state_dict(self.model, self.optim),
                "step": self.step, "sampler": self.sampler.state_dict()}


def _for_world(cfg):
    """``cfg`` with HYBRID_SHARD's mesh for the current world (collective). See [Note: Elastic training]."""
    if cfg.strategy not in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        return cfg
    import hpcfsdp.distributed as dist
    from hpcfsdp.distributed._mpi import node_layout

    layout = node_layout(dist.group.WORLD.comm)
    counts = Counter(layout["node_of_rank"]).values()
    k = math.gcd(*counts) if layout["node_major"] else 1
    world = dist.get_world_size()
    return dataclasses.replace(cfg, mesh=[world // k, k])


class _Run:
    """One world's context, session, copies, checkpoints and output."""

    def __init__(self, cfg, global_batch=None):
        import hpcfsdp.distributed as dist

        from . import _keep
        from hpcfsdp.distributed import elastic
        from hpcfsdp.distributed._mpi import get_mpi

        if not dist.is_initialized():
            dist.init_process_group()
        self.cfg = _for_world(cfg)
        self.ctx = Context(self.cfg)
        g = global_batch or cfg.batch_size * cfg.grad_accum * self.ctx.data_world
        self.session = ElasticSession(self.cfg, self.ctx, g)
        self.replicated = self.cfg.strategy in _REPLICATED  # an image of its own each step, sent nowhere
        self.copies = elastic.PartnerCopies(1 if self.replicated else self.cfg.memory_checkpoint_interval,
                                            send=not self.replicated)
        MPI = get_mpi()  # who each rank is in the launcher's numbering, and where (for the recovery's line)
        self.launched = self.ctx.comm.allgather((MPI.COMM_WORLD.Get_rank(), MPI.Get_processor_name()))
        self.ckpt = os.path.join(cfg.checkpoint_dir, "latest") if cfg.checkpoint_dir else None
        self.ckpts = _keep.CheckpointDir(self.cfg, self.ctx, self.session) if self.ckpt else None
        self.out = None

    def start(self, step, keep=None):
        """Copies of the state at ``step`` and the output from there, its log kept through step ``keep``
        (default ``step``) (collective)."""
        self.copies.setup()
        if self.copies.interval and step > 0:  # (at step 0 the state is the seed's: a state dict now would
            self.copies.save(self.session.image_state(), step)  # create the optimizer's, changing its steps)
        self.out = Output(self.cfg, self.ctx, step, keep)


def _restore(run, images) -> int:
    """Fill the new run's model, optimizer and sampler from the survivors' images; return the step."""
    from hpcfsdp.distributed import elastic

    state = run.session.state_to_fill()
    step = elastic.restore(state, images, run.ctx.comm)
    if step is None:  # lost before the first copy: the first step again, from the seed's initial state
        return run.session.step
    run.session.apply_state(state)
    return step


def train_elastic(cfg, *, stop=None) -> int:
    """`hpcfsdp train --elastic`. See [Note: Elastic training]."""
    from hpcfsdp.distributed import elastic

    from ._resume import clean_stale, resume
    from .config import resume_target

    run = _Run(cfg)
    if run.ckpt:
        clean_stale(run.cfg, run.ctx)
    source = resume_target(cfg)
    if source is not None:
        resume(run.cfg, run.ctx, run.session, source)
    start = run.session.step
    if start >= cfg.steps:
        if run.ctx.rank == 0:
            print(f"the checkpoint is at step {start} and --steps is {cfg.steps}: nothing to train", flush=True)
        return 0
    run.start(start)
    stop = stop if stop is not None else StopRequest().install()
    stop.last_words = lambda: run.ckpts.describe() if run.ckpts is not None else "nothing saved"
    first = last = None
    losses = 0
    committed = None  # the record of the last step this rank committed: See [Note: No committed step lost]
    try:
        while run.session.step < cfg.steps:
            try:
                rec = run.session.train_step()
                done = rec["step"]
                first = rec["loss"] if first is None else first
                last = rec["loss"]
                committed = rec
                if run.replicated:  # the image first (local): the step is kept whatever fails next
                    run.copies.save(run.session.image_state(), done)
                if run.copies.stall_s:
                    rec["memory_copy_s"] = run.copies.stall_s[-1]  # what the last copy made its step wait
                rec["memory_copy_bytes"] = run.copies.memory_bytes()  # this rank's images, its own and held
                if done % cfg.log_interval == 0 or done == cfg.steps or done == start + 1:
                    peaks = gather_peaks(run.ctx)
                    run.out.log_step({**rec, "peak_mem_bytes": peaks, "world_size": run.ctx.world}, peaks)
                # a partner copy is collective: after the log, so a step restored from a copy has its record (a
                # record of a step done again is trimmed by the new log, see Output)
                if not run.replicated and run.copies.due(done):
                    run.copies.save(run.session.image_state(), done)
                if run.ckpt and cfg.checkpoint_interval and done % cfg.checkpoint_interval == 0 and done < cfg.steps:
                    run.ckpts.save()  # synchronous (elastic refuses async_checkpoint): none is in flight at a loss
                if cfg.eval_interval and (done % cfg.eval_interval == 0 or done == cfg.steps):
                    val = run.session.evaluate()
                    run.out.record({"step": done, "val_loss": val})
                    run.out.say(f"step {done}/{cfg.steps}  val_loss {val:.4f}")
                run.out.tick(rec)
                got, _ = stop.poll(run.ctx.comm)
                if got and done < cfg.steps:
                    stop.settle()
                    code = stop_job(run.cfg, run.ctx, run.session, run.out, run.ckpts, got, stop, finalize=not losses)
                    return _leave(code, run) if losses else report_status(code)
            except Exception as e:
                if not elastic.is_process_failure(e):
                    raise
                losses += 1
                try:
                    run = _recover(cfg, run, e, committed)
                except (elastic.ProcessFailure, elastic.StateLost) as err:
                    return _leave(_give_up(run, err))
        if run.ckpts is not None:
            run.ckpts.save(final=True)
        stop.settle()
        stop.last_words = None
    finally:
        stop.restore()
        if run.out is not None:
            run.out.close()
    if run.ctx.rank == 0:
        print(f"loss {first:.4f} -> {last:.4f} over steps {start + 1}..{cfg.steps} on {run.ctx.world} rank(s) "
              f"after {losses} recovery(ies); metrics: {run.out.where}"
              + (f"; checkpoint: {run.ckpt} (step {cfg.steps})" if run.ckpt else ""), flush=True)
    return _leave(0, run) if losses else report_status(0)


def _leave(code: int, run=None) -> int:
    """End a process that survived a loss without MPI_Finalize, which Open MPI's ULFM does not always return from
    once a host's ranks are all gone (seen in every such run): every survivor has finished first (a barrier of
    the survivors' world, when there is one), everything is flushed, then the process exits with ``code``."""
    try:
        if run is not None:
            run.ctx.comm.Barrier()
    except Exception:  # noqa: BLE001 - a world lost again while finishing: exit all the same
        pass
    report_status(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _give_up(run, err) -> int:
    """Too few survivors, or a step's state lost with its partner: one line, exit 1 (the disk checkpoint stays)."""
    from hpcfsdp.distributed import _failure

    _failure.UNREPORTED.clear()  # the lost rank's failed collectives: reported by this line, not at exit
    rec = getattr(err, "recovery", None)  # set by elastic.recover; a StateLost gets new_rank from _recover
    first = (rec.new_rank if rec is not None else getattr(err, "new_rank", run.ctx.rank)) == 0
    if first:
        saved = run.ckpts.describe() if run.ckpts is not None else "nothing on disk (no --checkpoint-dir)"
        print(f"hpcfsdp train: elastic: {err}; stopping: {saved}", file=sys.stderr, flush=True)
    return 1


def _recover(cfg, run, exc, committed=None):
    """The survivors' way on after a lost rank: See [Note: Elastic training]. ``committed``: the record of the
    last step this rank committed (See [Note: No committed step lost])."""
    from hpcfsdp.distributed import elastic

    t0 = time.perf_counter()
    at = run.session.step
    run.copies.salvage()
    if run.out is not None:
        run.out.close()
    images = run.copies.images()
    old_world = run.ctx.world
    rec = elastic.recover(exc, min_ranks=cfg.min_ranks)
    if not rec.lost:  # an MPI error that was no lost rank (every rank took part in the shrink): it ends the job
        raise exc
    new = _Run(cfg, global_batch=run.session.sampler.global_batch)
    try:
        step = _restore(new, images)
    except elastic.StateLost as e:
        e.new_rank = new.ctx.rank
        raise
    again = (committed is not None and committed["step"] == step and new.ctx.rank == 0
             and (step % cfg.log_interval == 0 or step == cfg.steps))  # a step that has a record at all
    new.start(step, keep=step - 1 if again else None)  # (the lost rank 0 may have written it before the loss)
    if again:
        new.out.record({**committed, "world_size": old_world})
        new.out.say(f"step {step}/{cfg.steps}  loss {committed['loss']:.4f}  lr {committed['lr']:.2e}")
    if new.ctx.rank == 0:
        lost = [run.launched[r] for r in rec.lost]
        new.out.record({"step": step, "event": "recovered", "lost_ranks": [r for r, _ in lost],
                        "lost_hosts": sorted({h for _, h in lost}), "world_size": rec.new_size,
                        "failed_at_step": at, "recovery_s": time.perf_counter() - t0})
        where = ", ".join(f"{r} ({h})" for r, h in lost)
        print(f"elastic: lost rank(s) {where} of {old_world} at step {at}; {rec.new_size} rank(s) go on from step "
              f"{step} ({at - step} step(s) redone) after {time.perf_counter() - t0:.2f} s", flush=True)
    return new
