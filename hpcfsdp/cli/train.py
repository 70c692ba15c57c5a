"""`hpcfsdp train`: train the reference GPT with FSDP on the ranks this job was launched on.

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
A bad configuration must fail on every rank with the same message and exit code 2, and no rank may
be left waiting in a collective. Checks that see only the configuration and the world size run on
every rank before MPI communicates at all (every rank reaches the same verdict). Checks that touch
the machine (data files, devices, sharding, the checkpoint to resume) run on every rank, then
the ranks agree with one allgather on whether any failed, and all report the first failure. After
that agreement every rank shuts MPI down normally (MPI_Finalize) and exits 2: no MPI_Abort noise.
"""

import argparse
import json
import os
import sys
import time
import types

__all__ = ["add_parser", "run", "train", "CRASH_ENV", "PROGRESS_ENV", "VAL_FRACTION"]

CRASH_ENV = "HPCFSDP_TRAIN_CRASH_AFTER_STEP"  # testing aid: die hard (os._exit) right after this step
PROGRESS_ENV = "HPCFSDP_PROGRESS"  # 1 = tqdm bar on rank 0 even when stdout is not a terminal, 0 = none
VAL_FRACTION = 0.1  # tail of the token windows held out for --eval-interval
_CRASH_EXIT = 137  # the status of a SIGKILLed process

_EPILOG = f"""\
output (rank 0):
  one line per --log-interval, under a tqdm bar (steps, loss, tokens/s, peak memory per rank)
  when stdout is a terminal or {PROGRESS_ENV}=1; a JSONL metrics log, one record per logged
  step with step, loss, lr, grad_norm, tokens_per_s, step_time_s, comm_time_s (time the main thread
  waited on FSDP communication) and peak_mem_bytes (one entry per rank), plus one record with
  step and val_loss per evaluation; OUT_DIR/config.toml, the resolved configuration.

checkpoints:
  CHECKPOINT_DIR/latest is replaced atomically every --checkpoint-interval steps and at the end.
  --resume continues from it at the step it holds, with the same data order: at the same world
  size the losses equal those of an uninterrupted run. A finished run resumes to nothing and exits 0.

data:
  --data none trains on the byte-level corpus shipped with hpcfsdp. The last {VAL_FRACTION:.0%} of the
  token windows are held out for evaluation (--eval-interval); the sampler gives each rank a
  disjoint share of the rest, reshuffled every epoch from --seed.

exit status: 0 done, 1 soak failed, 2 bad configuration (every rank prints the same message).

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
        help="train a GPT with FSDP on the ranks of this job",
        description="Train hpcfsdp.models.GPT with fully sharded data parallelism on the MPI ranks this command "
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


def _launch_rank() -> int:
    """This process's rank from the launcher's environment (no MPI call), 0 when not launched."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 0


def _parser_error(parser, message):
    """argparse's error(), with the usage printed once per job rather than once per rank."""
    if _launch_rank() == 0:
        parser.print_usage(sys.stderr)
    _say_error(message, prog=parser.prog)
    sys.exit(2)


def _say_error(message, prog="hpcfsdp train"):
    sys.stderr.write(f"{prog}: error: {message}\n")  # one write: ranks' lines do not interleave
    sys.stderr.flush()


def _crash_step():
    from .config import ConfigError

    value = os.environ.get(CRASH_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"{CRASH_ENV}={value!r}: expected a step number >= 1")
    return int(value)


def run(args) -> int:
    from .config import ConfigError, config_from_args

    from hpcfsdp.distributed import _mpi

    try:  # See [Note: Failing together]: no communication before every rank has validated
        cfg = config_from_args(args)
        crash_after = _crash_step()
        cfg.validate(_mpi.get_mpi().COMM_WORLD.Get_size())
        if cfg.soak and cfg.resume:
            raise ConfigError("soak=True: a soak run starts from scratch; drop --resume")
    except ConfigError as err:
        return _exit_together(str(err))
    try:
        if cfg.soak:
            from ._soak import soak

            return soak(cfg)
        return train(cfg, crash_after=crash_after)
    except _Agreed as err:
        return _exit_together(str(err))


# ----------------------------------------------------------------------------------- failing together


class _Agreed(Exception):
    """A failure every rank knows about (after _agree): report it and leave MPI cleanly."""


def _exit_together(message) -> int:
    _say_error(message)
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()
    return 2


def _agree(comm, problem):
    """Collective: raise _Agreed with the first rank's problem if any rank has one."""
    problems = comm.allgather(problem)
    for r, p in enumerate(problems):
        if p:
            raise _Agreed(p if comm.Get_size() == 1 or p.startswith("rank") else f"rank {r}: {p}")


def _guarded(comm, what, fn):
    """Run fn() on every rank; if it fails on any, every rank raises _Agreed naming `what`."""
    result, problem = None, None
    try:
        result = fn()
    except (OSError, ValueError, TypeError, RuntimeError, KeyError) as e:
        problem = f"{what}: {e}"
    _agree(comm, problem)
    return result


# ----------------------------------------------------------------------------------- data


class _Windows:
    """Windows [lo, hi) of a TokenDataset, renumbered from 0."""

    def __init__(self, dataset, lo, hi):
        self.dataset, self.lo, self.hi = dataset, lo, hi

    def __len__(self):
        return self.hi - self.lo

    def get_batch(self, indices):
        import numpy as np

        return self.dataset.get_batch(np.asarray(indices, dtype=np.int64) + self.lo)


def _datasets(cfg):
    """(train, val) windows; val is None when the data is too small to hold out VAL_FRACTION."""
    import numpy as np

    from hpcfsdp.data import TokenDataset, default_corpus, open_token_data

    if cfg.data is None:
        ds = TokenDataset.from_text(default_corpus(), cfg.block_size, dtype=np.uint16)
    elif not os.path.exists(cfg.data):
        raise FileNotFoundError("no such file")
    else:  # memory-mapped on every rank; dtype and vocabulary checked against the sidecar
        ds = open_token_data(cfg.data, cfg.block_size, dtype=cfg.data_dtype, vocab_size=cfg.vocab_size)
    n = len(ds)
    n_val = int(n * VAL_FRACTION) - cfg.block_size  # the gap keeps val targets out of the training tokens
    if n_val < 1:
        return ds, None
    n_train = n - n_val - cfg.block_size
    return _Windows(ds, 0, n_train), _Windows(ds, n_train + cfg.block_size, n)


class _Batches:
    """This rank's batches, epoch after epoch, resumable through the sampler's state."""

    def __init__(self, dataset, sampler, batch_size):
        self.dataset, self.sampler, self.batch_size = dataset, sampler, batch_size
        self._it = iter(sampler)

    def next(self):
        idx = []
        while len(idx) < self.batch_size:
            try:
                idx.append(next(self._it))
            except StopIteration:  # a batch may straddle two epochs; the sampler's position says where
                self.sampler.set_epoch(self.sampler.epoch + 1)
                self._it = iter(self.sampler)
        return self.dataset.get_batch(idx)


class _Context:
    """What every session of a job shares: ranks, device, communicator, data."""

    def __init__(self, cfg):
        import hpcfsdp.distributed as dist

        from ._common import compute_device

        dist.init_process_group()
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.comm = dist.distributed_c10d._default_group().comm
        self.device = _guarded(self.comm, f"device={cfg.device!r}", lambda: compute_device(cfg.device))
        self.train_set, self.val_set = _guarded(self.comm, f"data={cfg.data!r}", lambda: _datasets(cfg))
        problem = None
        if self.val_set is None and cfg.eval_interval:
            problem = (f"eval_interval={cfg.eval_interval}: the data is too small to hold out {VAL_FRACTION:.0%} "
                       f"of it for evaluation; use --eval-interval 0")
        elif len(self.train_set) < self.world:
            problem = (f"data: {len(self.train_set)} training windows of block_size={cfg.block_size} cannot be "
                       f"shared by {self.world} ranks")
        _agree(self.comm, problem)


def _step_seed(seed, step, rank):
    return ((seed * 1_000_003 + step) * 65_537 + rank) & 0x7FFF_FFFF_FFFF


# ----------------------------------------------------------------------------------- one training state


class _Session:
    """One model, optimizer and sampler: what a checkpoint holds, and the step that trains them."""

    def __init__(self, cfg, ctx):
        from hpcfsdp.data import DistributedSampler

        from hpcfsdp.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_block_checkpointing

        from ._common import build_gpt, make_optimizer, shard_gpt

        self.cfg, self.ctx = cfg, ctx

        def build():
            model = build_gpt(cfg, ctx.device)
            if cfg.activation_checkpointing:
                apply_block_checkpointing(model)
            shard_gpt(model, cfg, "cuda" if ctx.device.startswith("cuda") else "cpu")
            return model

        self.model = _guarded(ctx.comm, f"strategy={cfg.strategy!r}", build)
        self.optim = make_optimizer(cfg, self.model.parameters())
        self.sampler = DistributedSampler(len(ctx.train_set), ctx.world, ctx.rank, shuffle=True, seed=cfg.seed)
        self.step = 0
        self._batches = None

    def state_dict(self):
        from hpcfsdp.distributed import checkpoint as dcp

        return {"model": dcp.get_model_state_dict(self.model),
                "optim": dcp.get_optimizer_state_dict(self.model, self.optim),
                "step": self.step, "sampler": self.sampler.state_dict(), "config": self.cfg.to_dict()}

    def save(self, path):
        from hpcfsdp.distributed import checkpoint as dcp

        dcp.save(self.state_dict(), checkpoint_id=path)

    def load(self, path):
        from hpcfsdp.distributed import checkpoint as dcp

        state = self.state_dict()
        dcp.load(state, checkpoint_id=path)
        dcp.set_model_state_dict(self.model, state["model"])
        dcp.set_optimizer_state_dict(self.model, self.optim, state["optim"])
        self.sampler.load_state_dict(state["sampler"])
        self.step = int(state["step"])
        self._batches = None

    def train_step(self) -> dict:
        """One optimizer step; its metrics record (without peak memory)."""
        import hpcfsdp as hp
        import hpcfsdp.distributed as dist
        from hpcfsdp.distributed.fsdp._fully_shard._fsdp_param_group import exposed_comm_seconds
        from hpcfsdp.nn.utils import clip_grad_norm_

        cfg, ctx, model = self.cfg, self.ctx, self.model
        if self._batches is None:
            self._batches = _Batches(ctx.train_set, self.sampler, cfg.batch_size)
        if cfg.dropout > 0:  # See [Note: Exact resume]
            hp.manual_seed(_step_seed(cfg.seed, self.step, ctx.rank))
        model.train()
        t0 = time.perf_counter()
        exposed_comm_seconds(reset=True)
        lr = cfg.lr_at(self.step)
        for g in self.optim.param_groups:
            g["lr"] = lr
        loss_sum = 0.0
        for micro in range(cfg.grad_accum):
            if cfg.grad_accum > 1:
                model.set_requires_gradient_sync(micro == cfg.grad_accum - 1)
            x, y = self._batches.next()
            _, loss = model(hp.tensor(x, device=ctx.device), hp.tensor(y, device=ctx.device))
            (loss / cfg.grad_accum).backward()
            loss_sum += loss.item() / cfg.grad_accum
        norm = clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        self.optim.step()
        self.optim.zero_grad()
        loss_t = hp.tensor([loss_sum], dtype=hp.float64)
        dist.all_reduce(loss_t, op=dist.ReduceOp.AVG)
        dt = time.perf_counter() - t0
        self.step += 1
        return {"step": self.step, "loss": float(loss_t.item()), "lr": lr, "grad_norm": float(norm.item()),
                "tokens_per_s": cfg.tokens_per_step(ctx.world) / dt, "step_time_s": dt,
                "comm_time_s": exposed_comm_seconds()}

    def evaluate(self) -> float:
        """Mean loss over eval_iters fixed batches of the held-out windows (all ranks together)."""
        import numpy as np

        import hpcfsdp as hp
        import hpcfsdp.distributed as dist

        cfg, ctx = self.cfg, self.ctx
        order = np.random.Generator(np.random.PCG64(cfg.seed)).permutation(len(ctx.val_set))
        total = 0.0
        self.model.eval()
        with hp.no_grad():
            for i in range(cfg.eval_iters):
                start = (i * ctx.world + ctx.rank) * cfg.batch_size
                idx = order[np.arange(start, start + cfg.batch_size) % len(order)]
                x, y = ctx.val_set.get_batch(idx)
                _, loss = self.model(hp.tensor(x, device=ctx.device), hp.tensor(y, device=ctx.device))
                total += loss.item()
        self.model.train()
        t = hp.tensor([total / cfg.eval_iters], dtype=hp.float64)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        return float(t.item())

    def local_params(self):
        """Copies of this rank's parameter shards, by name."""
        from hpcfsdp import _backend

        out = {}
        for name, p in self.model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            out[name] = _backend.to_numpy(local._data).copy()
        return out


# ----------------------------------------------------------------------------------- output


class _Output:
    """Rank 0's metrics log, progress bar and lines; a no-op on the other ranks."""

    def __init__(self, cfg, ctx, start):
        self.cfg, self.ctx = cfg, ctx
        self.metrics = self.bar = None
        self.peaks = [0] * ctx.world  # the latest per-rank peak memory, for the bar
        self.quiet = bool(os.environ.get("HPCFSDP_NO_PROGRESS")) or os.environ.get(PROGRESS_ENV) == "0"
        if ctx.rank != 0:
            return
        path = cfg.metrics_file()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        os.makedirs(cfg.out_dir, exist_ok=True)
        with open(os.path.join(cfg.out_dir, "config.toml"), "w") as f:
            f.write(cfg.to_toml())
        if start:
            _trim_metrics(path, start)
        self.metrics = open(path, "a" if start else "w")
        want_bar = os.environ.get(PROGRESS_ENV) == "1" or sys.stdout.isatty()
        if want_bar and not self.quiet:
            from tqdm import tqdm

            self.bar = tqdm(total=cfg.steps, initial=start, desc="train", unit="step",
                            dynamic_ncols=True, file=sys.stdout)

    def say(self, line):
        if self.ctx.rank != 0:
            return
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        elif not self.quiet:
            print(line, flush=True)

    def record(self, rec):
        if self.metrics is not None:
            self.metrics.write(json.dumps(rec) + "\n")
            self.metrics.flush()

    def log_step(self, rec, peaks):
        """Write the log record (with the per-rank peaks) and its line (above the bar, if any)."""
        if self.ctx.rank != 0:
            return
        self.peaks = peaks
        self.record(rec)
        self.say(f"step {rec['step']}/{self.cfg.steps}  loss {rec['loss']:.4f}  lr {rec['lr']:.2e}  "
                 f"{rec['tokens_per_s']:.0f} tok/s  peak {max(peaks) / 2**20:.0f} MiB/rank")

    def tick(self, rec):
        if self.bar is None:
            return
        peaks = self.peaks
        mem = (",".join(f"{p / 2**20:.0f}" for p in peaks) if len(peaks) <= 8 else f"max {max(peaks) / 2**20:.0f}")
        self.bar.set_postfix_str(f"loss={rec['loss']:.3f} tok/s={rec['tokens_per_s']:.0f} mem/rank={mem}MiB",
                                 refresh=False)
        self.bar.update(1)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        if self.metrics is not None:
            self.metrics.close()


def _trim_metrics(path, step):
    """Drop the records of steps after `step` (written by the run that died after its checkpoint)."""
    if not os.path.exists(path):
        return
    keep = []
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by the kill
                continue
            step_of = rec.get("step") if isinstance(rec, dict) else None
            if isinstance(step_of, int) and not isinstance(step_of, bool) and step_of > step:
                continue
            keep.append(line if line.endswith("\n") else line + "\n")
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.writelines(keep)
    os.replace(tmp, path)


def _gather_peaks(ctx):
    from ._common import peak_memory_bytes

    return ctx.comm.gather(peak_memory_bytes(ctx.device), root=0)


# ----------------------------------------------------------------------------------- resume


_SAME_ON_RESUME = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "bias", "tie_weights", "seed")


def _check_resumable(cfg, path):
    """The checkpoint at `path` was written for this model and this data; raise ValueError if not."""
    from hpcfsdp.distributed import checkpoint as dcp

    md = dcp.read_metadata(path)
    saved = ((md.extras or {}).get("skeleton") or {}).get("config")
    if not isinstance(saved, dict):
        raise ValueError(f"{path} holds no training configuration: not written by hpcfsdp train")
    mine = cfg.to_dict()
    for name in _SAME_ON_RESUME:
        if name in saved and saved[name] != mine[name]:
            raise ValueError(f"{name}={mine[name]!r}, but the checkpoint {path} was written with "
                             f"{name}={saved[name]!r}; resume with the same model, data and seed")


def _resume(cfg, ctx, session, ckpt):
    seen = ctx.comm.allgather(os.path.lexists(ckpt))
    if any(seen) and not all(seen):
        raise _Agreed(f"resume: {ckpt} exists on ranks {[r for r, s in enumerate(seen) if s]} only; "
                      f"checkpoints must be on a file system every rank sees")
    if not seen[0]:
        if ctx.rank == 0:
            print(f"no checkpoint at {ckpt} yet: starting from step 0", flush=True)
        return
    _guarded(ctx.comm, "resume", lambda: _check_resumable(cfg, ckpt))
    _guarded(ctx.comm, f"resume from {ckpt}", lambda: session.load(ckpt))
    if ctx.rank == 0:
        print(f"resumed from {ckpt} at step {session.step}", flush=True)


# ----------------------------------------------------------------------------------- train


def train(cfg, *, crash_after=None) -> int:
    ctx = _Context(cfg)
    session = _Session(cfg, ctx)
    ckpt = os.path.join(cfg.checkpoint_dir, "latest") if cfg.checkpoint_dir else None
    if cfg.resume:
        _resume(cfg, ctx, session, ckpt)
    start = session.step
    if start >= cfg.steps:
        if ctx.rank == 0:
            print(f"the checkpoint is at step {start} and --steps is {cfg.steps}: nothing to train", flush=True)
        return 0
    out = _guarded(ctx.comm, f"out_dir={cfg.out_dir!r}", lambda: _Output(cfg, ctx, start))
    first = last = None
    try:
        while session.step < cfg.steps:
            rec = session.train_step()
            done = rec["step"]
            first = rec["loss"] if first is None else first
            last = rec["loss"]
            if ckpt and cfg.checkpoint_interval and done % cfg.checkpoint_interval == 0 and done < cfg.steps:
                session.save(ckpt)
            if done % cfg.log_interval == 0 or done == cfg.steps or done == start + 1:
                peaks = _gather_peaks(ctx)
                out.log_step({**rec, "peak_mem_bytes": peaks}, peaks)
            if cfg.eval_interval and (done % cfg.eval_interval == 0 or done == cfg.steps):
                val = session.evaluate()
                out.record({"step": done, "val_loss": val})
                out.say(f"step {done}/{cfg.steps}  val_loss {val:.4f}")
            out.tick(rec)
            if crash_after is not None and done == crash_after:
                _crash(ctx, out, done)
        if ckpt:
            session.save(ckpt)
    finally:
        out.close()
    if ctx.rank == 0:
        print(f"loss {first:.4f} -> {last:.4f} over steps {start + 1}..{cfg.steps}; metrics: {cfg.metrics_file()}"
              + (f"; checkpoint: {ckpt}" if ckpt else ""), flush=True)
    return 0


def _crash(ctx, out, step):
    """Die as a killed job would (no cleanup, no MPI_Finalize), once every rank has finished the step."""
    ctx.comm.Barrier()  # so that the test sees every rank's record of the step, deterministically
    if ctx.rank == 0:
        print(f"{CRASH_ENV}={step}: exiting hard after step {step}", flush=True)
    out.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_CRASH_EXIT)
