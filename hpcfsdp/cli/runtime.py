"""What `hpcfsdp train` and its soak test share: the job context, the training session, output, failing together.

Every name here is public: `train.py` (a run) and `_soak.py` (checkpoint/reload cycles) both build on
them, and neither imports the other's internals. See [Note: Failing together] in train.py for why
`agree` / `guarded` exist, and [Note: Exact resume] for what a Session's state_dict holds.
"""

import os
import signal
import sys
import time

from hpcfsdp import _settings
from hpcfsdp._launcher_env import launcher_rank

from ._metrics import Sinks, trim_metrics

__all__ = [
    "PROGRESS_ENV", "VAL_FRACTION", "STOPPED_EXIT", "INTERRUPTED_EXIT", "STOP_SIGNALS", "StopRequest",
    "stop_exit_status", "requeue_slurm_job", "early_stop_request",
    "release_early_stop_request",
    "launch_rank", "say_error", "Agreed", "exit_together", "agree", "guarded",
    "Windows", "train_val_datasets", "Batches", "Context", "step_seed", "Session", "Output", "trim_metrics",
    "gather_peaks",
]

PROGRESS_ENV = "HPCFSDP_PROGRESS"  # on = tqdm bar on rank 0 even when stdout is not a terminal, off = none
VAL_FRACTION = 0.1  # tail of the token windows held out for --eval-interval


def launch_rank() -> int:
    """This process's rank from the launcher's environment (no MPI call; see [Note: Launcher rank] in
    hpcfsdp/_launcher_env.py), 0 when not launched."""
    rank = launcher_rank()
    return 0 if rank is None else rank


def _job_rank() -> int:
    """This rank: MPI's when MPI is running, else the launcher's environment."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        return MPI.COMM_WORLD.Get_rank()
    return launch_rank()


def say_error(message, prog="hpcfsdp train"):
    """``PROG: error: MESSAGE`` on stderr, as argparse writes it, once per job: every rank reaches the same
    verdict (see [Note: Failing together] in train.py), so rank 0 alone prints it."""
    if _job_rank() != 0:
        return
    sys.stderr.write(f"{prog}: error: {message}\n")  # one write: ranks' lines do not interleave
    sys.stderr.flush()


# ----------------------------------------------------------------------------------- failing together


class Agreed(Exception):
    """A failure every rank knows about (after agree): report it and leave MPI cleanly."""


def exit_together(message) -> int:
    """Report a failure every rank agreed on (rank 0 prints it, once per job), finalize MPI cleanly and
    return exit status 2."""
    if launch_rank() == 0:
        say_error(message)
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()
    return 2


def agree(comm, problem):
    """Collective: raise Agreed with the first rank's problem if any rank has one.

    ``problem`` is None, a message, or (message, secondary): a secondary problem only echoes another
    rank's failure (e.g. "checkpoint load failed on another rank"), so the first rank's own failure is
    reported in its place, naming that rank."""
    problems = [p if isinstance(p, tuple) else (p, False) for p in comm.allgather(problem)]
    ranked = [(secondary, r, p) for r, (p, secondary) in enumerate(problems) if p]
    if ranked:
        _, r, p = min(ranked, key=lambda t: (t[0], t[1]))
        raise Agreed(p if comm.Get_size() == 1 or p.startswith("rank") else f"rank {r}: {p}")


def guarded(comm, what, fn):
    """Run fn() on every rank; if it fails on any, every rank raises Agreed naming `what` and the rank."""
    result, problem = None, None
    try:
        result = fn()
    except (OSError, ValueError, TypeError, RuntimeError, KeyError) as e:
        problem = (f"{what}: {e}", bool(getattr(e, "on_other_rank", False)))
    agree(comm, problem)
    return result


# ----------------------------------------------------------------------------------- stop requests

# [Note: Stopping on a signal]
# SIGTERM (walltime, scancel, `hpcfsdp launch` forwarding a stop) and SIGUSR1 (Slurm's
# `--signal=B:USR1@T` warning, forwarded by the batch script) only set a flag: the handler runs between
# two Python bytecodes, possibly inside a collective, so it must not communicate. At every step boundary
# the ranks combine their flags with one small allreduce (MAX), so a signal that reached some ranks
# only stops all of them at the same step; they write a final checkpoint and exit with STOPPED_EXIT.
# The same allreduce says whether every rank's background checkpoint has finished (see
# [Note: Keeping the last K] in _keep.py), so that all ranks act on it at the same step.
#
# [Note: Ctrl-C]
# SIGINT (Ctrl-C; `hpcfsdp launch` forwards it to every rank) stops the same way, and wins over the
# others: the ranks save, say once what was saved at which step and how to resume, and exit
# INTERRUPTED_EXIT (130, the shell's status for Ctrl-C). A user stopped the job, so it is never
# requeued (--requeue and the sbatch scripts requeue on STOPPED_EXIT only) and is no failure. A second
# SIGINT stops at once: rank 0 writes one line (the checkpoint the run saved last, which is complete:
# saves are atomic) and leaves with os._exit(INTERRUPTED_EXIT), without a traceback and without waiting
# for the save in progress (its temporary is removed by a later start). The other ranks only point their
# output at /dev/null and go on: rank 0 may be blocked in a collective (a Python handler runs only between
# bytecodes), which must complete for its handler to run; mpiexec ends them once rank 0 has exited.
STOPPED_EXIT = 75  # EX_TEMPFAIL: stopped on request after a final checkpoint; resume to continue
INTERRUPTED_EXIT = 130  # 128 + SIGINT: stopped by Ctrl-C (after a final checkpoint, unless pressed twice)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)  # ignored once training has ended (StopRequest.settle)


def stop_exit_status(sig) -> int:
    """The exit status of a job stopped by signal ``sig``: INTERRUPTED_EXIT for SIGINT, else STOPPED_EXIT."""
    return INTERRUPTED_EXIT if sig == signal.SIGINT else STOPPED_EXIT


class StopRequest:
    """Flag set by SIGTERM/SIGUSR1/SIGINT; `agreed(comm)` (collective) says whether any rank got one.

    ``last_words`` (a callable returning a line; None once the run has said its last) is what rank 0 writes
    when a second SIGINT ends the process at once; see [Note: Ctrl-C]."""

    def __init__(self):
        self.signal = 0
        self.interrupts = 0
        self.last_words = lambda: "nothing saved yet"
        self._old = {}

    @classmethod
    def take(cls):
        """The StopRequest early_stop_request() installed, else a new one, installed."""
        return _EARLY.pop() if _EARLY else cls().install()

    def install(self):
        for sig in (*STOP_SIGNALS, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, sig, frame):
        if sig == signal.SIGINT:
            self.interrupts += 1
            if self.interrupts > 1:
                self._stop_now()
            self.signal = int(sig)  # Ctrl-C wins: exit 130, no requeue
        else:
            self.signal = self.signal or int(sig)

    def _stop_now(self):
        """The second Ctrl-C: rank 0 says what is left and leaves; the others only fall silent and go on, so that
        a collective rank 0 is blocked in completes and its handler runs; mpiexec ends them once rank 0 has
        exited (see [Note: Ctrl-C])."""
        if _job_rank() != 0:
            _silence()
            return
        words = self.last_words
        if words is not None:  # None: the run has said its last line already
            try:
                line = f"SIGINT again: stopped at once, without a final checkpoint; {words()}; exit {INTERRUPTED_EXIT}"
            except Exception as e:  # noqa: BLE001 (the process ends either way; say why the line is short)
                line = f"SIGINT again: stopped at once; what was saved is unknown ({e}); exit {INTERRUPTED_EXIT}"
            try:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            except (OSError, ValueError, RuntimeError):  # RuntimeError: the main thread was inside a write
                os.write(1, (line + "\n").encode())
        _silence()
        os._exit(INTERRUPTED_EXIT)

    def restore(self):
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old = {}

    def settle(self):
        """Training has ended (stopped on request, or trained to the end) and the process is about to exit:
        ignore SIGTERM/SIGUSR1 from now on, also after `restore`. srun (--kill-on-bad-exit) ends the step with
        SIGTERM as soon as the first rank exits STOPPED_EXIT, and Slurm's warning may come as a finished job
        exits; a rank still saving or finalizing must not die of either (exit 143: no requeue, or FAILED).
        SIGINT keeps this handler, also after `restore`: a second Ctrl-C still ends the process at once, in one
        line (see [Note: Ctrl-C])."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
            self._old[sig] = signal.SIG_IGN
        signal.signal(signal.SIGINT, self._handle)
        self._old[signal.SIGINT] = self._handle

    def agreed(self, comm) -> int:
        """Collective: the signal some rank received (SIGINT if any rank got one, else the highest), 0 when
        none did."""
        return self.poll(comm)[0]

    def poll(self, comm, busy: bool = False) -> tuple:
        """Collective: (the agreed signal as `agreed` returns it, whether ``busy`` is true on any rank)."""
        import numpy as np

        mine = np.array([self.signal == signal.SIGINT, self.signal, busy], dtype=np.int32)
        out = np.zeros(3, dtype=np.int32)
        comm.Allreduce(mine, out, op=_mpi_max())
        return (int(signal.SIGINT) if out[0] else int(out[1])), bool(out[2])


_EARLY = []  # the StopRequest installed by early_stop_request(), if any


def early_stop_request():
    """Install a StopRequest before the command has started (hpcfsdp/cli/main.py, for `train`): a stop signal
    (SIGINT included) that comes while MPI and the model start is kept for the first step boundary instead of
    a KeyboardInterrupt on some ranks while the others wait in MPI_Init. `StopRequest.take()` returns it."""
    _EARLY.append(StopRequest().install())
    return _EARLY[-1]


def release_early_stop_request():
    """Restore the handlers of an early_stop_request() the command did not take (it ended before)."""
    while _EARLY:
        _EARLY.pop().restore()


def _silence():
    """Point stdout and stderr at /dev/null: what a rank ended at once might still write (an MPI error about
    rank 0 gone) is noise."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, RuntimeError):
            pass
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(null, fd)
    os.close(null)


def _mpi_max():
    from mpi4py import MPI

    return MPI.MAX


def requeue_slurm_job() -> str:
    """`scontrol requeue $SLURM_JOB_ID`; returns what happened, in words."""
    import subprocess

    job = os.environ.get("SLURM_JOB_ID", "")
    if not job:
        return "--requeue: not a Slurm job (no SLURM_JOB_ID): not requeued"
    try:
        out = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"--requeue: scontrol requeue {job} failed: {e}"
    if out.returncode:
        return f"--requeue: scontrol requeue {job} failed: {(out.stderr or out.stdout).strip()}"
    return f"requeued Slurm job {job}"


# ----------------------------------------------------------------------------------- data


class Windows:
    """Windows [lo, hi) of a TokenDataset, renumbered from 0."""

    def __init__(self, dataset, lo, hi):
        self.dataset, self.lo, self.hi = dataset, lo, hi

    def __len__(self):
        return self.hi - self.lo

    def get_batch(self, indices):
        import numpy as np

        return self.dataset.get_batch(np.asarray(indices, dtype=np.int64) + self.lo)


def train_val_datasets(cfg):
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
    return Windows(ds, 0, n_train), Windows(ds, n_train + cfg.block_size, n)


class Batches:
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


class Context:
    """What every session of a job shares: ranks, device, communicator, data."""

    def __init__(self, cfg):
        import hpcfsdp.distributed as dist

        from ._common import compute_device

        if not dist.is_initialized():  # an elastic recovery made the survivors' group already
            dist.init_process_group()
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        # data parallelism: the tp ranks of one data-parallel rank (consecutive ranks) read the same batches
        self.data_rank, self.data_world = self.rank // cfg.tp, self.world // cfg.tp
        if cfg.trace:  # see [Note: Timeline] in hpcfsdp/_trace.py
            from hpcfsdp import _trace

            _trace.start(cfg.trace, self.rank)
        self.comm = dist.group.WORLD.comm
        self.device = guarded(self.comm, f"device={cfg.device!r}", lambda: compute_device(cfg.device))
        self.train_set, self.val_set = guarded(self.comm, f"data={cfg.data!r}", lambda: train_val_datasets(cfg))
        problem = None
        if self.val_set is None and cfg.eval_interval:
            problem = (f"eval_interval={cfg.eval_interval}: the data is too small to hold out {VAL_FRACTION:.0%} "
                       f"of it for evaluation; use --eval-interval 0")
        elif len(self.train_set) < self.world:
            problem = (f"data: {len(self.train_set)} training windows of block_size={cfg.block_size} cannot be "
                       f"shared by {self.world} ranks")
        agree(self.comm, problem)


def step_seed(seed, step, rank):
    """The dropout generator's seed for (seed, step, rank): no RNG state needs saving for an exact resume."""
    return ((seed * 1_000_003 + step) * 65_537 + rank) & 0x7FFF_FFFF_FFFF


# ----------------------------------------------------------------------------------- one training state


class Session:
    """One model, optimizer and sampler: what a checkpoint holds, and the step that trains them."""

    def __init__(self, cfg, ctx):
        from hpcfsdp.data import DistributedSampler
        from hpcfsdp.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_block_checkpointing

        from hpcfsdp.data.tokenizer_spec import tokenizer_spec

        from ._common import make_optimizer, shard_gpt
        from ._model import build_model, hf_kind, saved_model_config

        self.cfg, self.ctx = cfg, ctx

        def shard(model):
            if cfg.activation_checkpointing:
                apply_block_checkpointing(model)
            shard_gpt(model, cfg, "cuda" if ctx.device.startswith("cuda") else "cpu")

        what = f"init_from={cfg.init_from!r}" if cfg.init_from else f"strategy={cfg.strategy!r}"
        self.model = guarded(ctx.comm, what, lambda: build_model(cfg, ctx.device, shard))
        # saved with every checkpoint: See [Note: Tokenizer with the checkpoint] and [Note: Model keys]
        self.model_config = saved_model_config(self.model)
        self.hf_config = guarded(ctx.comm, what, lambda: hf_kind(cfg.init_from)[1]) if cfg.init_from else None
        self.tokenizer = guarded(ctx.comm, f"data={cfg.data!r}", lambda: tokenizer_spec(cfg.data))
        self.optim = make_optimizer(cfg, self.model.parameters())
        self.sampler = DistributedSampler(len(ctx.train_set), ctx.data_world, ctx.data_rank, shuffle=True,
                                          seed=cfg.seed)
        self.step = 0
        self._batches = None

    def state_dict(self):
        from hpcfsdp.distributed import checkpoint as dcp

        state = {"model": dcp.get_model_state_dict(self.model),
                 "optim": dcp.get_optimizer_state_dict(self.model, self.optim),
                 "step": self.step, "sampler": self.sampler.state_dict(), "config": self.cfg.to_dict(),
                 "model_config": dict(self.model_config), "tokenizer": self.tokenizer, "hf_config": self.hf_config}
        if self.cfg.quantize_grads != "none":  # the error-feedback residual: See [Note: Residual state]
            from hpcfsdp.distributed.fsdp import get_residual_state_dict

            state["residual"] = get_residual_state_dict(self.model)
        return state

    def save(self, path, asynchronous: bool = False):
        """Save; with ``asynchronous``, return once the state is copied to host memory (dcp.async_save), with
        the save's Future (its result() is None once committed); else return None once committed.
        The previous async save's error, if any, is raised here, at the next save."""
        from hpcfsdp.distributed import checkpoint as dcp

        pending, self._pending = getattr(self, "_pending", None), None
        if pending is not None:
            pending.result()
        if asynchronous:
            self._pending = dcp.async_save(self.state_dict(), checkpoint_id=path)
            return self._pending
        dcp.save(self.state_dict(), checkpoint_id=path)
        return None

    def load(self, path):
        from hpcfsdp.distributed import checkpoint as dcp

        state = self.state_to_fill()
        residual = state.pop("residual", None)
        dcp.load(state, checkpoint_id=path)
        if residual is not None:  # a checkpoint of an unquantized run owes nothing
            kept = {"residual": residual}
            dcp.load(kept, checkpoint_id=path, strict=False)  # what it lacks stays zero
            state["residual"] = kept["residual"]
        self.apply_state(state)

    def state_to_fill(self):
        """``state_dict()`` without what stays this run's own (checked against a checkpoint's, never loaded)."""
        state = self.state_dict()
        for key in ("tokenizer", "model_config", "hf_config"):
            del state[key]
        return state

    def apply_state(self, state):
        """Set model, optimizer, residual, sampler and step from a filled ``state_dict()``."""
        from hpcfsdp.distributed import checkpoint as dcp

        dcp.set_model_state_dict(self.model, state["model"])
        dcp.set_optimizer_state_dict(self.model, self.optim, state["optim"])
        if state.get("residual") is not None:
            from hpcfsdp.distributed.fsdp import set_residual_state_dict

            set_residual_state_dict(self.model, state["residual"])
        self.sampler.load_state_dict(state["sampler"])
        self.step = int(state["step"])
        self._batches = None

    def _begin_step(self) -> tuple[float, float]:
        """What every step starts with: dropout's seed for this step, train mode, the exposed-comm timer reset
        and the scheduled lr set; returns (start time, lr)."""
        import hpcfsdp as hp
        from hpcfsdp.distributed.fsdp import exposed_comm_seconds

        if self.cfg.dropout > 0:  # See [Note: Exact resume]
            hp.manual_seed(step_seed(self.cfg.seed, self.step, self.ctx.data_rank))
        self.model.train()
        t0 = time.perf_counter()
        exposed_comm_seconds(reset=True)
        lr = self.cfg.lr_at(self.step)
        for g in self.optim.param_groups:
            g["lr"] = lr
        return t0, lr

    def _forward_backward(self, batches, n: int, scale) -> list[float]:
        """Forward and backward over ``n`` (x, y) batches, the gradients synchronised on the last only, each
        loss scaled by ``scale(loss, i)`` before its backward; returns the unscaled losses."""
        import hpcfsdp as hp

        dev, out = self.ctx.device, []
        for i, (x, y) in zip(range(n), batches):
            if n > 1:
                self.model.set_requires_gradient_sync(i == n - 1)
            _, loss = self.model(hp.tensor(x, device=dev), hp.tensor(y, device=dev))
            scale(loss, i).backward()
            out.append(loss.item())
        return out

    def _clip(self):
        from hpcfsdp.nn.utils import clip_grad_norm_

        return clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf"))

    def train_step(self) -> dict:
        """One optimizer step; its metrics record (without peak memory)."""
        import hpcfsdp as hp
        import hpcfsdp.distributed as dist
        from hpcfsdp.distributed.fsdp import exposed_comm_seconds

        cfg, ctx = self.cfg, self.ctx
        if self._batches is None:
            self._batches = Batches(ctx.train_set, self.sampler, cfg.batch_size)
        t0, lr = self._begin_step()
        n = cfg.grad_accum
        losses = self._forward_backward(iter(self._batches.next, None), n, lambda loss, i: loss / n)
        loss_sum = sum(v / n for v in losses)
        norm = self._clip()
        self.optim.step()
        self.optim.zero_grad()
        loss_t = hp.tensor([loss_sum], dtype=hp.float64)
        dist.all_reduce(loss_t, op=dist.ReduceOp.AVG)
        dt = time.perf_counter() - t0
        self.step += 1
        return {"step": self.step, "loss": float(loss_t.item()), "lr": lr, "grad_norm": float(norm.item()),
                "tokens_per_s": cfg.tokens_per_step(ctx.data_world) / dt, "step_time_s": dt,
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
                start = (i * ctx.data_world + ctx.data_rank) * cfg.batch_size
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


class Output:
    """Rank 0's metrics sinks (--metrics), progress bar and lines; a no-op on the other ranks."""

    def __init__(self, cfg, ctx, start, keep=None):
        """``keep``: the last step whose records the log keeps (default ``start``; a resume drops the later ones)."""
        self.cfg, self.ctx = cfg, ctx
        self.metrics = self.bar = None
        self.where = "none"  # where the metrics go (rank 0), for the run's last line
        self.peaks = [0] * ctx.world  # the latest per-rank peak memory, for the bar
        # the first record of a run says where it began and at which world size (`hpcfsdp plot` marks resumes)
        self.run_start = {"world_size": ctx.world, **({"resumed_from": start} if start else {})}
        self.quiet = _settings.get(PROGRESS_ENV) is False
        if ctx.rank != 0:
            return
        os.makedirs(cfg.out_dir, exist_ok=True)
        with open(os.path.join(cfg.out_dir, "config.toml"), "w") as f:
            f.write(cfg.to_toml())
        self.metrics = Sinks(cfg, start, keep)  # See [Note: Metrics sinks] in _metrics.py
        self.where = ", ".join(self.metrics.where) or "none"
        want_bar = _settings.get(PROGRESS_ENV) or sys.stdout.isatty()
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
            self.metrics.record(rec)

    def log_step(self, rec, peaks):
        """Write the log record (with the per-rank peaks) and its line (above the bar, if any)."""
        if self.ctx.rank != 0:
            return
        self.peaks = peaks
        if self.run_start is not None:
            rec, self.run_start = {**rec, **self.run_start}, None
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
            self.metrics = None


def gather_peaks(ctx):
    """Every rank's peak memory, on rank 0 (None elsewhere)."""
    from ._common import peak_memory_bytes

    return ctx.comm.gather(peak_memory_bytes(ctx.device), root=0)


def saved_words(ckpts) -> str:
    """What a rerun can continue from, in words (no communication)."""
    if ckpts is None:
        return "nothing saved (no --checkpoint-dir): a rerun starts from step 0"
    return ckpts.describe()


def stop_job(cfg, ctx, session, out, ckpts, sig, stop, finalize: bool = True) -> int:
    """Every rank got here at the same step: save, say so once, leave MPI cleanly, exit STOPPED_EXIT (SIGTERM,
    SIGUSR1) or INTERRUPTED_EXIT (SIGINT, never requeued); see [Note: Ctrl-C] in runtime.py."""
    import signal

    name = signal.Signals(sig).name
    code = stop_exit_status(sig)
    if ckpts is not None:
        ckpts.save(final=True)
    out.close()
    stop.last_words = None  # said below: a second Ctrl-C from here on adds no line
    if ctx.rank == 0:
        print(f"{name}: stopped after step {session.step}/{cfg.steps}; {saved_words(ckpts)}; exit {code}", flush=True)
        if cfg.requeue and code == STOPPED_EXIT:
            print(requeue_slurm_job(), flush=True)
    ctx.comm.Barrier()  # no rank exits (and so has mpiexec end the others) before rank 0 has said it
    MPI = sys.modules.get("mpi4py.MPI")
    if finalize and MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()
    return code
