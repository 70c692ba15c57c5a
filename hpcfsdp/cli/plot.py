"""`hpcfsdp plot`: draw loss and throughput curves from a training run's JSONL metrics log.

The log is what `hpcfsdp train` writes on rank 0 (keys in `hpcfsdp.cli.config.METRICS_FIELDS`):
one JSON object per line. A record with `step` and `loss` is a training record; other records
(a header, an evaluation with only `val_loss`) are read for `val_loss` or skipped. matplotlib is an
optional extra (`pip install 'hpcfsdp[plot]'`), imported only when a plot is drawn.
"""

import json
import math
import os
import sys

__all__ = ["add_parser", "load_metrics", "plot_metrics", "MetricsError", "PlotDependencyError"]


class MetricsError(ValueError):
    """A metrics log that cannot be read; the message names the file, the line and the problem."""


class PlotDependencyError(RuntimeError):
    """matplotlib is missing."""


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load_metrics(path: str) -> dict:
    """Read a JSONL metrics log into columns: {'step', 'loss', 'tokens_per_s', 'val_step', 'val_loss'}.

    `tokens_per_s` has one entry per training record (NaN where a record lacks it). Raises
    MetricsError naming the line for a malformed record and when there is no training record.
    """
    try:
        f = open(path, "r", encoding="utf-8")
    except OSError as e:
        raise MetricsError(f"{path}: cannot read the metrics log ({e.strerror or e})") from None
    cols = {"step": [], "loss": [], "tokens_per_s": [], "val_step": [], "val_loss": []}
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise MetricsError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise MetricsError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
            if "loss" in rec or "val_loss" in rec:
                step = rec.get("step")
                if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                    raise MetricsError(f"{path}:{lineno}: step={step!r}: expected an integer >= 0")
            if "loss" in rec:
                if not _number(rec["loss"]):
                    raise MetricsError(f"{path}:{lineno}: loss={rec['loss']!r}: expected a number")
                tps = rec.get("tokens_per_s", math.nan)
                if not _number(tps):
                    raise MetricsError(f"{path}:{lineno}: tokens_per_s={tps!r}: expected a number")
                cols["step"].append(rec["step"])
                cols["loss"].append(float(rec["loss"]))
                cols["tokens_per_s"].append(float(tps))
            if "val_loss" in rec:
                if not _number(rec["val_loss"]):
                    raise MetricsError(f"{path}:{lineno}: val_loss={rec['val_loss']!r}: expected a number")
                cols["val_step"].append(rec["step"])
                cols["val_loss"].append(float(rec["val_loss"]))
    if not cols["step"]:
        raise MetricsError(f"{path}: no training records (JSON objects with 'step' and 'loss')")
    return cols


def _import_figure():
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise PlotDependencyError(
            f"matplotlib is not installed ({e}); install the plot extra: pip install 'hpcfsdp[plot]'"
        ) from None
    return Figure


def plot_metrics(cols: dict, out: str, *, title=None):
    """Draw two panels, loss vs step and tokens/s vs step, into `out` (format from its suffix).

    Uses `matplotlib.figure.Figure` directly (no pyplot, no display needed). Returns the Figure.
    """
    Figure = _import_figure()
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax_loss, ax_tps = fig.subplots(1, 2)
    ax_loss.plot(cols["step"], cols["loss"], label="train loss")
    if cols.get("val_step"):
        ax_loss.plot(cols["val_step"], cols["val_loss"], "o-", label="val loss")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.set_title("loss")
    ax_loss.legend()
    ax_loss.grid(True, alpha=0.3)
    ax_tps.plot(cols["step"], cols["tokens_per_s"], color="tab:green", label="tokens/s")
    ax_tps.set_xlabel("step")
    ax_tps.set_ylabel("tokens / s (all ranks)")
    ax_tps.set_title("throughput")
    ax_tps.grid(True, alpha=0.3)
    if all(math.isnan(v) for v in cols["tokens_per_s"]):
        ax_tps.text(0.5, 0.5, "no tokens_per_s in the log", ha="center", va="center", transform=ax_tps.transAxes)
    if title:
        fig.suptitle(title)
    fig.savefig(out)
    return fig


def add_parser(subparsers):
    p = subparsers.add_parser(
        "plot",
        help="plot loss and throughput from a metrics log",
        description="Draw loss and tokens/s against step from the JSONL metrics log of `hpcfsdp train`. "
        "Needs matplotlib: pip install 'hpcfsdp[plot]'.",
    )
    p.add_argument("metrics", metavar="METRICS.jsonl", help="metrics log written by hpcfsdp train")
    p.add_argument("-o", "--output", default="loss.png", help="image file; format from the suffix (default: loss.png)")
    p.add_argument("--title", default=None, help="figure title (default: the log's file name)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    try:
        cols = load_metrics(args.metrics)
        plot_metrics(cols, args.output, title=args.title or os.path.basename(args.metrics))
    except (MetricsError, PlotDependencyError) as err:
        print(f"hpcfsdp plot: error: {err}", file=sys.stderr, flush=True)
        return 1
    except (OSError, ValueError) as err:  # unwritable output, unknown image suffix
        print(f"hpcfsdp plot: error: cannot write {args.output!r}: {err}", file=sys.stderr, flush=True)
        return 1
    print(f"wrote {args.output} ({len(cols['step'])} steps)")
    return 0
