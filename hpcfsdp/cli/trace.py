"""`hpcfsdp trace merge|plot`: one Perfetto-ready timeline from the per-rank traces, and a PNG of one step.

`HPCFSDP_TRACE=DIR` (or `hpcfsdp train --trace DIR`) makes every rank write DIR/trace_rank<R>.json, Chrome
trace events (see [Note: Timeline] in hpcfsdp/_trace.py). `merge` puts them in one file (pid = rank, tid =
thread: main, hpcfsdp-comm, ...) that Perfetto (ui.perfetto.dev) and chrome://tracing open. `plot` draws one
training step per rank: each FSDP unit's forward and backward on the main thread (a colour per unit,
backward hatched), the main thread's exposed waits in a lane of their own beside them, and the collectives
on the communication thread, so overlap shows at a glance (matplotlib: the `plot` extra).
"""
from __future__ import annotations

import glob
import json
import os
import sys

__all__ = ["add_parser", "merge_traces", "load_trace", "step_windows", "step_figure", "plot_step", "TraceError"]


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


_COLORS = {"wait": "#d62728", "all_gather": "#2ca02c", "reduce_scatter": "#ff7f0e", "all_reduce": "#9467bd",
           "other": "#8c8c8c"}
# One colour per FSDP unit, none of them a collective's or the waits' (matplotlib's tab10/tab20 less those).
_UNIT_COLORS = ("#1f77b4", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#393b79", "#aec7e8",
                "#c49c94", "#f7b6d2", "#9edae5", "#dbdb8d", "#637939", "#843c39")
_BACKWARD_HATCH = "////"  # forward: the unit's colour; backward: the same colour, hatched
# Lanes of one rank (y offsets from its top and heights): the main thread's FSDP units, the main thread's
# waits and inline collectives beside them, the communication thread's collectives.
_LANES = {"compute": (0.0, 0.8), "wait": (-0.75, 0.5), "comm": (-1.4, 0.6)}
_RANK_PITCH = 2.2


def _unit_colors(units):
    if len(units) <= len(_UNIT_COLORS):
        return dict(zip(units, _UNIT_COLORS))
    from matplotlib import colormaps

    cmap = colormaps["turbo"]
    return {u: cmap(0.05 + 0.9 * k / (len(units) - 1)) for k, u in enumerate(units)}


def _unit_of(e):
    u = e.get("args", {}).get("unit")
    return u if u is not None else e.get("name", "").split(" ", 1)[-1]


def step_figure(path: str, step: int | None = None, title: str | None = None):
    """(Figure, totals) of one step per rank, three lanes per rank: the main thread's FSDP units (a colour per
    unit, forward plain and backward hatched, inner units over the outer ones), the main thread's waits on
    collectives and its inline collectives, and the communication thread's collectives (a colour per kind).
    totals, in ms: {rank: {"step", "compute" (FSDP units' forward/backward less the waits inside them),
    "comm" (collectives running), "exposed_wait" (main thread blocked on a collective)}}."""
    from .plot import _import_figure

    Figure = _import_figure()
    from matplotlib.patches import Patch

    trace = load_trace(path)
    step, windows = step_windows(trace, step)
    t0 = min(w[0] for w in windows.values())
    ranks = sorted(trace)
    first = {}  # unit -> its first start in the step on any rank: model order, root first
    for rank in ranks:
        lo, hi = windows[rank]
        for e in trace[rank]["events"]:
            if e.get("cat") == "compute" and lo <= e["ts"] < hi:
                u = _unit_of(e)
                first[u] = min(first.get(u, e["ts"]), e["ts"])
    units = sorted(first, key=lambda u: (first[u], u))
    colors = _unit_colors(units)
    fig = Figure(figsize=(11, 1.6 + 1.25 * len(ranks)), layout="constrained")
    ax = fig.subplots()
    totals, yticks, ylabels, kinds = {}, [], [], set()
    for i, rank in enumerate(ranks):
        lo, hi = windows[rank]
        r = trace[rank]
        top = -_RANK_PITCH * i

        def lane(name, _top=top):
            dy, h = _LANES[name]
            return (_top + dy - h / 2, h)

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
                comp.append((x, w, _unit_of(e), e.get("name", "").startswith("backward")))
            elif cat == "wait":
                ax.broken_barh([(x, w)], lane("wait"), facecolor=_COLORS["wait"], gid=f"wait:{rank}", zorder=2)
                tot["exposed_wait"] += w
            elif cat == "comm":
                kind = e.get("args", {}).get("kind", "other")
                kind = kind if kind in _COLORS else "other"
                kinds.add(kind)
                ax.broken_barh([(x, w)], lane("wait" if main else "comm"), facecolor=_COLORS[kind],
                               edgecolor="white", linewidth=0.3,
                               gid=f"{'main_comm' if main else 'comm'}:{rank}:{kind}", zorder=2)
                tot["comm"] += w
        # nested units: the longest (outer) first, so that the units inside are drawn over it
        for x, w, unit, backward in sorted(comp, key=lambda c: -c[1]):
            ax.broken_barh([(x, w)], lane("compute"), facecolor=colors[unit], edgecolor="white", linewidth=0.4,
                           hatch=_BACKWARD_HATCH if backward else None,
                           gid=f"compute:{rank}:{'backward' if backward else 'forward'}:{unit}", zorder=1)
        if comp:  # count the union of the units' spans, less the waits inside it
            end = -1e18
            for x, w, _, _ in sorted(comp):
                tot["compute"] += max(0.0, x + w - max(x, end))
                end = max(end, x + w)
            tot["compute"] = max(0.0, tot["compute"] - tot["exposed_wait"])
        totals[rank] = {k: round(v, 3) for k, v in tot.items()}
        yticks += [top + _LANES[k][0] for k in ("compute", "wait", "comm")]
        ylabels += [f"rank {rank} FSDP units", f"rank {rank} main waits ({tot['exposed_wait']:.1f} ms)",
                    f"rank {rank} comm thread"]
    ax.set_yticks(yticks, ylabels, fontsize=8)
    ax.set_ylim(-_RANK_PITCH * (len(ranks) - 1) + _LANES["comm"][0] - 0.5, 0.6)
    ax.set_xlabel("ms from the start of the step")
    ax.grid(True, axis="x", alpha=0.3)
    handles = [Patch(facecolor=colors[u], label=u) for u in units]
    handles += [Patch(facecolor="white", edgecolor="black", label="forward"),
                Patch(facecolor="white", edgecolor="black", hatch=_BACKWARD_HATCH, label="backward")]
    handles += [Patch(facecolor=_COLORS[k], label=k.replace("_", "-")) for k in
                ("all_gather", "reduce_scatter", "all_reduce", "other") if k in kinds]
    handles.append(Patch(facecolor=_COLORS["wait"], label="main thread waiting"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False,
              title="FSDP units / kinds", title_fontsize=8)
    ax.set_title(title or f"step {step}: FSDP units, waits and collectives per rank", fontsize=10)
    return fig, totals


def plot_step(path: str, out: str, step: int | None = None, title: str | None = None) -> dict:
    """Draw one step per rank (see `step_figure`) into ``out``; returns its per-rank totals in ms."""
    fig, totals = step_figure(path, step, title)
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
    q = sub.add_parser("plot", help="draw one training step per rank (compute, communication, waits)",
                       description="Draw one training step per rank in three lanes: the FSDP units on the main "
                       "thread (a colour per unit, forward plain, backward hatched), the main thread's waits on "
                       "collectives beside them, and the communication thread's collectives; a legend names "
                       "the units and kinds. Prints each rank's compute, communication and exposed wait.")
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
