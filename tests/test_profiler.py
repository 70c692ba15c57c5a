"""hpcfsdp.profiler (torch.profiler's API) and hpcfsdp.cuda.nvtx: schedules as PyTorch's, Chrome traces as
HPCFSDP_TRACE's, key_averages counts, and NVTX ranges that nest."""
import gzip
import json
import os
import subprocess
import sys
import threading
import warnings

import pytest

import hpcfsdp as hp
from hpcfsdp import _trace
from hpcfsdp.profiler import (ProfilerAction, ProfilerActivity, profile, record_function, schedule,
                              tensorboard_trace_handler)

HERE = os.path.dirname(os.path.abspath(__file__))
A = ProfilerAction


def _quiet_schedule(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # warmup=0 warns, as PyTorch's
        return schedule(**kw)


@pytest.fixture(autouse=True)
def _no_recorder():
    """These tests start with tracing off (HPCFSDP_TRACE unset) and leave it so."""
    assert _trace.RECORDER is None
    yield
    assert _trace.RECORDER is None


def _profiled_steps(sched, n):
    """Run n steps under a profile with ``sched``; (step_num at each on_trace_ready, the work labels in it)."""
    traces = []

    def ready(p):
        traces.append((p.step_num, sorted({e.name for e in p.events() if e.name.startswith("work")},
                                          key=lambda s: int(s[4:]))))

    with profile(activities=[ProfilerActivity.CPU], schedule=sched, on_trace_ready=ready) as prof:
        for i in range(n):
            with record_function(f"work{i}"):
                pass
            prof.step()
    return traces


# ------------------------------------------------------------------------------------------------ schedule


@pytest.mark.timeout(30)
def test_schedule_actions_are_pytorchs_documented_cycle():
    # torch.profiler's docs: wait=1, warmup=1, active=2, repeat=1: skip the first step, warm up on the second,
    # record the third and fourth (the fourth RECORD_AND_SAVE), then nothing
    s = schedule(wait=1, warmup=1, active=2, repeat=1)
    assert [s(i) for i in range(7)] == [A.NONE, A.WARMUP, A.RECORD, A.RECORD_AND_SAVE, A.NONE, A.NONE, A.NONE]
    # skip_first=3, then cycles repeat forever (repeat=0)
    s = schedule(wait=1, warmup=1, active=1, skip_first=3)
    assert [s(i) for i in range(9)] == [A.NONE] * 3 + [A.NONE, A.WARMUP, A.RECORD_AND_SAVE] * 2
    # skip_first_wait: the first cycle starts right after skip_first (its wait left out), later ones wait
    s = schedule(wait=3, warmup=1, active=1, skip_first=1, skip_first_wait=1)
    assert [s(i) for i in range(8)] == [A.NONE, A.WARMUP, A.RECORD_AND_SAVE, A.NONE, A.NONE, A.NONE, A.WARMUP,
                                        A.RECORD_AND_SAVE]
    with pytest.warns(UserWarning, match="won't be using warmup"):
        s = schedule(wait=0, warmup=0, active=2)
    assert [s(i) for i in range(4)] == [A.RECORD, A.RECORD_AND_SAVE] * 2
    with pytest.raises(AssertionError, match="active=0 \\(need > 0\\)"):
        schedule(wait=1, warmup=1, active=0)
    with pytest.raises(AssertionError, match="Step must be non-negative"):
        s(-1)
    with pytest.raises(TypeError, match="wait=1.5"):
        schedule(wait=1.5, warmup=1, active=1)


@pytest.mark.timeout(30)
def test_recorded_steps_and_trace_ready_follow_the_schedule():
    # two cycles of (wait 1, warmup 1, active 2): steps 2-3 and 6-7 recorded, the trace ready after 3 and 7
    assert _profiled_steps(schedule(wait=1, warmup=1, active=2, repeat=2), 10) == [
        (4, ["work2", "work3"]), (8, ["work6", "work7"])]
    # the profile stops inside a cycle's recording (step 7 of 5..9): that partial trace is handed over at exit
    assert _profiled_steps(schedule(wait=1, warmup=1, active=3), 8) == [(5, ["work2", "work3", "work4"]),
                                                                        (8, ["work7"])]
    # ... and stopping in a warmup (step 6) hands over nothing more, as PyTorch's
    assert _profiled_steps(schedule(wait=1, warmup=1, active=3), 6) == [(5, ["work2", "work3", "work4"])]
    # active=1 with no wait or warmup: every step is a trace of its own (the step begun by the last step() too)
    assert _profiled_steps(_quiet_schedule(wait=0, warmup=0, active=1), 3) == [(1, ["work0"]), (2, ["work1"]),
                                                                              (3, ["work2"]), (3, [])]
    # no schedule: one trace from start to stop, no ProfilerStep labels
    with profile() as prof:
        for i in range(3):
            with record_function(f"work{i}"):
                pass
            prof.step()
    assert prof.step_num == 3 and [e.name for e in prof.events()] == ["work0", "work1", "work2"]


@pytest.mark.system
@pytest.mark.timeout(300)
def test_schedules_record_the_steps_pytorchs_profiler_records():
    """The same script on torch.profiler and hpcfsdp.profiler: the actions of five schedules, the steps each
    trace holds and when on_trace_ready runs (PyTorch, the `peer` extra, is in the system tier)."""
    script = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
P = __import__(sys.argv[1] + ".profiler", fromlist=["profile"])
cases = [dict(wait=1, warmup=1, active=2, repeat=2), dict(wait=0, warmup=0, active=1),
         dict(wait=2, warmup=1, active=3, skip_first=3), dict(wait=1, warmup=2, active=3),
         dict(wait=5, warmup=1, active=2, skip_first=2, skip_first_wait=1, repeat=1)]
out = []
for c in cases:
    traces = []
    def ready(p):
        traces.append((p.step_num, sorted(e.name for e in p.events() if e.name.startswith("work"))))
    for n in (9, 11):
        with P.profile(activities=[P.ProfilerActivity.CPU], schedule=P.schedule(**c), on_trace_ready=ready) as prof:
            for i in range(n):
                with P.record_function(f"work{i:02d}"):
                    pass
                prof.step()
    out.append([[P.schedule(**c)(s).name for s in range(16)], traces])
print("RESULT", json.dumps(out))
"""
    got = {}
    for fw in ("torch", "hpcfsdp"):
        r = subprocess.run([sys.executable, "-c", script, fw], capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stderr[-3000:]
        got[fw] = json.loads(r.stdout.split("RESULT ", 1)[1])
    assert got["hpcfsdp"] == got["torch"]


# ------------------------------------------------------------------------------------------- traces


@pytest.mark.timeout(30)
def test_exported_trace_is_chrome_json_with_the_record_function_names(tmp_path):
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2, repeat=1)) as prof:
        for i in range(3):
            with record_function("outer", args="x"):
                with record_function("inner"):
                    pass
            prof.step()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    prof.export_chrome_trace(str(tmp_path / "t.json.gz"))
    trace = json.load(open(tmp_path / "t.json"))
    assert json.load(gzip.open(tmp_path / "t.json.gz", "rt")) == trace
    evs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    names = [e["name"] for e in sorted(evs, key=lambda e: e["ts"])]
    # steps 1 and 2 recorded (step 0 warms up), each labelled ProfilerStep#N as PyTorch labels them
    assert names == ["ProfilerStep#1", "outer", "inner", "ProfilerStep#2", "outer", "inner"]
    assert all(e["cat"] == "user_annotation" and e["pid"] == 0 and e["tid"] == 0 and e["dur"] >= 0 for e in evs)
    assert [e["args"] for e in evs if e["name"] == "outer"] == [{"args": "x"}] * 2
    step1, outer = (next(e for e in evs if e["name"] == n) for n in ("ProfilerStep#1", "outer"))
    assert step1["ts"] <= outer["ts"] + 1.0 and outer["ts"] + outer["dur"] <= step1["ts"] + step1["dur"] + 1.0
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    assert {"process_name", "thread_name"} <= {e["name"] for e in meta}
    assert trace["otherData"]["producer"] == "hpcfsdp"


@pytest.mark.timeout(30)
def test_tensorboard_trace_handler_writes_one_file_per_cycle(tmp_path):
    with profile(schedule=schedule(wait=1, warmup=1, active=1, repeat=2),
                 on_trace_ready=tensorboard_trace_handler(str(tmp_path), worker_name="w0", use_gzip=True)) as prof:
        for i in range(8):
            with record_function(f"work{i}"):
                pass
            prof.step()
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 2 and all(f.startswith("w0.") and f.endswith(".pt.trace.json.gz") for f in files)
    got = [sorted(e["name"] for e in json.load(gzip.open(tmp_path / f, "rt"))["traceEvents"] if e["ph"] == "X")
           for f in files]
    assert got == [["ProfilerStep#2", "work2"], ["ProfilerStep#5", "work5"]]


@pytest.mark.timeout(30)
def test_key_averages_counts_and_self_time():
    with profile(schedule=schedule(wait=1, warmup=1, active=3)) as prof:
        for i in range(5):  # step 5 waits: the trace of steps 2-4 is the last
            for _ in range(4):
                with record_function("outer"):
                    with record_function("inner"):
                        sum(range(2000))
                    with record_function("inner"):
                        sum(range(2000))
            prof.step()
    # the first window: steps 2, 3, 4
    avg = {a.key: a for a in prof.key_averages()}
    assert {k: a.count for k, a in avg.items()} == {"ProfilerStep#2": 1, "outer": 12, "inner": 24,
                                                    "ProfilerStep#3": 1, "ProfilerStep#4": 1}
    evs = prof.events()
    for outer in (e for e in evs if e.name == "outer"):
        assert [c.name for c in outer.cpu_children] == ["inner", "inner"]
        assert outer.self_cpu_time_total == pytest.approx(
            outer.cpu_time_total - sum(c.cpu_time_total for c in outer.cpu_children))
    assert avg["inner"].cpu_time_total == pytest.approx(sum(e.cpu_time_total for e in evs if e.name == "inner"))
    assert avg["inner"].cpu_time == pytest.approx(avg["inner"].cpu_time_total / 24)
    table = prof.key_averages().table(sort_by="count", row_limit=2)
    rows = [line.split() for line in table.splitlines() if line.strip() and not line.startswith("-")]
    assert rows[0][0] == "Name" and [r[0] for r in rows[1:3]] == ["inner", "outer"] and rows[1][-1] == "24"
    assert rows[3][:4] == ["Self", "CPU", "time", "total:"]
    with pytest.raises(ValueError, match="sort_by='cpu_tim'"):
        prof.key_averages().table(sort_by="cpu_tim")


@pytest.mark.timeout(30)
def test_record_function_without_a_recorder_records_nothing_and_decorates():
    calls = []

    @record_function("decorated")
    def f(x):
        calls.append(x)
        return x + 1

    assert f(1) == 2 and calls == [1]
    with profile() as prof:
        f(2)
        f(3)
    assert [e.name for e in prof.events()] == ["decorated", "decorated"]
    with profile() as prof:  # one decorated function in two threads at once: a span on each thread
        barrier = threading.Barrier(2)
        both = record_function("t")(barrier.wait)  # one instance, entered by both threads before either exits
        ts = [threading.Thread(target=both) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert [e.name for e in prof.events()] == ["t", "t"] and len({e.thread for e in prof.events()}) == 2
    with pytest.raises(RuntimeError, match="no trace has been recorded yet"):
        profile().export_chrome_trace("x.json")
    with pytest.raises(TypeError, match="ProfilerActivity"):
        profile(activities=["cpu"])


_JOB = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import hpcfsdp as hp
from hpcfsdp.distributed.fsdp import fully_shard
from hpcfsdp.profiler import ProfilerActivity, profile, record_function, schedule
from _fsdp_util import gpt_batches, local, tiny_gpt, world

w, rank = world()
model = tiny_gpt()
for b in model.transformer.h:
    fully_shard(b)
fully_shard(model)
opt = hp.optim.AdamW(model.parameters(), lr=1e-2)
out = sys.argv[2]
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2, repeat=1)) as prof:
    for x, y in gpt_batches(6, 4 * w + 1):
        with record_function("forward+loss"):
            _, loss = model(hp.tensor(local(x)), hp.tensor(local(y)))
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
            opt.zero_grad()
        prof.step()
prof.export_chrome_trace(os.path.join(out, f"prof_rank{rank}.json"))
"""


@pytest.mark.timeout(300)
def test_fsdp_run_at_two_ranks_profiles_into_the_hpcfsdp_trace(tmp_path):
    """Under HPCFSDP_TRACE as well: the profile's trace is the HPCFSDP_TRACE file's events of steps 2 and 3 (the
    same events, same format), with FSDP's units, collectives and the record_function labels."""
    job = tmp_path / "job.py"
    job.write_text(_JOB)
    env = dict(os.environ, HPCFSDP_TRACE=str(tmp_path / "env"))
    r = subprocess.run([sys.executable, "-m", "hpcfsdp.cli.main", "launch", "-n", "2", "--timeout", "240", "--",
                        sys.executable, str(job), HERE, str(tmp_path)], capture_output=True, text=True, env=env,
                       timeout=280)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    for rank in (0, 1):
        prof = json.load(open(tmp_path / f"prof_rank{rank}.json"))
        full = json.load(open(_trace.trace_file(str(tmp_path / "env"), rank)))
        assert prof["otherData"] == full["otherData"] == {"rank": rank, "producer": "hpcfsdp"}
        key = lambda e: json.dumps(e, sort_keys=True)  # noqa: E731
        pevs = [e for e in prof["traceEvents"] if e["ph"] != "M"]
        fevs = {key(e) for e in full["traceEvents"]}
        assert pevs and all(key(e) in fevs for e in pevs)  # every profiled event is HPCFSDP_TRACE's own
        names = [e["name"] for e in pevs]
        steps = sorted(n for n in names if n.startswith("ProfilerStep#"))
        assert steps == ["ProfilerStep#2", "ProfilerStep#3"]
        assert names.count("forward+loss") == names.count("optimizer") == 2
        assert names.count("forward root") == names.count("backward root") == 2
        assert any(n.startswith("all_gather transformer.h.0") for n in names)
        assert any(n.startswith("reduce_scatter transformer.h.1") for n in names)
        assert all(e["pid"] == rank for e in pevs)
        # and nothing outside the two recorded steps: the events lie within ProfilerStep#2 .. end of #3
        lo = min(e["ts"] for e in pevs if e["name"] == "ProfilerStep#2")
        hi = max(e["ts"] + e["dur"] for e in pevs if e["name"] == "ProfilerStep#3")
        assert all(lo - 1.0 <= e["ts"] <= hi + 1.0 for e in pevs if e["tid"] == 0)


@pytest.mark.timeout(30)
def test_profile_is_reachable_as_torch_profiler():
    import importlib

    assert hp.profiler is importlib.import_module("hpcfsdp.profiler")
    assert hp.profiler.profile is profile and hp.profiler.ProfilerActivity.CUDA.name == "CUDA"


# -------------------------------------------------------------------------------------------------- nvtx


@pytest.mark.timeout(30)
def test_nvtx_ranges_nest_per_thread_and_report_their_depth():
    import hpcfsdp.cuda.nvtx as nvtx

    assert hp.cuda.nvtx is nvtx
    assert nvtx.range_push("a") == 0 and nvtx.range_push("b") == 1
    depths = []
    t = threading.Thread(target=lambda: depths.extend([nvtx.range_push("t"), nvtx.range_pop(), nvtx.range_pop()]))
    t.start()
    t.join()
    assert depths == [0, 0, -1]  # another thread has its own stack
    assert nvtx.range_pop() == 1 and nvtx.range_pop() == 0 and nvtx.range_pop() == -1
    with nvtx.range("step {}", 3):
        with nvtx.range("inner"):
            assert nvtx.range_push("x") == 2
            assert nvtx.range_pop() == 2
    assert nvtx.range_pop() == -1
    rid = nvtx.range_start("async")
    nvtx.mark("here")
    nvtx.range_end(rid)
    with pytest.raises(ValueError, match="no open range"):
        nvtx.range_end(rid)
    with pytest.raises(TypeError, match="expected a str"):
        nvtx.range_push(3)


@pytest.mark.gpu_hw
@pytest.mark.timeout(60)
def test_nvtx_on_a_gpu_goes_through_cupy():
    import cupy.cuda.nvtx as cupy_nvtx

    from hpcfsdp import _nvtx

    assert _nvtx.range_push("gpu") == 0 and _nvtx._lib is cupy_nvtx
    with _nvtx.range("inner"):
        hp.ones(4, device="cuda").sum().item()
    assert _nvtx.range_pop() == 0
