"""Training efficiency of `hpcfsdp launch --max-restarts` when a rank is killed: summed step time over wall time.

    python scripts/bench_restart.py [--ranks 4] [--steps 200] [--kill-at 80] [--no-kill]

Runs `hpcfsdp launch -n RANKS --max-restarts 2 --min-ranks 2 -- hpcfsdp train` (a tiny GPT, a checkpoint every
step), SIGKILLs the training process of the last rank once step KILL_AT is logged, and prints one JSON line:
wall seconds, the summed step_time_s of the steps in the final metrics log, their ratio (the efficiency), the
step resumed from and the world sizes. --no-kill measures the same job uninterrupted, for reference.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

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


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--kill-at", type=int, default=80)
    p.add_argument("--no-kill", action="store_true")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpcfsdp-restart-") as d:
        metrics = os.path.join(d, "metrics.jsonl")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(x for x in (ROOT, os.environ.get("PYTHONPATH")) if x))
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "hpcfsdp.cli.main", "launch", "-n", str(a.ranks),
                                 "--max-restarts", "2", "--min-ranks", "2", "--", "hpcfsdp", "train", *TINY,
                                 "--steps", str(a.steps), "--out-dir", d, "--checkpoint-dir", os.path.join(d, "ck")],
                                cwd=d, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        while not a.no_kill and proc.poll() is None:
            steps = [r["step"] for r in _records(metrics) if "loss" in r]
            ranks = _ranks(d)
            if steps and steps[-1] >= a.kill_at and len(ranks) == a.ranks:
                os.kill(ranks[a.ranks - 1], signal.SIGKILL)
                break
            time.sleep(0.1)
        out = proc.communicate()[0]
        wall = time.monotonic() - t0
        recs = _records(metrics)
        busy = sum(r["step_time_s"] for r in recs if "loss" in r)
        starts = [(r["step"], r["world_size"]) for r in recs if "world_size" in r]
        print(json.dumps({"rc": proc.returncode, "wall_s": round(wall, 2), "step_time_s": round(busy, 2),
                          "efficiency": round(busy / wall, 3), "steps_logged": sum("loss" in r for r in recs),
                          "runs": starts, "killed": not a.no_kill,
                          "restart_line": next((ln for ln in out.splitlines() if "restart 1/" in ln), None)}))
        return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
