"""The timeline (HPCFSDP_TRACE): per-rank Chrome traces of a 2-rank FSDP run with the expected events and
nesting, `hpcfsdp trace merge` (valid JSON, every rank) and `plot` (a PNG), and nothing at all when off."""
import json
import os
import subprocess
import sys

import pytest

from hpcfsdp import _trace
from hpcfsdp.cli.trace import TraceError, load_trace, merge_traces, plot_step

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "_trace_job.py")
UNITS = ("root", "transformer.h.0", "transformer.h.1")


def _launch(n, cwd, env_extra):
    env = dict(os.environ)
    env.pop("HPCFSDP_TRACE", None)
    env.update(env_extra)
    cmd = [sys.executable, "-m", "hpcfsdp.cli.main", "launch", "-n", str(n), "--timeout", "120", "--",
           sys.executable, JOB]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=cwd)
    assert out.returncode == 0, f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}"


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    d = tmp_path_factory.mktemp("traced")
    _launch(2, str(d), {"HPCFSDP_TRACE": str(d / "trace")})
    return d / "trace"


def _events(path):
    data = json.load(open(path))
    threads = {e["tid"]: e["args"]["name"] for e in data["traceEvents"] if e.get("name") == "thread_name"}
    return [e for e in data["traceEvents"] if e["ph"] in ("X", "i")], threads


def _end(e):
    return e["ts"] + e["dur"]


def _inside(inner, outer, slack=1.0):
    return outer["ts"] - slack <= inner["ts"] and _end(inner) <= _end(outer) + slack


def _check_rank_file(path, rank):
    events, threads = _events(path)
    assert all(e.get("pid") == rank for e in events)
    assert threads[0] == "main" and "hpcfsdp-comm" in threads.values()
    comm_tid = next(t for t, n in threads.items() if n == "hpcfsdp-comm")
    its = sorted(e["ts"] for e in events if e["name"] == "iteration")
    assert len(its) == 3
    bounds = its + [float("inf")]
    for k in range(3):
        win = [e for e in events if e["ph"] == "X" and bounds[k] <= e["ts"] < bounds[k + 1]]
        by = {}
        for e in win:
            by.setdefault(e["name"], []).append(e)
        for u in UNITS:  # every unit: one forward and one backward on the main thread, with its collectives
            assert len(by[f"forward {u}"]) == 1 and len(by[f"backward {u}"]) == 1, (k, u, sorted(by))
            fwd, bwd = by[f"forward {u}"][0], by[f"backward {u}"][0]
            assert fwd["tid"] == 0 and bwd["tid"] == 0 and fwd["cat"] == "compute"
            assert _end(fwd) <= bwd["ts"] + 1.0
            ags = by[f"all_gather {u}"]
            assert ags and all(a["cat"] == "comm" and a["args"]["kind"] == "all_gather" for a in ags)
            # the unit's all-gather ran before its forward ended
            assert _end(ags[0]) <= _end(fwd) + 1.0, (k, u)
            # its gradients were reduce-scattered after its backward began and before the root's backward ended
            rs = by[f"reduce_scatter {u}"]
            assert len(rs) == 1 and rs[0]["ts"] >= bwd["ts"] - 1.0, (k, u)
            assert _end(rs[0]) <= _end(by["backward root"][0]) + 1.0, (k, u)
        for u in UNITS[1:]:  # blocks nest inside the root on the main thread
            assert _inside(by[f"forward {u}"][0], by["forward root"][0])
            assert _inside(by[f"backward {u}"][0], by["backward root"][0])
        # prefetched (async) all-gathers and the reductions ran on the communication thread
        assert by["all_gather transformer.h.1"][0]["tid"] == comm_tid
        assert all(e["tid"] == comm_tid for u in UNITS for e in by[f"reduce_scatter {u}"])
        # waits: the main thread, blocked, inside the hooks of the unit the collective belongs to
        waits = [e for e in win if e["cat"] == "wait"]
        assert all(e["tid"] == 0 for e in waits)
        for w in waits:
            u = w["args"].get("unit")
            if u is not None and w["args"]["kind"] == "all_gather":
                assert _inside(w, by[f"forward {u}"][0]) or _inside(w, by[f"backward {u}"][0]), w


def test_env_traced_2_rank_run_writes_one_file_per_rank_with_expected_events(traced):
    files = sorted(os.listdir(traced))
    assert files == ["trace_rank00000.json", "trace_rank00001.json"]
    for r, f in enumerate(files):
        _check_rank_file(os.path.join(traced, f), r)


def test_tracing_off_writes_nothing(tmp_path):
    _launch(2, str(tmp_path), {})
    assert [p for p in tmp_path.rglob("*") if "trace" in p.name] == []
    assert _trace.RECORDER is None  # this process: off unless asked


def test_merge_gives_one_valid_trace_with_every_rank(traced, tmp_path):
    out = tmp_path / "merged.json"
    res = merge_traces([str(traced)], str(out))
    assert res["ranks"] == [0, 1]
    data = json.load(open(out))
    names = {(e["pid"], e["args"]["name"]) for e in data["traceEvents"] if e.get("name") == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1")}
    per_rank = {r: sum(1 for e in data["traceEvents"] if e["pid"] == r and e["ph"] == "X") for r in (0, 1)}
    single = {r: len([e for e in _events(os.path.join(traced, f"trace_rank{r:05d}.json"))[0] if e["ph"] == "X"])
              for r in (0, 1)}
    assert per_rank == single
    with pytest.raises(TraceError, match="more than one input"):
        merge_traces([str(traced), os.path.join(traced, "trace_rank00000.json")], str(tmp_path / "x.json"))
    with pytest.raises(TraceError, match="no trace_rank"):
        merge_traces([str(tmp_path / "empty")] if os.makedirs(tmp_path / "empty") is None else [], str(out))


def test_cli_merge_and_plot_write_a_png(traced, tmp_path):
    pytest.importorskip("matplotlib")
    merged, png = tmp_path / "m.json", tmp_path / "step.png"
    run = lambda *a: subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "trace", *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    out = run("merge", str(traced), "-o", str(merged))
    assert out.returncode == 0, out.stderr
    out = run("plot", str(merged), "-o", str(png), "--step", "2")
    assert out.returncode == 0, out.stderr
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert "rank 0: step" in out.stdout and "rank 1: step" in out.stdout
    out = run("plot", str(merged), "-o", str(png), "--step", "9")
    assert out.returncode == 1 and "steps 1..3" in out.stderr


def test_plot_totals_are_consistent(traced, tmp_path):
    pytest.importorskip("matplotlib")
    merged = tmp_path / "m.json"
    merge_traces([str(traced)], str(merged))
    totals = plot_step(str(merged), str(tmp_path / "s.png"), step=2)
    assert sorted(totals) == [0, 1]
    for t in totals.values():
        assert 0 < t["step"] and 0 <= t["exposed_wait"] <= t["step"] + 0.01 and t["comm"] > 0
        assert t["compute"] + t["exposed_wait"] <= t["step"] + 0.01
    assert len(load_trace(str(merged))[0]["iterations"]) == 3


def test_train_with_trace_and_async_checkpoints(tmp_path):
    """`hpcfsdp train --trace DIR --async-checkpoint`: a trace per rank with one iteration per step, and the
    same losses and final checkpoint as the run with synchronous checkpoints."""
    tiny = ["--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--block-size", "16", "--batch-size", "4",
            "--steps", "5", "--log-interval", "1", "--lr", "3e-3", "--warmup-steps", "2", "--checkpoint-interval", "2"]
    losses = {}
    for mode in ("sync", "async"):
        d = tmp_path / mode
        args = tiny + ["--out-dir", str(d), "--checkpoint-dir", str(d / "ckpt")]
        if mode == "async":
            args += ["--async-checkpoint", "--trace", str(d / "trace")]
        cmd = [sys.executable, "-m", "hpcfsdp.cli.main", "launch", "-n", "2", "--timeout", "120", "--",
               sys.executable, "-m", "hpcfsdp.cli.main", "train", *args]
        env = {k: v for k, v in os.environ.items() if k != "HPCFSDP_TRACE"}
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        recs = [json.loads(line) for line in open(d / "metrics.jsonl") if line.strip()]
        losses[mode] = [r["loss"] for r in recs if "loss" in r]
        assert sorted(p.name for p in d.iterdir() if p.name.startswith("ckpt")) == ["ckpt"]
        assert [p.name for p in (d / "ckpt").iterdir() if ".tmp-" in p.name] == []
    assert len(losses["sync"]) == 5 and losses["async"] == losses["sync"]
    from hpcfsdp.distributed.checkpoint import read_metadata

    assert read_metadata(tmp_path / "async" / "ckpt" / "latest").extras["skeleton"]["step"] == 5
    for r in (0, 1):
        events, _ = _events(tmp_path / "async" / "trace" / f"trace_rank{r:05d}.json")
        assert sum(e["name"] == "iteration" for e in events) == 5
