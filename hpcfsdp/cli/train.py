"""`hpcfsdp train`: train GPT or Llama (--model, --init-from) with FSDP on the ranks this job was launched on.

[Note: Exact resume]
A checkpoint holds everything the next step depends on: the sharded model and optimizer state
(Adam moments and step counts), the optimizer step reached, and the sampler's epoch and global
position (see [Note: Lazy position] in hpcfsdp/data/sampler.py). The learning rate is a pure
function of the step (`TrainConfig.lr_at`) and dropout draws from a generator reseeded from
(seed, step, rank) before every step, so no RNG state needs saving. A run resumed at the same
world size therefore reproduces the uninterrupted run bit for bit: same batches in the same
order, same reductions, same losses. At another world size it continues with the next unseen
samples (the reductions' order, hence the last bits of the losses, differ). A resumed run rewrites
the metrics log without the records the lost run wrote after its checkpoint, then appends.

[Note: Failing together]
A bad configuration must fail on every rank with exit code 2 (rank 0 prints the message), and no rank may
be left waiting in a collective. Checks that see only the configuration and the world size run on
every rank before MPI communicates at all (every rank reaches the same verdict). Checks that touch
the machine (data files, devices, sharding, the checkpoint to resume) run on every rank, then
the ranks agree with one allgather on whether any failed, and all report the first failure. After
that agreement every rank shuts MPI down normally (MPI_Finalize) and exits 2: no MPI_Abort noise.
"""

import argparse
import os
import signal
import sys
import types

from hpcfsdp import _settings

from ._resume import clean_stale, resume
from .runtime import (INTERRUPTED_EXIT, PROGRESS_ENV, STOPPED_EXIT, VAL_FRACTION, Agreed, Context, Output, Session,
                      StopRequest, exit_together, gather_peaks, guarded, launch_rank, saved_words, say_error,
                      stop_job)

__all__ = ["add_parser", "run", "train", "check_slurm_world", "CRASH_ENV", "PROGRESS_ENV", "STOPPED_EXIT",
           "INTERRUPTED_EXIT", "VAL_FRACTION"]

CRASH_ENV = "HPCFSDP_TRAIN_CRASH_AFTER_STEP"  # testing aid: die hard (os._exit) right after this step
_CRASH_EXIT = 137  # the status of a SIGKILLed process

_EPILOG = f"""\
output (rank 0):
  one line per --log-interval, under a tqdm bar (steps, loss, tokens/s, peak memory per rank)
  when stdout is a terminal or {PROGRESS_ENV}=1; a JSONL metrics log, one record per logged
  step with step, loss, lr, grad_norm, tokens_per_s, step_time_s, comm_time_s (time the main thread
  waited on FSDP communication) and peak_mem_bytes (one entry per rank), plus one record with
  step and val_loss per evaluation; OUT_DIR/config.toml, the resolved configuration.

checkpoints:
  CHECKPOINT_DIR/latest is replaced atomically every --checkpoint-interval steps and at the end. Each holds
  the model's config and the data's tokenizer (`hpcfsdp generate CKPT`, `hpcfsdp checkpoint export --hf`).
  --resume continues from it at the step it holds, with the same data order: at the same world
  size the losses equal those of an uninterrupted run. A finished run resumes to nothing and exits 0.

data:
  --data none trains on the byte-level corpus shipped with hpcfsdp. The last {VAL_FRACTION:.0%} of the
  token windows are held out for evaluation (--eval-interval); the sampler gives each rank a
  disjoint share of the rest, reshuffled every epoch from --seed.

signals:
  SIGTERM or SIGUSR1 on any rank (a scheduler's warning, `hpcfsdp launch` forwarding one): every rank
  stops at the next step boundary, writes CHECKPOINT_DIR/latest and exits {STOPPED_EXIT}; --resume continues
  with no step lost or repeated. With --requeue under Slurm, rank 0 then runs `scontrol requeue $SLURM_JOB_ID`.
  SIGINT (Ctrl-C) does the same but exits {INTERRUPTED_EXIT} and is never requeued; a second Ctrl-C stops at once
  (no final checkpoint: --resume continues from the last one). Each says in one line what was saved,
  at which step, and how to resume.

exit status: 0 done, 1 soak failed, 2 bad configuration (rank 0 prints the message every rank agreed on),
  {STOPPED_EXIT} stopped by SIGTERM/SIGUSR1 after a final checkpoint (resume to continue), {INTERRUPTED_EXIT} stopped by
  Ctrl-C (SIGINT).

environment:
  {PROGRESS_ENV}=1|0              force the progress bar on (or off)
  {CRASH_ENV}=K  testing aid: every rank exits hard (status {_CRASH_EXIT})
                                    right after step K, as if the job were killed
"""

_SOAK_HELP = ("soak test: train --steps steps uninterrupted, then again in cycles of --checkpoint-interval steps "
              "(steps/4 when 0), saving, reloading into a fresh model, optimizer and sampler after each; fail "
              "(exit 1) unless every step after a reload has the uninterrupted run's loss and grad norm and "
              "memory stays bounded")


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def add_parser(subparsers):
    from .config import add_config_arguments

    p = subparsers.add_parser(
        "train",
        help="train a GPT or Llama with FSDP on the ranks of this job",
        description="Train hpcfsdp.models.GPT or Llama (--model; --init-from a Hugging Face directory) with fully "
        "sharded data parallelism on the MPI ranks this command "
        "runs on (start it with `hpcfsdp launch -n N -- hpcfsdp train ...`, mpiexec or srun). Configuration "
        "comes from --config FILE (TOML or JSON) and flags; flags win.",
        epilog=_EPILOG,
        formatter_class=_Formatter,
    )
    add_config_arguments(p)
    for action in p._actions:
        if action.dest == "soak":
            action.help = _SOAK_HELP + " (default: False)"
    p.error = types.MethodType(_parser_error, p)
    p.set_defaults(func=run)


def _parser_error(parser, message):
    """argparse's error(), printed once per job rather than once per rank."""
    if launch_rank() == 0:
        parser.print_usage(sys.stderr)
        say_error(message, prog=parser.prog)
    sys.exit(2)


def _crash_step():
    from .config import ConfigError

    try:
        return _settings.get(CRASH_ENV)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def run(args) -> int:
    from .config import ConfigError, config_from_args

    from hpcfsdp.distributed import _mpi

    stop = None
    try:  # See [Note: Failing together]: no communication before every rank has validated
        cfg = config_from_args(args)
        if cfg.soak:  # the soak test takes no stop signal: Ctrl-C is a KeyboardInterrupt (see cli/main.py)
            StopRequest.take().restore()
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if not cfg.soak:  # a stop signal while the job starts is kept for the first step boundary
            stop = StopRequest.take()
            stop.last_words = lambda: _untouched(cfg)
        crash_after = _crash_step()
        try:
            world = _mpi.get_mpi().COMM_WORLD.Get_size()
        except _mpi.MPILibraryError:
            raise  # one line from hpcfsdp/cli/main.py (see [Note: No MPI library] in distributed/_mpi.py)
        except RuntimeError as e:  # the launcher's rank variables disagree with MPI
            started = sys.modules.get("mpi4py.MPI")
            if started is not None and started.Is_initialized():
                check_slurm_world(started.COMM_WORLD.Get_size())  # the likely cause, with its fix
            raise ConfigError(str(e)) from None
        check_slurm_world(world)
        cfg.validate(world)
        if cfg.soak and cfg.resume:
            raise ConfigError("soak=True: a soak run starts from scratch; drop --resume")
        if cfg.elastic:
            from hpcfsdp.distributed.elastic import ulfm_status

            ok, why = ulfm_status()
            if not ok:
                raise ConfigError(f"elastic=True: {why}")
    except ConfigError as err:
        if stop is not None:
            stop.restore()
        return exit_together(str(err))
    try:
        if cfg.soak:
            from ._soak import soak

            return soak(cfg)
        if cfg.elastic:
            from ._elastic import train_elastic

            return train_elastic(cfg, stop=stop)
        return train(cfg, crash_after=crash_after, stop=stop)
    except Agreed as err:
        return exit_together(str(err))


def check_slurm_world(world, environ=None):
    """Refuse (ConfigError) an MPI world smaller than the srun step it runs in: each task started an MPI
    of its own (srun's MPI plugin does not match this MPI), so N one-rank copies would train side by
    side, writing the same files."""
    from .config import ConfigError

    env = os.environ if environ is None else environ
    tasks = env.get("SLURM_STEP_NUM_TASKS", "").strip()
    if "SLURM_PROCID" in env and tasks.isdigit() and world < int(tasks):
        raise ConfigError(f"MPI sees {world} rank(s) but srun started {tasks} tasks (SLURM_STEP_NUM_TASKS): srun's "
                          "MPI plugin does not match the MPI mpi4py uses, so each task would train alone; "
                          "launch with `srun --mpi=pmi2` (MPICH; `srun --mpi=list` shows the site's plugins) or "
                          "render the job with `hpcfsdp slurm render --mpi pmi2`")


# ----------------------------------------------------------------------------------- train


def train(cfg, *, crash_after=None, stop=None) -> int:
    from . import _keep

    ctx = Context(cfg)
    session = Session(cfg, ctx)
    ckpt = os.path.join(cfg.checkpoint_dir, "latest") if cfg.checkpoint_dir else None
    ckpts = _keep.CheckpointDir(cfg, ctx, session) if ckpt else None  # See [Note: Keeping the last K]
    if ckpt:
        clean_stale(cfg, ctx)
    from .config import resume_target

    source = resume_target(cfg)
    if source is not None:
        resume(cfg, ctx, session, source)
        if ckpts is not None and session.step and os.path.realpath(source) == os.path.realpath(ckpt):
            ckpts.saved_step = session.step
    start = session.step
    if start >= cfg.steps:
        if ctx.rank == 0:
            print(f"the checkpoint is at step {start} and --steps is {cfg.steps}: nothing to train", flush=True)
        return 0
    out = guarded(ctx.comm, f"out_dir={cfg.out_dir!r}", lambda: Output(cfg, ctx, start))
    first = last = None
    stop = stop if stop is not None else StopRequest().install()  # See [Note: Stopping on a signal] in runtime.py
    stop.last_words = lambda: saved_words(ckpts)
    try:
        while session.step < cfg.steps:
            rec = session.train_step()
            done = rec["step"]
            first = rec["loss"] if first is None else first
            last = rec["loss"]
            if done % cfg.log_interval == 0 or done == cfg.steps or done == start + 1:  # logged, then saved: a
                peaks = gather_peaks(ctx)  # kill between the two never leaves a saved step without its record
                out.log_step({**rec, "peak_mem_bytes": peaks}, peaks)
            if ckpt and cfg.checkpoint_interval and done % cfg.checkpoint_interval == 0 and done < cfg.steps:
                ckpts.save()
            if cfg.eval_interval and (done % cfg.eval_interval == 0 or done == cfg.steps):
                val = session.evaluate()
                out.record({"step": done, "val_loss": val})
                out.say(f"step {done}/{cfg.steps}  val_loss {val:.4f}")
            out.tick(rec)
            if crash_after is not None and done == crash_after:
                _crash(ctx, out, done)
            got, busy = stop.poll(ctx.comm, busy=ckpts is not None and ckpts.busy())
            if ckpts is not None and ckpts.pending() and not busy:
                ckpts.finish()  # every rank's background save has committed: link and prune now
            if got and done < cfg.steps:
                stop.settle()
                return stop_job(cfg, ctx, session, out, ckpts, got, stop)
        if ckpts is not None:
            ckpts.save(final=True)
        stop.settle()  # trained: a late stop signal (Slurm's warning) must not kill the ranks as they exit
        stop.last_words = None  # trained and saved: a late second Ctrl-C has nothing to add
    finally:
        stop.restore()
        out.close()
    if ctx.rank == 0:
        print(f"loss {first:.4f} -> {last:.4f} over steps {start + 1}..{cfg.steps}; metrics: {out.where}"
              + (f"; checkpoint: {ckpt} (step {cfg.steps})" if ckpt else ""), flush=True)
    return 0


def _untouched(cfg) -> str:
    """What a rerun can continue from before this run has saved anything, in words (no communication)."""
    if not cfg.checkpoint_dir:
        return "nothing saved (no --checkpoint-dir): a rerun starts from step 0"
    latest = os.path.join(cfg.checkpoint_dir, "latest")
    if os.path.lexists(latest):
        return f"checkpoint {latest} is as this run found it: rerun with --resume to continue from it"
    return f"no checkpoint saved in {cfg.checkpoint_dir} yet: a rerun starts from step 0"


def _crash(ctx, out, step):
    """Die as a killed job would (no cleanup, no MPI_Finalize), once every rank has finished the step."""
    ctx.comm.Barrier()  # so that the test sees every rank's record of the step, deterministically
    if ctx.rank == 0:
        print(f"{CRASH_ENV}={step}: exiting hard after step {step}", flush=True)
    out.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_CRASH_EXIT)
