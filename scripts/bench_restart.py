"""Training efficiency of `hpcfsdp launch --max-restarts` when ranks are killed: summed step time over wall time.

    python scripts/bench_restart.py [--ranks 4] [--steps 200] [--kill-at 80] [--no-kill]
    python scripts/bench_restart.py --ranks 6 --steps 500 --kill 60s:1 --kill 120s:4 --kill 180s:2 \
        --extra "--n-layer 2 --n-embd 128 --n-head 4 --block-size 64 --batch-size 4"

Runs `hpcfsdp launch -n RANKS --max-restarts K --min-ranks 2 -- hpcfsdp train` (a tiny GPT unless --extra
says otherwise, a checkpoint every step) and SIGKILLs training processes: with --kill-at, the last rank's once
step KILL_AT is logged; with --kill AT:RANK (repeatable, AT as `60s`, seconds after the first step, or a step
number), rank RANK of the job running then (the last rank where the job has fewer), each kill waiting until
the restarted job has logged a step. K is the number of kills (at least 2). Prints one JSON line: wall
seconds, the summed step_time_s of the steps in the final metrics log, their ratio (the efficiency), each
run's (first step, world size), the steps trained twice, and the kill times. --no-kill measures the same job
uninterrupted, for reference.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from elastic_bench import parse_kill  # noqa: E402  (the same AT:RANK syntax)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--block-size", "16", "--batch-size", "4",
        "--log-interval", "1", "--lr", "3e-3", "--warmup-steps", "2", "--checkpoint-interval", "1"]


def _ranks(mark):
    """{rank: pid} of the training processes (not their wrappers) whose command line holds ``mark``."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split("=", 1) for kv in f.read().decode(errors="replace").split("\0") if "=" in kv)
        except OSError:
            continue
        if argv[1:3] == ["-m", "mpi4py"] and "train" in argv and any(mark in a for a in argv):
            if env.get("PMI_RANK", "").isdigit():
                found[int(env["PMI_RANK"])] = int(pid)
    return found


def _records(path):
    try:
        with open(path) as f:
            return [json.loads(ln) for ln in f if ln.strip().endswith("}")]
    except OSError:
        return []


def _schedule(a):
    """[(kind, at, rank)] in order: --kill entries (one rank each), else --kill-at's last rank; [] with --no-kill."""
    if a.no_kill:
        return []
    if a.kill:
        out = []
        for kind, at, ranks in a.kill:
            if len(ranks) != 1:
                raise SystemExit(f"--kill: one rank per kill here (got {ranks}); a restart follows each kill")
            out.append((kind, at, ranks[0]))
        return out
    return [("step", a.kill_at, a.ranks - 1)]


def _kill_when_due(schedule, metrics, mark, expected, t_first, kills):
    """SIGKILL the next scheduled rank once it is due and the job running now has all ``expected`` ranks and
    has logged a step since the last kill (appended to ``kills``); returns t_first, set at the first step."""
    every = _records(metrics)
    recs = [r for r in every if "loss" in r]
    if not recs:
        return t_first
    t_first = t_first if t_first is not None else time.monotonic()
    kind, at, rank = schedule[len(kills)]
    due = (time.monotonic() - t_first >= at) if kind == "s" else recs[-1]["step"] >= at
    starts = [i for i, r in enumerate(every) if "world_size" in r]
    fresh = len(starts) == len(kills) + 1 and "loss" in every[-1] and starts[-1] < len(every) - 1
    ranks = _ranks(mark)
    if not (due and fresh and len(ranks) == expected):
        return t_first
    victim = min(rank, expected - 1)
    os.kill(ranks[victim], signal.SIGKILL)
    kills.append({"t_s": round(time.monotonic() - t_first, 1), "rank": victim, "world": expected,
                  "after_step": recs[-1]["step"]})
    return t_first


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--kill-at", type=int, default=80)
    p.add_argument("--kill", type=parse_kill, action="append", default=[])
    p.add_argument("--no-kill", action="store_true")
    p.add_argument("--extra", default="", help="more `hpcfsdp train` flags (the model), one string")
    a = p.parse_args()
    schedule = _schedule(a)
    with tempfile.TemporaryDirectory(prefix="hpcfsdp-restart-") as d:
        metrics = os.path.join(d, "metrics.jsonl")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(x for x in (ROOT, os.environ.get("PYTHONPATH")) if x))
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "hpcfsdp.cli.main", "launch", "-n", str(a.ranks),
                                 "--max-restarts", str(max(2, len(schedule))), "--min-ranks", "2", "--", "hpcfsdp",
                                 "train", *TINY, *a.extra.split(), "--steps", str(a.steps), "--out-dir", d,
                                 "--checkpoint-dir", os.path.join(d, "ck")],
                                cwd=d, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        kills, t_first = [], None
        while len(kills) < len(schedule) and proc.poll() is None:
            t_first = _kill_when_due(schedule, metrics, d, a.ranks - len(kills), t_first, kills)
            time.sleep(0.1)
        out = proc.communicate()[0]
        wall = time.monotonic() - t0
        recs = _records(metrics)
        busy = sum(r["step_time_s"] for r in recs if "loss" in r)
        starts = [(r["step"], r["world_size"]) for r in recs if "world_size" in r]
        logged = [r["step"] for r in recs if "loss" in r]
        lines = [ln for ln in out.splitlines() if "restart " in ln and "/" in ln]
        resumed = [int(m.group(1)) for m in map(re.compile(r"\(step (\d+)\)").search, lines) if m]
        for k, at in zip(kills, resumed):
            k["resumed_from"] = at  # the checkpoint's step: steps after it up to after_step are trained again
        print(json.dumps({"rc": proc.returncode, "wall_s": round(wall, 2), "step_time_s": round(busy, 2),
                          "efficiency": round(busy / wall, 3), "steps_logged": len(logged),
                          "steps_done_again": sum(k["after_step"] - k.get("resumed_from", k["after_step"]) for k in kills),
                          "runs": starts, "kills": kills, "restart_lines": lines}))
        return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
