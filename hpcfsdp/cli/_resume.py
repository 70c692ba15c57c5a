"""Resuming `hpcfsdp train` from a checkpoint: the checks that it is this run's, the load, and the temporaries
of unfinished saves (shared by the plain and the elastic trainer)."""

import os

from .runtime import Agreed, guarded

__all__ = ["resume", "clean_stale"]


_SAME_ON_RESUME = ("seed",)  # and the model's keys, resolved (See [Note: Model keys] in _model.py), and the tokenizer


def _check_resumable(cfg, path, tokenizer=None):
    """The checkpoint at `path` was written for this model and this data; raise ValueError if not."""
    import dataclasses

    from hpcfsdp.distributed import checkpoint as dcp

    from ._model import model_config, model_config_of

    md = dcp.read_metadata(path)
    skeleton = (md.extras or {}).get("skeleton") or {}
    saved = skeleton.get("config")
    if not isinstance(saved, dict):
        raise ValueError(f"{path} holds no training configuration: not written by hpcfsdp train")
    mine = cfg.to_dict()
    theirs = {"model": saved.get("model") or "gpt", **dataclasses.asdict(model_config_of({**saved, "dropout": None}))}
    ours = {"model": cfg.model, **dataclasses.asdict(model_config(dataclasses.replace(cfg, dropout=0.0)))}
    for name in list(theirs) + list(_SAME_ON_RESUME):
        a, b = (ours.get(name), theirs.get(name)) if name in theirs else (mine[name], saved.get(name, mine[name]))
        if a != b:
            raise ValueError(f"{name}={a!r}, but the checkpoint {path} was written with "
                             f"{name}={b!r}; resume with the same model, data and seed")
    had = skeleton.get("tokenizer")
    if isinstance(had, dict) and isinstance(tokenizer, dict) and (had.get("type"), had.get("json")) != (
            tokenizer.get("type"), tokenizer.get("json")):
        raise ValueError(f"data={cfg.data!r} was written with another tokenizer ({tokenizer.get('type')}, vocabulary "
                         f"{tokenizer.get('vocab_size')}) than the checkpoint {path} ({had.get('type')}, vocabulary "
                         f"{had.get('vocab_size')}); resume with the same model, data and seed")


def resume(cfg, ctx, session, ckpt):
    """Load ``ckpt`` into ``session`` (every rank; refused, on every rank, when it is not this run's)."""
    seen = ctx.comm.allgather(os.path.lexists(ckpt))
    if any(seen) and not all(seen):
        raise Agreed(f"resume: {ckpt} exists on ranks {[r for r, s in enumerate(seen) if s]} only; "
                      f"checkpoints must be on a file system every rank sees")
    if not seen[0]:
        if cfg.resume_if_exists:
            if ctx.rank == 0:
                print(f"no checkpoint at {ckpt} yet: starting from step 0", flush=True)
            return
        held = sorted(n for n in (os.listdir(cfg.checkpoint_dir) if cfg.checkpoint_dir and
                                  os.path.isdir(cfg.checkpoint_dir) else []) if n.startswith("step-") and
                      ".ckpt-" not in n)  # the kept steps (their .ckpt- directories are what they link to)
        what = f"; it holds {', '.join(held)}" if held else (
            "" if cfg.checkpoint_dir and os.path.isdir(cfg.checkpoint_dir) else
            f"; {cfg.checkpoint_dir} does not exist (a mistyped --checkpoint-dir?)" if cfg.checkpoint_dir else "")
        raise Agreed(f"resume: no checkpoint at {ckpt}{what}; --resume-if-exists starts from step 0 when there is "
                     "none")
    guarded(ctx.comm, "resume", lambda: _check_resumable(cfg, ckpt, session.tokenizer))
    guarded(ctx.comm, f"resume from {ckpt}", lambda: session.load(ckpt))
    if ctx.rank == 0:
        print(f"resumed from {ckpt} at step {session.step}", flush=True)


def clean_stale(cfg, ctx):
    """Rank 0 removes the temporaries of earlier, unfinished saves from the checkpoint directory."""
    from . import _keep

    def clean():
        if ctx.rank == 0 and os.path.isdir(cfg.checkpoint_dir):
            gone = _keep.remove_stale_temporaries(cfg.checkpoint_dir, _keep.job_start_time())
            if gone:
                print(f"removed {len(gone)} temporary file(s) of earlier, unfinished saves from "
                      f"{cfg.checkpoint_dir}: {', '.join(sorted(gone))}", flush=True)

    guarded(ctx.comm, f"checkpoint_dir={cfg.checkpoint_dir!r}", clean)
