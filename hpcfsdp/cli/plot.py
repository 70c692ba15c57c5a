"""`hpcfsdp plot`: draw loss and throughput curves from a training run's JSONL metrics log.

The log is what `hpcfsdp train` writes on rank 0 (keys in `hpcfsdp.cli.config.METRICS_FIELDS`):
one JSON object per line. A record with `step` and `loss` is a training record; other records
(a header, an evaluation with only `val_loss`) are read for `val_loss` or skipped. The first training
record of each run carries `world_size`, and `resumed_from` (the checkpoint's step) when the run resumed:
those are drawn as markers, and they fix the tokens per step for `--x tokens`. matplotlib is an
optional extra (`pip install 'hpcfsdp[plot]'`), imported only when a plot is drawn.
"""

import argparse
import bisect
import json
import math
import os
import sys

__all__ = ["add_parser", "load_metrics", "plot_metrics", "smooth", "MetricsError", "PlotDependencyError"]

SMOOTHING = 0.6  # TensorBoard's default scalar smoothing weight


class MetricsError(ValueError):
    """A metrics log that cannot be read; the message names the file, the line and the problem."""


class PlotDependencyError(RuntimeError):
    """matplotlib is missing."""


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load_metrics(path: str) -> dict:
    """Read a JSONL metrics log into columns: {'step', 'loss', 'tokens_per_s', 'val_step', 'val_loss',
    'tokens', 'world_size', 'runs'}.

    `tokens_per_s` has one entry per training record (NaN where a record lacks it); `tokens` the tokens
    trained on up to each record's step (None when the log lacks `tokens_per_s` or `step_time_s`);
    `world_size` the ranks of each record (None where unknown); `runs` one {'step', 'world_size',
    'resumed'} per run after the first (a resume, or a change of world size), at the step it began from.
    Raises MetricsError naming the line for a malformed record and when there is no training record.
    """
    try:
        f = open(path, "r", encoding="utf-8")
    except OSError as e:
        raise MetricsError(f"{path}: cannot read the metrics log ({e.strerror or e})") from None
    cols = {"step": [], "loss": [], "tokens_per_s": [], "val_step": [], "val_loss": []}
    per_step, world, resumed = [], [], []  # tokens of one step, ranks, the step a run resumed from (or None)
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
                r = rec.get("resumed_from")
                if r is not None and (isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < rec["step"]):
                    raise MetricsError(f"{path}:{lineno}: resumed_from={r!r}: expected an integer in "
                                       f"[0, step={rec['step']})")
                cols["step"].append(rec["step"])
                cols["loss"].append(float(rec["loss"]))
                cols["tokens_per_s"].append(float(tps))
                dt = rec.get("step_time_s")
                per_step.append(round(tps * dt) if _number(dt) and math.isfinite(tps) else None)
                w = rec.get("world_size")
                mem = rec.get("peak_mem_bytes")
                world.append(w if _number(w) else len(mem) if isinstance(mem, list) and mem else None)
                resumed.append(r)
            if "val_loss" in rec:
                if not _number(rec["val_loss"]):
                    raise MetricsError(f"{path}:{lineno}: val_loss={rec['val_loss']!r}: expected a number")
                cols["val_step"].append(rec["step"])
                cols["val_loss"].append(float(rec["val_loss"]))
    if not cols["step"]:
        raise MetricsError(f"{path}: no training records (JSON objects with 'step' and 'loss')")
    cols["world_size"] = world
    cols["runs"] = _runs(cols["step"], world, resumed)
    cols["token_knots"] = knots = _token_knots(cols["step"], per_step, resumed)
    cols["tokens"] = None if knots is None else [tokens_at(knots, s) for s in cols["step"]]
    return cols


def _runs(steps, world, resumed):
    """Where a run began after the first: a resume (at the checkpoint's step) or a change of world size."""
    runs = []
    for i, (s, w, r) in enumerate(zip(steps, world, resumed)):
        changed = i > 0 and w is not None and world[i - 1] is not None and w != world[i - 1]
        if r is not None or changed:  # a log of an older trainer has no resumed_from: the step before this one
            runs.append({"step": r if r is not None else s - 1, "world_size": w, "resumed": r is not None,
                         "previous_world_size": world[i - 1] if i else None})
    return runs


def _token_knots(steps, per_step, resumed):
    """(steps, tokens) at which the tokens trained on are known exactly; in between, every step trained on the
    same number of tokens (a run's tokens per step are fixed). The steps since the previous record ran at this
    record's tokens per step, except those before a resume, which ran at the previous record's. None when a
    record lacks `tokens_per_s` or `step_time_s`."""
    if any(t is None for t in per_step):
        return None
    xs, ys, prev = [0], [0], None
    for s, t, r in zip(steps, per_step, resumed):
        if r is not None and prev is not None and r > xs[-1]:
            xs.append(r)
            ys.append(ys[-1] + (r - xs[-2]) * prev)
        if s > xs[-1]:
            ys.append(ys[-1] + (s - xs[-1]) * t)
            xs.append(s)
        prev = t
    return xs, ys


def tokens_at(knots, step):
    """Tokens trained on after ``step`` (a log's ``token_knots``; linear between knots, exact at records)."""
    xs, ys = knots
    if step >= xs[-1]:
        return ys[-1] + (step - xs[-1]) * ((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0)
    k = bisect.bisect_right(xs, step)
    x0, x1, y0, y1 = xs[k - 1], xs[k], ys[k - 1], ys[k]
    return y0 + (y1 - y0) * (step - x0) / (x1 - x0)


def smooth(values, weight=SMOOTHING):
    """TensorBoard's scalar smoothing: a debiased exponential moving average (weight 0 = none, towards 1 =
    more); non-finite values are passed through and left out of the average."""
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight {weight!r}: expected a number in [0, 1)")
    out, last, n = [], 0.0, 0
    for v in values:
        if not math.isfinite(v):
            out.append(v)
            continue
        last = last * weight + (1.0 - weight) * v
        n += 1
        out.append(last / (1.0 - weight ** n))
    return out


def _import_figure():
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise PlotDependencyError(
            f"matplotlib is not installed ({e}); install the plot extra: pip install 'hpcfsdp[plot]'"
        ) from None
    return Figure


_RUN_STYLE = {"resume": dict(color="0.35", linestyle="--", linewidth=1.0),
              "world": dict(color="tab:purple", linestyle="-.", linewidth=1.2)}


def _marker_label(run):
    prev, w = run.get("previous_world_size"), run["world_size"]
    if prev is not None and w is not None and prev != w:
        return f"{prev}\u2192{w} ranks" + (f" (resumed at {run['step']})" if run["resumed"] else "")
    return f"resumed at {run['step']}"


def plot_metrics(cols: dict, out: str, *, title=None, x="step", smoothing=None):
    """Draw two panels, loss and tokens/s against ``x`` ("step" or "tokens", the tokens trained on), into
    `out` (format from its suffix), with a vertical line where a run resumed or the world size changed.
    ``smoothing`` (a weight in [0, 1), TensorBoard's EMA) adds the smoothed train loss and tokens/s over
    the raw curves, drawn faint. Uses `matplotlib.figure.Figure` directly (no pyplot, no display needed).
    Returns the Figure.
    """
    if x not in ("step", "tokens"):
        raise ValueError(f"x={x!r}: expected 'step' or 'tokens'")
    if x == "tokens" and cols.get("token_knots") is None:
        raise MetricsError("--x tokens: the log's training records need tokens_per_s and step_time_s")
    if smoothing is not None and not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing={smoothing!r}: expected a weight in [0, 1)")
    Figure = _import_figure()
    where = (lambda s: s) if x == "step" else (lambda s: tokens_at(cols["token_knots"], s))
    xs = [where(s) for s in cols["step"]]
    fig = Figure(figsize=(10, 4.6), layout="constrained")
    ax_loss, ax_tps = fig.subplots(1, 2)
    faint = {"alpha": 0.3} if smoothing else {}
    ax_loss.plot(xs, cols["loss"], color="tab:blue", label="train loss", **faint)
    if smoothing:
        ax_loss.plot(xs, smooth(cols["loss"], smoothing), color="tab:blue",
                     label=f"train loss, smoothed ({smoothing:g})")
    if cols.get("val_step"):
        ax_loss.plot([where(s) for s in cols["val_step"]], cols["val_loss"], "o-", color="tab:orange",
                     label="val loss")
    ax_tps.plot(xs, cols["tokens_per_s"], color="tab:green", label="tokens/s", **faint)
    if smoothing:
        ax_tps.plot(xs, smooth(cols["tokens_per_s"], smoothing), color="tab:green",
                    label=f"tokens/s, smoothed ({smoothing:g})")
    shown = set()
    for run in cols.get("runs", ()):
        kind = "world" if run.get("previous_world_size") not in (None, run["world_size"]) else "resume"
        pos = where(run["step"])
        for ax in (ax_loss, ax_tps):
            first = kind not in shown and ax is ax_loss
            ax.axvline(pos, gid=f"run:{kind}:{run['step']}", zorder=0,
                       label=("world size changed" if kind == "world" else "resumed") if first else "_nolegend_",
                       **_RUN_STYLE[kind])
            ax.annotate(_marker_label(run), (pos, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -2),
                        textcoords="offset points", fontsize=7, rotation=90, va="top", ha="left",
                        color=_RUN_STYLE[kind]["color"])
        shown.add(kind)
    xlabel = "step" if x == "step" else "tokens trained on"
    for ax, ylabel, name in ((ax_loss, "loss", "loss"), (ax_tps, "tokens / s (all ranks)", "throughput")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(name)
        ax.grid(True, alpha=0.3)
        if x == "tokens":
            from matplotlib.ticker import EngFormatter

            ax.xaxis.set_major_formatter(EngFormatter())
    # below the panels, so that the markers' labels (at their top) stay readable
    legend = dict(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    ax_loss.legend(**legend)
    if smoothing or cols.get("runs"):
        ax_tps.legend(**legend)
    if all(math.isnan(v) for v in cols["tokens_per_s"]):
        ax_tps.text(0.5, 0.5, "no tokens_per_s in the log", ha="center", va="center", transform=ax_tps.transAxes)
    if title:
        fig.suptitle(title)
    fig.savefig(out)
    return fig


def _weight(text):
    try:
        w = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a smoothing weight in [0, 1)") from None
    if not 0.0 <= w < 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a smoothing weight in [0, 1)")
    return w


def add_parser(subparsers):
    p = subparsers.add_parser(
        "plot",
        help="plot loss and throughput from a metrics log",
        description="Draw loss and tokens/s against step (or tokens) from the JSONL metrics log of `hpcfsdp "
        "train`, with a vertical line where a run resumed or changed its world size. Needs matplotlib: pip "
        "install 'hpcfsdp[plot]'.",
    )
    p.add_argument("metrics", metavar="METRICS.jsonl", help="metrics log written by hpcfsdp train")
    p.add_argument("-o", "--output", default="loss.png", help="image file; format from the suffix (default: loss.png)")
    p.add_argument("--title", default=None, help="figure title (default: the log's file name)")
    p.add_argument("--x", choices=("step", "tokens"), default="step",
                   help="x axis: training step, or tokens trained on (from each record's tokens_per_s and "
                   "step_time_s, at the world size of its run; default: step)")
    p.add_argument("--smooth", action="store_true",
                   help="draw the train loss and tokens/s smoothed over the raw curves (faint): TensorBoard's "
                   "exponential moving average")
    p.add_argument("--smooth-weight", type=_weight, default=SMOOTHING, metavar="W",
                   help=f"the smoothing weight, in [0, 1): higher is smoother (default {SMOOTHING}, TensorBoard's)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    try:
        cols = load_metrics(args.metrics)
        plot_metrics(cols, args.output, title=args.title or os.path.basename(args.metrics), x=args.x,
                     smoothing=args.smooth_weight if args.smooth else None)
    except (MetricsError, PlotDependencyError) as err:
        print(f"hpcfsdp plot: error: {err}", file=sys.stderr, flush=True)
        return 1
    except (OSError, ValueError) as err:  # unwritable output, unknown image suffix
        print(f"hpcfsdp plot: error: cannot write {args.output!r}: {err}", file=sys.stderr, flush=True)
        return 1
    runs = cols["runs"]
    print(f"wrote {args.output} ({len(cols['step'])} steps" + (f", {len(runs)} resume(s) or world-size change(s) "
          f"marked" if runs else "") + ")")
    return 0
