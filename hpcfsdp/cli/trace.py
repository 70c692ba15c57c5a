"""`hpcfsdp trace merge|plot`: one Perfetto-ready timeline from the per-rank traces, and a PNG of one step.

`HPCFSDP_TRACE=DIR` (or `hpcfsdp train --trace DIR`) makes every rank write DIR/trace_rank<R>.json, Chrome
trace events (see [Note: Timeline] in hpcfsdp/_trace.py). `merge` puts them in one file (pid = rank, tid =
thread: main, hpcfsdp-comm, ...) that Perfetto (ui.perfetto.dev) and chrome://tracing open. `plot` draws one
training step per rank: FSDP forward/backward on the main thread, collectives on the communication thread,
and the main thread's exposed waits, so overlap shows at a glance (matplotlib: the `plot` extra).
"""
from __future__ import annotations

import glob
import json
import os
import sys

__all__ = ["add_parser", "merge_traces", "load_trace", "step_windows", "plot_step", "TraceError"]


class TraceError(ValueError):
    """A trace file or directory that cannot be used; the message names it and the problem."""


def _read(path: str) -> list:
    try:
        with open(path, "r", encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"{path}: expected a Chrome trace (an object with 'traceEvents', or a list of events)")
    return events


def merge_traces(inputs, out: str) -> dict:
    """Merge per-rank trace files (paths, or directories holding trace_rank*.json) into ``out``.
    Returns {"ranks": [...], "events": count}."""
    files = []
    for p in inputs:
        if os.path.isdir(p):
            found = sorted(glob.glob(os.path.join(glob.escape(p), "trace_rank*.json")))
            if not found:
                raise TraceError(f"{p}: no trace_rank*.json files (was the run started with HPCFSDP_TRACE={p}?)")
            files += found
        else:
            files.append(p)
    if not files:
        raise TraceError("no trace files given")
    events, ranks = [], set()
    for f in files:
        evs = _read(f)
        pids = {e.get("pid") for e in evs if isinstance(e, dict)}
        dup = ranks & pids
        if dup:
            raise TraceError(f"{f}: rank(s) {sorted(dup)} appear in more than one input file")
        ranks |= pids
        events += evs
    events.sort(key=lambda e: (e.get("ph") != "M", e.get("ts", 0)))
    tmp = f"{out}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms",
                   "otherData": {"producer": "hpcfsdp trace merge", "ranks": sorted(ranks)}}, fh)
    os.replace(tmp, out)
    return {"ranks": sorted(ranks), "events": len(events)}


def load_trace(path: str) -> dict:
    """{rank: {"events": [X events], "iterations": [ts...], "threads": {tid: name}}} of a (merged) trace."""
    out: dict = {}
    for e in _read(path):
        if not isinstance(e, dict) or "pid" not in e:
            continue
        r = out.setdefault(e["pid"], {"events": [], "iterations": [], "threads": {}})
        ph = e.get("ph")
        if ph == "M" and e.get("name") == "thread_name":
            r["threads"][e.get("tid")] = e.get("args", {}).get("name", str(e.get("tid")))
        elif ph == "X":
            r["events"].append(e)
        elif ph == "i" and e.get("name") == "iteration":
            r["iterations"].append(e["ts"])
    for r in out.values():
        r["iterations"].sort()
    return out


def step_windows(trace: dict, step: int | None) -> tuple[int, dict]:
    """(step, {rank: (start us, end us)}) of training step ``step`` (1-based; None = the last complete one)."""
    counts = {rank: len(r["iterations"]) for rank, r in trace.items()}
    if not counts or min(counts.values()) == 0:
        raise TraceError("the trace has no training steps (no 'iteration' events: did an FSDP root run forward?)")
    n = min(counts.values())
    if step is None:
        step = n - 1 if n > 1 else 1
    if not 1 <= step <= n:
        raise TraceError(f"--step {step}: the trace holds steps 1..{n}")
    windows = {}
    for rank, r in trace.items():
        its = r["iterations"]
        start = its[step - 1]
        end = its[step] if step < len(its) else max(e["ts"] + e.get("dur", 0) for e in r["events"])
        windows[rank] = (start, end)
    return step, windows


_COLORS = {"compute": "#4c9be8", "wait": "#d62728", "all_gather": "#2ca02c", "reduce_scatter": "#ff7f0e",
           "all_reduce": "#9467bd", "other": "#8c8c8c"}


def plot_step(path: str, out: str, step: int | None = None, title: str | None = None) -> dict:
    """Draw one step per rank (lanes: main thread, communication thread) into ``out``. Returns per-rank
    totals in ms: {rank: {"step", "compute" (FSDP units' forward/backward less the waits inside them),
    "comm" (collectives running), "exposed_wait" (main thread blocked on a collective)}}."""
    from .plot import _import_figure

    Figure = _import_figure()
    trace = load_trace(path)
    step, windows = step_windows(trace, step)
    t0 = min(w[0] for w in windows.values())
    ranks = sorted(trace)
    fig = Figure(figsize=(11, 0.9 + 0.75 * len(ranks)), layout="constrained")
    ax = fig.subplots()
    totals, yticks, ylabels = {}, [], []
    for i, rank in enumerate(ranks):
        lo, hi = windows[rank]
        r = trace[rank]
        y_main, y_comm = -(2 * i) * 1.0, -(2 * i + 1) * 1.0
        tot = {"step": (hi - lo) / 1e3, "compute": 0.0, "comm": 0.0, "exposed_wait": 0.0}
        comp = []
        for e in r["events"]:
            s, d = e["ts"], e.get("dur", 0.0)
            if s + d <= lo or s >= hi:
                continue
            s, f = max(s, lo), min(s + d, hi)
            main = r["threads"].get(e.get("tid")) == "main" or e.get("tid") == 0
            cat = e.get("cat")
            x, w = (s - t0) / 1e3, (f - s) / 1e3
            if cat == "compute":
                comp.append((x, w))
            elif cat == "wait":
                ax.broken_barh([(x, w)], (y_main - 0.1, 0.5), color=_COLORS["wait"], zorder=3)
                tot["exposed_wait"] += w
            elif cat == "comm":
                kind = e.get("args", {}).get("kind", "other")
                color = _COLORS.get(kind, _COLORS["other"])
                ax.broken_barh([(x, w)], ((y_main if main else y_comm) - 0.35, 0.7), color=color,
                               edgecolor="white", linewidth=0.3, zorder=2)
                tot["comm"] += w
        if comp:  # nested units overlap: draw each, count the union (less the waits drawn over it)
            ax.broken_barh(comp, (y_main - 0.35, 0.7), color=_COLORS["compute"], edgecolor="white",
                           linewidth=0.3, zorder=1)
            comp.sort()
            end = -1e18
            for x, w in comp:
                tot["compute"] += max(0.0, x + w - max(x, end))
                end = max(end, x + w)
            tot["compute"] = max(0.0, tot["compute"] - tot["exposed_wait"])
        totals[rank] = {k: round(v, 3) for k, v in tot.items()}
        yticks += [y_main, y_comm]
        ylabels += [f"rank {rank} main\n(waits {tot['exposed_wait']:.1f} ms)", f"rank {rank} comm"]
    ax.set_yticks(yticks, ylabels, fontsize=8)
    ax.set_xlabel("ms from the start of the step")
    ax.grid(True, axis="x", alpha=0.3)
    from matplotlib.patches import Patch

    handles = [Patch(color=_COLORS[k], label=lab) for k, lab in (
        ("compute", "forward/backward (per FSDP unit)"), ("all_gather", "all-gather"),
        ("reduce_scatter", "reduce-scatter"), ("all_reduce", "all-reduce"), ("wait", "main thread waiting"))]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25 if len(ranks) > 2 else -0.35),
              ncol=5, fontsize=8, frameon=False)
    ax.set_title(title or f"step {step}: compute, communication and exposed waits per rank", fontsize=10)
    fig.savefig(out, dpi=110)
    return totals


def add_parser(subparsers):
    p = subparsers.add_parser(
        "trace", help="merge per-rank timelines (HPCFSDP_TRACE) and plot one step",
        description="Timelines written with HPCFSDP_TRACE=DIR or `hpcfsdp train --trace DIR`: merge the per-rank "
        "files into one that Perfetto opens, or draw one step per rank as a PNG (needs the plot extra).")
    sub = p.add_subparsers(dest="trace_command", metavar="ACTION")
    m = sub.add_parser("merge", help="merge DIR/trace_rank*.json into one Chrome trace (pid = rank)")
    m.add_argument("inputs", nargs="+", metavar="DIR|FILE", help="trace directory or per-rank files")
    m.add_argument("-o", "--output", default="merged.json", help="merged trace (default: merged.json)")
    m.set_defaults(func=_merge)
    q = sub.add_parser("plot", help="draw one training step per rank (compute, communication, waits)")
    q.add_argument("trace", metavar="MERGED.json", help="a merged trace (or one rank's file)")
    q.add_argument("-o", "--output", default="step.png", help="image file (default: step.png)")
    q.add_argument("--step", type=int, default=None, help="training step, from 1 (default: the last complete one)")
    q.add_argument("--title", default=None)
    q.set_defaults(func=_plot)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _merge(args) -> int:
    try:
        res = merge_traces(args.inputs, args.output)
    except TraceError as err:
        print(f"hpcfsdp trace merge: error: {err}", file=sys.stderr, flush=True)
        return 1
    except OSError as err:
        print(f"hpcfsdp trace merge: error: cannot write {args.output!r}: {err}", file=sys.stderr, flush=True)
        return 1
    print(f"wrote {args.output}: {res['events']} events of ranks {res['ranks']} (open it in ui.perfetto.dev)")
    return 0


def _plot(args) -> int:
    from .plot import PlotDependencyError

    try:
        totals = plot_step(args.trace, args.output, args.step, args.title)
    except (TraceError, PlotDependencyError) as err:
        print(f"hpcfsdp trace plot: error: {err}", file=sys.stderr, flush=True)
        return 1
    except (OSError, ValueError) as err:
        print(f"hpcfsdp trace plot: error: cannot write {args.output!r}: {err}", file=sys.stderr, flush=True)
        return 1
    for rank, t in sorted(totals.items()):
        print(f"rank {rank}: step {t['step']:.1f} ms, compute {t['compute']:.1f} ms, communication "
              f"{t['comm']:.1f} ms, exposed waits {t['exposed_wait']:.1f} ms")
    print(f"wrote {args.output}")
    return 0
