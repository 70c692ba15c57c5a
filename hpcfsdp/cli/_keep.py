"""The trainer's checkpoint directory: the last K step checkpoints behind `latest`, stale temporaries removed.

[Note: Keeping the last K]
With --keep-last K every save writes CHECKPOINT_DIR/step-NNNNNNNN (an ordinary atomic checkpoint:
a link to its committed directory), then rank 0 points the link `latest` at it (symlink to a
temporary name + rename(2): one step) and deletes the step checkpoints older than the last K, never
the one `latest` names. A crash between the two leaves `latest` at the previous step: --resume loses
nothing it did not already lose. Without --keep-last, `latest` itself is the checkpoint.

With --async-checkpoint the periodic saves are written in the background (dcp.async_save): the step
checkpoint is only linked and the old ones pruned once every rank's save has committed, which the
ranks learn together at a step boundary (the allreduce of [Note: Stopping on a signal] in runtime.py)
or at the next save, which waits for it first. Until then `latest` and every kept checkpoint stay as
they were, so a save that fails or is cut short costs nothing already kept, and nothing is deleted
that a running save needs (it writes only into its own temporary). The final save (end of training,
or a stop) is written synchronously: the process says it is saved only once it is.

A save writes into `NAME.tmp-<32 hex>` first; a writer killed mid-save leaves that directory behind.
When a job starts, rank 0 removes the ones that nothing has touched (the directory and every file in it)
since QUIET seconds before the job started: their writer was a job that ended. A job still writing into
the same directory (an error of its own, reported by its save) keeps its temporaries, since it touches
them; a writer killed less than QUIET seconds before this job started leaves its temporary to the next
start, which costs only disk space.
"""

import os
import re
import shutil
import time
import uuid

__all__ = ["step_name", "point_latest", "prune", "remove_stale_temporaries", "CheckpointDir"]

_STEP_RE = re.compile(r"step-(\d{8,})\Z")
_TMP_RE = re.compile(r".+\.(tmp|link)-[0-9a-f]{32}\Z")
QUIET = 120.0  # seconds without a write before a temporary older than the job counts as a dead writer's


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def point_latest(directory, name) -> None:
    """Rank 0: make CHECKPOINT_DIR/latest a link to `name` in one step; drop what `latest` held alone."""
    latest = os.path.join(directory, "latest")
    old = None
    if os.path.islink(latest):
        dest = os.readlink(latest)
        if os.path.dirname(dest) in ("", directory) and os.path.basename(dest).startswith("latest.ckpt-"):
            old = os.path.join(directory, os.path.basename(dest))  # a checkpoint saved as `latest` itself
    elif os.path.isdir(latest):
        old = os.path.join(directory, f"latest.ckpt-{uuid.uuid4().hex}")
        os.rename(latest, old)
    link = os.path.join(directory, f"latest.link-{uuid.uuid4().hex}")
    os.symlink(name, link)
    os.replace(link, latest)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def prune(directory, keep: int) -> list:
    """Rank 0: delete the step checkpoints older than the newest `keep` (never `latest`'s); returns their names."""
    steps = sorted((int(m.group(1)), n) for n in os.listdir(directory) if (m := _STEP_RE.match(n)))
    latest = os.path.join(directory, "latest")
    current = os.path.basename(os.readlink(latest)) if os.path.islink(latest) else None
    gone = []
    for _, name in steps[:-keep] if keep > 0 else []:
        if name == current:
            continue
        path = os.path.join(directory, name)
        real = os.path.realpath(path)
        if os.path.islink(path):
            os.unlink(path)
        if os.path.isdir(real) and os.path.dirname(real) == os.path.realpath(directory):
            shutil.rmtree(real, ignore_errors=True)
        gone.append(name)
    return gone


def _last_touched(path) -> float:
    """The newest mtime of `path` (not followed) and, for a directory, of its entries, recursively."""
    newest = os.lstat(path).st_mtime
    if os.path.isdir(path) and not os.path.islink(path):
        for root, dirs, files in os.walk(path):
            for n in dirs + files:
                try:
                    newest = max(newest, os.lstat(os.path.join(root, n)).st_mtime)
                except FileNotFoundError:
                    pass
    return newest


def remove_stale_temporaries(directory, started: float) -> list:
    """Rank 0: delete the `*.tmp-<hex>` directories and `*.link-<hex>` links untouched since QUIET seconds
    before `started` (a time.time()); returns their names."""
    gone = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return gone
    for name in names:
        if not _TMP_RE.match(name):
            continue
        path = os.path.join(directory, name)
        try:
            if _last_touched(path) >= started - QUIET:
                continue
        except FileNotFoundError:
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        gone.append(name)
    return gone


def job_start_time() -> float:
    """When this process started (the job is at least as old), as a time.time()."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


class CheckpointDir:
    """CHECKPOINT_DIR as `hpcfsdp train` writes it: `latest`, with keep_last the newest of K step checkpoints,
    periodic saves in the background with async_checkpoint. Every method is collective."""

    def __init__(self, cfg, ctx, session):
        self.cfg, self.ctx, self.session = cfg, ctx, session
        self.latest = os.path.join(cfg.checkpoint_dir, "latest")
        self.saved_step = None  # the step `latest` holds, as far as this run knows (None: nothing saved)
        self._inflight = None  # (future, step-name or None, step) of a background save not yet linked

    def save(self, final: bool = False) -> None:
        """Save the session's state at its step; in the background if async_checkpoint and not ``final``."""
        step = self.session.step
        self.finish()
        if self.saved_step == step:
            return  # saved at this step already (a stop right after a periodic save)
        background = self.cfg.async_checkpoint and not final
        name = step_name(step) if self.cfg.keep_last else None
        future = self.session.save(os.path.join(self.cfg.checkpoint_dir, name) if name else self.latest,
                                   asynchronous=background)
        if future is not None:
            self._inflight = (future, name, step)
        else:
            self._commit(name, step)

    def busy(self) -> bool:
        """This rank's background save is still being written."""
        return self._inflight is not None and not self._inflight[0].done()

    def pending(self) -> bool:
        """A background save is written, or being written, and not yet linked."""
        return self._inflight is not None

    def finish(self) -> None:
        """Wait for the background save, if any (every rank's error is every rank's), then link and prune."""
        if self._inflight is None:
            return
        from .runtime import guarded

        future, name, step = self._inflight
        self._inflight = None
        guarded(self.ctx.comm, f"checkpoint at step {step} (written in the background)", future.result)
        self._commit(name, step)

    def _commit(self, name, step) -> None:
        if name is not None:
            from .runtime import guarded

            def relink():
                if self.ctx.rank == 0:
                    point_latest(self.cfg.checkpoint_dir, name)
                    prune(self.cfg.checkpoint_dir, self.cfg.keep_last)

            guarded(self.ctx.comm, f"keep_last: pointing {self.latest} at {name}", relink)
        self.saved_step = step

    def describe(self) -> str:
        """What a rerun with --resume would continue from, in words (no communication: safe in a signal handler)."""
        step = self.saved_step
        if self._inflight is not None and self._inflight[0].done() and self._inflight[0].exception() is None \
                and self._inflight[1] is None:
            step = self._inflight[2]  # committed as `latest` itself; nothing left to link
        if step is None:
            return f"no checkpoint saved in {self.cfg.checkpoint_dir} yet: a rerun starts from step 0"
        return f"checkpoint {self.latest} holds step {step}: rerun with --resume to continue"
