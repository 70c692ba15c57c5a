"""Where `hpcfsdp train` sends its metrics (rank 0): the JSONL log, TensorBoard, Weights & Biases.

[Note: Metrics sinks]
``--metrics`` lists the sinks, comma-separated: ``jsonl`` (the default; OUT_DIR/metrics.jsonl or
--metrics-path, read by `hpcfsdp plot`), ``tensorboard`` (event files in OUT_DIR/tensorboard through
hpcfsdp.utils.tensorboard.SummaryWriter: `tensorboard --logdir OUT_DIR/tensorboard`) and ``wandb``
(wandb.init(dir=OUT_DIR, project=$WANDB_PROJECT or "hpcfsdp", config=the run's settings); WANDB_MODE=offline
writes OUT_DIR/wandb/offline-run-* for a later `wandb sync`). Every sink gets the same values: the step record's
numbers as ``train/<key>`` (peak memory as the largest rank's) and an evaluation's as ``val/loss``, at
``step``. A resumed run starts each sink where the checkpoint was: the JSONL log is trimmed (see [Note: Exact
resume] in train.py), TensorBoard purges the steps after it (SummaryWriter's purge_step), and wandb starts a new
run (set WANDB_RUN_ID and WANDB_RESUME=allow to continue one). The packages are checked when the
configuration is validated, so a missing one fails every rank before training, naming its pip command.
"""
import importlib.util
import json
import os
import time

__all__ = ["SINKS", "parse_metrics", "check_metrics", "scalars", "Sinks", "trim_metrics"]

SINKS = ("jsonl", "tensorboard", "wandb")
_PIP = {"tensorboard": "pip install tensorboard", "wandb": "pip install wandb"}


def parse_metrics(text) -> tuple:
    """'jsonl,tensorboard' -> ('jsonl', 'tensorboard'); an unknown or repeated name raises ValueError."""
    import difflib

    names = [n.strip() for n in str(text).split(",")]
    if not any(names):
        raise ValueError(f"metrics={text!r}: expected one or more of {', '.join(SINKS)}, comma-separated")
    for n in names:
        if n not in SINKS:
            close = difflib.get_close_matches(n, SINKS, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"metrics={text!r}: {n!r} is not a metrics sink; expected {', '.join(SINKS)}{hint}")
    if len(set(names)) != len(names):
        raise ValueError(f"metrics={text!r}: a sink is named twice")
    return tuple(names)


def check_metrics(text) -> tuple:
    """parse_metrics, and the package of each sink importable here (ValueError naming its pip command)."""
    names = parse_metrics(text)
    for n in names:
        if n in _PIP and importlib.util.find_spec(n) is None:
            raise ValueError(f"metrics={text!r}: {n} is not installed here: {_PIP[n]}")
    return names


def scalars(rec) -> dict:
    """The numbers of one record as the tags every sink gets (``train/<key>``, ``val/loss``)."""
    out = {}
    for k, v in rec.items():
        if k in ("step", "time"):
            continue
        if k == "val_loss":
            out["val/loss"] = v
        elif k == "peak_mem_bytes":
            if v:
                out["train/peak_mem_bytes"] = max(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"train/{k}"] = v
    return out


class Sinks:
    """The sinks of one run on rank 0: record(rec) writes a record to each, close() ends them."""

    def __init__(self, cfg, start, keep=None):
        self.names = check_metrics(cfg.metrics)
        self.jsonl = self.tb = self.wandb = None
        self.where = []
        try:
            if "jsonl" in self.names:
                path = cfg.metrics_file()
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                if start:
                    trim_metrics(path, start if keep is None else keep)
                self.jsonl = open(path, "a" if start else "w")
                self.where.append(path)
            if "tensorboard" in self.names:
                from hpcfsdp.utils.tensorboard import SummaryWriter

                logdir = os.path.join(cfg.out_dir, "tensorboard")
                purge = (start if keep is None else keep) + 1 if start else None
                self.tb = SummaryWriter(logdir, purge_step=purge, flush_secs=30)
                self.where.append(f"tensorboard --logdir {logdir}")
            if "wandb" in self.names:
                import wandb

                self.wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "hpcfsdp"), dir=cfg.out_dir,
                                        config=cfg.to_dict())
                self.where.append(f"wandb {os.path.join(cfg.out_dir, 'wandb')}")
        except BaseException:
            self.close()
            raise

    def record(self, rec):
        if self.jsonl is not None:  # every record carries its wall-clock time (Unix seconds)
            self.jsonl.write(json.dumps({**rec, "time": round(time.time(), 3)}) + "\n")
            self.jsonl.flush()
        values = scalars(rec) if (self.tb is not None or self.wandb is not None) else None
        if self.tb is not None:
            for tag, v in values.items():
                self.tb.add_scalar(tag, v, rec["step"])
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(values, step=rec["step"])

    def close(self):
        if self.jsonl is not None:
            self.jsonl.close()
            self.jsonl = None
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


def trim_metrics(path, step):
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
