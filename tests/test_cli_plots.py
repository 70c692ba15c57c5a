"""The pictures: `hpcfsdp trace plot` (a colour per FSDP unit, backward hatched, waits in their own lane, a legend)
on a trace whose events are known, `hpcfsdp plot` (resume and world-size markers, --x tokens, --smooth) on
logs whose numbers are known and on a real 2 -> 4 rank resumed run, and the committed PNGs of the docs."""
import json
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

from hpcfsdp.cli.plot import load_metrics, plot_metrics, smooth, tokens_at
from hpcfsdp.cli.trace import step_figure

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
HPC = [sys.executable, "-m", "hpcfsdp.cli.main"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
UNITS = ("root", "layers.0", "layers.1")


# ------------------------------------------------------------------------------------------- trace plot


def _trace(tmp_path, ranks=(0, 1)):
    """Two steps per rank, times in us: root forward [0, 100) holding layers.0 [10, 40) and layers.1 [40, 80),
    backward in reverse at [100, 200); a wait on layers.1's all-gather at [40, 50) on the main thread, an inline
    all-reduce at [200, 210); the comm thread's all-gathers and reduce-scatters."""
    events = []
    for r in ranks:
        events += [{"name": "process_name", "ph": "M", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}},
                   {"name": "thread_name", "ph": "M", "pid": r, "tid": 0, "args": {"name": "main"}},
                   {"name": "thread_name", "ph": "M", "pid": r, "tid": 2, "args": {"name": "hpcfsdp-comm"}}]
        for k in range(2):
            o = 1_000_000 + 1000 * k

            def x(name, cat, ts, dur, tid=0, **args):
                events.append({"name": name, "cat": cat, "ph": "X", "pid": r, "tid": tid, "ts": o + ts, "dur": dur,
                               "args": args})

            events.append({"name": "iteration", "cat": "iteration", "ph": "i", "pid": r, "tid": 0, "ts": o})
            x("forward root", "compute", 0, 100, unit="root")
            x("forward layers.0", "compute", 10, 30, unit="layers.0")
            x("forward layers.1", "compute", 40, 40, unit="layers.1")
            x("backward root", "compute", 100, 100, unit="root")
            x("backward layers.1", "compute", 110, 30, unit="layers.1")
            x("backward layers.0", "compute", 150, 30, unit="layers.0")
            x("wait all_gather layers.1", "wait", 40, 10, kind="all_gather", unit="layers.1")
            x("all_gather layers.1", "comm", 15, 35, tid=2, kind="all_gather", unit="layers.1")
            x("reduce_scatter layers.1", "comm", 140, 20, tid=2, kind="reduce_scatter", unit="layers.1")
            x("all_reduce", "comm", 200, 10, kind="all_reduce")
    p = tmp_path / "merged.json"
    p.write_text(json.dumps({"traceEvents": events}))
    return str(p)


def _bars(ax, prefix):
    """{gid: [(x0, x1, y0, y1), ...]} of the bar collections whose gid starts with ``prefix``."""
    out = {}
    for c in ax.collections:
        gid = c.get_gid() or ""
        if gid.startswith(prefix):
            for path in c.get_paths():
                (x0, y0), (x1, y1) = path.get_extents().get_points()
                out.setdefault(gid, []).append((x0, x1, y0, y1))
    return out


def _faces(ax, prefix):
    return {c.get_gid(): tuple(np.round(c.get_facecolor()[0], 4)) for c in ax.collections
            if (c.get_gid() or "").startswith(prefix)}


@pytest.mark.timeout(60)
def test_trace_plot_colours_units_hatches_backward_and_lanes_waits_apart(tmp_path):
    fig, totals = step_figure(_trace(tmp_path), step=1)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:3] == list(UNITS)  # the units, in model order (first forward)
    assert {"forward", "backward", "all-gather", "reduce-scatter", "all-reduce", "main thread waiting"} <= set(labels)
    faces = _faces(ax, "compute:")
    for r in (0, 1):  # one colour per unit, the same for its forward and its backward
        per_unit = {u: {faces[f"compute:{r}:{ph}:{u}"] for ph in ("forward", "backward")} for u in UNITS}
        assert all(len(c) == 1 for c in per_unit.values())
        assert len({next(iter(c)) for c in per_unit.values()}) == len(UNITS)
    colls = {c.get_gid(): c for c in ax.collections}
    assert all(not colls[f"compute:0:forward:{u}"].get_hatch() for u in UNITS)
    assert all(colls[f"compute:0:backward:{u}"].get_hatch() for u in UNITS)
    legend_faces = {t.get_text(): tuple(np.round(h.get_facecolor(), 4))
                    for t, h in zip(ax.get_legend().get_texts(), ax.get_legend().legend_handles)}
    assert all(legend_faces[u] == faces[f"compute:0:forward:{u}"] for u in UNITS)
    # the x extents are the events' (ms from the step start), nested units drawn over their root
    bars = _bars(ax, "compute:0:")
    assert bars["compute:0:forward:layers.1"] == [pytest.approx((0.04, 0.08, *bars["compute:0:forward:root"][0][2:]))]
    order = [c.get_gid() for c in ax.collections if (c.get_gid() or "").startswith("compute:0:forward")]
    assert order.index("compute:0:forward:root") < order.index("compute:0:forward:layers.0")
    # lanes: per rank, waits and inline collectives below the units, the comm thread below those; no overlap
    for r in (0, 1):
        lanes = {}
        for kind in ("compute", "wait", "comm"):
            ys = [(y0, y1) for bs in _bars(ax, f"{kind}:{r}").values() for (_, _, y0, y1) in bs]
            lanes[kind] = (min(y for y, _ in ys), max(y for _, y in ys))
        assert lanes["compute"][0] > lanes["wait"][1] and lanes["wait"][0] > lanes["comm"][1], lanes
        (wait,) = _bars(ax, f"wait:{r}")[f"wait:{r}"]
        assert wait[:2] == pytest.approx((0.04, 0.05))
        assert not _bars(ax, f"comm:{r}:all_reduce")
        inline = _bars(ax, f"main_comm:{r}:all_reduce")[f"main_comm:{r}:all_reduce"][0]
        assert lanes["wait"][0] <= inline[2] and inline[3] <= lanes["wait"][1]  # main thread: the wait lane
    # totals: units' union 0.2 ms less 0.01 ms of waits; collectives 0.035 + 0.02 + 0.01 ms
    assert totals[0] == {"step": 1.0, "compute": 0.19, "comm": 0.065, "exposed_wait": 0.01}


@pytest.mark.timeout(60)
def test_trace_plot_many_units_get_distinct_colours(tmp_path):
    events = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "main"}},
              {"name": "iteration", "cat": "iteration", "ph": "i", "pid": 0, "tid": 0, "ts": 0}]
    units = [f"layers.{k}" for k in range(30)]
    events += [{"name": f"forward {u}", "cat": "compute", "ph": "X", "pid": 0, "tid": 0, "ts": 10 * k, "dur": 10,
                "args": {"unit": u}} for k, u in enumerate(units)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps(events))
    fig, _ = step_figure(str(p), step=1)
    faces = _faces(fig.axes[0], "compute:")
    assert len(set(faces.values())) == 30


# ------------------------------------------------------------------------------------------- metrics plot


def _log(tmp_path, recs):
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return str(p)


def _rec(step, world, tokens_per_step, **extra):
    dt = 0.25
    return {"step": step, "loss": 5.0 - 0.1 * step, "tokens_per_s": tokens_per_step / dt, "step_time_s": dt,
            "peak_mem_bytes": [1] * world, **extra}


def _resumed_log(tmp_path):
    """Steps 1..10 at 2 ranks (1024 tokens per step, logged every 5), a checkpoint at 8, resumed there at 2
    ranks, logged at 9, 10, 12; resumed at 12 at 4 ranks (2048 tokens per step): 13, 15."""
    recs = [_rec(1, 2, 1024, world_size=2), _rec(5, 2, 1024), _rec(9, 2, 1024, world_size=2, resumed_from=8),
            _rec(10, 2, 1024), _rec(12, 2, 1024), _rec(13, 4, 2048, world_size=4, resumed_from=12),
            _rec(15, 4, 2048), {"step": 15, "val_loss": 3.0}]
    return _log(tmp_path, recs)


@pytest.mark.timeout(60)
def test_plot_marks_resumes_and_world_size_changes_at_their_step(tmp_path):
    cols = load_metrics(_resumed_log(tmp_path))
    assert cols["runs"] == [{"step": 8, "world_size": 2, "resumed": True, "previous_world_size": 2},
                            {"step": 12, "world_size": 4, "resumed": True, "previous_world_size": 2}]
    fig = plot_metrics(cols, str(tmp_path / "m.png"))
    for ax in fig.axes:
        marks = {ln.get_gid(): list(ln.get_xdata()) for ln in ax.get_lines() if (ln.get_gid() or "").startswith("run:")}
        assert marks == {"run:resume:8": [8, 8], "run:world:12": [12, 12]}
        texts = {t.get_text() for t in ax.texts}
        assert {"resumed at 8", "2\u21924 ranks (resumed at 12)"} <= texts
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["train loss", "val loss", "resumed", "world size changed"]
    # a log of an older trainer: no resumed_from, the world size from peak_mem_bytes; marked before the change
    old = load_metrics(_log(tmp_path, [_rec(1, 2, 1024), _rec(5, 2, 1024), _rec(6, 4, 2048)]))
    assert old["runs"] == [{"step": 5, "world_size": 4, "resumed": False, "previous_world_size": 2}]


@pytest.mark.timeout(60)
def test_plot_tokens_axis_counts_each_step_at_its_runs_size(tmp_path):
    cols = load_metrics(_resumed_log(tmp_path))
    # independently: steps 1..12 at 1024 tokens, 13..15 at 2048
    per_step = {s: 1024 if s <= 12 else 2048 for s in range(1, 16)}
    want = [sum(per_step[k] for k in range(1, s + 1)) for s in cols["step"]]
    assert cols["tokens"] == want
    assert tokens_at(cols["token_knots"], 8) == 8 * 1024 and tokens_at(cols["token_knots"], 12) == 12 * 1024
    fig = plot_metrics(cols, str(tmp_path / "t.png"), x="tokens")
    ax = fig.axes[0]
    train, val = [ln for ln in ax.get_lines() if not (ln.get_gid() or "").startswith("run:")]
    assert list(train.get_xdata()) == want and list(val.get_xdata()) == [want[-1]]
    marks = {ln.get_gid(): ln.get_xdata()[0] for ln in ax.get_lines() if (ln.get_gid() or "").startswith("run:")}
    assert marks == {"run:resume:8": 8 * 1024, "run:world:12": 12 * 1024}
    assert ax.get_xlabel() == "tokens trained on"
    # a log without step_time_s cannot give tokens: one clear line from the CLI
    bare = _log(tmp_path, [{"step": 1, "loss": 2.0, "tokens_per_s": 10.0}])
    out = subprocess.run(HPC + ["plot", bare, "--x", "tokens", "-o", str(tmp_path / "b.png")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "step_time_s" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.timeout(60)
def test_smooth_is_tensorboards_debiased_ema(tmp_path):
    rng = np.random.default_rng(0)
    v = list(rng.normal(3.0, 1.0, 40))
    for w in (0.0, 0.6, 0.9):
        # closed form: s_n = sum_k (1-w) w^(n-k) v_k / (1 - w^n)
        want = [sum((1 - w) * w ** (n - k) * v[k - 1] for k in range(1, n + 1)) / (1 - w ** n) for n in range(1, 41)]
        assert smooth(v, w) == pytest.approx(want, rel=1e-12)
    assert smooth([2.0, 2.0, 2.0]) == pytest.approx([2.0, 2.0, 2.0])  # debiased: a constant stays put
    nan = smooth([1.0, float("nan"), 3.0], 0.5)
    assert nan[0] == 1.0 and np.isnan(nan[1]) and nan[2] == pytest.approx((0.25 * 1 + 0.5 * 3) / 0.75)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        smooth(v, 1.0)
    cols = load_metrics(_resumed_log(tmp_path))
    fig = plot_metrics(cols, str(tmp_path / "s.png"), smoothing=0.6)
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    assert lines["train loss"].get_alpha() == 0.3
    assert list(lines["train loss, smoothed (0.6)"].get_ydata()) == pytest.approx(smooth(cols["loss"], 0.6))
    out = subprocess.run(HPC + ["plot", "--smooth", _resumed_log(tmp_path), "-o", str(tmp_path / "c.png")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "2 resume(s) or world-size change(s) marked" in out.stdout, out.stderr
    out = subprocess.run(HPC + ["plot", _resumed_log(tmp_path), "--smooth", "--smooth-weight", "1.5"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "[0, 1)" in out.stderr


def _train(tmp, n, args):
    env = {k: v for k, v in os.environ.items() if k not in ("HPCFSDP_TRACE", "HPCFSDP_PROGRESS")}
    cmd = HPC + ["launch", "-n", str(n), "--timeout", "150", "--", sys.executable, "-m", "hpcfsdp.cli.main", "train",
                 "--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--block-size", "16", "--batch-size", "4",
                 "--log-interval", "2", "--lr", "3e-3", "--warmup-steps", "2", "--out-dir", "run",
                 "--checkpoint-dir", "ckpt", "--checkpoint-interval", "3", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp, timeout=200)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]


@pytest.mark.timeout(400)
def test_resumed_run_at_another_world_size_is_marked_and_counted(tmp_path):
    """`hpcfsdp train` for 5 steps at 2 ranks, resumed to 8 at 4 ranks: the log's first record of each run
    says so, `plot` marks the change at step 5, and the tokens axis counts 5 steps of 2 x 4 x 16 tokens and
    3 of 4 x 4 x 16."""
    _train(tmp_path, 2, ["--steps", "5", "--trace", "trace"])
    _train(tmp_path, 4, ["--steps", "8", "--resume"])
    log = tmp_path / "run" / "metrics.jsonl"
    recs = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    firsts = [(r["step"], r.get("world_size"), r.get("resumed_from")) for r in recs if "world_size" in r]
    assert firsts == [(1, 2, None), (6, 4, 5)]
    cols = load_metrics(str(log))
    assert cols["runs"] == [{"step": 5, "world_size": 4, "resumed": True, "previous_world_size": 2}]
    tokens = dict(zip(cols["step"], cols["tokens"]))
    assert tokens[4] == 4 * 2 * 64 and tokens[5] == 5 * 2 * 64 and tokens[8] == 5 * 2 * 64 + 3 * 4 * 64
    png = tmp_path / "m.png"
    out = subprocess.run(HPC + ["plot", str(log), "--x", "tokens", "--smooth", "-o", str(png)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and png.read_bytes()[:8] == PNG_MAGIC, out.stderr
    # the traced first run: every unit the trainer wrapped has a colour of its own and a legend entry
    subprocess.run(HPC + ["trace", "merge", "trace", "-o", "m.json"], cwd=tmp_path, check=True, capture_output=True,
                   timeout=60)
    fig, totals = step_figure(str(tmp_path / "m.json"), step=3)
    labels = {t.get_text() for t in fig.axes[0].get_legend().get_texts()}
    assert {"root", "transformer.h.0", "transformer.h.1"} <= labels and sorted(totals) == [0, 1]
    assert len(set(_faces(fig.axes[0], "compute:0:").values())) == len(labels & {"root", "transformer.h.0",
                                                                                  "transformer.h.1"})


# ------------------------------------------------------------------------------------------- the docs' PNGs


def _png_size(path):
    """(width, height) of a PNG, after checking its signature and its IHDR chunk's CRC."""
    data = open(path, "rb").read()
    assert data[:8] == PNG_MAGIC, path
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    body, crc = data[16:29], struct.unpack(">I", data[29:33])[0]
    assert zlib.crc32(b"IHDR" + body) == crc
    assert data[-8:-4] == b"IEND"
    return struct.unpack(">II", body[:8])


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ["trace_step.png", "metrics_resume.png"])
def test_docs_pictures_are_committed_pngs_made_by_the_named_script(name):
    w, h = _png_size(os.path.join(ROOT, "docs", "img", name))
    assert w >= 600 and h >= 250
    script = os.path.join(ROOT, "scripts", "docs_images.sh")
    assert name in open(script).read()
    docs = open(os.path.join(ROOT, "docs", "performance.md")).read()
    assert "scripts/docs_images.sh" in docs and f"img/{name}" in docs
